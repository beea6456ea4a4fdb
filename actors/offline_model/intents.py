"""Reading a user's prompt as a list of tool calls — the offline model's "understanding".

Pure functions over text. A prompt is cut into clauses ("list /tmp and read
README.md, then run `date`" → three clauses) and each clause is matched
against a few verb patterns. Backtick- and quote-delimited spans are protected
first, so a command like "run `ls; echo a and b`" stays one clause.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

#: The built-in tools the rules know how to ask for (names fixed by DESIGN §5).
SHELL, READ_FILE, LIST_DIR, WRITE_FILE = "shell", "read_file", "list_dir", "write_file"


@dataclass(frozen=True)
class ToolCall:
    """One tool call the prompt asks for: a tool name and its input."""

    name: str
    input: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """A short human phrase for this call, e.g. "run `date`"."""
        if self.name == SHELL:
            return f"run `{self.input.get('command', '')}`"
        if self.name == READ_FILE:
            return f"read `{self.input.get('path', '')}`"
        if self.name == LIST_DIR:
            return f"list `{self.input.get('path', '')}`"
        if self.name == WRITE_FILE:
            return f"write to `{self.input.get('path', '')}`"
        return f"use `{self.name}`"


# Spans the splitter must not look inside: `code`, "double" and 'single' quotes.
# A single quote only opens at a word start so "don't" is left alone.
_PROTECTED = re.compile(r"`[^`]*`|\"[^\"]*\"|(?<![\w])'[^']*'(?![\w])")
_PLACEHOLDER = re.compile(r"\x00(\d+)\x00")

# Clause separators: "and", "then", commas, semicolons, newlines, sentence ends.
_SEPARATORS = re.compile(
    r"\s*(?:,\s*(?:and\s+)?then\b|,\s*and\b|\band\s+then\b|\bthen\b|\band\b|[;,\n]"
    # a full stop ends a sentence only after a word, so "." and ".." stay paths
    r"|(?<=[^\s./])\.(?:\s+|$))\s*",
    re.IGNORECASE,
)

# Filler a clause may start with: "please", "can you", "now", "also", "first"...
_FILLER = re.compile(
    r"^(?:(?:please|kindly|can\s+you|could\s+you|would\s+you|will\s+you|now|also|"
    r"first|next|finally|afterwards|i\s+want\s+you\s+to|go\s+ahead\s+and)\s+)+",
    re.IGNORECASE,
)

_RUN = re.compile(
    r"^(?:run|execute|exec)\s+(?:the\s+)?(?:(?:shell\s+)?command\s+)?(?P<cmd>.+)$",
    re.IGNORECASE | re.DOTALL,  # a quoted command or content may span lines
)
_READ = re.compile(
    r"^(?:read|cat|show|open|print|display)\s+(?:me\s+)?(?:the\s+)?(?:contents?\s+of\s+)?"
    r"(?:the\s+)?(?:file\s+)?(?P<path>\S+)$",
    re.IGNORECASE,
)
_LIST = re.compile(
    r"^(?:list|ls)(?:\s+(?:the\s+)?(?:files|contents|entries)?\s*"
    r"(?:(?:in|of|under|inside)\s+)?(?:the\s+)?(?:(?:current|this|working)\s+)?"
    r"(?:directory|folder|dir)?\s*(?P<path>\S+)?)?$",
    re.IGNORECASE,
)
_WRITE = re.compile(
    r"^(?:write|put|save)\s+(?P<content>.+?)\s+(?:to|into|in)\s+"
    r"(?:the\s+)?(?:file\s+)?(?P<path>\S+)$",
    re.IGNORECASE | re.DOTALL,
)
# Words that mean "here" when they stand where a directory path should be.
_HERE = frozenset({"files", "contents", "entries", "directory", "folder", "dir", "here", "current"})


def protect(text: str) -> tuple[str, list[str]]:
    """Replace quoted spans by numbered placeholders; return the text and the spans."""
    spans: list[str] = []

    def stash(match: re.Match[str]) -> str:
        spans.append(match.group(0))
        return f"\x00{len(spans) - 1}\x00"

    return _PROTECTED.sub(stash, text), spans


def restore(text: str, spans: list[str]) -> str:
    """Undo `protect` on one piece of text."""
    return _PLACEHOLDER.sub(lambda m: spans[int(m.group(1))], text)


def split_clauses(text: str) -> list[str]:
    """Cut a prompt into clauses at "and", "then", commas, semicolons and sentence ends."""
    masked, spans = protect(text)
    pieces = _SEPARATORS.split(masked)
    return [restore(p, spans).strip() for p in pieces if p and p.strip()]


def unquote(value: str) -> str:
    """Strip one level of backticks or quotes around a value."""
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "`\"'":
        return value[1:-1]
    return value


def clean_path(raw: str) -> str:
    """A path as written in prose: unquoted, without trailing punctuation."""
    path = unquote(raw.rstrip(",;:!?"))
    # "README.md." ends a sentence; "." and ".." are real paths and stay.
    if len(path) > 1 and path.endswith(".") and path[-2] not in "./":
        path = path[:-1]
    return path


def parse_clause(clause: str) -> ToolCall | None:
    """One clause as a tool call, or None when no pattern matches."""
    clause = _FILLER.sub("", clause.strip()).strip()
    if match := _WRITE.match(clause):
        content = unquote(match.group("content"))
        return ToolCall(WRITE_FILE, {"path": clean_path(match.group("path")), "content": content})
    if match := _RUN.match(clause):
        command = unquote(match.group("cmd").rstrip(".!?"))
        return ToolCall(SHELL, {"command": command}) if command else None
    if match := _LIST.match(clause):
        raw = match.group("path")
        path = "." if raw is None or raw.lower() in _HERE else clean_path(raw)
        return ToolCall(LIST_DIR, {"path": path})
    if match := _READ.match(clause):
        return ToolCall(READ_FILE, {"path": clean_path(match.group("path"))})
    return None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every tool call a prompt asks for, in the order it asks."""
    calls = []
    for clause in split_clauses(text):
        call = parse_clause(clause)
        if call is not None:
            calls.append(call)
    return calls
