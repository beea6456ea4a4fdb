"""The web view in a real browser: headless Chromium (Debian's `chromium`, which
`scripts/test` installs where it can) driven by Playwright against the system binary.

Screenshots of the list and of a session mid-run are saved in `$OPLOOP_ARTIFACTS/web`
(default /tmp/oploop-artifacts/web).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest
from homes import make_home, remove_home
from hostkit import running_host

from actors.gateway.urls import page_url
from actors.usage import money, short_count

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.async_api import Page, async_playwright
except ImportError:  # the test extra brings it; a bare venv may not have it
    async_playwright = None

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian package `chromium`: "
                       "scripts/test installs it when run as root with apt-get)"),
    pytest.mark.skipif(async_playwright is None, reason="playwright is not installed "
                       "(the test extra: pip install -e .[test])"),
]

WORDS = " ".join(f"word{i}" for i in range(400))
BIG = " ".join(f"w{i}" for i in range(10_000))
SCRIPTS = {"slow": [{"reply": WORDS, "delay_s": 0.03}],
           "big": [{"reply": BIG, "delay_s": 0}],
           # Two calls the `asker` agent must have approved: one approved, one denied.
           "ask": [{"reply": [
               {"type": "tool_use", "name": "shell", "input": {"command": "echo from-the-page"}},
               {"type": "tool_use", "name": "shell", "input": {"command": "echo never"}}]},
               {"reply": "decided", "stop_reason": "end_turn"}]}
# A reply in Markdown, with what a page must never run: a script, an event handler, a
# `javascript:` link (the model's text is rendered; these must come out inert).
XSS = ('<img src=x onerror="window.__xss=1"> <script>window.__xss=2</script> '
       '[click](javascript:window.__xss=3) <a href="javascript:window.__xss=4">a</a> '
       '<svg><script>window.__xss=5</script></svg> <iframe src="javascript:window.__xss=6">')
MARKDOWN = ("# Findings\n\nThe **disk** is fine:\n\n- one\n- two\n\n"
            "```sh\ndf -h /\n```\n\n" + XSS)
SCRIPTS["md"] = [{"reply": MARKDOWN, "delay_s": 0}]
# A tool that runs until cancelled: the page shows its elapsed time meanwhile.
SCRIPTS["sleepy"] = [{"reply": [{"type": "text", "text": "Checking the **disk** first, with "
                                                        "`df`; then I wait:"},
                                {"type": "tool_use", "name": "shell",
                                 "input": {"command": "df -h /; sleep 60"}}]},
                     {"reply": "slept", "stop_reason": "end_turn"}]
ASKER = '[agents.asker]\napproval_timeout_s = 600\n[agents.asker.permissions]\nshell = "ask"\n'
ARTIFACTS = Path(os.environ.get("OPLOOP_ARTIFACTS", "/tmp/oploop-artifacts")) / "web"
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    home = make_home("opw-")
    files = tmp_path_factory.mktemp("web")
    (files / "scenario.json").write_text(json.dumps({"scripts": SCRIPTS}))
    # Unbatched: one TOKEN event per streamed delta, for a session of 10,000 events.
    env = {"OPLOOP_OFFLINE_SCENARIO": str(files / "scenario.json"),
           "OPLOOP_HTTP_LISTEN": "127.0.0.1:0", "OPLOOP_TOKEN_BATCH_MS": "0"}
    Path(home, "oploop.toml").write_text(ASKER)
    try:
        with running_host(home, env) as h:
            yield h
    finally:
        remove_home(Path(home))


async def log_text(page: Page) -> str:
    return str(await page.inner_text("#log"))


def token_of(home: str) -> str:
    return (Path(home) / "web.token").read_text().strip()


async def start_in_page(page: Page, body: dict[str, str]) -> str:
    """Start a session with the page's own fetch (its cookie; the page's host name is
    one only the browser resolves)."""
    status, reply = await page.evaluate(
        """async (body) => {
          const r = await fetch('/api/sessions', {method: 'POST', body: JSON.stringify(body),
            headers: {'Content-Type': 'application/json'}});
          return [r.status, await r.json()];
        }""", body)
    assert status == 201, reply
    return str(reply["session"])


def page_base(home: str) -> str:
    """The page's own address (`oploop-<id>.localhost`, where its cookie lives)."""
    return (page_url(Path(home)) or "").split("?")[0]


