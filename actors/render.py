"""How the CLI shows events: readable text in a terminal, or JSON lines."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO


class Renderer:
    """Prints events as they come and remembers how the run ended."""

    def __init__(self, json_lines: bool = False, out: TextIO | None = None) -> None:
        self.json_lines = json_lines
        self.out = out or sys.stdout
        self.terminal: str | None = None
        self._mid_line = False
        #: Text of the model call in flight was printed (void if a RETRY follows).
        self._streamed = False

    def event(self, ev: dict[str, Any]) -> None:
        """Show one event."""
        kind, data = ev["type"], ev["data"]
        if kind in ("DONE", "ERROR", "CANCELLED"):
            self.terminal = kind
        if self.json_lines:
            print(json.dumps(ev, default=repr), file=self.out, flush=True)
            return
        if kind == "TOKEN":
            self._write(data.get("text", ""))
            self._streamed = True
            return
        if kind == "THINKING":
            self._write(f"\x1b[2m{data.get('text', '')}\x1b[0m" if self.out.isatty()
                        else data.get("text", ""))
            self._streamed = True
            return
        if kind == "RETRY" and self._streamed:
            self._write(" [void]")  # the failed attempt's text, printed already, is void
        self._streamed = False
        line = self._line(kind, data)
        if line is not None:
            self._end_line()
            print(line, file=self.out, flush=True)

    def _line(self, kind: str, data: dict[str, Any]) -> str | None:
        if kind == "TOOL_START":
            return f"→ {data['name']} {_brief(data.get('input'))}"
        if kind == "TOOL_END":
            mark = "✗" if data.get("is_error") else "✓"
            first = (data.get("output") or "").strip().splitlines()
            tail = f": {first[0][:100]}" if first and data.get("is_error") else ""
            return f"  {mark} {data['name']} ({data.get('duration_ms', 0):.0f} ms){tail}"
        if kind == "RETRY":
            return (f"↻ attempt {data['attempt']} failed ({data['error']}); retrying in "
                    f"{data['wait_s']:.1f} s — text streamed by that attempt is void")
        if kind == "DONE":
            return f"— done: {data['turns']} turn(s), stop {data['stop']}"
        if kind == "ERROR":
            return f"— error: {data['error']}: {data['message']}"
        if kind == "CANCELLED":
            return f"— cancelled ({data.get('mode')}): {data.get('reason', '')}"
        return None

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        self._mid_line = bool(text) and not text.endswith("\n")

    def _end_line(self) -> None:
        if self._mid_line:
            self.out.write("\n")
            self._mid_line = False

    def exit_status(self) -> int:
        """0 done, 130 cancelled, 1 error (or no terminal event)."""
        return {"DONE": 0, "CANCELLED": 130}.get(self.terminal or "", 1)


def _brief(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 1] + "…"
