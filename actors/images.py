"""Image blocks a tool result may carry to the model: checked where they enter the loop.

An executor (an MCP server's image, `actors/mcp/results.py`) sends image blocks beside
a tool's text. The history is sent again every turn, so one block the Messages API
refuses (not base64, a type it does not take, bytes of another type, too large) would
fail every later turn of the session with a 400. And an executor may be a worker
machine elsewhere: its blocks are checked here, on the host, not trusted. A block
that fails is replaced by a line of text saying why.
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
#: Their bytes together, decoded: the whole request must stay under the API's 32 MB.
MAX_RESULT_BYTES = 10 * 1024 * 1024
#: How each type's bytes begin: a block whose bytes are another type's (or none's) is
#: refused by the API ("could not process image"), every turn after it.
_MAGIC: dict[str, tuple[bytes, ...]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),  # then 4 bytes of size, then "WEBP" (checked below)
}


def accepted(images: list[Any]) -> tuple[tuple[dict[str, Any], ...], list[str]]:
    """The blocks of `images` the API takes, and a note for each one left out."""
    kept: list[dict[str, Any]] = []
    notes: list[str] = []
    total = 0
    for n, block in enumerate(images, 1):
        why, size = _problem(block)
        if why is None and len(kept) >= MAX_IMAGES:
            why = f"more than {MAX_IMAGES} images in one result"
        if why is None and total + size > MAX_RESULT_BYTES:
            why = f"the result's images would pass {MAX_RESULT_BYTES >> 20} MB together"
        if why is None:
            kept.append({"type": "image", "source": dict(block["source"])})
            total += size
        else:
            notes.append(f"[image {n} dropped: {why}]")
    return tuple(kept), notes


def _problem(block: Any) -> tuple[str | None, int]:
    """Why `block` is not an image block the API takes (None: it is), and its size."""
    if not isinstance(block, dict) or block.get("type") != "image":
        return "not an image block", 0
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64" \
            or set(source) != {"type", "media_type", "data"}:
        return "not a base64 image source", 0
    media_type = source.get("media_type")
    if media_type not in MEDIA_TYPES:
        return f"type {media_type!r} is not one the API takes", 0
    data = source.get("data")
    if not isinstance(data, str):
        return "its data is not text", 0
    if len(data) > (MAX_IMAGE_BYTES * 4) // 3 + 4:
        return f"larger than {MAX_IMAGE_BYTES >> 20} MB", 0
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "its data is not base64", 0
    if not raw.startswith(_MAGIC[media_type]) or \
            (media_type == "image/webp" and raw[8:12] != b"WEBP"):
        return f"its bytes are not {media_type}", 0
    return None, len(raw)
