"""An MCP `CallToolResult` as a tool_result: text, image blocks, the error flag.

- text blocks: their text, one after another;
- image blocks: Messages-API image blocks (base64), beside the text;
- `structuredContent`: as JSON text, unless a text block already says the same
  (servers are asked to send both, and most do: no need to say it twice; the
  SDK's servers wrap a plain return as `{"result": value}` beside its text);
- audio, resource links and embedded resources: text naming them (an embedded
  text resource: its text);
- `isError` → `is_error`;
- a block whose `annotations.audience` is `["user"]` (not the assistant) is kept from
  the model: its text (or a line naming it) goes to `shown`, which viewers see in
  `TOOL_END` (`for_user`) and the history does not hold.

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
    #: What the server meant for the user only (shown to viewers, not sent to the model).
    shown: str = ""


def outcome_of(result: types.CallToolResult,
               max_chars: int = MAX_RESULT_CHARS) -> McpOutcome:
    """Map one `CallToolResult` (see the module's docstring); its text at most
    `max_chars` characters (and the notes on images dropped)."""
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    shown: list[str] = []
    for block in result.content:
        if _for_user_only(block):
            shown.append(block.text if isinstance(block, types.TextContent)
                         else _named(block) or f"[{block.type}]")
        elif isinstance(block, types.ImageContent) and block.mime_type in MEDIA_TYPES:
            images.append({"type": "image", "source": {
                "type": "base64", "media_type": block.mime_type, "data": block.data}})
        elif isinstance(block, types.TextContent):
            texts.append(block.text)
        else:
            texts.append(_named(block))
    structured = result.structured_content
    if structured is not None and not any(_said(t, structured) for t in texts):
        texts.append(json.dumps(structured, ensure_ascii=False))
    kept, dropped = accepted(images)  # (a note per image dropped: cut with the text)
    output = "\n".join([*texts, *dropped])
    if not output and kept:
        output = f"[{len(kept)} image(s)]"
    return McpOutcome(cut_text(output, max_chars), bool(result.is_error), list(kept),
                      cut_text("\n".join(shown), max_chars))


def _for_user_only(block: Any) -> bool:
    """Whether a content block is annotated for the user's eyes, not the model's."""
    notes = getattr(block, "annotations", None)
    audience = getattr(notes, "audience", None)
    return bool(audience) and "assistant" not in audience


def _named(block: Any) -> str:
    """A block that is not text, as text: an embedded text resource's text, otherwise
    a line naming what is not shown."""
    if isinstance(block, types.ImageContent):
        return f"[an image of type {block.mime_type}, not shown]"
    if isinstance(block, types.AudioContent):
        return f"[audio of type {block.mime_type}, not shown]"
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return resource.text
        return f"[resource {resource.uri}: {resource.mime_type or 'binary'}, not shown]"
    if isinstance(block, types.ResourceLink):
        return f"[resource {block.uri}" + (f": {block.name}]" if block.name else "]")
    return ""


def _said(text: str, value: Any) -> bool:
    """Whether `text` says `value` already: the same JSON, or the wrapped plain value."""
    if isinstance(value, dict) and list(value) == ["result"] and value["result"] == text:
        return True
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False
