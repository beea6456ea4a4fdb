"""msgpack codec for `Envelope`s: one frame, validated on the way in.

Wire form: a msgpack array `[v, kind, id, sid, job, deadline, body]` where
`body` is a map of the body's field names to values, and an 8th item, the
envelope's `traceparent`, only when it has one: a frame without trace context is
the 7-item array it always was, so a peer that predates it decodes every frame
of a host not tracing. Decoding checks, in order,
the frame size, msgpack well-formedness (with msgpack's own length limits), the
array shape, the protocol version, the kind, and every body field's type; any
failure is a `BadFrame` and nothing half-decoded escapes.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import msgpack

from bus.errors import BadFrame
from bus.limits import MAX_FRAME_BYTES
from bus.messages import BY_KIND, PROTOCOL_VERSION, Body, Envelope, Event

Check = Callable[[Any], bool]

#: Characters of an envelope's `traceparent` at most (W3C's version 00 has 55).
TRACEPARENT_MAX = 256


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_dict(v: Any) -> bool:
    # Keys are already str: the unpacker runs with strict_map_key and raw=False.
    return type(v) is dict


_SCALARS: dict[Any, Check] = {
    str: lambda v: type(v) is str,
    bytes: lambda v: type(v) is bytes,
    bool: lambda v: type(v) is bool,
    int: _is_int,
    float: _is_number,
    Any: lambda v: True,
}


def _checker(tp: Any) -> Check:
    """A predicate for values of annotation `tp` (the shapes messages use)."""
    if tp in _SCALARS:
        return _SCALARS[tp]
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is dict:
        return _is_dict
    if origin is list:
        item = _checker(args[0])
        return lambda v: isinstance(v, list) and all(item(x) for x in v)
    if origin in (typing.Union, __import__("types").UnionType):
        options = [_checker(a) for a in args]
        return lambda v: any(ok(v) for ok in options)
    raise TypeError(f"no wire checker for annotation {tp!r}")


#: Value types that pass a field's check outright (the common case, tested with one
#: `type(v) in ...`); anything else goes through the field's full check.
_EXACT: dict[Any, tuple[type, ...]] = {
    str: (str,), bytes: (bytes,), bool: (bool,), int: (int,), float: (float, int),
}


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    check: Check
    type_name: str
    required: bool
    exact: tuple[type, ...]
    default: Callable[[], Any] | None


def _fields_of(cls: type[Body]) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        default: Callable[[], Any] | None = None
        if f.default is not dataclasses.MISSING:
            default = (lambda value: lambda: value)(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory
        tp = hints[f.name]
        exact = _EXACT.get(tp, (dict,) if typing.get_origin(tp) is dict else ())
        out.append(_Field(f.name, _checker(tp), getattr(tp, "__name__", str(tp)),
                          default is None, exact, default))
    return tuple(out)


_SCHEMAS: dict[str, tuple[_Field, ...]] = {kind: _fields_of(cls) for kind, cls in BY_KIND.items()}
_NAMES: dict[str, tuple[str, ...]] = {k: tuple(f.name for f in fs) for k, fs in _SCHEMAS.items()}
_NAME_SETS: dict[str, frozenset[str]] = {k: frozenset(names) for k, names in _NAMES.items()}

# One packer per process: every actor encodes from a single event-loop thread.
_packer = msgpack.Packer(use_bin_type=True)
_EVENT = Event.KIND

_LIMITS = {
    "max_str_len": MAX_FRAME_BYTES,
    "max_bin_len": MAX_FRAME_BYTES,
    "max_array_len": 1_000_000,
    "max_map_len": 100_000,
    "max_ext_len": 0,
}


def encode(env: Envelope) -> bytes:
    """Encode `env` to one frame. Raises `BadFrame` if it would exceed the size limit."""
    body = env.body
    fields = {name: getattr(body, name) for name in _NAMES[body.KIND]}
    items = [env.v, body.KIND, env.id, env.sid, env.job, env.deadline, fields]
    if env.traceparent:
        items.append(env.traceparent)
    try:
        frame: bytes = _packer.pack(items)
    except (TypeError, ValueError, OverflowError) as exc:
        _packer.reset()
        raise BadFrame("unencodable", str(exc), body.KIND) from exc
    if len(frame) > MAX_FRAME_BYTES:
        raise BadFrame("oversize", f"{len(frame)} bytes > {MAX_FRAME_BYTES}", body.KIND)
    return frame


def encode_event(sid: str, seq: int, type_: str, turn: int, ts: float,
                 data: dict[str, Any]) -> bytes:
    """`encode(Envelope(Event(seq, type_, turn, ts, data), sid=sid))`, the same bytes,
    without making the two frozen objects first (the supervisor encodes every event it
    stamps: ~4 a turn). Raises `BadFrame` as `encode` does."""
    fields = {"seq": seq, "type": type_, "turn": turn, "ts": ts, "data": data}
    try:
        frame: bytes = _packer.pack([PROTOCOL_VERSION, _EVENT, "", sid, "", 0.0, fields])
    except (TypeError, ValueError, OverflowError) as exc:
        _packer.reset()
        raise BadFrame("unencodable", str(exc), _EVENT) from exc
    if len(frame) > MAX_FRAME_BYTES:
        raise BadFrame("oversize", f"{len(frame)} bytes > {MAX_FRAME_BYTES}", _EVENT)
    return frame


def decode(frame: bytes) -> Envelope:
    """Decode and validate one frame; raises `BadFrame` describing the first problem."""
    if len(frame) > MAX_FRAME_BYTES:
        raise BadFrame("oversize", f"{len(frame)} bytes > {MAX_FRAME_BYTES}")
    try:
        raw = msgpack.unpackb(frame, raw=False, strict_map_key=True, **_LIMITS)
    except Exception as exc:  # msgpack raises a zoo of types; all mean "not our frame"
        raise BadFrame("malformed", f"not msgpack: {type(exc).__name__}: {exc}") from exc
    if not isinstance(raw, list):
        raise BadFrame("malformed", "envelope is not a 7-item array (8 with a traceparent)")
    if len(raw) == 7:  # (the usual frame: no trace context, nothing more to check)
        v, kind, mid, sid, job, deadline, fields = raw
        traceparent = ""
    elif len(raw) == 8:
        v, kind, mid, sid, job, deadline, fields, traceparent = raw
        if not isinstance(traceparent, str) or len(traceparent) > TRACEPARENT_MAX:
            raise BadFrame("field_type", f"traceparent must be a string of at most "
                           f"{TRACEPARENT_MAX} characters",
                           kind if isinstance(kind, str) else None)
    else:
        raise BadFrame("malformed", "envelope is not a 7-item array (8 with a traceparent)")
    if v != PROTOCOL_VERSION:
        raise BadFrame("version", f"protocol version {v!r}, expected {PROTOCOL_VERSION}")
    cls = BY_KIND.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise BadFrame("unknown_kind", f"unknown kind {kind!r}")
    if not (isinstance(mid, str) and isinstance(sid, str) and isinstance(job, str)):
        raise BadFrame("field_type", "id, sid and job must be strings", kind)
    if not _is_number(deadline):
        raise BadFrame("field_type", "deadline must be a number", kind)
    if not isinstance(fields, dict):
        raise BadFrame("field_type", "body must be a map", kind)
    env = object.__new__(Envelope)  # see _build_body: the same, minus a keyword call
    _set(env, "body", _build_body(cls, kind, fields))
    _set(env, "id", mid)
    _set(env, "sid", sid)
    _set(env, "job", job)
    _set(env, "deadline", float(deadline))
    _set(env, "v", v)
    _set(env, "traceparent", traceparent)
    return env



#: An event's fields, as `encode_event` packs them (a frame with any other set is
#: decoded in full instead, which says what is wrong).
_EVENT_FIELDS = frozenset(("seq", "type", "turn", "ts", "data"))


def event_head(frame: bytes) -> tuple[str, int, str, dict[str, Any]] | None:
    """(sid, seq, type, data) of an event frame, checked as `decode` checks it, without
    building its `Envelope` and `Event` (the broadcaster takes ~4 events a turn and
    needs only these: it publishes the frame itself). None when the frame is not a
    plain event (another kind, a trace context, an odd field): `decode` it. Raises
    `BadFrame` as `decode` does for what is not a frame at all."""
    if len(frame) > MAX_FRAME_BYTES:
        raise BadFrame("oversize", f"{len(frame)} bytes > {MAX_FRAME_BYTES}")
    try:
        raw = msgpack.unpackb(frame, raw=False, strict_map_key=True, **_LIMITS)
    except Exception as exc:  # (as in `decode`)
        raise BadFrame("malformed", f"not msgpack: {type(exc).__name__}: {exc}") from exc
    if type(raw) is not list or len(raw) != 7:
        return None
    v, kind, mid, sid, job, deadline, fields = raw
    if v != PROTOCOL_VERSION or kind != _EVENT or type(fields) is not dict \
            or fields.keys() != _EVENT_FIELDS:
        return None
    seq, type_, turn, ts, data = (fields["seq"], fields["type"], fields["turn"],
                                  fields["ts"], fields["data"])
    if type(mid) is not str or type(sid) is not str or type(job) is not str or \
            type(seq) is not int or type(type_) is not str or type(turn) is not int or \
            type(ts) not in (float, int) or type(data) is not dict or \
            not _is_number(deadline):
        return None
    return sid, seq, type_, data

# Bodies are built field by field, their types checked on the way: the frozen
# dataclasses' own __init__ (keyword call, one object.__setattr__ per field) cost
# more than the whole unpacking of a typical frame.
_set = object.__setattr__


def _build_body(cls: type[Body], kind: str, fields: dict[str, Any]) -> Body:
    schema = _SCHEMAS[kind]
    body = object.__new__(cls)
    for f in schema:
        name = f.name
        if name in fields:
            value = fields[name]
            if type(value) not in f.exact and not f.check(value):
                got = type(value).__name__
                raise BadFrame("field_type",
                               f"{kind}.{name}: expected {f.type_name}, got {got}", kind)
        elif f.default is None:
            raise BadFrame("field_type", f"{kind}.{name}: missing", kind)
        else:
            value = f.default()
        _set(body, name, value)
    if len(fields) > len(schema) or not fields.keys() <= _NAME_SETS[kind]:
        extra = sorted(str(k) for k in fields.keys() - _NAME_SETS[kind])
        raise BadFrame("field_type", f"{kind}: unknown field(s) {', '.join(extra)}", kind)
    return body
