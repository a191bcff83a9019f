"""A scripted LLM endpoint on localhost for the LLM-agent tests: a real HTTP
server speaking the Anthropic Messages API (``POST /v1/messages``) and the
OpenAI Chat Completions API (``POST /v1/chat/completions``), so the official
SDKs run unmodified against it. Replies are scripted per answer schema (the
forced tool's name, or the json_schema's name): a valid JSON answer, raw text
(malformed), an HTTP status (429, 500), or a delay (a timeout). Every request
is kept (``requests``) for the tests to inspect. No network beyond 127.0.0.1.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ScriptedLLM", "ok", "text", "status", "slow"]


def ok(obj: Any, tokens: tuple[int, int] = (100, 20)) -> dict[str, Any]:
    return {"kind": "json", "obj": obj, "tokens": tokens}


def text(raw: str, tokens: tuple[int, int] = (100, 20)) -> dict[str, Any]:
    return {"kind": "text", "raw": raw, "tokens": tokens}


def status(code: int, retry_after_ms: int | None = 10) -> dict[str, Any]:
    return {"kind": "status", "code": code, "retry_after_ms": retry_after_ms}


def slow(seconds: float, then: dict[str, Any]) -> dict[str, Any]:
    return {**then, "delay": seconds}


class ScriptedLLM:
    """``with ScriptedLLM() as s: s.script("ConfigProposal", ok({...}), text("{bad"))``; ``s.url``."""

    def __init__(self) -> None:
        self.queues: dict[str, deque[dict[str, Any]]] = defaultdict(deque)
        self.requests: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_a: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                owner.requests.append({"path": self.path, "body": body, "headers": dict(self.headers)})
                anthropic = self.path.endswith("/messages")
                name = (body.get("tool_choice") or {}).get("name") if anthropic else \
                    ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
                q = owner.queues.get(str(name))
                if not q:
                    return self._send(500, {"error": {"type": "api_error", "message": f"script exhausted for {name}"}})
                step = q.popleft()
                if step["kind"] == "pick":  # the answer for whichever request this is (by a needle in its body)
                    text = json.dumps(body)
                    step = next((v for k, v in step["by"].items() if json.dumps(k)[1:-1] in text), None)
                    if step is None:
                        return self._send(500, {"error": {"type": "api_error", "message": "no pick matched"}})
                if step.get("delay"):
                    time.sleep(step["delay"])
                if step["kind"] == "status":
                    extra = {"retry-after-ms": str(step["retry_after_ms"])} if step.get("retry_after_ms") else {}
                    kind = "rate_limit_error" if step["code"] == 429 else "api_error"
                    return self._send(step["code"], {"type": "error", "error": {"type": kind, "message": "scripted"}},
                                      extra)
                tin, tout = step["tokens"]
                raw = json.dumps(step["obj"]) if step["kind"] == "json" else step["raw"]
                if anthropic:
                    block = ({"type": "tool_use", "id": "toolu_1", "name": name, "input": step["obj"]}
                             if step["kind"] == "json" else {"type": "text", "text": raw})
                    return self._send(200, {"id": "msg_1", "type": "message", "role": "assistant",
                                            "model": body.get("model"), "content": [block],
                                            "stop_reason": "tool_use" if step["kind"] == "json" else "end_turn",
                                            "stop_sequence": None,
                                            "usage": {"input_tokens": tin, "output_tokens": tout}})
                return self._send(200, {"id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                                        "model": body.get("model"),
                                        "choices": [{"index": 0, "finish_reason": "stop",
                                                     "message": {"role": "assistant", "content": raw}}],
                                        "usage": {"prompt_tokens": tin, "completion_tokens": tout,
                                                  "total_tokens": tin + tout}})

            def _send(self, code: int, obj: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(obj).encode()
                try:
                    self.send_response(code)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def script(self, schema: str, *steps: dict[str, Any]) -> "ScriptedLLM":
        self.queues[schema].extend(steps)
        return self

    def left(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.queues.items() if v}

    def __enter__(self) -> "ScriptedLLM":
        self.thread.start()
        return self

    def __exit__(self, *_a: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