def test_start_watch_cancel_in_two_pages(host):
    address = (Path(host) / "run" / "web.url").read_text().strip()
    url = page_base(host)
    token = token_of(host)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    async def main() -> None:
        assert async_playwright is not None
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM,
                                               args=["--no-sandbox", "--disable-gpu"])
            errors: list[str] = []
            try:
                page = await browser.new_page()
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.set_default_timeout(TIMEOUT_MS)
                await page.goto(f"{address}?token={token}")  # the gateway's own address
                assert page.url == url  # at the page's own name, the token in a cookie
                await page.fill("#start-prompt", "#slow go")
                await page.click("#start-form button")
                await page.wait_for_url("**/s/*")
                sid = page.url.rsplit("/", 1)[1]
                # Streamed text appears while the run goes on.
                await page.wait_for_function(
                    "() => document.querySelector('#log .text')?.textContent.includes('word20')")
                assert await page.inner_text("#state") == "running"
                await page.screenshot(path=str(ARTIFACTS / "session-mid-run.png"))
                # A second page joins mid-run: it replays from seq 1, then follows.
                other = await browser.new_page()
                other.on("pageerror", lambda exc: errors.append(str(exc)))
                other.set_default_timeout(TIMEOUT_MS)
                await other.goto(f"{url}s/{sid}?token={token}")
                await other.wait_for_function(
                    "() => document.querySelector('#log .text')?.textContent.includes('word0')")
                # The message box serves the running session: a message for its next step.
                assert await page.inner_text("#follow-send") == "Send message"
                await page.fill("#follow-prompt", "a note from the page")
                await page.click("#follow-send")
                await page.wait_for_function(
                    "() => document.getElementById('notice').textContent.includes('message sent')")
                await page.click("#cancel-ui")
                for p in (page, other):
                    await p.wait_for_selector(".terminal.CANCELLED")
                    assert await p.inner_text("#state") == "idle"
                    # Said before the end: it joined the run's history, shown in both.
                    said = await p.inner_text(".said")  # (its time, then what was said)
                    assert said.endswith("\n✉ local: a note from the page"), said
                    assert await p.inner_text("#follow-send") == "Send follow-up"
                seqs = [await p.get_attribute("#log", "data-seq") for p in (page, other)]
                assert seqs[0] == seqs[1] and int(seqs[0] or 0) > 3
                assert await log_text(page) == await log_text(other)
                assert "word20" in await log_text(other)
                assert WORDS not in await log_text(page)  # cut short by the cancel
                # The list shows it, idle.
                await page.goto(url)
                row = page.locator("#sessions tbody tr", has_text=sid)
                await row.wait_for()
                assert "idle" in await row.inner_text()
                await page.screenshot(path=str(ARTIFACTS / "sessions.png"))
                assert not errors, errors
            finally:
                await browser.close()

    asyncio.run(main())


def test_a_session_of_10000_events_renders_in_full(host):
    url = page_base(host)
    token = token_of(host)

    async def main() -> None:
        assert async_playwright is not None
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM,
                                               args=["--no-sandbox", "--disable-gpu"])
            try:
                page = await browser.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.set_default_timeout(60_000)
                await page.goto(f"{url}?token={token}")
                sid = await start_in_page(page, {"prompt": "#big"})
                # Opened while it streams: replay, then live, rendered in frame batches.
                await page.goto(f"{url}s/{sid}")
                await page.wait_for_selector(".terminal.DONE")
                last = await page.evaluate(
                    f"fetch('/api/sessions/{sid}').then(r => r.json())"
                    ".then(j => j.session.last_seq)")
                assert last > 10_000
                assert await page.get_attribute("#log", "data-seq") == str(last)
                # The answer's text is drawn in frame batches: its last batch may follow
                # the DONE card by a frame (a full suite on a busy machine read it before).
                words = len(BIG.split())
                await page.wait_for_function(
                    "n => { const e = document.querySelector('#log .text .md');"
                    " return e && e.textContent.trim().split(/\\s+/).length >= n; }",
                    arg=words)
                text = await page.evaluate(
                    "[...document.querySelectorAll('#log .text .md')].map(e => e.textContent)")
                assert text[0].strip() == BIG
                assert not errors, errors
            finally:
                await browser.close()

    asyncio.run(main())


