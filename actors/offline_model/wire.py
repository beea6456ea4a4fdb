"""The Messages API's shapes: requests checked, replies as JSON Messages and as SSE events.

Pure functions, no I/O. The event sequence is the real API's:

    message_start, ping,
    (content_block_start, content_block_delta*, content_block_stop) per block,
    message_delta (stop_reason, usage), message_stop

Text and thinking are cut into word-sized deltas and tool input JSON into a
few `partial_json` pieces, so a client sees a stream, not one lump.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Stop reasons the API defines (a scripted reply may use any of them).
STOP_REASONS = frozenset(
    {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"}
)

#: The API's error `type` for each HTTP status; other 4xx/5xx fall back below.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}

_WORDISH = re.compile(r"\s*\S+\s*|\s+")


@dataclass(frozen=True)
class Reply:
    """What the model says: content blocks in response form, and why it stopped."""

    content: tuple[dict[str, Any], ...]
    stop_reason: str | None
    output_tokens: int


class InvalidRequest(ValueError):
    """A request body the API would refuse with 400 `invalid_request_error`."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def error_type_for(status: int) -> str:
    """The API's error `type` for an HTTP status."""
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def error_body(error_type: str, message: str, request_id: str | None = None) -> dict[str, Any]:
    """The API's error JSON: `{"type": "error", "error": {"type", "message"}}`."""
    body: dict[str, Any] = {"type": "error", "error": {"type": error_type, "message": message}}
    if request_id is not None:
        body["request_id"] = request_id
    return body


def new_message_id() -> str:
    """A fresh `msg_...` id."""
    return "msg_" + os.urandom(12).hex()


def new_request_id() -> str:
    """A fresh `req_...` id (the `request-id` header the SDK exposes)."""
    return "req_" + os.urandom(12).hex()


def count_tokens(text: str) -> int:
    """The offline model's token count: one token per word."""
    return len(text.split())


def prompt_tokens(text: str) -> int:
    """The offline model's count of input: a token per four characters (of a block's
    JSON), about what the API counts for English and code."""
    return (len(text) + 3) // 4


#: What the API counts for an image: about width x height / 750 tokens of the image
#: scaled to at most ~1.15 megapixels, so at most about 1,600 (never its base64's length).
IMAGE_TOKENS = 1_600


def without_images(value: Any) -> tuple[Any, int]:
    """`value` with each image block replaced by a bare `{"type": "image"}`, and how many
    there were: what is counted as text, and the images counted as `IMAGE_TOKENS`."""
    images = 0

    def strip(v: Any) -> Any:
        nonlocal images
        if isinstance(v, dict):
            if v.get("type") == "image":
                images += 1
                return {"type": "image"}
            return {k: strip(x) for k, x in v.items()}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return strip(value), images


def value_tokens(value: Any, *, sort_keys: bool = False) -> int:
    """The tokens of a part of a request (a block, the messages): its JSON's, an image
    counting `IMAGE_TOKENS`."""
    text, images = without_images(value)
    return prompt_tokens(json.dumps(text, sort_keys=sort_keys)) + images * IMAGE_TOKENS


def input_tokens(request: Mapping[str, Any]) -> int:
    """A rough input size: the system prompt, messages and tool definitions."""
    parts = [request.get("system"), request.get("messages"), request.get("tools")]
    return max(1, sum(value_tokens(p) for p in parts if p))


def prompt_too_long(tokens: int, window: int) -> str:
    """The API's message for a request over the model's context window."""
    return f"prompt is too long: {tokens} tokens > {window} maximum"


