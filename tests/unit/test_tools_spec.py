"""ToolSpec: wire round trip, validation of wire dicts, API form."""

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.tools import BUILTIN, ToolSpec

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


def make_spec(**overrides: object) -> ToolSpec:
    fields: dict[str, object] = {
        "name": "read_file",
        "description": "Read a file.",
        "input_schema": SCHEMA,
        "tags": ("fs", "core"),
        "risky": False,
        "core": True,
    }
    fields.update(overrides)
    return ToolSpec(**fields)  # type: ignore[arg-type]


def test_wire_round_trip_through_msgpack() -> None:
    spec = make_spec()
    wire = msgpack.unpackb(msgpack.packb(spec.to_wire()))
    assert ToolSpec.from_wire(wire) == spec
    assert isinstance(ToolSpec.from_wire(wire).tags, tuple)


def test_builtin_specs_round_trip() -> None:
    for spec in BUILTIN.specs():
        wire = msgpack.unpackb(msgpack.packb(spec.to_wire()))
        assert ToolSpec.from_wire(wire) == spec


@given(
    name=st.from_regex(r"[a-zA-Z0-9_-]{1,64}", fullmatch=True),
    description=st.text(min_size=1).filter(str.strip),
    tags=st.lists(st.text(max_size=10), max_size=5).map(tuple),
    risky=st.booleans(),
    core=st.booleans(),
)
def test_wire_round_trip_property(
    name: str, description: str, tags: tuple[str, ...], risky: bool, core: bool
) -> None:
    spec = ToolSpec(name, description, {"type": "object", "properties": {}}, tags, risky, core)
    assert ToolSpec.from_wire(msgpack.unpackb(msgpack.packb(spec.to_wire()))) == spec


def test_to_wire_is_a_copy() -> None:
    spec = make_spec()
    spec.to_wire()["input_schema"]["properties"].clear()
    spec.to_api()["input_schema"]["properties"].clear()
    assert spec.input_schema["properties"] == {"path": {"type": "string"}}


def test_to_api_shape() -> None:
    assert make_spec().to_api() == {
        "name": "read_file",
        "description": "Read a file.",
        "input_schema": SCHEMA,
    }


def test_spec_is_hashable_and_frozen() -> None:
    spec = make_spec()
    assert hash(spec) == hash(make_spec())
    with pytest.raises(AttributeError):
        spec.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("name"), "missing key(s): name"),
        (lambda d: d.update(extra=1), "unknown key(s): extra"),
        (lambda d: d.update(name=3), "tool name must match"),
        (lambda d: d.update(name="has space"), "tool name must match"),
        (lambda d: d.update(description=""), "description must be a non-empty string"),
        (lambda d: d.update(input_schema=[]), "input_schema must be a dict"),
        (lambda d: d.update(input_schema={"type": "string"}), "type 'object'"),
        (lambda d: d.update(tags="fs"), "tags must be a list"),
        (lambda d: d.update(tags=["fs", 1]), "tags must be a tuple of strings"),
        (lambda d: d.update(risky="no"), "risky must be a bool"),
        (lambda d: d.update(core=1), "core must be a bool"),
    ],
)
def test_from_wire_rejects_bad_dicts(mutate: object, message: str) -> None:
    wire = make_spec().to_wire()
    mutate(wire)  # type: ignore[operator]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ToolSpec.from_wire(wire)


def test_from_wire_rejects_non_dict() -> None:
    with pytest.raises(ValueError, match="must be a dict, got list"):
        ToolSpec.from_wire([])
