"""Model backends: the `anthropic` SDK, and the shape every backend shares.

A backend turns one Messages-API request body into the final assistant
message as a plain dict (`role`, `content` blocks in request form,
`stop_reason`, `model`, `usage`), streaming text and thinking deltas to a
callback on the way.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from actors import nossl
from actors.llm_caller import stalls
from actors.llm_caller.bodies import BodyCache
from actors.llm_caller.failures import StreamIncomplete, StreamMalformed
from actors.llm_caller.stalls import StallWatch, StreamBounds
from actors.usage import API_FIELDS

if TYPE_CHECKING:
    import anthropic

OnDelta = Callable[[str, str], None]

# What the SDK raises on a stream the API never sends: `json.JSONDecodeError`
# (a ValueError) for bad JSON, IndexError for a delta of a block never started,
# RuntimeError for an event before `message_start`, pydantic's errors (ValueErrors).
_MALFORMED = (ValueError, IndexError, KeyError, TypeError, RuntimeError)


class ModelBackend(Protocol):
    """What the llm caller needs of a model."""

    async def stream(
        self, request: dict[str, Any], on_delta: OnDelta, *, bounds: StreamBounds,
        timeout_s: float,
    ) -> dict[str, Any]:
        """One streaming call; raises on failure, `StreamStalled` when a bound passes."""
        ...

    async def create(self, request: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        """One non-streaming call."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...

    def forget(self, messages: list[Any]) -> None:
        """`messages` will not be sent again (their session's history was dropped): let go
        of whatever is kept of them."""
        ...


def split_known(request: dict[str, Any], method: Any) -> dict[str, Any]:
    """`request` as keyword arguments of an SDK method: fields the SDK version at hand
    does not declare (this one has no `temperature`) travel in `extra_body`, so the
    server still receives the request exactly as built."""
    known = _known_params(method)
    kwargs = {k: v for k, v in request.items() if k in known}
    extra = {k: v for k, v in request.items() if k not in known}
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


def _known_params(method: Any) -> frozenset[str]:
    cached = _PARAMS.get(method.__name__)
    if cached is None:
        cached = _PARAMS[method.__name__] = frozenset(inspect.signature(method).parameters)
    return cached


_PARAMS: dict[str, frozenset[str]] = {}


def block_to_param(block: Any) -> dict[str, Any]:
    """An SDK content block as the dict a later request sends back."""
    kind = block.type
    if kind == "text":
        return {"type": "text", "text": block.text}
    if kind == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    if kind == "thinking":
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    if kind == "redacted_thinking":
        return {"type": "redacted_thinking", "data": block.data}
    dumped: dict[str, Any] = block.model_dump(mode="json", exclude_none=True)
    return dumped


def usage_to_dict(usage: Any) -> dict[str, int]:
    """The SDK's `Usage` as the four token counts (a field the server left out or
    sent as null counts 0). When streaming, the SDK has already folded
    `message_delta`'s cumulative counts into the snapshot's usage."""
    return {name: getattr(usage, name, 0) or 0 for name in API_FIELDS}


def message_to_dict(message: Any) -> dict[str, Any]:
    """An SDK `Message` as the plain dict carried in `LlmResult`."""
    return {
        "role": "assistant",
        "content": [block_to_param(b) for b in message.content],
        "stop_reason": message.stop_reason,
        "model": message.model,
        "usage": usage_to_dict(message.usage),
    }


def checked(message: dict[str, Any]) -> dict[str, Any]:
    """`message`, or `StreamMalformed` if it is not what the API sends: a `tool_use`
    whose input is not an object would enter the history and fail every later call."""
    for block in message["content"]:
        if block.get("type") == "tool_use" and not isinstance(block.get("input"), dict):
            kind = type(block.get("input")).__name__
            raise StreamMalformed(f"tool_use {block.get('name')!r} input is a {kind}, "
                                  "not an object")
    return message


def _short(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text if len(text) <= limit else text[:limit] + "..."


async def import_aside(name: str) -> Any:
    """`importlib.import_module(name)` in a daemon thread of its own: the loop keeps
    serving meanwhile, and a stop does not wait for it. (On the loop's default executor,
    `asyncio.run` joins the import at exit: an llm caller told to stop, its host killed,
    during its SDK's import went on seconds after the other actors, tens of seconds
    with every core busy.)"""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(module: Any, error: BaseException | None) -> None:
        if done.done():  # (its waiter was cancelled)
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(module)

    def work() -> None:
        module, error = None, None
        try:
            module = importlib.import_module(name)
        except BaseException as exc:  # handed to the waiter, raised there
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, module, error)

    threading.Thread(target=work, name=f"import {name}", daemon=True).start()
    return await done


