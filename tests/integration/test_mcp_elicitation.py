"""MCP elicitation through the operators' loop (issue 30, item 7): a server's question
mid-call becomes `ELICITATION_REQUESTED` in the session, answered by `oploop answer`,
`Client.answer` or the gateway's API, said as `ELICITATION_ANSWERED`; the server gets
the answer. The tests' own server (its `book` tool asks a form) and the reference
`server-everything` (`trigger-elicitation-request`, a form of every field type), both
over stdio in the sandbox; a short `timeout_s` server whose question times out; a
question open while the supervisor is killed (SIGKILL) and restarted by the host (asked
again and answered; closed when its executor died too)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from everything import everything, serving
from homes import make_home
from hostkit import actor, assert_one_run, of_type, oploop, running_host, until
from mcpkit import PYTHON, TEST_SERVER, call, free_port, wait_tools

from actors.sandbox.workspaces import remove_home
from bus.client import Client
from bus.errors import RemoteError

SCRIPTS = {
    "book": call("mcp__test__book"),
    "short": call("mcp__short__book"),
    "everything": call("mcp__ev__trigger-elicitation-request"),
    "everything-http": call("mcp__evh__trigger-elicitation-request"),
}

OnAsk = Callable[[Client, str, dict[str, Any]], Awaitable[None]]


@pytest.fixture(scope="module")
def host():
    program = everything()
    with serving(program, free_port()) as url:
        yield from _host(program, url)


def _host(program: Path, url: str) -> Iterator[str]:
    home = make_home("opme-")
    tests = str(Path(TEST_SERVER).parent)
    server = (f"command = [{json.dumps(PYTHON)}, {json.dumps(TEST_SERVER)}, \"stdio\"]\n"
              "start_timeout_s = 90  # (importing the SDK on busy cores: a minute)")
    # What the test server did (its uid writes there; outside the home, which the
    # sandbox hides).
    marks = Path(tempfile.mkdtemp(prefix="opme-m-", dir="/tmp"))
    marks.chmod(0o777)
    Path(home, "marks.path").write_text(str(marks))
    Path(home, "oploop.toml").write_text(f"""
[mcp.test]
{server}
timeout_s = 60
env = {{ OPLOOP_TEST_MARKS = "{marks}" }}
[mcp.test.sandbox]
read_paths = ["{tests}"]
write_paths = ["{marks}"]

[mcp.short]                     # 2 s left for an answer (timeout_s less the margin)
{server}
timeout_s = 4
[mcp.short.sandbox]
read_paths = ["{tests}"]

[mcp.ev]
command = ["{program}", "stdio"]
timeout_s = 60

