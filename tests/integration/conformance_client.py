"""The client command of the MCP conformance suite's client scenarios
(`conformance client --command "python conformance_client.py" --scenario S`): oploop's
own MCP client, as an executor runs it, against the scenario's server.

The suite runs it with the scenario's server URL as its last argument and the scenario
in `MCP_CONFORMANCE_SCENARIO`. It does what oploop does with a server `conf = {url}`:

- `auth/...`: first `oploop mcp login conf` (`actors.mcp.oauth.login`: discovery,
  registration, PKCE, the loopback redirect), the "browser" being this script, which
  opens the printed URL and follows its redirect to the loopback callback (the suite's
  authorization server approves at once, as a person would);
- then an executor's `McpHub` (`initialize`, `tools/list`; the OAuth tokens from the
  login), and a call of every listed tool, arguments made from its schema, inside
  `Elicitations.calling` as a tool job would be: a server's question goes to the
  "operator", who accepts the form as offered (its fields' defaults: what
  `oploop answer SESSION ID` with no field sends, `actors.mcp.forms.checked`).

Prints each call's outcome; exits 0 unless the login or the server's start failed.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by the suite as is)

import httpx2  # noqa: E402

from actors.mcp.config import parse_servers  # noqa: E402
from actors.mcp.elicitation import Elicitations  # noqa: E402
from actors.mcp.forms import FormError, checked  # noqa: E402
from actors.mcp.hub import McpHub  # noqa: E402
from actors.mcp.oauth import login  # noqa: E402
from bus.mcpwire import Elicit, ElicitAnswer  # noqa: E402
from bus.messages import Envelope, ToolJob  # noqa: E402

SERVER = "conf"
CALL_S = 20.0


def arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """A value for each required property, of its type (the scenarios' tools take
    numbers, or nothing)."""
    properties = schema.get("properties") or {}
    out: dict[str, Any] = {}
    for key in schema.get("required") or ():
        kind = (properties.get(key) or {}).get("type")
        out[key] = {"number": 2, "integer": 2, "boolean": True, "array": [],
                    "object": {}}.get(kind, "conformance")
    return out


class Operator:
    """The person answering the server's questions: accepts each form as offered."""

    def __init__(self) -> None:
        self.elicitations = Elicitations(self.send)

    def send(self, env: Envelope, body: Any) -> None:
        """What the executor sends the supervisor for a job: a question is answered."""
        if isinstance(body, Elicit):
            try:
                answer = ElicitAnswer(body.id, "accept", checked(body.schema, {}))
            except FormError as exc:
                print(f"question {body.id}: declined ({exc})", flush=True)
                answer = ElicitAnswer(body.id, "decline", {})
            asyncio.get_running_loop().call_soon(self.elicitations.answered, answer)


async def open_in_browser(url: str) -> None:
    """Open the authorization URL and follow its redirects to the loopback callback."""
    async with httpx2.AsyncClient(follow_redirects=True, timeout=CALL_S) as http:
        response = await http.get(url)
        print(f"authorization: HTTP {response.status_code} at {response.url}", flush=True)


async def main(url: str, scenario: str) -> int:
    home = Path(tempfile.mkdtemp(prefix="opconf-"))
    config = parse_servers({SERVER: {"url": url, "timeout_s": CALL_S,
                                     "start_timeout_s": CALL_S}}, "conformance")[SERVER]
    browsing: set[asyncio.Task[None]] = set()
    if scenario.startswith("auth/"):
        def say(link: str) -> None:
            task = asyncio.get_running_loop().create_task(open_in_browser(link))
            browsing.add(task)  # (kept until done)
            task.add_done_callback(browsing.discard)

        tools = await login(config, home, say, wait_s=CALL_S)
        print(f"logged in: {tools} tool(s)", flush=True)
    operator = Operator()
    hub = McpHub({SERVER: config}, None, lambda: None, run_dir=home / "run",
                 session_options=lambda name: {
                     "elicitation_callback": operator.elicitations.callback(name)})
    starting = asyncio.create_task(hub.start_all())
    try:
        async with asyncio.timeout(CALL_S):
            await hub.settled.wait()
        if not hub.specs():
            print(f"no tools: {hub.statuses()}", flush=True)
        ids = itertools.count(1)
        for spec in hub.specs():
            job = f"job-{next(ids)}"
            args = arguments(spec.input_schema)
            env = Envelope(ToolJob(spec.name, args, str(home), CALL_S, [], ""), id=job,
                           sid="conformance", job=job)
            with operator.elicitations.calling(SERVER, env, CALL_S):
                outcome = await hub.call(spec.name, args, CALL_S)
            print(f"{spec.name}: {'error: ' if outcome.is_error else ''}{outcome.output}",
                  flush=True)
    finally:
        starting.cancel()
        await hub.aclose()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[-1], os.environ.get("MCP_CONFORMANCE_SCENARIO", ""))))
