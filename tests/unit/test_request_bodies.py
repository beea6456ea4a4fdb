"""A streamed request's body (`llm_caller.bodies`): the request as built, each history
message encoded once across calls; and what a server receives through the real SDK
(`AnthropicBackend.stream`) is that request."""

from __future__ import annotations

import asyncio
import http.server
import json
from typing import Any

import pytest
from httpkit import serving

from actors.llm_caller.backend import AnthropicBackend
from actors.llm_caller.bodies import BodyCache
from actors.llm_caller.stalls import StreamBounds


def _turn(i: int, text: str = "x" * 100) -> list[dict[str, Any]]:
    use = {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file", "input": {"path": "/a"}}
    result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": text}
    return [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]


def _request(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 100, "temperature": 0.5,
            "system": [{"type": "text", "text": "é, \u2028 and \"quotes\""}],
            "messages": messages, "metadata": {"user_id": "s1"}}


def test_a_body_is_the_request_and_a_grown_history_encodes_only_its_new_messages():
    cache = BodyCache()
    history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for i in range(5):
        history = [*history, *_turn(i)]  # (a new list, the same message objects)
        request = _request(history)
        before = cache.encoded
        assert json.loads(cache.body(request, stream=True)) == {**request, "stream": True}
        assert cache.encoded - before == (3 if i == 0 else 2)
    assert json.loads(cache.body({"model": "m"}, stream=True)) == {"model": "m", "stream": True}
    assert json.loads(cache.body({"messages": history})) == {"messages": history}


def test_the_cache_is_bounded_and_a_message_evicted_is_encoded_again():
    cache = BodyCache(max_bytes=2_000)
    history = [m for i in range(10) for m in _turn(i, "y" * 300)]
    request = _request(history)
    assert json.loads(cache.body(request)) == request
    assert cache._bytes <= 2_000 and 0 < len(cache) < len(history)
    before = cache.encoded
    assert json.loads(cache.body(request)) == request
    assert cache.encoded > before  # (the oldest were gone)


def test_what_json_cannot_carry_is_refused_as_the_sdk_would():
    with pytest.raises(TypeError):
        BodyCache().body({"messages": [{"role": "user", "content": b"bytes"}]})


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A Messages API that records each request's body and streams a short reply."""

    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        size = int(self.headers["Content-Length"])
        _Recorder.bodies.append(json.loads(self.rfile.read(size)))
        events = [
            ("message_start", {"type": "message_start", "message": {
                "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 3, "output_tokens": 0}}}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": "hi"}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {
                "stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 1}}),
            ("message_stop", {"type": "message_stop"}),
        ]
        data = "".join(f"event: {k}\ndata: {json.dumps(v)}\n\n" for k, v in events).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_server_receives_the_request_as_built_through_the_sdk():
    _Recorder.bodies = []
    history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]

    async def main(port: int) -> list[str]:
        backend = AnthropicBackend(api_key="k", base_url=f"http://127.0.0.1:{port}")
        said: list[str] = []
        try:
            for i in range(3):
                history.extend(_turn(i))
                reply = await backend.stream(_request(list(history)),
                                             lambda kind, text: said.append(text),
                                             bounds=StreamBounds(), timeout_s=30)
                assert reply["content"] == [{"type": "text", "text": "hi"}]
                assert reply["stop_reason"] == "end_turn"
            assert backend.bodies.encoded == 7  # (each message once, over three calls)
        finally:
            await backend.aclose()
        return said

    with serving(_Recorder) as port:
        said = asyncio.run(main(port))
    assert said == ["hi", "hi", "hi"]
    assert [len(b["messages"]) for b in _Recorder.bodies] == [3, 5, 7]
    assert _Recorder.bodies[-1] == {**_request(history), "stream": True}
