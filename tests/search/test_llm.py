"""The LLM client through the real openai SDK against a real HTTP server on 127.0.0.1."""
import socket

import pytest
from fake_openai import API_KEY, MODEL, error, fake_openai, reply  # noqa: F401  (fixture)

from autokernel.errors import UserError
from autokernel.search.llm import LLMClient, RetryPolicy


class FakeClock:
    """Time that moves only when the client sleeps: no real waiting in tests."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def client_for(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)

    def make(server, **kwargs):
        clock, lines = FakeClock(), []
        client = LLMClient(MODEL, base_url=server.base_url, sleep=clock.sleep, clock=clock,
                           log=lines.append, seed=0, timeout_s=5, **kwargs)
        return client, clock, lines
    return make


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]


def test_reply_text_tokens_and_request_body(fake_openai, client_for):
    fake_openai.script(reply("hi there", prompt_tokens=12, completion_tokens=3))
    client, clock, lines = client_for(fake_openai)
    answer = client.query(MESSAGES)
    assert (answer.text, answer.prompt_tokens, answer.completion_tokens) == ("hi there", 12, 3)
    # the request is timed on the client's clock, which moves only when the client sleeps: here, not at all
    assert answer.seconds == 0.0 and clock.sleeps == [] and lines == []
    body = fake_openai.requests[0]
    assert body["model"] == MODEL and body["messages"] == MESSAGES
    assert fake_openai.auth_headers[0] == f"Bearer {API_KEY}"


def test_429_then_success_honours_retry_after(fake_openai, client_for):
    fake_openai.script(error(429, retry_after=7, message="slow down"), reply("ok"))
    client, clock, lines = client_for(fake_openai)
    assert client.query(MESSAGES).text == "ok"
    assert len(fake_openai.requests) == 2
    assert clock.sleeps[0] >= 7.0  # the server's Retry-After wins over a shorter backoff
    assert "HTTP 429" in lines[0] and "slow down" in lines[0] and "retry 1" in lines[0]


def test_run_of_500s_backs_off_exponentially_with_jitter(fake_openai, client_for):
    fake_openai.script(*[error(500)] * 4, error(503), reply("finally"))
    policy = RetryPolicy(first_delay_s=2, max_delay_s=10, pause_after_s=1e9)
    client, clock, lines = client_for(fake_openai, retry=policy)
    assert client.query(MESSAGES).text == "finally"
    assert len(clock.sleeps) == 5 and len(lines) == 5
    caps = [2, 4, 8, 10, 10]
    for slept, cap in zip(clock.sleeps, caps):
        assert cap / 2 <= slept <= cap  # jitter within the upper half of each backoff step
    assert len(set(clock.sleeps)) > 1
    assert client.waited_s == pytest.approx(sum(clock.sleeps))


def test_long_outage_pauses_and_keeps_retrying(fake_openai, client_for):
    fake_openai.script(*[error(502)] * 12, reply("back"))
    policy = RetryPolicy(first_delay_s=30, max_delay_s=60, pause_after_s=180)
    client, clock, lines = client_for(fake_openai, retry=policy)
    assert client.query(MESSAGES).text == "back"
    assert len(lines) == 12  # one line per attempt
    assert "paused" not in lines[0] and "run paused" in lines[-1]
    assert sum(clock.sleeps) > 180


def test_401_is_a_user_error_with_hint_and_not_retried(fake_openai, client_for):
    fake_openai.script(error(401, message="Incorrect API key provided"), reply("never"))
    client, clock, _ = client_for(fake_openai)
    with pytest.raises(UserError) as caught:
        client.query(MESSAGES)
    assert "Incorrect API key provided" in caught.value.message
    assert "OPENAI_API_KEY" in caught.value.hint
    assert len(fake_openai.requests) == 1 and clock.sleeps == []


def test_404_unknown_model_hint_names_model_and_base_url(fake_openai, client_for):
    fake_openai.script(error(404, message="model 'nope' not found"))
    client, _, _ = client_for(fake_openai)
    with pytest.raises(UserError) as caught:
        client.query(MESSAGES)
    assert "not found" in caught.value.message and "--base-url" in caught.value.hint


def test_missing_key_names_the_variable(monkeypatch, fake_openai):
    monkeypatch.delenv("MY_GATEWAY_KEY", raising=False)
    client = LLMClient(MODEL, base_url=fake_openai.base_url, api_key_env="MY_GATEWAY_KEY")
    with pytest.raises(UserError) as caught:
        client.check()
    assert "MY_GATEWAY_KEY" in caught.value.message and "MY_GATEWAY_KEY" in caught.value.hint
    assert fake_openai.requests == []


def test_check_passes_against_a_live_endpoint(fake_openai, client_for):
    client, clock, lines = client_for(fake_openai)
    client.check()  # GET /v1/models answers
    assert fake_openai.gets == ["/v1/models"]  # the check asked the endpoint, once, and nothing else
    assert fake_openai.requests == [] and clock.sleeps == [] and lines == []


def test_unreachable_endpoint_at_startup(client_for, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    class Closed:
        base_url = f"http://127.0.0.1:{port}/v1"
    client, _, _ = client_for(Closed)
    with pytest.raises(UserError) as caught:
        client.check()
    assert f"127.0.0.1:{port}" in caught.value.message and "--base-url" in caught.value.hint


def test_timeout_is_retried(fake_openai, client_for, monkeypatch):
    fake_openai.script(reply("late", delay_s=10.0), reply("on time"))
    client, clock, lines = client_for(fake_openai)
    client.timeout_s = 1.0  # far below the late reply, far above a loopback round trip on a busy machine
    assert client.query(MESSAGES).text == "on time"
    assert "Timeout" in lines[0] and len(clock.sleeps) == 1


# ------------------------------------------------------------------ LLMProposer
def _ctx():
    from autokernel.search.proposer import SearchContext
    source = "KERNEL_TYPE = \"softmax\"\n"
    return SearchContext("softmax", {"M": 8, "N": 128}, "float32", "softmax[8x128:float32]", source,
                         device={"type": "cpu"}, experiment=1)


def test_llm_proposer_takes_the_last_python_block(fake_openai, client_for):
    from autokernel.search.llm_agent import LLMProposer
    from autokernel.search.proposer import Proposer
    fake_openai.script(reply("Use **one block** per row.\n```python\nA = 1\n```\n```python\nB = 2\n```",
                             prompt_tokens=900, completion_tokens=40),
                       reply("I am not sure what to change."))
    client, _, _ = client_for(fake_openai)
    proposer = LLMProposer(client)
    assert isinstance(proposer, Proposer) and proposer.name == "llm"
    first = proposer.propose(_ctx())
    assert first.source == "B = 2\n" and not first.parse_error
    assert first.description == "Use one block per row."
    assert (first.prompt_tokens, first.completion_tokens) == (900, 40)
    assert "softmax[8x128:float32]" in first.prompt and first.response.startswith("Use **one")
    assert fake_openai.requests[0]["messages"][1]["content"] in first.prompt
    second = proposer.propose(_ctx())
    assert second.parse_error and second.source is None
    assert second.response == "I am not sure what to change."


def test_llm_proposer_with_messages_of_another_task(fake_openai, client_for):
    from autokernel.search.llm_agent import LLMProposer
    fake_openai.script(reply("Done.\n```python\nclass ModelNew: pass\n```"))
    client, _, _ = client_for(fake_openai)
    ask = [{"role": "user", "content": "write ModelNew for problem 19"}]
    candidate = LLMProposer(client, messages_for=lambda ctx: ask).propose(_ctx())
    assert fake_openai.requests[0]["messages"] == ask
    assert candidate.source == "class ModelNew: pass\n" and "problem 19" in candidate.prompt


def test_max_tokens_reasoning_effort_and_a_server_that_refuses_it(fake_openai, client_for):
    fake_openai.script(error(400, message="Unrecognized request argument supplied: reasoning_effort"),
                       reply("ok", finish_reason="length", reasoning_content="```python\nX = 1\n```"))
    client, clock, lines = client_for(fake_openai, max_tokens=512, reasoning_effort="high")
    answer = client.query(MESSAGES)
    first, second = fake_openai.requests
    assert first["reasoning_effort"] == "high" and "reasoning_effort" not in second  # dropped, once
    assert first["max_tokens"] == second["max_tokens"] == 512
    assert answer.text == "ok" and answer.truncated and answer.reasoning_chars > 0  # thinking kept apart
    assert "does not take reasoning_effort" in lines[0] and clock.sleeps == []


def test_a_prompt_refused_for_its_length_is_not_a_fatal_error(fake_openai, client_for):
    from autokernel.search.llm import PromptTooLong
    fake_openai.script(error(400, message="This model's maximum context length is 4096 tokens"),
                       error(400, message="messages: unknown role 'tool'"))
    client, _, _ = client_for(fake_openai)
    with pytest.raises(PromptTooLong, match="maximum context length"):
        client.query(MESSAGES)
    with pytest.raises(UserError, match="unknown role"):  # any other 400 still is
        client.query(MESSAGES)
