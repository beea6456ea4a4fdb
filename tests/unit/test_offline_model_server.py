"""The offline model over real HTTP, through the real `anthropic` SDK."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anthropic
import h11
import httpx2
import pytest
import uvloop

from actors.offline_model import OfflineServer, ScenarioError, start_server

pytestmark = pytest.mark.timeout(20)

TOOLS = [
    {"name": n, "description": n, "input_schema": {"type": "object"}}
    for n in ("shell", "read_file", "list_dir", "write_file")
]
REPO = Path(__file__).resolve().parents[2]

Test = Callable[[anthropic.AsyncAnthropic, OfflineServer], Awaitable[None]]


def serve(test: Test, scenario: Any = None, **server_kw: Any) -> None:
    """Run `test` against a fresh server and client; fail if anything is left open."""

    async def main() -> None:
        server = await start_server(scenario=scenario, **server_kw)
        client = anthropic.AsyncAnthropic(
            base_url=f"http://127.0.0.1:{server.port}", api_key="offline", max_retries=0
        )
        try:
            await test(client, server)
        finally:
            await client.close()
            await server.aclose()
        assert server.statistics().connections_open == 0
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())


def ask(prompt: str, **extra: Any) -> dict[str, Any]:
    """Request arguments for one user prompt."""
    return {
        "model": "offline",
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": prompt}],
        "tools": TOOLS,
        **extra,
    }


async def raw_events(client: anthropic.AsyncAnthropic, **kwargs: Any) -> list[str]:
    """The SSE event names exactly as sent (the SDK's stream hides pings)."""
    names = []
    async with client.messages.with_streaming_response.create(stream=True, **kwargs) as resp:
        async for line in resp.iter_lines():
            if line.startswith("event: "):
                names.append(line.removeprefix("event: "))
    return names


def test_streaming_text() -> None:
    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        async with client.messages.stream(**ask("hello")) as stream:
            pieces = [text async for text in stream.text_stream]
            final = await stream.get_final_message()
        assert len(pieces) > 5  # word-sized deltas, not one lump
        assert final.content[0].type == "text" and final.content[0].text == "".join(pieces)
        assert final.stop_reason == "end_turn" and final.id.startswith("msg_")
        assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0

    serve(test)


def test_exact_event_sequence_with_ping() -> None:
    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        names = await raw_events(client, **ask("run `date`"))
        assert names[:3] == ["message_start", "ping", "content_block_start"]
        assert names[-2:] == ["message_delta", "message_stop"]
        assert "content_block_delta" in names and names.count("content_block_stop") == 2

    serve(test)


def test_several_tool_uses_reassembled_by_the_sdk() -> None:
    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        content = 'h\u00e9 "q" \\ x\nnext'  # quotes, a backslash, non-ASCII, a newline
        prompt = f"list /tmp and read README.md, then write `{content}` to n.txt"
        partials = 0
        async with client.messages.stream(**ask(prompt)) as stream:
            async for event in stream:
                partials += event.type == "input_json"
            final = await stream.get_final_message()
        uses = [b for b in final.content if b.type == "tool_use"]
        assert final.stop_reason == "tool_use"
        assert [(u.name, u.input) for u in uses] == [
            ("list_dir", {"path": "/tmp"}),
            ("read_file", {"path": "README.md"}),
            ("write_file", {"path": "n.txt", "content": content}),
        ]
        assert partials >= 3 * len(uses)  # each input arrived in several pieces
        assert len({u.id for u in uses}) == 3 and all(u.id.startswith("toolu_") for u in uses)

    serve(test)


def test_non_streaming_and_tool_result_round_trip() -> None:
    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        first = await client.messages.create(**ask("run `uname -a`"))
        assert first.type == "message" and first.role == "assistant" and first.model == "offline"
        assert first.stop_reason == "tool_use" and first.stop_sequence is None
        use = next(b for b in first.content if b.type == "tool_use")
        history = [
            {"role": "user", "content": "run `uname -a`"},
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in first.content],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": use.id,
                        "content": "Linux box 6.1 x86_64",
                    }
                ],
            },
        ]
        second = await client.messages.create(
            model="offline", max_tokens=1000, messages=history, tools=TOOLS
        )
        assert second.stop_reason == "end_turn"
        assert second.content[0].type == "text"
        assert "`uname -a` printed:" in second.content[0].text
        assert "Linux box 6.1" in second.content[0].text
        # both requests went over one kept-alive connection
        assert server.statistics().connections_total == 1

    serve(test)


