"""Exceptions of the wire. zmq and msgpack exceptions never leave `bus/`."""

from __future__ import annotations


class BusError(Exception):
    """Base of every error raised by `bus`."""


class BadFrame(BusError):
    """A frame that cannot be accepted: malformed, wrong kind/version/type, or oversize.

    `reason` is a short machine-readable tag (used for reject counters), `detail`
    the human explanation.
    """

    def __init__(self, reason: str, detail: str, kind: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.kind = kind


class PeerGone(BusError):
    """The peer a message was addressed to is not connected (it died or never came)."""

    def __init__(self, peer: bytes | str) -> None:
        super().__init__(f"peer {peer!r} is not connected")
        self.peer = peer


class Backpressure(BusError):
    """A send would block: the peer's queue is at its high-water mark."""


class Closed(BusError):
    """The socket or client was closed by us; nothing more can be sent or received."""


class RequestTimeout(BusError):
    """A request got no reply before its deadline."""

    def __init__(self, kind: str, seconds: float) -> None:
        super().__init__(f"no reply to {kind!r} within {seconds:g} s")
        self.kind = kind
        self.seconds = seconds


class RemoteError(BusError):
    """The peer answered a request with an error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class AccessDenied(BusError):
    """The peer refused our handshake: our key is not authorised there (or revoked),
    or one side speaks CURVE and the other does not."""

    def __init__(self, endpoint: str, reason: str) -> None:
        super().__init__(f"{endpoint}: the host {reason}")
        self.endpoint = endpoint
        self.reason = reason


class SessionRemoved(BusError):
    """The session a viewer follows was deleted (`oploop rm`, retention): its events
    end here, and it will have no more."""

    def __init__(self, session: str) -> None:
        super().__init__(f"session {session} was removed")
        self.session = session
