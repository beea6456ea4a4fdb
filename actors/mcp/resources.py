"""What an MCP server offers besides tools: resources, prompts, its instructions.

Learnt once a connection is up (`discover`, after `initialize` and the tool
listing), each only if the server declares the capability:

- **resources**: a server with the `resources` capability gets one more tool,
  `mcp__NAME__read_resource` (`reader_spec`), taking a `uri`: what a resource link
  in a tool result names, or one of the resources it lists (the first
  `LISTED_IN_DESCRIPTION` are named in the tool's description). Its result is the
  resource's contents (`read_outcome`): text as text, images as image blocks, other
  binary content named.
- **prompts**: listed (at most `MAX_PROMPTS`), carried in the server's status
  (`oploop prompts`); `prompts/get` through a `PromptJob` (`oploop run --prompt
  NAME/PROMPT key=value`) turns a prompt's messages into a session's first message
  (`prompt_messages`, then `prompts.prompt_text`).
- **instructions** (`initialize`'s `instructions`): kept, cut to `MAX_INSTRUCTIONS`;
  with `include_instructions = true` they travel on the server's first tool spec and
  join the system prompt (`actors.core.request.reminders`).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mcp_types as types

from actors.bounds import cut_line, cut_text
from actors.images import MEDIA_TYPES, accepted
from actors.tools.spec import ToolSpec

from .results import McpOutcome

if TYPE_CHECKING:
    from mcp.client.session import ClientSession

    from .config import McpServerConfig

#: The extra tool of a server with resources (`mcp__NAME__read_resource`).
READ_RESOURCE = "read_resource"
#: Longest instructions kept (characters): they are sent with every request.
MAX_INSTRUCTIONS = 8192
#: Prompts kept per server (its status carries them over the bus).
MAX_PROMPTS = 100
#: Resources listed per server (pages of the server's own size, this many in all).
MAX_RESOURCES = 200
#: Resources named in the reader's description.
LISTED_IN_DESCRIPTION = 20
#: Pages read of one listing at most (a server paging for ever).
MAX_PAGES = 20


@dataclass(frozen=True, slots=True)
class Extras:
    """What `discover` learnt of a server: its instructions, resources, prompts."""

    instructions: str = ""
    has_resources: bool = False
    resources: list[dict[str, str]] = field(default_factory=list)
    templates: list[dict[str, str]] = field(default_factory=list)
    prompts: list[dict[str, Any]] = field(default_factory=list)


async def discover(session: ClientSession) -> Extras:
    """Instructions, resources (and templates) and prompts of a server just initialized,
    each only if it declares the capability. A listing the server fails is left empty
    (its tools still work): the failure is no reason to refuse the server."""
    caps = session.server_capabilities
    instructions = cut_line(session.instructions or "", MAX_INSTRUCTIONS) \
        if session.instructions else ""
    resources: list[dict[str, str]] = []
    templates: list[dict[str, str]] = []
    prompts: list[dict[str, Any]] = []
    has_resources = caps is not None and caps.resources is not None
    if has_resources:
        async for item in _pages(session.list_resources, "resources", MAX_RESOURCES):
            resources.append(_described({"uri": item.uri, "name": item.name},
                                        item.description, item.mime_type))
        async for item in _pages(session.list_resource_templates, "resource_templates",
                                 MAX_RESOURCES):
            templates.append(_described({"uri_template": item.uri_template,
                                         "name": item.name}, item.description,
                                        item.mime_type))
    if caps is not None and caps.prompts is not None:
        async for item in _pages(session.list_prompts, "prompts", MAX_PROMPTS):
            prompts.append(_prompt_entry(item))
    return Extras(instructions, has_resources, resources, templates, prompts)


def _described(entry: dict[str, str], description: str | None,
               mime_type: str | None) -> dict[str, str]:
    if description:
        entry["description"] = cut_line(description, 300)
    if mime_type:
        entry["mime_type"] = mime_type
    return entry


def _prompt_entry(prompt: types.Prompt) -> dict[str, Any]:
    """A prompt as its server's status carries it (plain, bounded)."""
    return {
        "name": cut_line(prompt.name, 200),
        "description": cut_line(prompt.description or prompt.title or "", 500),
        "arguments": [{"name": cut_line(a.name, 100),
                       "description": cut_line(a.description or "", 300),
                       "required": bool(a.required)}
                      for a in (prompt.arguments or [])[:50]],
    }


