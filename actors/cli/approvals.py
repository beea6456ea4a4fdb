"""Approvals at the terminal: `oploop run` and `watch` ask about a call waiting for
approval (`approve? [y/N/a(lways for this session)]`), or approve it unasked
(`--yes`). With `--json`, or when stdin or stdout is not a terminal, nothing is
asked: the decision comes from another command or program (`oploop approve`)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from bus.client import Client
from bus.errors import RemoteError

#: The question, as the issue spells it.
QUESTION = "approve? [y/N/a(lways for this session)] "

#: What the model is told when the person at the terminal says no.
DENIED_HERE = "denied at the terminal"


def interactive(json_lines: bool) -> bool:
    """Whether to ask: text output, and a person at both ends of the terminal."""
    return not json_lines and sys.stdin.isatty() and sys.stdout.isatty()


def describe(data: dict[str, Any]) -> str:
    """The call waiting, as shown above the question."""
    args = json.dumps(data.get("input"), ensure_ascii=False)
    if len(args) > 300:
        args = args[:300] + " …"
    rule = f" (rule {data['rule']!r})" if data.get("rule") else ""
    return f"? {data.get('tool')} {args}{rule} waits for approval [{data.get('call_id')}]"


def answer_of(line: str) -> str:
    """"approve", "always" or "deny" from what was typed (anything else: deny)."""
    word = line.strip().lower()
    if word in ("y", "yes"):
        return "approve"
    if word in ("a", "always"):
        return "always"
    return "deny"


async def decide_here(client: Client, session: str, data: dict[str, Any], *,
                      yes: bool) -> None:
    """Ask about (or, `yes`, approve) one `APPROVAL_REQUESTED` call and send the
    decision; one taken elsewhere first is reported, not an error."""
    call_id = str(data.get("call_id", ""))
    if yes:
        answer = "approve"
    else:
        print(describe(data), flush=True)
        print(QUESTION, end="", flush=True)
        answer = answer_of(await asyncio.to_thread(sys.stdin.readline))
    try:
        if answer == "deny":
            await client.deny(session, [call_id], reason=DENIED_HERE)
        else:
            await client.approve(session, [call_id], always=answer == "always")
    except RemoteError as exc:  # decided elsewhere first, timed out, the run ended
        print(f"oploop: {exc.message}", file=sys.stderr, flush=True)