def test_thinking_block_streams_first() -> None:
    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        kinds = []
        thinking = {"type": "enabled", "budget_tokens": 1024}
        async with client.messages.stream(**ask("run `date`", thinking=thinking)) as stream:
            async for event in stream:
                if event.type in ("thinking", "signature", "text"):
                    kinds.append(event.type)
            final = await stream.get_final_message()
        assert kinds.index("signature") < kinds.index("text")
        assert final.content[0].type == "thinking" and final.content[0].signature
        assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]

    serve(test)


def test_max_tokens_stop() -> None:
    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        message = await client.messages.create(**{**ask("hello"), "max_tokens": 3})
        assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3

    serve(test)


def test_many_concurrent_streams() -> None:
    async def one(client: anthropic.AsyncAnthropic, i: int) -> str:
        async with client.messages.stream(**ask(f"run `echo {i}`")) as stream:
            final = await stream.get_final_message()
        return next(b.input["command"] for b in final.content if b.type == "tool_use")

    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        got = await asyncio.gather(*(one(client, i) for i in range(20)))
        assert got == [f"echo {i}" for i in range(20)]

    serve(test, delta_delay_s=0.001)


# --- scripted faults ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "error_class", "header"),
    [
        ({"status": 529}, anthropic.OverloadedError, None),
        ({"status": 429, "headers": {"retry-after": "1"}}, anthropic.RateLimitError, "retry-after"),
        (
            {"status": 429, "headers": {"retry-after-ms": "250"}},
            anthropic.RateLimitError,
            "retry-after-ms",
        ),
        ({"status": 500}, anthropic.InternalServerError, None),
        ({"status": 400}, anthropic.BadRequestError, None),
        ({"status": 401}, anthropic.AuthenticationError, None),
    ],
)
def test_status_faults(fault: dict[str, Any], error_class: type, header: str | None) -> None:
    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        with pytest.raises(error_class) as caught:
            async with client.messages.stream(**ask("hello")) as stream:
                await stream.get_final_message()
        err = caught.value
        assert err.status_code == fault["status"]
        assert err.body["type"] == "error" and err.body["error"]["type"]
        if header:
            assert err.response.headers[header] == fault["headers"][header]
        # the scenario has run out: the next call gets the rules' answer
        assert (await client.messages.create(**ask("hello"))).stop_reason == "end_turn"

    serve(test, scenario=[{"fault": "status", **fault}])


def test_error_event_raises() -> None:
    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        with pytest.raises(anthropic.APIStatusError) as caught:
            async with client.messages.stream(**ask("hello")) as stream:
                await stream.get_final_message()
        assert caught.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]

    serve(test, scenario=[{"fault": "error_event", "after_events": 4}])


def test_drop_is_a_transport_error() -> None:
    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        # the SDK does not wrap errors raised while reading a stream's body
        with pytest.raises((httpx2.TransportError, anthropic.APIConnectionError)):
            async with client.messages.stream(**ask("hello")) as stream:
                await stream.get_final_message()
        with pytest.raises(anthropic.APIConnectionError):  # not streaming: no response at all
            await client.messages.create(**ask("hello"))
        assert (await client.messages.create(**ask("hello"))).stop_reason == "end_turn"

    serve(test, scenario=[{"fault": "drop", "after_events": 5}, {"fault": "drop"}])


def test_drop_after_every_event_still_lacks_the_final_chunk() -> None:
    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        with pytest.raises((httpx2.TransportError, anthropic.APIConnectionError)):
            await raw_events(client, **ask("hello"))

    serve(test, scenario=[{"fault": "drop", "after_events": 10_000}])


def test_truncate_leaves_stop_reason_none() -> None:
    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        async with client.messages.stream(**ask("hello")) as stream:
            final = await stream.get_final_message()
        assert final.stop_reason is None and final.content[0].type == "text"

    serve(test, scenario=[{"fault": "truncate"}])


def test_stall_then_continue_and_then_drop() -> None:
    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        names = await raw_events(client, **ask("hello"))
        assert names.count("ping") >= 2 and names[-1] == "message_stop"
        with pytest.raises((httpx2.TransportError, anthropic.APIConnectionError)):
            await raw_events(client, **ask("hello"))

    stall = {"fault": "stall", "seconds": 0.03, "ping_every_s": 0.01}
    serve(test, scenario=[stall, {**stall, "then": "drop"}])


def test_scripted_reply_per_session() -> None:
    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        for session in ("s1", "s2"):
            message = await client.messages.create(**ask("x", metadata={"user_id": session}))
            assert message.content[0].type == "text" and message.content[0].text == "scripted"
        again = await client.messages.create(**ask("hello", metadata={"user_id": "s1"}))
        assert again.content[0].type == "text" and again.content[0].text != "scripted"

    serve(test, scenario=[{"reply": "scripted"}])


