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
                    assert await p.inner_text(".said") == "✉ local: a note from the page"
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
                text = await page.evaluate(
                    "[...document.querySelectorAll('#log .text')].map(e => e.textContent)")
                assert text[0] == BIG
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
