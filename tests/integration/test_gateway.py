"""The gateway: the JSON + SSE API and /metrics of a real host, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver
from homes import make_home, remove_home
from hostkit import (
    TERMINAL,
    actor,
    of_type,
    oploop,
    running_host,
    until,
    wait_until,
    workspace,
)
from prometheus_client.parser import text_string_to_metric_families

from actors.gateway.urls import cookie_name, page_host

PROMPT_LIMIT = 2_000
WORDS = " ".join(f"word{i}" for i in range(150))
SCRIPTS = {
    # A reply streamed slowly: there is time to join mid-run, resume and cancel.
    "slow": [{"reply": WORDS, "delay_s": 0.02}],
    "think": [{"reply": [{"type": "thinking", "thinking": "let me see"},
                         {"type": "text", "text": "thought it through"}]}],
    # A tool that waits for the test's "go"; then the rules answer (and heed what was said).
    "wait": [{"reply": [{"type": "tool_use", "name": "shell", "input": {
        "command": "touch started; until [ -e go ]; do sleep 0.01; done; echo finished"}}]},
        "rules", "rules"],
    # Two calls under the `asker` agent's `ask` rule: decided over HTTP.
    "ask": [{"reply": [{"type": "tool_use", "name": "shell", "input": {"command": "echo one"}},
                       {"type": "tool_use", "name": "shell", "input": {"command": "echo two"}}]},
            {"reply": "decided", "stop_reason": "end_turn"}],
}
GATEWAY_ENV = {"OPLOOP_HTTP_LISTEN": "127.0.0.1:0"}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    home = make_home("opg-")
    files = tmp_path_factory.mktemp("gateway")
    (files / "scenario.json").write_text(json.dumps({"scripts": SCRIPTS}))
    Path(home, "oploop.toml").write_text(f"[limits]\nmax_prompt_chars = {PROMPT_LIMIT}\n"
                                         "[agents.asker]\napproval_timeout_s = 600\n"
                                         "[agents.asker.permissions]\nshell = \"ask\"\n")
    env = {"OPLOOP_OFFLINE_SCENARIO": str(files / "scenario.json"), **GATEWAY_ENV}
    try:
        with running_host(home, env) as h:
            yield h
    finally:
        remove_home(Path(home))


def url_of(home: str) -> str:
    return (Path(home) / "run" / "web.url").read_text().strip()


def page_base(home: str) -> str:
    """The page's own address: `http://oploop-<id>.localhost:PORT/`."""
    port = url_of(home).rsplit(":", 1)[1]
    return f"http://{page_host((Path(home) / 'web.token').read_text().strip())}:{port}"


class _LoopbackNames(AbstractResolver):
    """`*.localhost` to 127.0.0.1, as browsers resolve it (this machine's resolver
    may not: RFC 6761 lets it, glibc without nss-myhostname does not)."""

    def __init__(self) -> None:
        self.rest = DefaultResolver()

    async def resolve(self, host: str, port: int = 0, family: Any = 0) -> list[Any]:
        if host == "localhost" or host.endswith(".localhost"):
            return [{"hostname": host, "host": "127.0.0.1", "port": port,
                     "family": socket.AF_INET, "proto": 0, "flags": socket.AI_NUMERICHOST}]
        return await self.rest.resolve(host, port, family)

    async def close(self) -> None:
        await self.rest.close()


def loopback_names() -> aiohttp.TCPConnector:
    """A connector that reaches the page's own name (`_LoopbackNames`)."""
    return aiohttp.TCPConnector(resolver=_LoopbackNames())


def session(home: str) -> aiohttp.ClientSession:
    """An HTTP client carrying the host's web token."""
    token = (Path(home) / "web.token").read_text().strip()
    return aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"})