class AnthropicBackend:
    """The real SDK, pointed at the API or any server that speaks it (`base_url`).

    The SDK's own retries are off: the llm caller's retry policy owns them. The SDK
    is imported off the event loop at the first call (or `preload()`), not at start-up:
    it costs ~1-3 s and ~60 MiB resident on these machines, which a caller would
    otherwise spend before it could say it is ready, and hold while idle.
    """

    def __init__(self, api_key: str | None = None, base_url: str | None = None) -> None:
        # (The endpoint is chosen once, by `actors.settings.model_choice`.)
        self.api_key = api_key or "none"
        self.base_url = base_url or None
        self._client: anthropic.AsyncAnthropic | None = None
        #: Streamed requests' bodies, each history message encoded once.
        self.bodies = BodyCache()

    async def preload(self) -> None:
        """Import the SDK and build the client now (in a thread: the loop keeps serving)."""
        await self.sdk_client()

    async def sdk_client(self) -> anthropic.AsyncAnthropic:
        """The SDK client, importing the SDK on first use."""
        if self._client is None:
            nossl.let_in()  # (the SDK's TLS: `__main__` kept ssl out until now)
            sdk = await import_aside("anthropic")
            if self._client is None:  # another call may have built it meanwhile
                http = sdk.DefaultAsyncHttpxClient(event_hooks=stalls.watched_client_hooks())
                self._client = sdk.AsyncAnthropic(
                    api_key=self.api_key, base_url=self.base_url, max_retries=0,
                    http_client=http,
                )
        return self._client

    async def stream(
        self, request: dict[str, Any], on_delta: OnDelta, *, bounds: StreamBounds,
        timeout_s: float,
    ) -> dict[str, Any]:
        """Stream one reply; `StreamStalled` when a bound of `bounds` passes without
        progress (`actors.llm_caller.stalls`), `StreamMalformed` on a stream the API
        never sends."""
        client = await self.sdk_client()
        watch = StallWatch(bounds)
        token = stalls.CURRENT.set(watch)  # the client's response hook feeds `watch`
        try:
            async with watch.timeout, self._stream(client, request, timeout_s) as stream:
                stopped = False
                async for event in stream:
                    kind = event.type
                    block = getattr(event, "content_block", None)
                    watch.on_event(kind, getattr(block, "type", "") if block else "")
                    stopped = stopped or kind == "message_stop"
                    if kind == "text":
                        on_delta("text", event.text)
                    elif kind == "thinking":
                        on_delta("thinking", event.thinking)
                final = stream.current_message_snapshot
        except TimeoutError:
            if watch.timeout.expired():
                raise watch.stalled() from None
            raise
        except _MALFORMED as exc:
            # The SDK parsing what the server sent: bad JSON, an event out of order,
            # a delta for a block never started. Not a bug of ours: the attempt is void.
            what = ("an event for a content block never started"
                    if isinstance(exc, IndexError) else type(exc).__name__)
            raise StreamMalformed(f"{what}: {_short(exc)}") from exc
        finally:
            stalls.CURRENT.reset(token)
        if not stopped or final.stop_reason is None:  # truncated, even after message_delta
            raise StreamIncomplete()
        return checked(message_to_dict(final))

    def _stream(self, client: anthropic.AsyncAnthropic, request: dict[str, Any],
                timeout_s: float) -> Any:
        """The SDK's `messages.stream` of `request`, its body made by `bodies` (each
        history message encoded once); a request JSON cannot carry goes to
        `messages.stream` itself, which says what is wrong as it always did."""
        try:
            body = self.bodies.body(request, stream=True)
        except (TypeError, ValueError):
            return client.messages.stream(**split_known(request, client.messages.stream),
                                          timeout=timeout_s)
        import anthropic as sdk  # noqa: PLC0415  (imported by now: `client` is its)
        from anthropic.lib.streaming import AsyncMessageStreamManager  # noqa: PLC0415
        return AsyncMessageStreamManager(client.post(
            "/v1/messages", cast_to=sdk.types.Message, content=body,
            options={"timeout": timeout_s}, stream=True,
            stream_cls=sdk.AsyncStream[sdk.types.RawMessageStreamEvent],
        ))

    async def create(self, request: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        """One non-streaming call (the fallback when a stream dies near the deadline)."""
        client = await self.sdk_client()
        kwargs = split_known(request, client.messages.create)
        message = await client.messages.create(**kwargs, timeout=timeout_s)
        return checked(message_to_dict(message))

    async def count_tokens(self, request: dict[str, Any], *, timeout_s: float) -> int:
        """The request's input tokens as the server counts them (`count_tokens`)."""
        client = await self.sdk_client()
        kwargs = split_known(request, client.messages.count_tokens)
        counted = await client.messages.count_tokens(**kwargs, timeout=timeout_s)
        return int(counted.input_tokens)

    def forget(self, messages: list[Any]) -> None:
        """Drop the encoded JSON of `messages` (`BodyCache.drop`)."""
        self.bodies.drop(messages)

    async def aclose(self) -> None:
        """Close the SDK's HTTP client (if one was ever built)."""
        if self._client is not None:
            await self._client.close()
