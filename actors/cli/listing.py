"""Sessions as the CLI shows them: the columns of the web list (`oploop sessions`), and
times for people (`oploop inspect`), from the supervisor's session summaries."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from actors.usage import Usage, money, short_count

#: The columns of `oploop sessions`, as the web list has them.
COLUMNS = ("SESSION", "STATE", "AGENT", "STARTED", "DURATION", "TURNS", "TOKENS", "COST",
           "TITLE")
#: Characters of a title shown in the table (the summary keeps more).
TITLE_SHOWN = 60


def _epoch(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None


def ago(ts: Any, now: float | None = None) -> str:
    """How long ago `ts` (seconds since the epoch) was: "12 s ago", "3 min ago",
    "5 h ago", "2 d ago", else the date; "" if `ts` is not a time."""
    at = _epoch(ts)
    if at is None:
        return ""
    s = max(0.0, (time.time() if now is None else now) - at)
    if s < 60:
        return f"{s:.0f} s ago"
    if s < 3600:
        return f"{s / 60:.0f} min ago"
    if s < 86400:
        return f"{s / 3600:.0f} h ago"
    if s < 7 * 86400:
        return f"{s / 86400:.0f} d ago"
    return time.strftime("%Y-%m-%d", time.localtime(at))


def when(ts: Any, now: float | None = None) -> str:
    """An absolute local time with how long ago: "2026-12-06 10:21:10 (5 min ago)"."""
    at = _epoch(ts)
    if at is None:
        return "-"
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(at))} ({ago(at, now)})"


def took(seconds: Any) -> str:
    """A duration for people: 850 ms, 4.2 s, 3 min 5 s, 2 h 10 min."""
    if not isinstance(seconds, int | float) or seconds < 0:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {seconds % 60:.0f} s"
    return f"{int(seconds // 3600)} h {(seconds % 3600) / 60:.0f} min"


def run_time(s: dict[str, Any], now: float | None = None) -> float:
    """How long the session has run: its finished runs, and the open one so far."""
    total = s.get("duration_s")
    total = float(total) if isinstance(total, int | float) else 0.0
    started = _epoch(s.get("run_started"))
    if s.get("state") == "running" and started is not None:
        total += max(0.0, (time.time() if now is None else now) - started)
    return total


def row(s: dict[str, Any], now: float | None = None) -> tuple[str, ...]:
    """One session's cells, in `COLUMNS` order."""
    usage = Usage.from_dict(s.get("usage"))
    title = str(s.get("title") or "")
    if len(title) > TITLE_SHOWN:
        title = title[:TITLE_SHOWN - 1] + "…"
    return (str(s.get("session", "")), str(s.get("state", "")), str(s.get("agent", "")),
            ago(s.get("started", s.get("created")), now), took(run_time(s, now)),
            str(s.get("turns", 0)), short_count(usage.tokens), money(usage.cost) or "?",
            title)


def newest_first(sessions: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sessions, the most recently started first."""
    return sorted(sessions, key=lambda s: _epoch(s.get("started", s.get("created"))) or 0.0,
                  reverse=True)


def table(sessions: Iterable[dict[str, Any]], now: float | None = None) -> list[str]:
    """`oploop sessions`: a header and one aligned line per session, newest first."""
    rows = [COLUMNS, *(row(s, now) for s in newest_first(sessions))]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    numeric = {"DURATION", "TURNS", "TOKENS", "COST"}
    lines = []
    for r in rows:
        cells = [r[i].rjust(widths[i]) if COLUMNS[i] in numeric else r[i].ljust(widths[i])
                 for i in range(len(widths))]
        lines.append(("  ".join(cells) + "  " + r[-1]).rstrip())
    return lines