async def sse(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """(id, event) of each SSE message of `resp`."""
    fields: dict[str, str] = {}
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if "data" in fields:
                yield int(fields["id"]), json.loads(fields["data"])
            fields = {}
            continue
        name, _, value = line.partition(":")
        fields[name] = value.removeprefix(" ")


async def read_all(http: aiohttp.ClientSession, url: str, sid: str,
                   headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The session's events to its newest terminal one, through SSE."""
    async with http.get(f"{url}api/sessions/{sid}/events", params={"stop_at": "last"},
                        headers=headers or {}) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        out = []
        async for seq, ev in sse(resp):
            assert seq == ev["seq"]
            out.append(ev)
        return out


async def start(http: aiohttp.ClientSession, url: str, prompt: str) -> str:
    async with http.post(f"{url}api/sessions", json={"prompt": prompt}) as resp:
        body = await resp.json()
        assert resp.status == 201, body
        assert body["page"] == f"/s/{body['session']}"
        return str(body["session"])


def assert_contiguous_run(events: list[dict[str, Any]]) -> None:
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    terminal = [e for e in events if e["type"] in TERMINAL]
    assert len(terminal) == 1 and terminal[0] is events[-1], [e["type"] for e in events]


def test_start_list_inspect_and_stream(host):
    async def main() -> None:
        url = url_of(host)
        async with session(host) as http:
            sid = await start(http, url, "#think hello")
            events = await read_all(http, url, sid)
            assert_contiguous_run(events)
            assert events[-1]["type"] == "DONE"
            assert [e["data"]["text"] for e in events if e["type"] == "THINKING"] == ["let me see"]
            async with http.get(f"{url}api/sessions") as resp:
                listed = (await resp.json())["sessions"]
            assert sid in [s["session"] for s in listed]
            async with http.get(f"{url}api/sessions/{sid}") as resp:
                info = await resp.json()
            assert info["session"]["session"] == sid
            assert info["session"]["last_seq"] == events[-1]["seq"]
            assert info["history"][0]["role"] == "user"

    asyncio.run(main())


def test_last_event_id_resumes_mid_run_without_gap_or_duplicate(host):
    async def main() -> None:
        url = url_of(host)
        async with session(host) as http:
            sid = await start(http, url, "#slow go")
            first: list[dict[str, Any]] = []
            async with http.get(f"{url}api/sessions/{sid}/events") as resp:
                async for _, ev in sse(resp):
                    first.append(ev)
                    if len([e for e in first if e["type"] == "TOKEN"]) >= 3:
                        break  # leave mid-run, live
            assert first[-1]["type"] not in TERMINAL
            rest = await read_all(http, url, sid, {"Last-Event-ID": str(first[-1]["seq"])})
            assert rest[0]["seq"] == first[-1]["seq"] + 1
            whole = first + rest
            assert_contiguous_run(whole)
            assert whole == await read_all(http, url, sid)  # a late viewer sees the same
            text = "".join(e["data"]["text"] for e in whole if e["type"] == "TOKEN")
            assert text == WORDS

    asyncio.run(main())


def test_cancel_then_follow_up_on_one_stream(host):
    async def main() -> None:
        url = url_of(host)
        async with session(host) as http:
            sid = await start(http, url, "#slow go")
            seen: list[dict[str, Any]] = []
            async with http.get(f"{url}api/sessions/{sid}/events") as resp:  # follows runs
                async for _, ev in sse(resp):
                    seen.append(ev)
                    if ev["type"] == "TOKEN" and sum(e["type"] == "TOKEN" for e in seen) == 1:
                        async with http.post(f"{url}api/sessions/{sid}/messages",
                                             json={"prompt": "more"}) as said:
                            body = await said.json()
                            assert said.status == 202, body
                            assert body == {"session": sid, "state": "queued", "run": 1,
                                            "from_seq": 0}
                        async with http.post(f"{url}api/sessions/{sid}/cancel",
                                             json={"mode": "ui"}) as cancel:
                            assert cancel.status == 200, await cancel.text()
                            assert (await cancel.json())["session"] == sid
                    if ev["type"] == "CANCELLED":
                        assert ev["data"]["mode"] == "ui"
                        async with http.post(f"{url}api/sessions/{sid}/messages",
                                             json={"prompt": "list /tmp"}) as again:
                            body = await again.json()
                            assert again.status == 201, body
                            assert body["run"] == 2 and body["from_seq"] == ev["seq"] + 1
                    if ev["type"] == "DONE":
                        break
            assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
            assert [e["type"] for e in seen if e["type"] in TERMINAL] == ["CANCELLED", "DONE"]
            # What was said into the cancelled run still joined its history, before its end.
            kinds = [e["type"] for e in seen]
            assert kinds.index("USER_MESSAGE") < kinds.index("CANCELLED")
            assert of_type(seen, "USER_MESSAGE")[0]["data"] == {"text": "more", "by": "local"}

    asyncio.run(main())


def test_compact_over_http_summarises_an_idle_session(host):
    async def main() -> None:
        url = url_of(host)
        async with session(host) as http:
            sid = await start(http, url, "run `seq 1 2000`")
            async with http.get(f"{url}api/sessions/{sid}/events") as resp:
                async for _, ev in sse(resp):
                    if ev["type"] in TERMINAL:
                        break
            async with http.post(f"{url}api/sessions/{sid}/compact", json={}) as done:
                body = await done.json()
                assert done.status == 200, body
                assert body["session"] == sid and body["state"] == "compacted"
                assert body["after_tokens"] < body["before_tokens"]
            async with http.post(f"{url}api/sessions/nosuch/compact", json={}) as unknown:
                assert unknown.status == 404, await unknown.text()

    asyncio.run(main())


def test_a_message_to_a_running_session_reaches_its_next_model_call(host):
    async def main() -> None:
        url = url_of(host)
        async with session(host) as http:
            sid = await start(http, url, "#wait go")
            await until(lambda: (workspace(host, sid) / "started").exists(),
                        what="the tool to start")
            said = "run `echo heard-on-the-web`"
            async with http.post(f"{url}api/sessions/{sid}/messages",
                                 json={"prompt": said}) as resp:
                body = await resp.json()
                assert resp.status == 202, body
                assert body == {"session": sid, "state": "queued", "run": 1, "from_seq": 0}
            # Refused, naming the limit, with nothing queued: what the session could not
            # take (the waiting messages' total) and what no message may be.
            for text, status, code, names in [
                ("y" * (PROMPT_LIMIT - 10), 409, "busy", f"{PROMPT_LIMIT} chars in all"),
                ("x" * (PROMPT_LIMIT + 1), 400, "too_large", f"limit of {PROMPT_LIMIT}"),
                ("   ", 400, "bad_request", "non-empty"),
            ]:
                async with http.post(f"{url}api/sessions/{sid}/messages",
                                     json={"prompt": text}) as resp:
                    body = await resp.json()
                    assert (resp.status, body["error"]) == (status, code), body
                    assert names in body["message"], body
                    assert "max_prompt_chars" in body["message"] or code == "bad_request"
            (workspace(host, sid) / "go").touch()
            events = await read_all(http, url, sid)
            assert_contiguous_run(events)
            assert [e["data"] for e in of_type(events, "USER_MESSAGE")] == [
                {"text": said, "by": "local"}]
            kinds = [e["type"] for e in events]
            at = kinds.index("USER_MESSAGE")  # after the tool's result, before the next call
            assert kinds[at - 2:at + 2] == ["TOOL_END", "TURN_END", "USER_MESSAGE",
                                            "TURN_START"]
            # The next model call held it: the offline model ran what was said.
            (heard,) = [e for e in of_type(events, "TOOL_START") if e["turn"] == 2]
            assert heard["data"]["input"] == {"command": "echo heard-on-the-web"}
            assert events[-1]["type"] == "DONE"
            # Idle now: a message starts the session's next run.
            async with http.post(f"{url}api/sessions/{sid}/messages",
                                 json={"text": "run `echo two`"}) as resp:
                body = await resp.json()
                assert resp.status == 201, body
                assert body == {"session": sid, "state": "started", "run": 2,
                                "from_seq": events[-1]["seq"] + 1, "page": f"/s/{sid}"}
            both = await read_all(http, url, sid)
            assert [s["data"]["prompt"] for s in of_type(both, "SESSION_START")] == [
                "#wait go", "run `echo two`"]
            assert both[-1]["type"] == "DONE"

    asyncio.run(main())


def test_calls_waiting_for_approval_are_approved_and_denied_over_http(host):
    async def main() -> None:
        url = url_of(host)
        async with session(host) as http:
            async with http.post(f"{url}api/sessions",
                                 json={"prompt": "#ask go", "agent": "asker"}) as resp:
                assert resp.status == 201, await resp.text()
                sid = (await resp.json())["session"]
            seen: list[dict[str, Any]] = []
            async with http.get(f"{url}api/sessions/{sid}/events",
                                params={"stop_at": "first"}) as resp:
                async for _, ev in sse(resp):
                    seen.append(ev)
                    asks = of_type(seen, "APPROVAL_REQUESTED")
                    if ev["type"] != "APPROVAL_REQUESTED" or len(asks) < 2:
                        continue
                    one, two = (a["data"]["call_id"] for a in asks)
                    decide = f"{url}api/sessions/{sid}/"
                    # Refused, nothing decided: no calls named, bad types, a call unknown.
                    for body, status in [({}, 400), ({"calls": "x"}, 400),
                                         ({"calls": [one], "always": "yes"}, 400),
                                         ({"calls": [one, "nope"]}, 409)]:
                        async with http.post(decide + "approve", json=body) as bad:
                            assert bad.status == status, (body, await bad.text())
                    async with http.post(decide + "approve", json={"calls": [one]}) as ok:
                        assert ok.status == 200, await ok.text()
                        assert await ok.json() == {"session": sid, "decided": [one],
                                                   "by": "local"}
                    async with http.post(decide + "approve", json={"calls": [one]}) as again:
                        body = await again.json()
                        assert again.status == 409 and "already decided" in body["message"]
                    async with http.post(decide + "deny", json={"all": True,
                                                                "reason": "not today"}) as no:
                        assert no.status == 200, await no.text()
                        assert (await no.json())["decided"] == [two]
            assert_contiguous_run(seen)
            decided = [(e["data"]["decision"], e["data"]["by"])
                       for e in of_type(seen, "APPROVAL_DECIDED")]
            assert decided == [("approve", "local"), ("deny", "local")]
            outputs = {e["data"]["tool_use_id"]: e["data"] for e in of_type(seen, "TOOL_END")}
            assert outputs[one]["output"] == "one\n" and not outputs[one]["is_error"]
            assert outputs[two]["is_error"] and "not today" in outputs[two]["output"]
            assert seen[-1]["type"] == "DONE"
            async with http.post(f"{url}api/sessions/nope/deny", json={"all": True}) as resp:
                assert resp.status == 404 and (await resp.json())["error"] == "unknown_session"

    asyncio.run(main())


def test_the_list_stream_tells_of_every_sessions_changes_but_deltas(host):
    async def main() -> None:
        url = url_of(host)
        async with session(host) as http, http.get(f"{url}api/events") as feed:
            assert feed.status == 200
            await feed.content.readline()  # ": listening": the stream is open
            sid = await start(http, url, "#think hello")
            types = []
            async for raw in feed.content:
                line = raw.decode()
                if not line.startswith("data: "):
                    continue
                notice = json.loads(line[6:])
                if notice["session"] == sid:
                    types.append(notice["type"])
                    if notice["type"] == "DONE":
                        break
            assert types[0] == "SESSION_START" and "TURN_START" in types
            assert not {"TOKEN", "THINKING"} & set(types)

    asyncio.run(main())


def test_every_request_needs_the_token(host):
    async def main() -> None:
        url = url_of(host)
        token = (Path(host) / "web.token").read_text().strip()
        assert (Path(host) / "web.token").stat().st_mode & 0o077 == 0
        own = page_base(host)
        async with aiohttp.ClientSession(connector=loopback_names()) as http:
            for path in ("", "s/abc", "static/app.js", "api/sessions", "metrics"):
                for headers in ({}, {"Authorization": "Bearer wrong"}):
                    async with http.get(url + path, headers=headers) as resp:
                        assert resp.status == 401, path
                        assert await resp.json() == {"error": "unauthorized",
                                                     "message": "a token is required"}
            async with http.post(f"{url}api/sessions", json={"prompt": "hi"}) as resp:
                assert resp.status == 401
            async with http.delete(f"{url}api/sessions/abc") as resp:
                assert resp.status == 401
            # A first visit with ?token= goes to the page's own name, which sets the
            # cookie and drops the token from the URL.
            async with http.get(f"{url}?token={token}") as resp:
                assert resp.status == 200 and str(resp.url) == own
            assert [c.key for c in http.cookie_jar] == [cookie_name(token)]
            async with http.get(f"{own}api/sessions") as resp:
                assert resp.status == 200  # the cookie now
            async with http.get(f"{url}api/sessions") as resp:
                assert resp.status == 401  # not at 127.0.0.1: no cookie of ours there

    asyncio.run(main())


async def _any_session(host: str) -> str:
    async with session(host) as http:
        return await start(http, url_of(host), "list /tmp")


def test_oploop_web_prints_the_pages_address_with_its_token(host):
    shown = oploop(host, "web", "--no-open", env=GATEWAY_ENV)
    assert shown.returncode == 0, shown.stderr
    token = (Path(host) / "web.token").read_text().strip()
    assert shown.stdout.strip() == f"{page_base(host)}?token={token}"
    unknown = oploop(host, "web", "abc123", "--no-open", env=GATEWAY_ENV)
    assert unknown.returncode == 1 and unknown.stdout == ""  # no address of a page of nothing
    assert unknown.stderr.strip() == "oploop: no session 'abc123'", unknown.stderr
    sid = asyncio.run(_any_session(host))
    one = oploop(host, "web", sid, "--no-open", env=GATEWAY_ENV)
    assert one.stdout.strip() == f"{page_base(host)}s/{sid}?token={token}"

    async def main() -> None:
        async with aiohttp.ClientSession(connector=loopback_names()) as http, \
                http.get(shown.stdout.strip()) as resp:
            assert resp.status == 200 and "oploop" in await resp.text()

    asyncio.run(main())


def test_bad_input_gets_a_json_error(host):
    async def main() -> None:
        url = url_of(host)
        async with session(host) as http:
            for method, path in [("GET", "api/sessions/nope"), ("GET", "api/sessions/nope/events"),
                                 ("POST", "api/sessions/nope/cancel"),
                                 ("POST", "api/sessions/nope/messages")]:
                async with http.request(method, url + path, json={"prompt": "hi"}) as resp:
                    assert resp.status == 404, (path, await resp.text())
                    assert (await resp.json())["error"] == "unknown_session"
            async with http.post(f"{url}api/sessions", data=b'{"prompt": ') as resp:
                assert resp.status == 400
                assert "malformed JSON" in (await resp.json())["message"]
            async with http.post(f"{url}api/sessions", json=["list"]) as resp:
                assert resp.status == 400
            deep = b'{"prompt": ' + b"[" * 3_000 + b"]" * 3_000 + b"}"  # past the parser's stack
            async with http.post(f"{url}api/sessions", data=deep) as resp:
                assert resp.status == 400 and "too deep" in (await resp.json())["message"]
            async with http.post(f"{url}api/sessions", json={"prompt": 3}) as resp:
                assert resp.status == 400 and "prompt" in (await resp.json())["message"]
            async with http.post(f"{url}api/sessions",
                                 json={"prompt": "x" * (PROMPT_LIMIT + 1)}) as resp:
                body = await resp.json()
                assert resp.status == 400, body
                assert str(PROMPT_LIMIT) in body["message"]
                assert "max_prompt_chars" in body["message"]
            async with http.post(f"{url}api/sessions", json={"prompt": "hi", "agent": "x"}) as resp:
                assert resp.status == 400 and (await resp.json())["error"] == "unknown_agent"
            # What a page of another site could make a browser send.
            async with http.post(f"{url}api/sessions", json={"prompt": "run `id`"},
                                 headers={"Origin": "http://evil.example"}) as resp:
                assert resp.status == 403 and "cross-site" in (await resp.json())["message"]
            async with http.post(f"{url}api/sessions", data="{}",
                                 headers={"Sec-Fetch-Site": "cross-site"}) as resp:
                assert resp.status == 403
            async with http.get(f"{url}api/sessions", headers={"Host": "evil.example"}) as resp:
                assert resp.status == 403  # DNS rebinding: another site's name
            # A delete likewise: never from another site; an unknown session is a 404.
            async with http.delete(f"{url}api/sessions/nosuch",
                                   headers={"Origin": "http://evil.example"}) as resp:
                assert resp.status == 403 and "cross-site" in (await resp.json())["message"]
            async with http.delete(f"{url}api/sessions/nosuch") as resp:
                assert resp.status == 404 and (await resp.json())["error"] == "unknown_session"
            async with http.get(f"{url}api/nothing") as resp:
                assert resp.status == 404 and (await resp.json())["error"] == "not_found"
            sid = await start(http, url, "list /tmp")
            async with http.post(f"{url}api/sessions/{sid}/cancel", json={"mode": "x"}) as resp:
                assert resp.status == 400 and "mode" in (await resp.json())["message"]
            async with http.get(f"{url}api/sessions/{sid}/events",
                                headers={"Last-Event-ID": "x"}) as resp:
                assert resp.status == 400
            assert_contiguous_run(await read_all(http, url, sid))  # nothing was lost

    asyncio.run(main())


def test_a_stalled_client_costs_other_viewers_nothing(host):
    async def main() -> None:
        url = url_of(host)
        async with session(host) as http, session(host) as stalled:
            sid = await start(http, url, "#slow go")
            # One viewer connects and never reads; another reads the whole run.
            async with stalled.get(f"{url}api/sessions/{sid}/events") as stuck:
                assert stuck.status == 200
                events = await read_all(http, url, sid)
                assert_contiguous_run(events)

    asyncio.run(main())


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_runs_turns_tools_and_read_the_host(host):
    async def main() -> None:
        url = url_of(host)
        async with session(host) as http:
            sid = await start(http, url, "list /tmp")
            events = await read_all(http, url, sid)
            turns = sum(e["type"] == "TURN_START" for e in events)
            cancelled = await start(http, url, "#slow go")
            async with http.get(f"{url}api/sessions/{cancelled}/events") as resp:
                sent = False  # (streamed text is committed in groups: several TOKENs at once)
                async for _, ev in sse(resp):
                    if ev["type"] == "TOKEN" and not sent:
                        async with http.post(f"{url}api/sessions/{cancelled}/cancel") as c:
                            assert c.status == 200
                        sent = True
                    if ev["type"] == "CANCELLED":
                        break

            async def scrape() -> dict[Any, float]:
                async with http.get(f"{url}metrics") as resp:
                    assert resp.status == 200
                    return metric_samples(await resp.text())

            # The live stream reaches the gateway's counters a moment after the viewer.
            for _ in range(200):
                samples = await scrape()
                if samples.get(("oploop_runs_total", (("terminal", "CANCELLED"),)), 0) >= 1:
                    break
                await asyncio.sleep(0.05)
            assert samples[("oploop_turns_total", ())] >= turns
            calls = sum(v for (name, labels), v in samples.items()
                        if name == "oploop_tool_calls_total" and ("tool", "list_dir") in labels)
            assert calls >= 1
            assert samples[("oploop_tool_call_duration_seconds_count",
                            (("tool", "list_dir"),))] >= 1
            assert samples[("oploop_sessions", (("state", "idle"),))] >= 1
            assert samples[("oploop_turn_ends_total", (("stop", "end_turn"),))] >= 1
            assert samples[("oploop_broadcaster_events_lost", ())] == 0
            assert samples[("oploop_actor_restarts", (("actor", "supervisor"),))] == 0
            assert samples[("oploop_actor_up", (("actor", "gateway"), ("state", "running")))] == 1
            assert samples[("oploop_gateway_events_missed_total", ())] == 0
            # The cancel went through the gateway: timed to its CANCELLED.
            assert samples[("oploop_gateway_cancel_seconds_count", ())] >= 1
            assert samples[("oploop_runs_total", (("terminal", "CANCELLED"),))] >= 1
            # Every state and terminal is exported, at 0 when none is; and the cost.
            assert ("oploop_sessions", (("state", "running"),)) in samples
            assert ("oploop_runs_total", (("terminal", "ERROR"),)) in samples
            assert ("oploop_cancels_total", (("mode", "deadline"),)) in samples
            priced = sum((e["data"].get("usage") or {}).get("cost_usd") or 0 for e in events
                         if e["type"] == "TURN_END")
            assert samples[("oploop_model_cost_usd_total", ())] >= priced * 0.999
            assert samples[("oploop_sessions_cost_usd", ())] >= priced * 0.999
            # Every stream of the tests before has ended, those the client left mid-run
            # too: their handlers were cancelled, their subscriptions closed.
            for _ in range(200):
                if samples[("oploop_gateway_sse_clients", ())] == 0:
                    break
                await asyncio.sleep(0.05)
                samples = await scrape()
            assert samples[("oploop_gateway_sse_clients", ())] == 0

    asyncio.run(main())


def test_a_killed_gateway_is_restarted_by_the_host(host):
    async def request() -> None:  # (the gateway starts at a first connection, if none yet)
        async with session(host) as http, http.get(f"{url_of(host)}api/sessions") as resp:
            assert resp.status == 200

    asyncio.run(request())
    pid = actor(host, "gateway")["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: actor(host, "gateway")["restarts"] == 1
               and actor(host, "gateway")["state"] == "running", "the gateway back")

    async def main() -> None:
        async with session(host) as http:
            wait_until(lambda: (Path(host) / "run" / "web.url").exists(), "its url")
            async with http.get(f"{url_of(host)}api/sessions") as resp:
                assert resp.status == 200
                assert isinstance((await resp.json())["sessions"], list)

    asyncio.run(main())