# --- bad input ---------------------------------------------------------------------------


async def raw_http(port: int, data: bytes) -> tuple[int, dict[str, Any]]:
    """Send raw bytes, return the status and JSON body of the one response."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        conn = h11.Connection(h11.CLIENT)
        conn.send(
            h11.Request(method="POST", target="/", headers=[("host", "x")])
        )  # to read a reply
        status, body = 0, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return status, json.loads(body)
    finally:
        writer.close()
        await writer.wait_closed()


def test_bad_requests_get_errors_and_the_server_goes_on() -> None:
    async def test(client: anthropic.AsyncAnthropic, server: OfflineServer) -> None:
        body = b"{not json"
        head = f"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n"
        status, error = await raw_http(server.port, head.encode() + body)
        assert status == 400 and error["error"]["type"] == "invalid_request_error"
        status, error = await raw_http(server.port, b"GARBAGE\r\n\r\n")
        assert status == 400 and error["type"] == "error"
        with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
            await client.messages.create(**{**ask("x"), "max_tokens": 0})
        with pytest.raises(anthropic.NotFoundError) as missing:
            await client.get("/v1/models", cast_to=object)
        assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
        with pytest.raises(anthropic.APIStatusError) as wrong:
            await client.get("/v1/messages", cast_to=object)
        assert wrong.value.status_code == 405
        assert (await client.messages.create(**ask("hello"))).stop_reason == "end_turn"

    serve(test)


def test_close_while_streaming_leaves_nothing_behind() -> None:
    async def main() -> None:
        server = await start_server(scenario=[{"fault": "stall", "seconds": 60}])
        client = anthropic.AsyncAnthropic(
            base_url=f"http://127.0.0.1:{server.port}", api_key="offline", max_retries=0
        )
        try:
            async with client.messages.stream(**ask("hello")) as stream:
                async for event in stream:
                    if event.type == "content_block_start":  # now the server is stalled
                        await server.aclose()
                        break
        finally:
            await client.close()
            await server.aclose()
        assert server.statistics().connections_open == 0

    asyncio.run(main())


def test_clients_gone_mid_stream_are_abandoned_replies_on_uvloop() -> None:
    """The process runs on uvloop, whose transports raise RuntimeError when written
    after the peer is gone: still a client that hung up, not a server failure."""
    words = " ".join(f"w{i}" for i in range(400))
    clients = 30

    async def hang_up(port: int, after_s: float) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps({**ask("hello"), "stream": True}).encode()
        head = (f"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                f"\r\ncontent-length: {len(body)}\r\n\r\n")
        writer.write(head.encode() + body)
        await reader.readuntil(b"content_block_delta")  # mid-stream now
        await asyncio.sleep(after_s)  # hang up at various points of the server's writes
        writer.transport.abort()

    async def main() -> None:
        # one scripted turn per request: they all share the default session
        server = await start_server(scenario=[{"reply": words, "delay_s": 0.002}] * clients)
        try:
            await asyncio.gather(*(hang_up(server.port, (n % 5) * 0.003)
                                   for n in range(clients)))
            async with asyncio.timeout(5):
                while server.statistics().abandoned < clients:  # noqa: ASYNC110 (a counter)
                    await asyncio.sleep(0.01)
            assert (await raw_http_ok(server.port)) == 200  # and it goes on serving
        finally:
            await server.aclose()
        assert server.statistics().connections_open == 0

    uvloop.run(main())


async def raw_http_ok(port: int) -> int:
    """The status of one plain request."""
    client = anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{port}", api_key="offline",
                                      max_retries=0)
    try:
        reply = await client.messages.with_raw_response.create(**ask("hello"))
        return reply.status_code
    finally:
        await client.close()


# --- the process -------------------------------------------------------------------------


def test_process_serves_until_sigterm(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "actors.offline_model", "--port-file", str(port_file)],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        assert "listening on" in proc.stderr.readline()  # logged after the port file is written
        port = int(port_file.read_text())
        with anthropic.Anthropic(
            base_url=f"http://127.0.0.1:{port}", api_key="offline", max_retries=0
        ) as client:
            reply = client.messages.create(**ask("run `date`"))
        assert reply.stop_reason == "tool_use"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def test_bad_scenario_fails_at_start(tmp_path: Path) -> None:
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps([{"fault": "status", "status": "oops"}]))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "actors.offline_model",
            "--port-file",
            str(tmp_path / "p"),
            "--scenario",
            str(scenario),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=10,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 2
    assert "turns[0].status" in done.stderr and not (tmp_path / "p").exists()
    with pytest.raises(ScenarioError):
        asyncio.run(start_server(scenario=str(scenario)))