def validate_request(body: Any) -> dict[str, Any]:
    """The body as a request dict, or `InvalidRequest` naming the first problem."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest("model: field required (a non-empty string)")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise InvalidRequest("max_tokens: field required (an integer >= 1)")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: field required (a non-empty list)")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise InvalidRequest(f"messages.{i}: must be an object with role 'user' or 'assistant'")
        if not isinstance(message.get("content"), str | list):
            raise InvalidRequest(f"messages.{i}.content: must be a string or a list of blocks")
    for name in ("tools", "stop_sequences"):
        if name in body and not isinstance(body[name], list):
            raise InvalidRequest(f"{name}: must be a list")
    if "metadata" in body and not isinstance(body["metadata"], dict):
        raise InvalidRequest("metadata: must be an object")
    for i, tool in enumerate(body.get("tools") or ()):
        _check_tool(i, tool)
    return body


#: The API's typed tools this server knows, by type: the name each must have.
TYPED_TOOLS = {"memory_20250818": "memory"}


def _check_tool(i: int, tool: Any) -> None:
    """A tool definition as the API checks it: a custom tool (name, input_schema an
    object) or a typed one it knows (`{"type": "memory_20250818", "name": "memory"}`)."""
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise InvalidRequest(f"tools.{i}: must be an object with a name")
    kind = tool.get("type", "custom")
    if kind == "custom":
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise InvalidRequest(f"tools.{i}.input_schema: field required (an object schema)")
        return
    if kind not in TYPED_TOOLS:
        raise InvalidRequest(f"tools.{i}.type: unknown tool type {kind!r}")
    if tool["name"] != TYPED_TOOLS[kind]:
        raise InvalidRequest(f"tools.{i}.name: a {kind} tool is named "
                             f"{TYPED_TOOLS[kind]!r}, got {tool['name']!r}")
    extra = set(tool) - {"type", "name", "cache_control"}
    if extra:
        raise InvalidRequest(f"tools.{i}.{sorted(extra)[0]}: Extra inputs are not permitted")


def message_json(reply: Reply, *, model: str, message_id: str, in_tokens: int,
                 cache_write: int = 0, cache_read: int = 0) -> dict[str, Any]:
    """The non-streaming response: a complete Message object (`in_tokens`: input not
    written to nor read from the prompt cache, as the API counts it)."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [dict(block) for block in reply.content],
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": in_tokens, "output_tokens": reply.output_tokens,
                  "cache_creation_input_tokens": cache_write,
                  "cache_read_input_tokens": cache_read},
    }


def text_chunks(text: str) -> list[str]:
    """Word-sized pieces that join back to `text` exactly."""
    return _WORDISH.findall(text)


def json_chunks(data: str, pieces: int = 4) -> list[str]:
    """`data` cut into about `pieces` parts (the API sends tool input this way)."""
    if not data:
        return []
    size = max(1, math.ceil(len(data) / pieces))
    return [data[i : i + size] for i in range(0, len(data), size)]


def _block_start(block: Mapping[str, Any]) -> dict[str, Any]:
    """A block as `content_block_start` announces it: empty, filled by deltas."""
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": ""}
    if kind == "thinking":
        return {"type": "thinking", "thinking": "", "signature": ""}
    if kind == "tool_use":
        return {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
    return dict(block)  # e.g. redacted_thinking arrives whole


def _block_deltas(block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The deltas that fill one block."""
    kind = block.get("type")
    if kind == "text":
        return [{"type": "text_delta", "text": t} for t in text_chunks(block["text"])]
    if kind == "thinking":
        out = [{"type": "thinking_delta", "thinking": t} for t in text_chunks(block["thinking"])]
        return [*out, {"type": "signature_delta", "signature": block.get("signature", "")}]
    if kind == "tool_use":
        # ensure_ascii keeps every piece plain ASCII, so no piece splits a character.
        raw = json.dumps(block.get("input", {}))
        return [{"type": "input_json_delta", "partial_json": p} for p in json_chunks(raw)]
    return []


def stream_events(message: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The complete SSE event sequence for a Message, as (event name, data) pairs."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    # As the API: message_start has the input counts (and 1 output token so far),
    # message_delta the final output count.
    start["usage"] = {**message["usage"], "output_tokens": 1}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(message["content"]):
        events.append(
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": _block_start(block),
                },
            )
        )
        for delta in _block_deltas(block):
            events.append(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    usage = {"output_tokens": message["usage"]["output_tokens"]}
    events.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def encode_sse(name: str, data: Mapping[str, Any]) -> bytes:
    """One SSE event on the wire: `event:` and `data:` lines and a blank line."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
