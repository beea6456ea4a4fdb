"""The frame's shell: `Envelope` (routing-free header fields) and `Body`, the base of
every message type (`bus.messages`, `bus.jobs`); the protocol version."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

__all__ = ["PROTOCOL_VERSION", "Body", "Envelope"]

PROTOCOL_VERSION = 1


@dataclass(frozen=True, slots=True)
class Body:
    """Base of every message body; `KIND` is the envelope's `kind` tag."""

    KIND: ClassVar[str] = ""


@dataclass(frozen=True, slots=True)
class Envelope:
    """One message: routing-free header fields plus a typed body.

    `id` identifies the message (a reply carries the request's `id`), `sid` the
    session, `job` the job, `deadline` an absolute `time.time()` after which the
    work is moot (0 when none applies). `traceparent`: the W3C trace context of the
    work (a run's model call, a caller's span), "" when none: sent only when set.
    """

    body: Body
    id: str = ""
    sid: str = ""
    job: str = ""
    deadline: float = 0.0
    v: int = PROTOCOL_VERSION
    traceparent: str = ""

    @property
    def kind(self) -> str:
        """The body's kind tag."""
        return self.body.KIND

    def with_body(self, body: Body) -> Envelope:
        """This envelope with `body` instead (`dataclasses.replace(self, body=body)`, at a
        fraction of its cost: the dispatcher makes one per model call it sends)."""
        env = object.__new__(Envelope)
        _set(env, "body", body)
        _set(env, "id", self.id)
        _set(env, "sid", self.sid)
        _set(env, "job", self.job)
        _set(env, "deadline", self.deadline)
        _set(env, "v", self.v)
        _set(env, "traceparent", self.traceparent)
        return env


_set = object.__setattr__