async def _pages(method: Any, attribute: str, cap: int) -> Any:
    """The items of a paginated listing, at most `cap` (and `MAX_PAGES` pages); stops
    quietly at a failure (what was read so far is kept)."""
    cursor: str | None = None
    count = 0
    for _ in range(MAX_PAGES):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        try:
            result = await method(params=params)
        except Exception:  # a server that declares a capability it does not serve
            return
        for item in getattr(result, attribute):
            if count >= cap:
                return
            count += 1
            yield item
        cursor = result.next_cursor
        if not cursor:
            return


def reader_spec(name: str, config: McpServerConfig, extras: Extras,
                max_description: int) -> ToolSpec:
    """The `read_resource` tool of a server with resources, offered as `name`."""
    lines = [f"Read a resource of the MCP server {config.name} by its URI: one a tool "
             f"result links to ([resource URI]), or one it lists."]
    for entry in extras.resources[:LISTED_IN_DESCRIPTION]:
        what = entry.get("description") or entry.get("name", "")
        lines.append(f"- {entry['uri']}" + (f": {what}" if what else ""))
    if len(extras.resources) > LISTED_IN_DESCRIPTION:
        lines.append(f"(and {len(extras.resources) - LISTED_IN_DESCRIPTION} more)")
    for entry in extras.templates[:LISTED_IN_DESCRIPTION]:
        lines.append(f"- template {entry['uri_template']}"
                     + (f": {entry['description']}" if entry.get("description") else ""))
    return ToolSpec(
        name=name,
        description=cut_line("\n".join(lines), max_description),
        input_schema={"type": "object",
                      "properties": {"uri": {"type": "string",
                                             "description": "the resource's URI"}},
                      "required": ["uri"]},
        tags=tuple(config.tags), risky=config.risky, core=False, server=config.name)


def read_outcome(result: types.ReadResourceResult, max_chars: int) -> McpOutcome:
    """A `resources/read` result as a tool result: each content's text, an image as an
    image block (checked as a tool's are), other binary content named."""
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    many = len(result.contents) > 1
    for content in result.contents:
        if many:
            texts.append(f"[{content.uri}]")
        if isinstance(content, types.TextResourceContents):
            texts.append(content.text)
            continue
        mime = content.mime_type or "application/octet-stream"
        if mime in MEDIA_TYPES:
            images.append({"type": "image", "source": {"type": "base64", "media_type": mime,
                                                       "data": content.blob}})
        else:
            texts.append(f"[binary content of {content.uri}: {mime}, {_size(content.blob)}, "
                         f"not shown]")
    kept, dropped = accepted(images)
    output = "\n".join([*texts, *dropped])
    if not output and kept:
        output = f"[{len(kept)} image(s)]"
    return McpOutcome(cut_text(output or "[empty resource]", max_chars), False, list(kept))


def _size(blob: str) -> str:
    try:
        return f"{len(base64.b64decode(blob, validate=True))} bytes"
    except (binascii.Error, ValueError):
        return "not valid base64"


def prompt_messages(result: types.GetPromptResult, max_chars: int) -> list[dict[str, str]]:
    """A prompt's messages as `{role, text}`: text as is, an embedded text resource its
    text, anything else named (a session's message is text)."""
    out = []
    for message in result.messages:
        block = message.content
        if isinstance(block, types.TextContent):
            text = block.text
        elif isinstance(block, types.EmbeddedResource) and isinstance(
                block.resource, types.TextResourceContents):
            text = f"[resource {block.resource.uri}]\n{block.resource.text}"
        elif isinstance(block, types.ResourceLink):
            text = f"[resource {block.uri}" + (f": {block.name}]" if block.name else "]")
        else:
            text = f"[{block.type} content, not shown]"
        out.append({"role": message.role, "text": cut_text(text, max_chars)})
    return out

