"""An MCP `CallToolResult` as a tool_result: text, image blocks, the error flag.

- text blocks: their text, one after another;
- image blocks: Messages-API image blocks (base64), beside the text;
- `structuredContent`: as JSON text, unless a text block already says the same
  (servers are asked to send both, and most do: no need to say it twice; the
  SDK's servers wrap a plain return as `{"result": value}` beside its text);
- audio, resource links and embedded resources: text naming them (an embedded
  text resource: its text);
- `isError` → `is_error`.

Bounded here, on the executor, so that what crosses the bus and enters the history
is (`actors.bounds`): the text to `max_result_chars` (head and tail kept, a line
between saying how much was cut), the images as `actors.images.accepted` takes them
(each one dropped is a line of text saying why; the host checks them again).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types

from actors.bounds import MAX_RESULT_CHARS, cut_text
from actors.images import MEDIA_TYPES, accepted


@dataclass(frozen=True, slots=True)
class McpOutcome:
    """A tool call's result as oploop carries it: text, image blocks, the error flag."""

    output: str
    is_error: bool
    images: list[dict[str, Any]] = field(default_factory=list)


def outcome_of(result: types.CallToolResult,
               max_chars: int = MAX_RESULT_CHARS) -> McpOutcome:
    """Map one `CallToolResult` (see the module's docstring); its text at most
    `max_chars` characters (and the notes on images dropped)."""
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            texts.append(block.text)
        elif isinstance(block, types.ImageContent):
            if block.mime_type in MEDIA_TYPES:
                images.append({"type": "image", "source": {
                    "type": "base64", "media_type": block.mime_type, "data": block.data}})
            else:
                texts.append(f"[an image of type {block.mime_type}, not shown]")
        elif isinstance(block, types.AudioContent):
            texts.append(f"[audio of type {block.mime_type}, not shown]")
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, types.TextResourceContents):
                texts.append(resource.text)
            else:
                texts.append(f"[resource {resource.uri}: {resource.mime_type or 'binary'}, "
                             f"not shown]")
        elif isinstance(block, types.ResourceLink):
            texts.append(f"[resource {block.uri}" + (f": {block.name}]" if block.name else "]"))
    structured = result.structured_content
    if structured is not None and not any(_said(t, structured) for t in texts):
        texts.append(json.dumps(structured, ensure_ascii=False))
    kept, dropped = accepted(images)  # (a note per image dropped: cut with the text)
    output = "\n".join([*texts, *dropped])
    if not output and kept:
        output = f"[{len(kept)} image(s)]"
    return McpOutcome(cut_text(output, max_chars), bool(result.is_error), list(kept))


def _said(text: str, value: Any) -> bool:
    """Whether `text` says `value` already: the same JSON, or the wrapped plain value."""
    if isinstance(value, dict) and list(value) == ["result"] and value["result"] == text:
        return True
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False
