"""A chat client for any OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, a gateway).

Retries are ours, not the SDK's, so every one is visible on stderr and testable: rate limits (429),
server errors (5xx), timeouts and connection errors back off exponentially with jitter, honouring
Retry-After. An outage never ends a run on its own: after a few minutes the client says the run is
paused and keeps trying, until the endpoint answers or the user stops the run. Errors a retry cannot
fix (401 bad key, 404 unknown model, 400 rejected request) become a UserError with a hint, except a
prompt refused for its length (PromptTooLong: the caller retries with a smaller one).

A reply cut off at the token limit (finish_reason "length") says so (`Reply.truncated`); a reasoning
model's `reasoning_content` is kept apart from the reply's text and never read as its answer;
`reasoning_effort` is sent where the server accepts it and dropped, once, where it does not.
"""
from __future__ import annotations

import os
import random
import re
import sys
import time
from dataclasses import dataclass
from typing import Callable

from autokernel.errors import UserError

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
RETRY_STATUSES = (408, 409, 429)  # plus every 5xx: the request may succeed when repeated
MAX_RETRY_AFTER_S = 600.0
# How servers word a prompt refused for its length (OpenAI, vLLM, llama.cpp, Ollama, gateways)
CONTEXT_LENGTH_WORDS = re.compile(r"context.length|context.window|maximum context|too many tokens|prompt is too long"
                                  r"|reduce the length|exceeds the (?:model's )?(?:max|context)|input is too long"
                                  r"|context_length_exceeded", re.I)


class PromptTooLong(Exception):
    """The server refused the prompt for its length (HTTP 400): a smaller one may fit."""


@dataclass
class Reply:
    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    seconds: float  # wall time of the successful request, retries and waits excluded
    truncated: bool = False  # finish_reason "length": cut off at the token limit
    reasoning_chars: int = 0  # the length of a reasoning model's reasoning_content (never parsed)
    model: str = ""


@dataclass
class RetryPolicy:
    first_delay_s: float = 2.0
    max_delay_s: float = 60.0
    # after this long without an answer the run is reported as paused (it keeps retrying)
    pause_after_s: float = 180.0


def api_key_from_env(api_key_env: str = DEFAULT_API_KEY_ENV) -> str | None:
    value = os.environ.get(api_key_env, "").strip()
    return value or None


def choose_agent(agent: str | None, api_key_env: str = DEFAULT_API_KEY_ENV) -> str:
    """"llm" or "tune" as asked; when not asked, the LLM exactly when its API key is configured."""
    if agent is None:
        return "llm" if api_key_from_env(api_key_env) else "tune"
    if agent not in ("llm", "tune"):
        from autokernel.errors import UsageError
        raise UsageError(f"unknown agent {agent!r}", "use --agent llm or --agent tune")
    return agent


def _stderr_line(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _retry_after_s(error: Exception) -> float | None:
    """The server's own wait, from Retry-After (seconds) or retry-after-ms, if it sent one."""
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None) or {}
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value:
            try:
                return max(float(value) * scale, 0.0)
            except ValueError:
                return None  # an HTTP date: fall back to our own backoff
    return None


