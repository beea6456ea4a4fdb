"""The `[router]`, `[limits]` and `[retention]` tables of `oploop.toml`.

Plain settings with their defaults, each read by `record` and checked here; no
other part of oploop is imported (`actors.mcp` takes `Limits` from here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors import bounds

from .checks import ConfigError, as_table, checked, no_unknown, parse_duration, parse_size, record


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """The intent router's cheap classification call."""

    enabled: bool = False
    model: str = "haiku"
    max_tokens: int = 8
    #: The classifier fails fast: this many attempts (one retry) within this long,
    #: then the run goes on as AGENT (the ROUTE event says why).
    attempts: int = 2
    timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class Limits:
    """What the api refuses up front, with a clear error, and what is cut where it enters."""

    max_prompt_chars: int = 1_000_000
    max_running_sessions: int = 1_000
    #: Disk space (MB) the session log keeps for itself: new runs are refused below
    #: it, and a reserve file of this size is given up to journal the ends of the
    #: runs under way when the disk fills (0: no reserve).
    journal_reserve_mb: int = 64
    #: A session's state is written (a compaction: its small fields, and the messages
    #: new since the last one) once this many KB of records were logged since the
    #: last one, mid-run or at a run's end: a load or a restart folds at most about
    #: this much (0: never mid-run, and at each run's end with as many bytes of records
    #: since as the state took). Each message is written once whatever this is; a
    #: smaller value rewrites the state's digest list more often.
    compact_every_kb: int = 256
    #: What enters a history from outside the built-ins is cut to these, with a note
    #: saying how much was cut (`actors.bounds`): an MCP result's text and an
    #: `ask_machine` answer (characters; the host also cuts every tool result it takes
    #: to this, and 1 KiB of the tools' own notes); the MCP tools one executor offers, each
    #: description (characters), each input schema (characters of JSON; a tool over it
    #: is left out, and its server's status says so).
    max_result_chars: int = bounds.MAX_RESULT_CHARS
    max_tools: int = bounds.MAX_TOOLS
    max_tool_description_chars: int = bounds.MAX_TOOL_DESCRIPTION_CHARS
    max_tool_schema_chars: int = bounds.MAX_TOOL_SCHEMA_CHARS


@dataclass(frozen=True, slots=True)
class Retention:
    """Which finished sessions the host deletes, log and all (0: no limit on that rule).

    The defaults keep a busy host's disk bounded without losing what a person
    still looks at: a month of history, the 1,000 most recent sessions (at the
    ~5 KB of a short session, 5 MB; at the several MB of a long tool-heavy one, a
    few GB), and whatever those are, never more than 1 GiB on disk, which a
    laptop's disk takes without notice. Checked every minute: a host starting
    100 sessions a second overshoots `max_sessions` by at most a minute's worth.
    A running session is never deleted.
    """

    max_age_s: float = 30 * 86_400.0
    max_sessions: int = 1_000
    max_bytes: int = 1 << 30
    every_s: float = 60.0


def parse_limits(raw: Any, source: str) -> Limits:
    """`[limits]`: every cut at least 1."""
    limits: Limits = record(Limits, raw, source, "limits")
    for name in ("max_result_chars", "max_tools", "max_tool_description_chars",
                 "max_tool_schema_chars"):
        if getattr(limits, name) < 1:
            raise ConfigError(f"{source}: limits.{name}: must be at least 1")
    return limits


def parse_retention(raw: Any, source: str) -> Retention:
    """`[retention]`: durations and sizes as `30d`, `1GiB`."""
    table = as_table(raw, source, "retention")
    no_unknown(table, {"max_age", "max_sessions", "max_bytes", "every"}, source, "retention")
    default = Retention()

    def read(key: str, parse: Any, fallback: Any) -> Any:
        try:
            return parse(table.get(key, fallback))
        except ValueError as exc:
            raise ConfigError(f"{source}: retention.{key}: {exc}") from None

    out = Retention(
        max_age_s=read("max_age", parse_duration, default.max_age_s),
        max_sessions=checked(int, table.get("max_sessions", default.max_sessions), source,
                            "retention.max_sessions"),
        max_bytes=read("max_bytes", parse_size, default.max_bytes),
        every_s=read("every", parse_duration, default.every_s),
    )
    if out.max_sessions < 0:
        raise ConfigError(f"{source}: retention.max_sessions: must be at least 0")
    if out.every_s <= 0:
        raise ConfigError(f"{source}: retention.every: must be more than 0 s")
    return out
