"""A real OpenAI-compatible HTTP server on 127.0.0.1 for tests: scripted replies, in order.

Each POST /v1/chat/completions takes the next item of the script: a text reply (optionally cut off at
the token limit, finish_reason "length", or with a reasoning model's `reasoning_content` beside it),
an HTTP error (429 with Retry-After, 500s, a 400 refusing the prompt's length...) or a delay before
either. Every request body is recorded so tests can
assert on the prompts, and every GET's path. GET /v1/models answers with the configured model. When the script runs out
the server answers 400, which the client does not retry: a test that asks for more replies than it
scripted fails at once instead of retrying forever.

    def test_x(fake_openai):
        fake_openai.script(reply("hello"), error(429, retry_after=2), reply("again"))
        client = LLMClient("fake-model", base_url=fake_openai.base_url, ...)
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

MODEL = "fake-model"
API_KEY = "sk-test-fake-key"


@dataclass
class Scripted:
    status: int = 200
    text: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    message: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str = "stop"
    reasoning_content: str | None = None


def reply(text: str, *, prompt_tokens: int | None = None, completion_tokens: int | None = None,
          delay_s: float = 0.0, finish_reason: str = "stop", reasoning_content: str | None = None) -> Scripted:
    return Scripted(text=text, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                    delay_s=delay_s, finish_reason=finish_reason, reasoning_content=reasoning_content)


def error(status: int, *, retry_after: float | None = None, message: str = "",
          delay_s: float = 0.0) -> Scripted:
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
    return Scripted(status=status, headers=headers, delay_s=delay_s,
                    message=message or f"scripted error {status}")


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a client that timed out and hung up (a scripted delay) is expected, not news


class FakeOpenAI:
    """The server, its script and the requests it received."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._script: list[Scripted] = []
        self.requests: list[dict] = []  # JSON bodies of chat-completions requests, in order
        self.auth_headers: list[str] = []
        self.gets: list[str] = []  # the path of every GET
        self._server = _QuietServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def script(self, *items: Scripted | str) -> None:
        with self._lock:
            self._script.extend(reply(i) if isinstance(i, str) else i for i in items)

    @property
    def remaining(self) -> int:
        return len(self._script)

    def prompts(self) -> list[str]:
        """The text of every message of every request, one string per request."""
        return ["\n".join(m.get("content") or "" for m in body.get("messages", []))
                for body in self.requests]

    def next_item(self, body: dict, auth: str) -> Scripted | None:
        with self._lock:
            self.requests.append(body)
            self.auth_headers.append(auth)
            return self._script.pop(0) if self._script else None

    def start(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _completion(body: dict, item: Scripted) -> dict:
    prompt_chars = sum(len(m.get("content") or "") for m in body.get("messages", []))
    prompt_tokens = item.prompt_tokens if item.prompt_tokens is not None else prompt_chars // 4
    completion_tokens = item.completion_tokens if item.completion_tokens is not None else len(item.text) // 4
    message = {"role": "assistant", "content": item.text}
    if item.reasoning_content is not None:  # as vLLM and DeepSeek send a reasoning model's thinking
        message["reasoning_content"] = item.reasoning_content
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model", MODEL),
        "choices": [{"index": 0, "finish_reason": item.finish_reason, "message": message}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def _handler_for(fake: FakeOpenAI):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep test output clean
            pass

        def _send(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            fake.gets.append(self.path)
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model",
                                                              "created": 0, "owned_by": "test"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            item = fake.next_item(body, self.headers.get("Authorization", ""))
            if item is None:
                self._send(400, {"error": {"message": "fake server: script exhausted",
                                           "type": "invalid_request_error"}})
                return
            if item.delay_s:
                time.sleep(item.delay_s)
            if item.status != 200:
                self._send(item.status, {"error": {"message": item.message, "type": "scripted"}},
                           item.headers)
                return
            self._send(200, _completion(body, item), item.headers)

    return Handler


@pytest.fixture
def fake_openai():
    server = FakeOpenAI().start()
    try:
        yield server
    finally:
        server.stop()