def test_approve_and_deny_from_the_page(host):
    url = page_base(host)
    token = token_of(host)

    async def main() -> None:
        assert async_playwright is not None
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM,
                                               args=["--no-sandbox", "--disable-gpu"])
            try:
                page = await browser.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.set_default_timeout(TIMEOUT_MS)
                await page.goto(f"{url}?token={token}")
                sid = await start_in_page(page, {"prompt": "#ask", "agent": "asker"})
                await page.goto(f"{url}s/{sid}")
                asks = page.locator(".ask")
                await asks.nth(1).locator("button.deny").wait_for()
                await page.screenshot(path=str(ARTIFACTS / "session-approval.png"))
                await asks.nth(0).locator("button.approve").first.click()
                await page.wait_for_selector(".ask.approved")
                await asks.nth(1).locator("button.deny").click()
                await page.wait_for_selector(".terminal.DONE")
                assert "approved by local" in await asks.nth(0).inner_text()
                assert "denied by local" in await asks.nth(1).inner_text()
                assert await page.locator(".ask button").count() == 0  # nothing left to decide
                outputs = await page.evaluate(
                    "[...document.querySelectorAll('#log .tool .output')].map(e => e.textContent)")
                assert any("from-the-page" in o for o in outputs), outputs
                assert any("denied by local" in o for o in outputs), outputs
                assert not errors, errors
            finally:
                await browser.close()

    asyncio.run(main())


async def _browser(pw):
    return await pw.chromium.launch(executable_path=CHROMIUM,
                                    args=["--no-sandbox", "--disable-gpu"])


async def _page(browser, errors: list[str]) -> Page:
    page = await browser.new_page(viewport={"width": 1200, "height": 760})
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_default_timeout(TIMEOUT_MS)
    return page


def _row(sid: str) -> str:
    return f'#sessions tr[data-session="{sid}"]'


SHOWN = "[...document.querySelectorAll('#sessions tbody tr')].map(r => r.dataset.session)"


def test_markdown_is_rendered_and_nothing_in_it_runs(host):
    url = page_base(host)
    token = token_of(host)

    async def main() -> None:
        assert async_playwright is not None
        async with async_playwright() as pw:
            browser = await _browser(pw)
            errors: list[str] = []
            try:
                page = await _page(browser, errors)
                await page.goto(f"{url}?token={token}")
                # The prompt carries markup too: shown as text, never parsed.
                sid = await start_in_page(
                    page, {"prompt": "#md <img src=y onerror=window.__xss=7>"})
                await page.goto(f"{url}s/{sid}")
                await page.wait_for_selector(".terminal.DONE")
                md = page.locator("#log .text .md").first
                assert await md.locator("h1").inner_text() == "Findings"
                assert await md.locator("strong").inner_text() == "disk"
                assert await md.locator("li").count() == 2
                assert "df -h /" in await md.locator("pre code").inner_text()
                assert "```" not in await md.inner_text()  # the fence is a block, not text
                assert "<img src=y" in await page.inner_text(".prompt")
                dangerous = await page.evaluate("""() => ({
                  xss: window.__xss ?? null,
                  scripts: document.querySelectorAll('#log script').length,
                  frames: document.querySelectorAll('#log iframe').length,
                  handlers: [...document.querySelectorAll('#log *')].filter(
                    e => [...e.attributes].some(a => a.name.startsWith('on'))).length,
                  jsLinks: [...document.querySelectorAll('#log a')].filter(
                    a => (a.getAttribute('href') || '').trim().toLowerCase()
                      .startsWith('javascript')).length,
                  promptImages: document.querySelectorAll('#log .prompt img').length,
                })""")
                assert dangerous == {"xss": None, "scripts": 0, "frames": 0, "handlers": 0,
                                     "jsLinks": 0, "promptImages": 0}, dangerous
                # Every event has its time; the run its totals (the offline model is free).
                assert await page.locator("#log .run > .prompt time.at").count() == 1
                assert await page.locator("#log .text time.at").count() >= 1
                totals = await page.inner_text("#log .run .totals")
                assert totals.startswith("run total:") and "$" in totals, totals
                # A type the page has no renderer for (one added since): shown by name
                # with its data, as text, not dropped.
                shown = await page.evaluate("""() => {
                  window.oploopView.render({type: 'NEW_KIND', seq: 1e9, ts: Date.now() / 1000,
                    data: {note: '<b>as text</b>'}});
                  const box = [...document.querySelectorAll('#log .event')].pop();
                  return [box.querySelector('.kind').textContent, box.textContent,
                          box.querySelectorAll('b').length];
                }""")
                assert shown[0] == "NEW_KIND" and "<b>as text</b>" in shown[1] and shown[2] == 0
                assert not errors, errors
            finally:
                await browser.close()

    asyncio.run(main())


