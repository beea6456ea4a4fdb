"""The wire's size limit, in a module of its own: the configuration's bounds
(`actors/bounds.py`) are checked against it in processes that never encode a frame
(the host, the offline model), which would otherwise load the codec and every message
type with it (~1 MiB resident)."""

from __future__ import annotations

#: Largest frame the codec accepts; sockets set ZMQ_MAXMSGSIZE well above it so that
#: an oversize frame gets a counted rejection here rather than a silent disconnect.
MAX_FRAME_BYTES = 16 * 1024 * 1024
