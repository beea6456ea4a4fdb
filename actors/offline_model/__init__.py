"""The offline model: a local server speaking the Anthropic Messages API.

It is the embedded default model when no API key or base URL is configured,
and the scripted model of tests, demos and benchmarks. Clients reach it with
the real SDK::

    AsyncAnthropic(base_url=f"http://127.0.0.1:{port}", api_key="offline", max_retries=0)

`POST /v1/messages` answers, JSON or SSE (`"stream": true`), keep-alive, and
`POST /v1/messages/count_tokens` counts. A request over the context window
(`OPLOOP_OFFLINE_CONTEXT`, default 200000 tokens; a token per four characters of
each block's JSON) is refused as the API does: 400 `invalid_request_error`
"prompt is too long: N tokens > M maximum". A compaction's summary request
(`rules.SUMMARY_MARK`) is answered by the rules with a deterministic summary.
Each request is answered by the next turn of a scripted scenario if one is
loaded and the session still has turns, else by the rule engine (`rules`):
prompts like "list /tmp and read README.md, then run `date`" become
`tool_use` blocks for the tools the request offers; tool results are
reported back in a few lines; anything else gets a short help text.

Modules: `intents` (prompt → tool calls), `rules` (request → reply), `wire`
(API shapes, SSE events), `scenario` (scenario files), `plan` (request →
actions, no I/O), `server` (h11 over asyncio), `cli` (the process).

Scenario files
--------------
JSON: a list of turns, or ``{"turns": [...], "scripts": {name: [...]},
"description": "..."}``. A session whose first prompt contains ``#name`` plays
``scripts[name]`` instead of ``turns``, so one server can script many tests. Every
session (the request's ``metadata.user_id``; requests without one share a
default session) plays the turns from the first, one turn per request; when
its turns run out, the rules answer. A turn is one of:

``"rules"``
    Let the rule engine answer this turn.

``{"reply": ..., "stop_reason": ..., "delay_s": ...}``
    A scripted reply. ``reply`` is a string (one text block), ``"rules"``, or a
    list of content blocks in response form: ``{"type": "text", "text"}``,
    ``{"type": "thinking", "thinking", "signature"?}``,
    ``{"type": "tool_use", "name", "input": {...}, "id"?}`` (missing ids and
    signatures are filled in deterministically). ``stop_reason`` defaults to
    ``tool_use`` when a tool_use block is present, else ``end_turn``.
    ``delay_s`` pauses before every streamed delta (default: the server's).

``{"fault": "status", "status": 529, "headers": {...}, "error": {...}}``
    An HTTP error: status 400–599, extra headers (e.g. ``"retry-after": "1"``
    or ``"retry-after-ms": "250"``), and the ``error`` object of the API's error
    JSON (``{"type": "overloaded_error", "message": "..."}``; ``type`` defaults
    from the status, ``message`` to a generic one).

``{"fault": "drop", "after_events": 3}``
    Stream ``after_events`` SSE events (``message_start`` and ``ping`` count),
    then close the connection without the final zero-length chunk. Not
    streaming: close without any response.

``{"fault": "stall", "seconds": 2, "after_events": 3, "ping_every_s": 0.5, "then": "continue"}``
    After ``after_events`` events send no content for ``seconds`` (only pings
    every ``ping_every_s`` if given), then ``continue`` the stream or ``drop``
    it. Not streaming: the response is delayed (or dropped). ``after_events: 0``
    stalls right after the headers, ``1`` after ``message_start``; a large
    ``seconds`` with pings is "pings forever"; ``"before_headers": true`` sends
    nothing at all, not even headers (no pings then). A short stall inside a
    block that then continues is a pause.

``{"fault": "malformed", "what": "bad_json", "after_events": 3}``
    Bad input a client must survive, spliced in after ``after_events`` events:
    ``bad_json`` (an event whose data is not JSON), ``unknown_event`` (an event
    type the API does not define; the stream goes on and a client ignores it),
    ``orphan_delta`` (a ``content_block_delta`` for index 99, never started),
    ``tool_input_not_object`` (every ``tool_use`` block's input is ``[1, 2]``).
    Not streaming: a body cut mid-JSON (``bad_json``, ``orphan_delta``), the
    list input, or a plain reply.

``{"fault": "truncate", "after_events": 5}``
    End the chunked body cleanly but early: always before ``message_stop``;
    by default (no ``after_events``) just before ``message_delta``, so the SDK's
    final message has ``stop_reason`` None. Not streaming: a 200 Message with
    ``stop_reason`` null.

``{"fault": "error_event", "after_events": 3, "error": {...}}``
    A 200 stream that sends ``event: error`` with
    ``{"type": "error", "error": {...}}`` (default ``overloaded_error``) after
    ``after_events`` events, then ends. Not streaming: the matching HTTP status
    (529 overloaded, 429 rate limit, else 500).

Mid-stream faults (``drop``, ``stall``, ``truncate``, ``error_event``, ``malformed``) stream
the rules' answer unless they carry their own ``reply``/``stop_reason``/
``delay_s``. ``after_events`` defaults to 3 (after the first
``content_block_start``). Unknown keys and wrong types are errors: loading
raises `ScenarioError` naming the file, the turn (``turns[2].status``) and
the problem.
"""


from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (the "X as X" form: re-exported, as __getattr__ does at run time)
    from actors.offline_model.cli import main as main
    from actors.offline_model.scenario import Scenario as Scenario
    from actors.offline_model.scenario import ScenarioError as ScenarioError
    from actors.offline_model.scenario import load_scenario as load_scenario
    from actors.offline_model.scenario import parse_scenario as parse_scenario
    from actors.offline_model.server import OfflineServer as OfflineServer
    from actors.offline_model.server import ServerStatistics as ServerStatistics
    from actors.offline_model.server import start_server as start_server

# The names are loaded on first use: the llm caller's scripted backend plays
# scenarios (`scenario`, `plan`, `wire`) and has no use for the HTTP server, h11
# and the command line, which importing the package would otherwise load.
_HOMES = {
    "main": "cli",
    "Scenario": "scenario", "ScenarioError": "scenario", "load_scenario": "scenario",
    "parse_scenario": "scenario",
    "OfflineServer": "server", "ServerStatistics": "server", "start_server": "server",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # once loaded, a plain module attribute
    return value
