"""The `ask_machine` tool as the model sees it, and the checking of its input."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.ask.peers import Peer, describe

NAME = "ask_machine"

#: Longest prompt sent to another host (its own `limits.max_prompt_chars` applies too).
MAX_PROMPT_CHARS = 100_000


def spec(peers: Mapping[str, Peer]) -> dict[str, Any]:
    """The tool's spec (wire form, as executors announce theirs), naming the peers."""
    names = sorted(peers)
    return {
        "name": NAME,
        "description": (
            "Ask the agent of another machine (an oploop host) to do something there, and "
            "get its final answer. Its progress is shown to the user as it happens. "
            f"Machines: {', '.join(names)}. Calls to several machines run concurrently."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "machine": {"type": "string", "enum": names,
                            "description": "the machine to ask"},
                "prompt": {"type": "string",
                           "description": "what its agent should do, self-contained"},
            },
            "required": ["machine", "prompt"],
            "additionalProperties": False,
        },
        "tags": ["machines"],
        # Not an executor's risky tool: nothing runs here; the other host confines
        # what its agent does with its own sandbox and rules.
        "risky": False,
        "core": False,
    }


def check(call_input: Any, peers: Mapping[str, Peer]) -> tuple[Peer, str] | str:
    """(peer, prompt) of a well-formed call, else the error to answer it with."""
    if not isinstance(call_input, Mapping):
        return f"{NAME}: the input must be an object with machine and prompt"
    extra = sorted(set(call_input) - {"machine", "prompt"})
    if extra:
        return f"{NAME}: unknown input field(s) {', '.join(map(str, extra))}"
    machine, prompt = call_input.get("machine"), call_input.get("prompt")
    if not isinstance(machine, str) or not machine:
        return f"{NAME}: machine is required (one of: {describe(peers)})"
    peer = peers.get(machine)
    if peer is None:
        return f"{NAME}: unknown machine {machine!r}; configured peers: {describe(peers)}"
    if not isinstance(prompt, str) or not prompt.strip():
        return f"{NAME}: prompt is required (a non-empty string)"
    if len(prompt) > MAX_PROMPT_CHARS:
        return f"{NAME}: prompt of {len(prompt)} chars exceeds {MAX_PROMPT_CHARS}"
    return peer, prompt
