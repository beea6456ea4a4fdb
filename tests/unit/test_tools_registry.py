"""Schema derivation, input validation, the Catalogue and invoke."""

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import Field

from actors.tools import (
    Catalogue,
    Tool,
    ToolContext,
    ToolInputError,
    ToolOutcome,
    invoke,
    tool,
)

CTX = ToolContext(cwd=Path("."))


@tool(tags=("demo",), risky=False)
async def demo(
    ctx: ToolContext,
    name: Annotated[str, Field(description="Who to greet.")],
    count: int,
    ratio: float = 0.5,
    loud: bool = False,
    words: list[str] | None = None,
) -> str:
    """Greet someone.

    This second paragraph is for humans, not the model.
    """
    return f"{name} {count} {ratio} {loud} {words} {ctx.cwd}"


def test_schema_types_required_and_defaults() -> None:
    schema = demo.spec.input_schema
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["name", "count"]
    props = schema["properties"]
    assert list(props) == ["name", "count", "ratio", "loud", "words"]
    assert props["name"] == {"type": "string", "description": "Who to greet."}
    assert props["count"] == {"type": "integer"}
    assert props["ratio"] == {"type": "number", "default": 0.5}
    assert props["loud"] == {"type": "boolean", "default": False}
    assert props["words"]["anyOf"] == [{"type": "array", "items": {"type": "string"}},
                                       {"type": "null"}]


def test_schema_has_no_noise_and_is_json() -> None:
    text = json.dumps(demo.spec.to_api())
    assert "title" not in text
    assert "$defs" not in text
    assert "ctx" not in demo.spec.input_schema["properties"]


def test_description_is_first_paragraph() -> None:
    assert demo.spec.description == "Greet someone."


def test_spec_flags_from_decorator() -> None:
    assert demo.spec.tags == ("demo",)
    assert demo.spec.risky is False
    assert demo.spec.core is False
    assert demo.name == "demo"


def test_property_named_title_is_kept() -> None:
    @tool(risky=False)
    async def titled(title: str) -> str:
        """Has a field called title."""
        return title

    assert titled.spec.input_schema["properties"] == {"title": {"type": "string"}}


def test_no_parameters_gives_empty_object_schema() -> None:
    @tool(risky=False, name="ping_tool")
    async def ping() -> str:
        """Ping."""
        return "pong"

    assert ping.name == "ping_tool"
    assert ping.spec.input_schema["properties"] == {}
    assert ping.validate({}) == {}


def test_validate_returns_kwargs() -> None:
    assert demo.validate({"name": "a", "count": 2}) == {
        "name": "a",
        "count": 2,
        "ratio": 0.5,
        "loud": False,
        "words": None,
    }


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"count": 1}, "name", "demo: 'name': field required"),
        ({"name": "a", "count": "many"}, "count", "demo: 'count': input should be a valid integer"),
        ({"name": 1, "count": 1}, "name", "demo: 'name': input should be a valid string"),
        ({"name": "a", "count": 1, "words": "x"}, "words", "demo: 'words': input should be"),
        (
            {"name": "a", "count": 1, "colour": "red", "size": 2},
            "colour",
            "demo: 'colour': unknown input key(s) 'colour', 'size'; expected name, count",
        ),
    ],
)
def test_validation_errors_name_the_field(data: dict[str, object], field: str,
                                          message: str) -> None:
    with pytest.raises(ToolInputError) as info:
        demo.validate(data)
    assert info.value.tool == "demo"
    assert info.value.field == field
    assert str(info.value).startswith(message)


def test_validation_reports_every_bad_field() -> None:
    with pytest.raises(ToolInputError) as info:
        demo.validate({"count": "x"})
    assert str(info.value) == (
        "demo: 'name': field required; "
        "'count': input should be a valid integer, unable to parse string as an integer"
    )


def test_validation_nested_field_path() -> None:
    with pytest.raises(ToolInputError) as info:
        demo.validate({"name": "a", "count": 1, "words": ["ok", 3]})
    assert info.value.field == "words.1"