def test_a_running_tool_shows_its_elapsed_time(host):
    url = page_base(host)
    token = token_of(host)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    async def main() -> None:
        assert async_playwright is not None
        async with async_playwright() as pw:
            browser = await _browser(pw)
            errors: list[str] = []
            try:
                page = await _page(browser, errors)
                await page.goto(f"{url}?token={token}")
                sid = await start_in_page(page, {"prompt": "#sleepy check the disk, slowly"})
                await page.goto(f"{url}s/{sid}")
                tool = page.locator("#log .tool.running")
                await tool.wait_for()
                # The elapsed time counts up while the tool runs (a tick a second).
                await page.wait_for_function(
                    "() => /[1-9][.0-9]* s$/.test(document.querySelector("
                    "'#log .tool.running .elapsed')?.textContent ?? '')")
                assert "running" in await tool.inner_text()
                # What the command printed (df, before its sleep) is in its card while it
                # still runs: TOOL_OUTPUT streamed into the page, before TOOL_END.
                live = page.locator("#log .tool.running .live pre")
                await live.wait_for()
                await page.wait_for_function(
                    "() => /Filesystem/.test(document.querySelector("
                    "'#log .tool.running .live pre')?.textContent ?? '')")
                await page.screenshot(path=str(ARTIFACTS / "session-running-tool.png"))
                await page.click("#cancel-ui")
                await page.wait_for_selector(".terminal.CANCELLED")
                assert await page.locator("#log .tool.running").count() == 0
                # A cancelled tool reports the time it ran (over a second), not 0 ms, and
                # /metrics buckets it so.
                head = await page.inner_text("#log .tool .head")
                assert "failed" in head and head.endswith(" s"), head
                metrics = await page.evaluate("fetch('/metrics').then(r => r.text())")
                buckets = {line.split('le="')[1].split('"')[0]: float(line.split()[-1])
                           for line in metrics.splitlines() if line.startswith(
                               'oploop_tool_call_duration_seconds_bucket{') and
                           'tool="shell"' in line}
                assert buckets["+Inf"] - buckets["1.0"] >= 1, buckets
                assert not errors, errors
            finally:
                await browser.close()

    asyncio.run(main())