def _server_message(error: Exception) -> str:
    body = getattr(error, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if body.get("message"):
            return str(body["message"])
    return str(getattr(error, "message", "") or error)


class LLMClient:
    """`query(messages) -> Reply` against one model at one endpoint."""

    def __init__(self, model: str, *, base_url: str | None = None,
                 api_key_env: str = DEFAULT_API_KEY_ENV, timeout_s: float = 600.0,
                 temperature: float | None = None, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] = _stderr_line, seed: int | None = None,
                 max_tokens: int | None = None, reasoning_effort: str | None = None):
        self.model = model
        self.max_tokens, self.reasoning_effort = max_tokens, reasoning_effort
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.temperature = temperature
        self.retry = retry or RetryPolicy()
        self._sleep, self._clock, self._log = sleep, clock, log
        self._rng = random.Random(seed)
        self.waited_s = 0.0  # total time spent backing off: the run was paused for this long
        self._client = None

    # ------------------------------------------------------------------ setup
    def _where(self) -> str:
        return self.base_url or "the OpenAI API"

    def _sdk(self):
        if self._client is None:
            key = api_key_from_env(self.api_key_env)
            if key is None:
                raise UserError(f"no API key: the environment variable {self.api_key_env} is not set",
                                f"export {self.api_key_env}=<your key> (or --api-key-env NAME for "
                                "another variable), or use --agent tune to search without an LLM")
            import openai  # the SDK is slow to import: only when an LLM is actually used
            # max_retries=0: our own loop retries, visibly, with a clock tests can replace
            self._client = openai.OpenAI(api_key=key, base_url=self.base_url, max_retries=0,
                                         timeout=self.timeout_s)
        return self._client

    def check(self) -> None:
        """Fail fast at startup: a missing key or an endpoint that does not answer is a UserError.
        An endpoint that answers at all (even 404 for /models, as some gateways do) is fine."""
        import openai
        client = self._sdk()
        try:
            client.models.list()
        except (openai.APIConnectionError, openai.APITimeoutError) as e:
            raise UserError(f"cannot reach the LLM endpoint at {self._where()}: {e}",
                            "check --base-url (OpenAI-compatible servers usually end in /v1) "
                            "and that the server is running") from None
        except openai.APIStatusError as e:
            if e.status_code in (401, 403):
                raise self._fatal(e) from None

    # ------------------------------------------------------------------ querying
    def query(self, messages: list[dict]) -> Reply:
        """One chat completion. Retries transient failures forever (with backoff); raises UserError
        for failures a retry cannot fix."""
        import openai
        client = self._sdk()
        failing_since, attempt = None, 0
        while True:
            start = self._clock()
            try:
                response = client.chat.completions.create(model=self.model, messages=messages, **self._options())
                return self._reply(response, self._clock() - start)
            except (openai.APIConnectionError, openai.APITimeoutError, openai.APIStatusError) as e:
                if getattr(e, "status_code", None) == 400:
                    message = _server_message(e)
                    if CONTEXT_LENGTH_WORDS.search(message):
                        raise PromptTooLong(message) from None
                    if self.reasoning_effort and "reasoning" in message.lower():
                        self._log(f"LLM {self._where()}: {self.model} does not take reasoning_effort "
                                  f"({message[:160]}); asking without it")
                        self.reasoning_effort = None
                        continue
                if not self._retryable(e):
                    raise self._fatal(e) from None
                failing_since = start if failing_since is None else failing_since
                attempt += 1
                self._back_off(e, attempt, self._clock() - failing_since)

    def _options(self) -> dict:
        kwargs: dict = {} if self.temperature is None else {"temperature": self.temperature}
        if self.max_tokens:
            kwargs["max_tokens"] = self.max_tokens
        if self.reasoning_effort:
            kwargs["reasoning_effort"] = self.reasoning_effort
        return kwargs

    def _reply(self, response, seconds: float) -> Reply:
        text, truncated, reasoning = "", False, ""
        if response.choices:
            choice = response.choices[0]
            # only `content` is the answer: a reasoning model's thinking (reasoning_content, an
            # extra field of the message) may hold code it then rejected
            text = choice.message.content or ""
            truncated = choice.finish_reason == "length"
            reasoning = getattr(choice.message, "reasoning_content", None) or ""
        usage = getattr(response, "usage", None)
        return Reply(text=text, prompt_tokens=getattr(usage, "prompt_tokens", None),
                     completion_tokens=getattr(usage, "completion_tokens", None), seconds=seconds,
                     truncated=truncated, reasoning_chars=len(reasoning), model=self.model)

    @staticmethod
    def _retryable(error: Exception) -> bool:
        status = getattr(error, "status_code", None)
        return status is None or status in RETRY_STATUSES or status >= 500

    def _back_off(self, error: Exception, attempt: int, failing_s: float) -> None:
        backoff_s = min(self.retry.max_delay_s, self.retry.first_delay_s * 2 ** (attempt - 1))
        # full jitter on the upper half: many workers hitting one endpoint do not retry in step
        delay_s = backoff_s * (0.5 + 0.5 * self._rng.random())
        server_s = _retry_after_s(error)
        if server_s is not None:  # the server knows best, within reason
            delay_s = max(delay_s, min(server_s, MAX_RETRY_AFTER_S))
        status = getattr(error, "status_code", None)
        what = f"HTTP {status}" if status else type(error).__name__
        paused = failing_s >= self.retry.pause_after_s
        self._log(f"LLM {self._where()}: {what} ({_server_message(error)[:200]}); "
                  f"retry {attempt} in {delay_s:.1f}s"
                  + (f"; run paused, endpoint failing for {failing_s / 60:.1f} min" if paused else ""))
        self.waited_s += delay_s
        self._sleep(delay_s)

    def _fatal(self, error: Exception) -> UserError:
        status = getattr(error, "status_code", None)
        message = f"the LLM endpoint {self._where()} answered HTTP {status}: {_server_message(error)}"
        hints = {
            401: f"the key in {self.api_key_env} was refused: set a valid key for this endpoint",
            403: f"the key in {self.api_key_env} may not use this model or endpoint",
            404: f"check the model name (--llm {self.model}) and --base-url",
            400: "the server rejected the request: check that the model accepts chat messages "
                 "of this length",
        }
        return UserError(message, hints.get(status, "check --llm, --base-url and --api-key-env"))
