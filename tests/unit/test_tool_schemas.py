"""The built-in tools' hand-written input contracts (`actors.tools.plain`) against what
pydantic derived from their signatures before: the same schemas announced, the same
answers to the inputs a model sends (issue 13: an executor does not import pydantic).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import pytest
from pydantic import Field

from actors.tools import BUILTIN, ToolContext, ToolInputError, tool
from actors.tools.builtin import SHELL_DEFAULT_TIMEOUT_S, SHELL_MAX_TIMEOUT_S
from actors.tools.plain import PlainInput

# The built-ins' signatures as they were declared for pydantic (the reference).
PathArg = Annotated[
    str, Field(description="Path; a relative path is taken from the working directory.")
]


@tool(risky=False, name="read_file")
async def read_file(ctx: ToolContext[Any], path: PathArg) -> str:
    """Reference."""
    return ""


@tool(risky=False, name="list_dir")
async def list_dir(ctx: ToolContext[Any], path: PathArg) -> str:
    """Reference."""
    return ""


@tool(risky=True, name="write_file")
async def write_file(
    ctx: ToolContext[Any],
    path: PathArg,
    content: Annotated[str, Field(description="The complete new contents of the file.")],
) -> str:
    """Reference."""
    return ""


@tool(risky=True, name="shell")
async def shell(
    ctx: ToolContext[Any],
    command: Annotated[str, Field(description="The command line, run by /bin/sh -c.")],
    timeout_s: Annotated[
        float,
        Field(gt=0, le=SHELL_MAX_TIMEOUT_S,
              description="Seconds before the command and all its children are killed."),
    ] = SHELL_DEFAULT_TIMEOUT_S,
) -> str:
    """Reference."""
    return ""


REFERENCE = {t.name: t for t in (read_file, list_dir, write_file, shell)}


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_the_announced_schema_is_the_one_pydantic_derived(name: str) -> None:
    announced = BUILTIN[name].spec.to_wire()["input_schema"]
    derived = REFERENCE[name].spec.input_schema
    # Same text, key order included: the bytes the model sees each turn.
    assert json.dumps(announced) == json.dumps(derived)
    assert type(BUILTIN[name].input_model) is PlainInput


INPUTS: list[tuple[str, object]] = [
    ("read_file", {"path": "a.txt"}),
    ("read_file", {}),
    ("read_file", {"path": 5}),
    ("read_file", {"path": None}),
    ("read_file", {"path": ["a"]}),
    ("read_file", {"path": "x", "mode": "r"}),
    ("read_file", {"colour": 1, "size": 2}),
    ("read_file", ["a.txt"]),
    ("read_file", "a.txt"),
    ("list_dir", {"path": "."}),
    ("list_dir", {"path": {"p": 1}}),
    ("write_file", {"path": "a", "content": "x"}),
    ("write_file", {}),
    ("write_file", {"path": "a"}),
    ("write_file", {"path": 1, "content": 2}),
    ("write_file", {"path": "a", "content": "\ud800"}),
    ("shell", {"command": "true"}),
    ("shell", {"command": "true", "timeout_s": 5}),
    ("shell", {"command": "true", "timeout_s": 1.5}),
    ("shell", {"command": "true", "timeout_s": "30"}),
    ("shell", {"command": "true", "timeout_s": " 1e1 "}),
    ("shell", {"command": "true", "timeout_s": 600}),
    ("shell", {"command": "true", "timeout_s": 600.5}),
    ("shell", {"command": "true", "timeout_s": 0}),
    ("shell", {"command": "true", "timeout_s": -1}),
    ("shell", {"command": "true", "timeout_s": "soon"}),
    ("shell", {"command": "true", "timeout_s": None}),
    ("shell", {"command": "true", "timeout_s": [1]}),
    ("shell", {"command": "true", "timeout_s": 10**400}),
    ("shell", {"command": "true", "timeout_s": float("inf")}),
    ("shell", {"command": 5, "timeout_s": "x"}),
    ("shell", {"timeout_s": 5}),
]


def _answer(validate: Any, data: object, fields: tuple[str, ...]) -> object:
    try:
        out = validate(data)
    except ToolInputError as exc:
        return ("error", exc.field, str(exc))
    defaults = {"timeout_s": SHELL_DEFAULT_TIMEOUT_S} if "timeout_s" in fields else {}
    return {**defaults, **out}  # the plain validator leaves a default to the function


@pytest.mark.parametrize(("name", "data"), INPUTS)
def test_the_plain_validator_answers_as_pydantic_did(name: str, data: object) -> None:
    plain, reference = BUILTIN[name], REFERENCE[name]
    fields = plain.input_model.fields
    assert fields == reference.input_model.fields
    assert _answer(plain.validate, data, fields) == _answer(reference.validate, data, fields)


@pytest.mark.parametrize(("data", "message"), [
    ({"command": "true", "timeout_s": True}, "input should be a valid number"),
    ({"command": b"true"}, "input should be a valid string"),
])
def test_where_the_plain_validator_is_stricter_than_pydantic(data: object, message: str) -> None:
    # pydantic's lax mode took True as 1.0 and bytes as text; a model sends neither.
    with pytest.raises(ToolInputError, match=message):
        BUILTIN["shell"].validate(data)


def test_a_schema_the_plain_validator_would_not_enforce_is_refused() -> None:
    async def fn(path: str) -> str:
        """Doc."""
        return path

    loose = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    with pytest.raises(TypeError, match="forbid additional properties"):
        PlainInput("t", loose, fn)
    pattern = {**loose, "additionalProperties": False,
               "properties": {"path": {"type": "string", "pattern": "^a"}}}
    with pytest.raises(TypeError, match="only string and number"):
        PlainInput("t", pattern, fn)
    nested = {**loose, "additionalProperties": False, "properties": {"path": {"type": "array"}}}
    with pytest.raises(TypeError, match="only string and number"):
        PlainInput("t", nested, fn)


def test_a_schema_that_does_not_match_the_function_is_refused() -> None:
    schema = {"type": "object", "additionalProperties": False,
              "properties": {"path": {"type": "string"}}, "required": ["path"]}

    async def other(name: str) -> str:
        """Doc."""
        return name

    async def optional(path: str = ".") -> str:
        """Doc."""
        return path

    with pytest.raises(TypeError, match="differ from the schema"):
        tool(risky=False, schema=schema)(other)
    with pytest.raises(TypeError, match="without a default"):
        tool(risky=False, schema=schema)(optional)