def test_the_list_has_its_columns_search_filters_and_delete(host):
    url = page_base(host)
    token = token_of(host)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    async def main() -> None:
        assert async_playwright is not None
        async with async_playwright() as pw:
            browser = await _browser(pw)
            errors: list[str] = []
            try:
                page = await _page(browser, errors)
                await page.goto(f"{url}?token={token}")
                first = await start_in_page(page, {"prompt": "#md summarise the zebra report"})
                second = await start_in_page(page, {"prompt": "#md list the quokka files"})
                running = await start_in_page(page, {"prompt": "#sleepy wait for the pelican"})
                await page.goto(url)
                await page.wait_for_function(
                    f"""() => document.querySelector('{_row(running)} .state')?.textContent
                          === 'running' && [...document.querySelectorAll(
                          '{_row(first)} .state, {_row(second)} .state')].length === 2
                          && [...document.querySelectorAll(
                          '{_row(first)} .state, {_row(second)} .state')]
                          .every(e => e.textContent === 'idle')""")
                heads = await page.evaluate(
                    "[...document.querySelectorAll('#sessions thead th')].map(e => e.textContent)")
                assert heads == ["title", "state", "agent", "started", "duration", "turns",
                                 "tokens", "cost", ""]
                # Newest first: the three just started lead, the last one on top.
                order = await page.evaluate(SHOWN)
                assert order[:3] == [running, second, first], order
                cells = await page.locator(_row(second)).evaluate(
                    "r => [...r.cells].map(c => c.innerText)")
                title, state, agent, started, took, turns, tokens, cost, _ = cells
                assert title.startswith("#md list the quokka files") and second in title
                listed = await page.evaluate("fetch('/api/sessions').then(r => r.json())")
                summary = next(x for x in listed["sessions"] if x["session"] == second)
                usage = summary["usage"]
                # The cost as the host prices it (`actors/usage.py`), the tokens all kinds.
                assert (state, agent, turns, cost) == (
                    "idle", "default", "1", money(usage["cost_usd"])), cells
                assert usage["cost_usd"] is not None and usage["cost_usd"] > 0, usage
                assert tokens == short_count(sum(v for k, v in usage.items()
                                                 if k.endswith("_tokens"))), cells
                assert started.endswith("s ago") and took.endswith(("ms", " s")), cells
                assert summary["title"] == "#md list the quokka files", summary
                assert summary["ended"] >= summary["started"] > 0, summary
                hover = await page.locator(f"{_row(second)} time").get_attribute("title")
                assert hover and any(ch.isdigit() for ch in hover)
                body = await page.inner_text("body")
                for bad in ("Invalid Date", "NaN", "undefined", "null"):
                    assert bad not in body, body
                await page.screenshot(path=str(ARTIFACTS / "sessions-list.png"))
                # Search and filters.
                await page.fill("#search", "quokka")
                assert await page.evaluate(SHOWN) == [second]
                await page.fill("#search", "")
                await page.select_option("#filter-state", "running")
                shown = await page.evaluate(SHOWN)
                assert running in shown and first not in shown and second not in shown
                await page.select_option("#filter-state", "")
                await page.select_option("#filter-agent", "default")
                assert {first, second, running} <= set(await page.evaluate(SHOWN))
                await page.select_option("#filter-agent", "")
                # Delete, confirmed: gone from the list and from the host. A running one
                # cannot be deleted (its button is off; the API says why).
                assert await page.locator(f"{_row(running)} button.delete").is_disabled()
                page.once("dialog", lambda d: asyncio.ensure_future(d.accept()))
                await page.click(f"{_row(first)} button.delete")
                await page.locator(_row(first)).wait_for(state="detached")
                status = await page.evaluate(f"fetch('/api/sessions/{first}').then(r => r.status)")
                assert status == 404
                refused = await page.evaluate(
                    f"fetch('/api/sessions/{running}', {{method: 'DELETE'}})"
                    ".then(async r => [r.status, await r.json()])")
                assert refused[0] == 409 and "running" in refused[1]["message"], refused
                # Dismissed: nothing is deleted.
                asked: list[str] = []

                async def dismiss(dialog) -> None:
                    asked.append(dialog.message)
                    await dialog.dismiss()

                page.once("dialog", lambda d: asyncio.ensure_future(dismiss(d)))
                await page.click(f"{_row(second)} button.delete")
                await page.wait_for_function("() => true")
                assert asked and second in asked[0]
                assert await page.evaluate(
                    f"fetch('/api/sessions/{second}').then(r => r.status)") == 200
                cancelled = await page.evaluate(
                    f"fetch('/api/sessions/{running}/cancel', {{method: 'POST', "
                    "headers: {'Content-Type': 'application/json'}, body: '{}'})"
                    ".then(r => r.status)")
                assert cancelled == 200
                assert not errors, errors
            finally:
                await browser.close()

    asyncio.run(main())
