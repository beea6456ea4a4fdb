"""How the CLI shows events: readable text, the final answer alone (`quiet`), or
JSON lines. One method per event kind (`_on_<KIND>`); kinds without one are not
shown as text. Colour only on a terminal, and never under `NO_COLOR`."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from typing import Any, TextIO

from actors.usage import describe, short_count, total_line
from bus.vocab import TERMINAL, EventType


def usage_suffix(data: dict[str, Any]) -> str:
    """What a run's end adds about tokens and cost ("" for none): the one place the
    `DONE`/`ERROR`/`CANCELLED` lines take it from (its totals on a line of their own)."""
    return total_line(data)


class Renderer:
    """Prints events as they come and remembers how the run ended.

    `prompts`: show each run's prompt (`SESSION_START`): a replay (`watch`) shows
    them; `run` does not repeat what was just typed. `tool_output`: show what
    running tools print (`TOOL_OUTPUT`; `--quiet-tools` hides it, JSON lines too).
    """

    def __init__(self, json_lines: bool = False, out: TextIO | None = None, *,
                 quiet: bool = False, prompts: bool = False, tool_output: bool = True) -> None:
        self.json_lines = json_lines
        self.quiet = quiet
        self.prompts = prompts
        self.tool_output = tool_output
        #: A running call's output not shown yet: the start of a line, per (call, stream).
        self._partial: dict[tuple[str, str], str] = {}
        self.out = out or sys.stdout
        self.color = _color(self.out)
        self.terminal: str | None = None
        self._mid_line = False
        #: Tools running now (tool_use_id -> name, start), for the progress line.
        self._running: dict[str, tuple[str, float]] = {}
        self._status = False  # a progress line is on screen (to be erased)
        self.progress = self.color and not json_lines and not quiet
        #: Text of the model call in flight was printed (void if a RETRY follows).
        self._streamed = False

    def event(self, ev: dict[str, Any]) -> None:
        """Show one event."""
        kind, data = ev["type"], ev["data"]
        if kind in TERMINAL:
            self.terminal = kind
        if kind == EventType.TOOL_OUTPUT and not self.tool_output:
            return
        if self.json_lines:
            print(json.dumps(ev, default=repr), file=self.out, flush=True)
            return
        if self.quiet:
            self._quiet(kind, data)
            return
        show = getattr(self, f"_on_{kind}", None)
        if show is not None:
            self._clear_status()
            show(data)
        streamed = kind in (EventType.TOKEN, EventType.THINKING)
        self._streamed = streamed or (self._streamed and show is None)

    def tick(self) -> None:
        """Redraw the progress line of running tools (on a terminal; called every
        fraction of a second while a run streams)."""
        if not self.progress or not self._running or self._mid_line:
            return
        now = time.monotonic()
        shown = ", ".join(f"{name} {now - t0:.0f} s" for name, t0 in self._running.values())
        self.out.write(f"\r\x1b[K{self._dim(f'  … {shown}')}")
        self.out.flush()
        self._status = True

    def _clear_status(self) -> None:
        if self._status:
            self.out.write("\r\x1b[K")
            self._status = False

    # -- quiet: the final answer, and why there is none ------------------------------------

    def _quiet(self, kind: str, data: dict[str, Any]) -> None:
        if kind == EventType.DONE:
            text = data.get("text") or ""
            self.out.write(text if text.endswith("\n") or not text else text + "\n")
            self.out.flush()
        elif kind in (EventType.ERROR, EventType.CANCELLED):  # on stderr (stdout: the answer)
            line = self._terminal_line(kind, data)
            print(line, file=sys.stderr, flush=True)

    # -- text ----------------------------------------------------------------------------

    def _on_TOKEN(self, data: dict[str, Any]) -> None:  # noqa: N802 - named after the kind
        self._write(data.get("text", ""))

    def _on_THINKING(self, data: dict[str, Any]) -> None:  # noqa: N802
        self._write(self._dim(data.get("text", "")))

    def _on_SESSION_START(self, data: dict[str, Any]) -> None:  # noqa: N802
        if self.prompts:
            prompt = str(data.get("prompt", ""))
            first = prompt.strip().splitlines()[0] if prompt.strip() else ""
            more = " …" if len(first) > 100 or "\n" in prompt.strip() else ""
            self._line(self._bold(f"› run {data.get('run', '?')}: {first[:100]}{more}"))

    def _on_USER_MESSAGE(self, data: dict[str, Any]) -> None:  # noqa: N802
        text = str(data.get("text", "")).strip()
        first = text.splitlines()[0] if text else ""
        more = " …" if len(first) > 100 or "\n" in text else ""
        self._line(self._bold(f"› {data.get('by', '?')}: {first[:100]}{more}"))

    def _on_RESUMED(self, data: dict[str, Any]) -> None:  # noqa: N802
        self._line(f"↺ resumed ({data.get('reason', '')})")

    def _on_STORE_UNAVAILABLE(self, data: dict[str, Any]) -> None:  # noqa: N802
        self._line(self._dim(f"⏸ the store was unavailable: the session waited "
                             f"({data.get('error', '')})"))

    def _on_STORE_AVAILABLE(self, data: dict[str, Any]) -> None:  # noqa: N802
        down = data.get("down_s")
        took = f" after {down:.1f} s" if isinstance(down, (int, float)) else ""
        self._line(self._dim(f"▶ the store is back{took}: the session goes on"))

    def _on_TOOL_START(self, data: dict[str, Any]) -> None:  # noqa: N802
        self._running[str(data.get("tool_use_id", ""))] = (data["name"], time.monotonic())
        machine = data.get("machine")
        # Said only for a worker machine: the host's own ("local") is the usual case.
        where = f" (on {machine})" if machine and machine != "local" else ""
        self._line(f"→ {data['name']} {_brief(data.get('input'))}{where}")

    def _on_TOOL_OUTPUT(self, data: dict[str, Any]) -> None:  # noqa: N802
        """What a running tool printed, line by line under its `→` line: `  │ ` for
        stdout, `  ! ` for stderr (a line's start waits for its end, or the call's)."""
        key = (str(data.get("call_id", "")), str(data.get("stream", "")))
        text = self._partial.pop(key, "") + str(data.get("text", ""))
        if data.get("cut"):  # the note that the rest is not shown live
            self._tool_lines(key[1], text.rstrip("\n"), note=True)
            return
        whole, _, rest = text.rpartition("\n")
        if rest:
            self._partial[key] = rest
        if whole or text.startswith("\n"):
            self._tool_lines(key[1], whole)

    def _tool_lines(self, stream: str, text: str, note: bool = False) -> None:
        for line in text.split("\n"):
            if note:
                self._line(self._dim(f"  │ {line}"))
            elif stream == "stderr":
                self._line(self._red("  ! ") + line)
            else:
                self._line(self._dim("  │ ") + line)

    def _flush_output(self, call_id: str) -> None:
        """The last unfinished line of each stream of `call_id` (its call ended)."""
        for key in [k for k in self._partial if k[0] == call_id]:
            self._tool_lines(key[1], self._partial.pop(key))

    def _on_TOOL_END(self, data: dict[str, Any]) -> None:  # noqa: N802
        self._flush_output(str(data.get("tool_use_id", "")))
        self._running.pop(str(data.get("tool_use_id", "")), None)
        mark = "✗" if data.get("is_error") else "✓"
        first = (data.get("output") or "").strip().splitlines()
        tail = f": {first[0][:100]}" if first and data.get("is_error") else ""
        self._line(f"  {mark} {data['name']} ({data.get('duration_ms', 0):.0f} ms){tail}")
        for line in str(data.get("for_user") or "").strip().splitlines()[:20]:
            # (what the tool meant for the user only: never sent to the model)
            self._line(self._dim("    │ ") + line[:200])

    def _on_TOOL_PROGRESS(self, data: dict[str, Any]) -> None:  # noqa: N802
        name = self._running.get(str(data.get("call_id", "")), ("tool", 0.0))[0]
        done, total = data.get("progress"), data.get("total")
        amount = f"{done:g}/{total:g}" if isinstance(total, int | float) and total else \
            f"{done:g}" if isinstance(done, int | float) else "?"
        message = str(data.get("message") or "")[:100]
        self._line(self._dim(f"  … {name} {amount}" + (f" {message}" if message else "")))

    def _on_APPROVAL_REQUESTED(self, data: dict[str, Any]) -> None:  # noqa: N802
        self._line(f"? {data.get('tool')} {_brief(data.get('input'))} waits for approval "
                   f"[{data.get('call_id')}]")

    def _on_APPROVAL_DECIDED(self, data: dict[str, Any]) -> None:  # noqa: N802
        verb = "approved" if data.get("decision") == "approve" else "denied"
        always = f", always for {data['always']} in this session" if data.get("always") else ""
        reason = "" if verb == "approved" else f": {data.get('reason', '')}"
        self._line(f"  {verb} by {data.get('by')}{always}{reason} [{data.get('call_id')}]")

    def _on_ELICITATION_REQUESTED(self, data: dict[str, Any]) -> None:  # noqa: N802
        """An MCP server's question: its message, the form's fields (or the page to
        open), and how to answer."""
        ask = data.get("id", "?")
        again = " (again, after a supervisor restart)" if data.get("again") else ""
        self._line(f"? MCP server {data.get('server')} asks{again}: {data.get('message', '')} "
                   f"[{ask}]")
        if data.get("url"):
            self._line(f"  open {data['url']}")
        schema = data.get("schema") if isinstance(data.get("schema"), dict) else {}
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = set(schema.get("required") or ()) if isinstance(
            schema.get("required"), list) else set()
        for name, spec in props.items():
            spec = spec if isinstance(spec, dict) else {}
            kind = spec.get("type", "string")
            choices = spec.get("enum") or [o.get("const") for o in spec.get("oneOf") or ()
                                           if isinstance(o, dict)]
            what = f"{kind}: {', '.join(map(str, choices))}" if choices else kind
            need = ", required" if name in required else ""
            about = f" — {spec['description']}" if spec.get("description") else ""
            if "default" in spec:
                about += f" [default: {spec['default']}]"
            self._line(f"  {name} ({what}{need}){about}")
        self._line(f"  answer: oploop answer SESSION {ask} key=value ... (or --decline, "
                   f"--cancel) within {data.get('timeout_s', '?')} s")

    def _on_ELICITATION_ANSWERED(self, data: dict[str, Any]) -> None:  # noqa: N802
        fields = data.get("fields") or []
        said = f" ({', '.join(map(str, fields))})" if fields else ""
        why = f": {data['reason']}" if data.get("reason") else ""
        self._line(f"  {data.get('action')} by {data.get('by')}{said} [{data.get('id')}]{why}")

    def _on_SAMPLING(self, data: dict[str, Any]) -> None:  # noqa: N802
        usage = describe(data.get("usage"))
        self._line(f"  ⟲ MCP server {data.get('server')} used the model {data.get('model')}"
                   + (f" ({usage})" if usage else "") + f" [{data.get('id')}]")

    def _on_MACHINE_EVENT(self, data: dict[str, Any]) -> None:  # noqa: N802
        """An event of a run on another host (`ask_machine`), indented `  [NAME] …`:
        shown as that host's own viewer would show it, line by line."""
        inner = data.get("event")
        if not isinstance(inner, dict) or not isinstance(inner.get("data"), dict):
            return
        buf = io.StringIO()
        sub = Renderer(out=buf, prompts=False)
        sub.color = sub.progress = False
        try:
            sub.event({"type": str(inner.get("type", "")), "data": inner["data"]})
        except (KeyError, TypeError, ValueError):  # a peer's odd event: shown by kind
            buf = io.StringIO(str(inner.get("type", "")))
        text = buf.getvalue().rstrip("\n")
        if inner.get("type") == EventType.SESSION_START:
            text = f"session {data.get('session', '?')} started"
        if data.get("dropped"):
            text += f"  ({data['dropped']} events of it not shown here)"
        prefix = f"  [{data.get('machine', '?')}] "
        for line in text.splitlines() or [""]:
            if line.strip():
                self._line(self._dim(prefix) + line)

    def _on_COMPACTED(self, data: dict[str, Any]) -> None:  # noqa: N802
        """`⇣ compacted (budget): 81.2k → 12.4k tokens, 14 results cleared, 9 turns
        summarised`, and a note when the summary could not be had."""
        parts = [f"{short_count(int(data.get('before_tokens') or 0))} → "
                 f"{short_count(int(data.get('after_tokens') or 0))} tokens"]
        if data.get("cleared_results"):
            parts.append(f"{data['cleared_results']} results cleared")
        if data.get("summarised_turns"):
            parts.append(f"{data['summarised_turns']} turns summarised")
        note = f" — {data['note']}" if data.get("note") else ""
        self._line(self._dim(f"⇣ compacted ({data.get('by', '?')}): {', '.join(parts)}{note}"))

    def _on_RETRY(self, data: dict[str, Any]) -> None:  # noqa: N802
        if self._streamed:
            self._write(" [void]")  # the failed attempt's text, printed already, is void
        self._line(f"↻ attempt {data['attempt']} failed ({data['error']}); retrying in "
                   f"{data['wait_s']:.1f} s — text streamed by that attempt is void")

    def _on_DONE(self, data: dict[str, Any]) -> None:  # noqa: N802
        self._line(self._terminal_line(EventType.DONE, data))

    def _on_ERROR(self, data: dict[str, Any]) -> None:  # noqa: N802
        self._line(self._terminal_line(EventType.ERROR, data))

    def _on_CANCELLED(self, data: dict[str, Any]) -> None:  # noqa: N802
        self._line(self._terminal_line(EventType.CANCELLED, data))

    def _terminal_line(self, kind: str, data: dict[str, Any]) -> str:
        self._running.clear()
        self._partial.clear()
        if kind == EventType.DONE:
            line = f"— done: {data.get('turns', 0)} turn(s), stop {data.get('stop', '')}"
        elif kind == EventType.ERROR:
            line = f"— error: {data.get('error', '')}: {data.get('message', '')}"
        else:
            line = f"— cancelled ({data.get('mode')}): {data.get('reason', '')}"
        return line + usage_suffix(data)

    # -- output --------------------------------------------------------------------------

    def _line(self, text: str) -> None:
        self._end_line()
        print(text, file=self.out, flush=True)

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        self._mid_line = bool(text) and not text.endswith("\n")

    def _end_line(self) -> None:
        if self._mid_line:
            self.out.write("\n")
            self._mid_line = False

    def _dim(self, text: str) -> str:
        return f"\x1b[2m{text}\x1b[0m" if self.color and text else text

    def _red(self, text: str) -> str:
        return f"\x1b[31m{text}\x1b[0m" if self.color and text else text

    def _bold(self, text: str) -> str:
        return f"\x1b[1m{text}\x1b[0m" if self.color else text

    def exit_status(self) -> int:
        """0 done, 130 cancelled, 1 error (or no terminal event)."""
        codes: dict[str, int] = {EventType.DONE: 0, EventType.CANCELLED: 130}
        return codes.get(self.terminal or "", 1)


def _color(out: TextIO) -> bool:
    """Colour on a terminal, unless `NO_COLOR` is set (https://no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def _brief(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 1] + "…"
