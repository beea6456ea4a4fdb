"""Image blocks a tool result may carry to the model: checked where they enter the loop.

An executor (an MCP server's image, `actors/mcp/results.py`) sends image blocks beside
a tool's text. The history is sent again every turn, so one block the Messages API
refuses (not base64, a type it does not take, too large) would fail every later turn
of the session with a 400. And an executor may be a worker machine elsewhere: its
blocks are checked here, on the host, not trusted. A block that fails is replaced by
a line of text saying why.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

#: Image types the Messages API takes in a tool_result (an MCP server's image of
#: another type is named in the text, not sent: `actors/mcp/results.py`).
MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
#: The API's limit on one image, decoded.
MAX_IMAGE_BYTES = 5 * 1024 * 1024
#: Images one tool result may carry (the API takes 100 per request, all turns included).
MAX_IMAGES = 8


def accepted(images: list[Any]) -> tuple[tuple[dict[str, Any], ...], list[str]]:
    """The blocks of `images` the API takes, and a note for each one left out."""
    kept: list[dict[str, Any]] = []
    notes: list[str] = []
    for n, block in enumerate(images, 1):
        why = _problem(block)
        if why is None and len(kept) >= MAX_IMAGES:
            why = f"more than {MAX_IMAGES} images in one result"
        if why is None:
            kept.append({"type": "image", "source": dict(block["source"])})
        else:
            notes.append(f"[image {n} dropped: {why}]")
    return tuple(kept), notes


def _problem(block: Any) -> str | None:
    """Why `block` is not an image block the API takes (None: it is)."""
    if not isinstance(block, dict) or block.get("type") != "image":
        return "not an image block"
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64" \
            or set(source) != {"type", "media_type", "data"}:
        return "not a base64 image source"
    if source.get("media_type") not in MEDIA_TYPES:
        return f"type {source.get('media_type')!r} is not one the API takes"
    data = source.get("data")
    if not isinstance(data, str):
        return "its data is not text"
    if len(data) > (MAX_IMAGE_BYTES * 4) // 3 + 4:
        return f"larger than {MAX_IMAGE_BYTES >> 20} MB"
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "its data is not base64"
    return None