def test_validation_rejects_non_object() -> None:
    with pytest.raises(ToolInputError) as info:
        demo.validate(["name"])
    assert info.value.field is None
    assert str(info.value) == "demo: input must be an object, got list"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(x: int) -> str:\n    'Doc.'\n    return ''", "must be an async function"),
        ("async def f(x: int) -> str:\n    return ''", "needs a docstring"),
        ("async def f(x) -> str:\n    'Doc.'\n    return ''", "needs a type hint"),
        ("async def f(*xs: int) -> str:\n    'Doc.'\n    return ''", "must be a named parameter"),
        ("async def f(ctx: int) -> str:\n    'Doc.'\n    return ''",
         "must be annotated ToolContext"),
    ],
)
def test_decorator_rejects_bad_functions(source: str, message: str) -> None:
    namespace: dict[str, object] = {}
    exec(source, namespace)  # noqa: S102 - building bad functions to hand to @tool
    with pytest.raises(TypeError, match=message):
        tool(risky=False)(namespace["f"])  # type: ignore[arg-type]


def test_catalogue_mapping_and_specs() -> None:
    cat = Catalogue([demo])
    assert list(cat) == ["demo"]
    assert cat["demo"] is demo
    assert len(cat) == 1
    assert cat.specs() == (demo.spec,)
    with pytest.raises(ValueError, match="duplicate tool name 'demo'"):
        Catalogue([demo, demo])


# --- invoke ----------------------------------------------------------------------


@tool(risky=False)
async def boom(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(reason)


@tool(risky=False)
async def not_text() -> str:
    """Returns the wrong type."""
    return 42  # type: ignore[return-value]


@tool(risky=False)
async def fails_softly() -> ToolOutcome:
    """Returns an error outcome."""
    return ToolOutcome.error("nope")


@tool(risky=False)
async def inner_timeout() -> str:
    """Raises its own TimeoutError."""
    raise TimeoutError("upstream timed out")


class Blocker:
    """A tool that blocks until released, and says when it has started."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finished = False

        @tool(risky=False, name="block")
        async def block() -> str:
            """Blocks forever."""
            self.started.set()
            try:
                await asyncio.Event().wait()
            finally:
                self.finished = True
            return "unreachable"

        self.tool: Tool = block


CAT = Catalogue([demo, boom, not_text, fails_softly, inner_timeout])


def run_invoke(name: str, data: object, ctx: ToolContext = CTX) -> ToolOutcome:
    return asyncio.run(invoke(CAT, name, data, ctx))


def test_invoke_happy_path_passes_ctx() -> None:
    out = run_invoke("demo", {"name": "a", "count": 1})
    assert out == ToolOutcome("a 1 0.5 False None .", False)


def test_invoke_unknown_tool() -> None:
    assert run_invoke("nope", {}) == ToolOutcome("tool nope is not available", True)


def test_invoke_bad_input_names_field() -> None:
    out = run_invoke("demo", {"name": "a"})
    assert out == ToolOutcome("demo: 'count': field required", True)


def test_invoke_exception_becomes_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="actors.tools.registry"):
        out = run_invoke("boom", {"reason": "kaput"})
    assert out == ToolOutcome("boom failed: RuntimeError: kaput", True)
    assert any("tool boom raised" in r.getMessage() for r in caplog.records)


def test_invoke_wrong_return_type_becomes_error() -> None:
    out = run_invoke("not_text", {})
    assert out.is_error
    assert "TypeError: tool not_text returned int, not str" in out.output


def test_invoke_passes_error_outcome_through() -> None:
    assert run_invoke("fails_softly", {}) == ToolOutcome("nope", True)


def test_invoke_tool_timeout_error_is_not_a_deadline() -> None:
    out = run_invoke("inner_timeout", {}, ToolContext(Path("."), time.time() + 60))
    assert out == ToolOutcome("inner_timeout failed: TimeoutError: upstream timed out", True)


def test_invoke_deadline_already_passed() -> None:
    blocker = Blocker()
    past = ToolContext(Path("."), time.time() - 1)
    out = asyncio.run(invoke(Catalogue([blocker.tool]), "block", {}, past))
    assert out == ToolOutcome("block: deadline passed before the call started", True)
    assert not blocker.started.is_set()


def test_invoke_deadline_exceeded_stops_the_tool() -> None:
    blocker = Blocker()
    ctx = ToolContext(Path("."), time.time() + 0.1)
    out = asyncio.run(invoke(Catalogue([blocker.tool]), "block", {}, ctx))
    assert out == ToolOutcome("block: deadline exceeded", True)
    assert blocker.finished


def test_invoke_cancellation_propagates() -> None:
    blocker = Blocker()

    async def main() -> None:
        task = asyncio.create_task(invoke(Catalogue([blocker.tool]), "block", {}, CTX))
        await blocker.started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert blocker.finished