[mcp.evh]                       # the same, over streamable HTTP
url = "{url}"
timeout_s = 60
""")
    scenario = Path(tempfile.mkdtemp(prefix="opme-s-", dir="/tmp"), "scenario.json")
    scenario.write_text(json.dumps({"scripts": SCRIPTS}))
    try:
        with running_host(home, {"OPLOOP_OFFLINE_SCENARIO": str(scenario),
                                 "OPLOOP_HTTP_LISTEN": "127.0.0.1:0"}) as h:
            wait_tools(h, {"mcp__test__book", "mcp__short__book",
                           "mcp__ev__trigger-elicitation-request",
                           "mcp__evh__trigger-elicitation-request"})
            yield h
    finally:
        remove_home(Path(home))
        shutil.rmtree(marks, ignore_errors=True)
        scenario.unlink()
        scenario.parent.rmdir()


async def asked_run(home: str, prompt: str, on_ask: OnAsk | None) -> list[dict[str, Any]]:
    """A run whose questions `on_ask` answers (None: left to time out)."""
    async with Client.connect(Path(home)) as client:
        started = await client.start(prompt)
        events = []
        async for event in client.events(started.session, started.from_seq, stop_at="first"):
            events.append(event)
            if event["type"] == "ELICITATION_REQUESTED" and on_ask is not None:
                await on_ask(client, started.session, event["data"])
    assert_one_run(events, started.from_seq)
    return events


def output(events: list[dict[str, Any]]) -> str:
    (end,) = of_type(events, "TOOL_END")
    return end["data"]["output"]


def test_a_question_is_answered_with_oploop_answer_and_reaches_the_server(host):
    asked: list[dict[str, Any]] = []

    async def answer(client: Client, session: str, data: dict[str, Any]) -> None:
        asked.append(data)
        # A value of the wrong type is refused, naming the field: nothing is sent.
        with pytest.raises(RemoteError, match="seats: expected a number"):
            await client.answer(session, data["id"], {"name": "Ada", "seats": "many"})
        with pytest.raises(RemoteError, match="seats: required"):
            await client.answer(session, data["id"], {"name": "Ada"})
        done = await asyncio.to_thread(oploop, host, "answer", session, data["id"],
                                       "name=Ada", "seats=2", "window=yes")
        assert done.returncode == 0, done.stderr
        assert f"accept sent for {data['id']}" in done.stdout
        again = await asyncio.to_thread(oploop, host, "answer", session, data["id"],
                                        "--decline")
        assert again.returncode != 0 and "no question" in again.stderr

    events = asyncio.run(asked_run(host, "#book", answer))
    (data,) = asked
    assert data["server"] == "test" and data["message"] == "Who is travelling?"
    assert set(data["schema"]["properties"]) == {"name", "seats", "window"}
    assert data["call_id"] == of_type(events, "TOOL_START")[0]["data"]["tool_use_id"]
    (answered,) = of_type(events, "ELICITATION_ANSWERED")
    assert answered["data"] == {"id": data["id"], "action": "accept", "by": "local",
                                "fields": ["name", "seats", "window"]}
    assert output(events) == "booked 2 seat(s) for Ada, window True"
    assert events[-1]["type"] == "DONE"


def test_a_declined_question_is_said_to_the_server(host):
    async def decline(client: Client, session: str, data: dict[str, Any]) -> None:
        await client.answer(session, data["id"], action="decline")

    events = asyncio.run(asked_run(host, "#book", decline))
    assert output(events) == "not booked: decline"
    (answered,) = of_type(events, "ELICITATION_ANSWERED")
    assert answered["data"]["action"] == "decline"


def test_an_unanswered_question_is_declined_when_its_time_is_up(host):
    events = asyncio.run(asked_run(host, "#short", None))
    (asked,) = of_type(events, "ELICITATION_REQUESTED")
    assert asked["data"]["timeout_s"] <= 2.0
    (answered,) = of_type(events, "ELICITATION_ANSWERED")
    assert answered["data"]["action"] == "decline" and answered["data"]["by"] == "timeout"
    assert output(events) == "not booked: decline"


@pytest.mark.parametrize("script", ["everything", "everything-http"])
def test_the_reference_servers_form_of_every_field_type(host, script):
    async def fill(client: Client, session: str, data: dict[str, Any]) -> None:
        with pytest.raises(RemoteError, match="integer: 500 is outside its maximum 100"):
            await client.answer(session, data["id"], {"name": "Ada", "integer": "500"})
        await client.answer(session, data["id"], {
            "name": "Ada", "check": "true", "integer": "7", "number": "2.5",
            "untitledSingleSelectEnum": "Joey", "untitledMultipleSelectEnum": "Piano,Drums",
            "titledSingleSelectEnum": "hero-3", "titledMultipleSelectEnum": ["fish-2"]})

    events = asyncio.run(asked_run(host, f"#{script}", fill))
    text = output(events)
    assert "User provided the requested information" in text, text
    assert "Ada" in text and "Piano" in text and "hero-3" in text, text


def test_a_question_is_answered_through_the_gateways_api(host):
    url = (Path(host) / "run" / "web.url").read_text().strip()
    token = (Path(host) / "web.token").read_text().strip()
    statuses: list[tuple[int, dict[str, Any]]] = []

    async def answer(client: Client, session: str, data: dict[str, Any]) -> None:
        async with aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {token}"}) as http:
            for body in ({"id": data["id"], "content": {"name": "Cy", "seats": "x"}},
                         {"id": data["id"], "content": {"name": "Cy", "seats": 3}},
                         {"id": data["id"], "action": "cancel"}):
                async with http.post(f"{url}api/sessions/{session}/answer",
                                     json=body) as resp:
                    statuses.append((resp.status, await resp.json()))

    events = asyncio.run(asked_run(host, "#book", answer))
    (bad, _), (good, said), (late, _) = statuses
    assert (bad, good, late) == (400, 200, 409), statuses
    assert said["by"] == "local"
    assert output(events) == "booked 3 seat(s) for Cy, window False"


def test_watch_shows_the_question_its_fields_and_the_answer(host):
    """`oploop watch` shows the question, its fields and how to answer it."""
    sessions: list[str] = []

    async def answer(client: Client, session: str, data: dict[str, Any]) -> None:
        sessions.append(session)
        await client.answer(session, data["id"], {"name": "Bo", "seats": 1})

    asyncio.run(asked_run(host, "#book", answer))
    shown = oploop(host, "watch", sessions[0], "--no-follow").stdout
    assert "? MCP server test asks: Who is travelling?" in shown, shown
    assert "seats (integer, required) — how many seats" in shown, shown
    assert "accept by local (name, seats, window)" in shown, shown  # (window: its default)


async def until_event(events: Any, kind: str, seen: list[dict[str, Any]]) -> dict[str, Any]:
    """Read `events` into `seen` until one of type `kind`; that one."""
    async for event in events:
        seen.append(event)
        if event["type"] == kind:
            return event
    raise AssertionError(f"no {kind}: {[e['type'] for e in seen]}")


def test_a_question_open_across_a_supervisor_restart_is_asked_again_and_answered(host):
    """The supervisor killed (SIGKILL) while a question waits, and restarted by the host:
    the executor still runs the call, reports it, and asks the question again (same id,
    `again`); the resumed run adopts the call, an answer given after the restart reaches
    the server, and the call's one result is the server's (never "interrupted")."""
    marks = Path(Path(host, "marks.path").read_text())
    for mark in marks.iterdir():
        mark.unlink()

    async def main() -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
        async with Client.connect(Path(host)) as client:
            started = await client.start("#book")
            seen: list[dict[str, Any]] = []
            events = client.events(started.session, started.from_seq, stop_at="first")
            asked = await until_event(events, "ELICITATION_REQUESTED", seen)
            os.kill(actor(host, "supervisor")["pid"], signal.SIGKILL)
            await until_event(events, "RESUMED", seen)
            again = await until_event(events, "ELICITATION_REQUESTED", seen)
            await client.answer(started.session, again["data"]["id"],
                                {"name": "Ada", "seats": 3})
            seen += [e async for e in events]
            return seen, asked["data"], again["data"]

    seen, asked, again = asyncio.run(main())
    kinds = [e["type"] for e in seen]
    assert_one_run(seen)
    assert kinds.count("RESUMED") == 1 and kinds.count("TOOL_START") == 1, kinds
    assert again["id"] == asked["id"] and again["again"] is True
    assert again["call_id"] == asked["call_id"] and again["schema"] == asked["schema"]
    assert 0 < again["timeout_s"] <= asked["timeout_s"]
    (answered,) = of_type(seen, "ELICITATION_ANSWERED")
    assert answered["data"] == {"id": asked["id"], "action": "accept", "by": "local",
                                "fields": ["name", "seats", "window"]}  # (a default)
    assert output(seen).startswith("booked 3 seat(s) for Ada"), output(seen)
    assert seen[-1]["type"] == "DONE", kinds
    assert (marks / "book-accept").exists()


def test_a_question_whose_executor_died_with_the_supervisor_is_closed(host):
    """The supervisor and the executor holding the call both killed while a question
    waits: no executor reports the call within the grace, so the question is closed,
    "cancel" by "restart", saying why, and the call ends "interrupted" (never run
    twice); `oploop answer` then says no question waits; the run goes on to its end."""

    async def main() -> tuple[list[dict[str, Any]], dict[str, Any], str]:
        async with Client.connect(Path(host)) as client:
            started = await client.start("#book")
            seen: list[dict[str, Any]] = []
            events = client.events(started.session, started.from_seq, stop_at="first")
            asked = await until_event(events, "ELICITATION_REQUESTED", seen)
            # Both die together: the supervisor stopped first, so that it cannot see
            # the executor go (and end the call itself) before its own end.
            supervisor = actor(host, "supervisor")["pid"]
            os.kill(supervisor, signal.SIGSTOP)
            os.kill(actor(host, "executor-1")["pid"], signal.SIGKILL)
            os.kill(supervisor, signal.SIGKILL)
            seen += [e async for e in events]
            await until(lambda: actor(host, "supervisor")["state"] == "running",
                        what="the supervisor back")
            return seen, asked["data"], started.session

    seen, asked, session = asyncio.run(main())
    kinds = [e["type"] for e in seen]
    assert kinds.count("ELICITATION_REQUESTED") == 1, kinds
    (closed,) = of_type(seen, "ELICITATION_ANSWERED")
    assert closed["data"]["id"] == asked["id"]
    assert (closed["data"]["action"], closed["data"]["by"]) == ("cancel", "restart")
    assert "supervisor restarted" in closed["data"]["reason"]
    assert kinds.index("RESUMED") < kinds.index("ELICITATION_ANSWERED"), kinds
    assert output(seen).startswith("interrupted: the supervisor restarted"), output(seen)
    assert seen[-1]["type"] == "DONE", kinds
    # Closed for every viewer: an answer now is refused, saying why.
    late = oploop(host, "answer", session, asked["id"], "name=Ada", "seats=1")
    assert late.returncode != 0 and "supervisor restarted" in late.stderr, late.stderr
    shown = oploop(host, "watch", session, "--no-follow").stdout
    assert f"cancel by restart [{asked['id']}]: the supervisor restarted" in shown, shown
    asyncio.run(wait_tools_back(host))


async def wait_tools_back(home: str) -> None:
    """The executor restarted with its MCP servers (the module's host is shared)."""
    await until(lambda: actor(home, "executor-1")["state"] == "running", what="the executor")
    await asyncio.to_thread(wait_tools, home, {"mcp__test__book", "mcp__short__book"})


def test_a_question_is_answered_from_the_web_page(host):
    """The web view shows the question as a form from its schema (a default filled in);
    a value the form refuses is said on the page, nothing sent; the answer sent closes
    the form for every viewer and reaches the server."""
    from test_web_page import (
        CHROMIUM,
        TIMEOUT_MS,
        async_playwright,
        page_base,
        start_in_page,
        token_of,
    )

    if CHROMIUM is None or async_playwright is None:
        pytest.skip("no chromium or playwright (see test_web_page.py)")
    url = page_base(host)

    async def main() -> tuple[str, list[str], list[str]]:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM,
                                               args=["--no-sandbox", "--disable-gpu"])
            try:
                page = await browser.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.set_default_timeout(TIMEOUT_MS)
                await page.goto(f"{url}?token={token_of(host)}")
                sid = await start_in_page(page, {"prompt": "#book"})
                await page.goto(f"{url}s/{sid}")
                form = page.locator("form.elicit")
                await form.locator("button.accept").wait_for()
                assert not await form.locator("input[name=window]").is_checked()
                await form.locator("input[name=name]").fill("Di")
                await form.locator("button.accept").click()  # seats, required, missing
                await page.wait_for_function(
                    "document.querySelector('form.elicit .why').textContent.includes("
                    "'seats: required')")
                await form.locator("input[name=seats]").fill("4")
                await form.locator("input[name=window]").check()
                await form.locator("button.accept").click()
                await page.wait_for_selector("form.elicit.answered")
                await page.wait_for_selector(".terminal.DONE")
                outputs = await page.evaluate(
                    "[...document.querySelectorAll('#log .tool .output')].map(e => e.textContent)")
                return await form.inner_text(), outputs, errors
            finally:
                await browser.close()

    shown, outputs, errors = asyncio.run(main())
    assert "? MCP server test asks: Who is travelling?" in shown, shown
    assert "accept by local (name, seats, window)" in shown, shown
    assert any("booked 4 seat(s) for Di, window True" in o for o in outputs), outputs
    assert not errors, errors
