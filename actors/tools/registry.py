"""Tools as code: the `@tool` decorator, the `Catalogue`, and `invoke`.

`invoke` is the one place a tool call becomes a `ToolOutcome`: whatever the model
sent and whatever the tool did (short of cancellation), the caller gets an
outcome to put in a tool_result, never an exception.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, get_origin, get_type_hints

from .plain import PlainInput, ToolInputError
from .spec import ToolSpec

log = logging.getLogger(__name__)

_CTX_PARAM = "ctx"


Deps = TypeVar("Deps")


@dataclass(frozen=True, slots=True)
class ToolContext(Generic[Deps]):
    """Where and until when a call runs; passed to tools whose first parameter is `ctx`.

    `deadline` is absolute wall-clock time (`time.time()`), as carried in an
    envelope across processes; None means no deadline. `deps` are the
    dependencies a program embedding the loop gives its tools (`Runner`);
    None in the executor process. `private`: directories the file tools refuse
    to read or list (the host's keys, journal and sockets; the sandbox hides
    them already). `workspace`: the session's workspace, where sandboxed tools
    run (None: `cwd`); `read_paths`: what the confined reads may see besides
    the system's files and the workspace (the session's cwd, the agent's
    `read_paths`).
    """

    cwd: Path
    deadline: float | None = None
    deps: Deps = None  # type: ignore[assignment]
    private: tuple[Path, ...] = ()
    workspace: Path | None = None
    read_paths: tuple[str, ...] = ()
    #: Paths the sandbox hides from this call, and those it binds back among them (the
    #: working directory): the file tools answer "hidden by the sandbox" for them.
    hidden: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    #: The session's sandbox mode ("" outside a sandbox), named in those messages.
    mode: str = ""
    #: The folder of the agent's `memory` name, where the `memory` tool works (None:
    #: the agent has none, and `memory` is refused).
    memory: Path | None = None
    #: Told what a running command prints, chunk by chunk ("stdout" | "stderr", bytes):
    #: the executor's live tool output (`actors/tools/live.py`); None: nobody watches.
    on_output: Callable[[str, bytes], None] | None = None


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """The result of one tool call, as it goes into a tool_result block."""

    output: str
    is_error: bool

    @classmethod
    def ok(cls, output: str) -> ToolOutcome:
        """A successful outcome."""
        return cls(output, False)

    @classmethod
    def error(cls, output: str) -> ToolOutcome:
        """A failed outcome; `output` says what went wrong, for the model to read."""
        return cls(output, True)


ToolFn = Callable[..., Awaitable[str | ToolOutcome]]
"""A tool implementation: returns its output text (success) or a full outcome."""


class InputContract(Protocol):
    """What a tool's input goes through: `schema.InputModel` (pydantic, from the
    signature) or `plain.PlainInput` (a hand-written schema: the built-ins)."""

    tool: str
    fields: tuple[str, ...]
    json_schema: dict[str, Any]

    def validate(self, data: object) -> dict[str, Any]:
        """The validated keyword arguments for `data`; raise ToolInputError."""
        ...


@dataclass(frozen=True, slots=True)
class Tool:
    """A `ToolSpec` with the code behind it: an async implementation and its validator."""

    spec: ToolSpec
    fn: ToolFn
    input_model: InputContract
    wants_ctx: bool

    @property
    def name(self) -> str:
        """The tool's name (same as `spec.name`)."""
        return self.spec.name

    def validate(self, data: object) -> dict[str, Any]:
        """The validated keyword arguments for `data`; raise ToolInputError naming the field."""
        return self.input_model.validate(data)

    async def call(self, kwargs: dict[str, Any], ctx: ToolContext[Any]) -> ToolOutcome:
        """Run the implementation with already-validated `kwargs`; exceptions propagate."""
        result = await (self.fn(ctx, **kwargs) if self.wants_ctx else self.fn(**kwargs))
        if isinstance(result, ToolOutcome):
            return result
        if isinstance(result, str):
            return ToolOutcome.ok(result)
        raise TypeError(f"tool {self.name} returned {type(result).__name__}, not str")


def tool(
    *,
    risky: bool,
    tags: Iterable[str] = (),
    core: bool = False,
    name: str | None = None,
    schema: dict[str, Any] | None = None,
) -> Callable[[ToolFn], Tool]:
    """Decorator: build a `Tool` from an async function with type-hinted parameters.

    The input schema comes from the parameters (pydantic; `Annotated[T,
    Field(description=...)]` documents one), the description from the docstring's
    first paragraph. A first parameter `ctx: ToolContext` receives the call's
    context and is not part of the schema. `risky` has no default on purpose: a
    tool must say whether it needs the sandbox. A hand-written `schema` (string and
    number properties: `plain.PlainInput`) is used instead of the signature's, and
    pydantic is not imported for it.
    """

    def build(fn: ToolFn) -> Tool:
        tool_name = name or fn.__name__
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"tool {tool_name}: implementation must be an async function")
        wants_ctx = _wants_ctx(tool_name, fn)
        exclude = frozenset({_CTX_PARAM}) if wants_ctx else frozenset()
        input_model: InputContract
        if schema is not None:
            input_model = PlainInput(tool_name, schema, fn, exclude)
        else:
            from .schema import InputModel  # pydantic: only for tools without a schema

            input_model = InputModel(tool_name, fn, exclude)
        spec = ToolSpec(
            name=tool_name,
            description=_first_paragraph(tool_name, fn),
            input_schema=input_model.json_schema,
            tags=tuple(tags),
            risky=risky,
            core=core,
        )
        return Tool(spec=spec, fn=fn, input_model=input_model, wants_ctx=wants_ctx)

    return build


def _wants_ctx(tool_name: str, fn: ToolFn) -> bool:
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].name != _CTX_PARAM:
        return False
    hint = get_type_hints(fn).get(_CTX_PARAM)
    if hint is not ToolContext and get_origin(hint) is not ToolContext:
        raise TypeError(f"tool {tool_name}: parameter 'ctx' must be annotated ToolContext")
    return True


def _first_paragraph(tool_name: str, fn: ToolFn) -> str:
    doc = inspect.getdoc(fn) or ""
    paragraph = doc.strip().split("\n\n", 1)[0]
    text = " ".join(line.strip() for line in paragraph.splitlines())
    if not text:
        raise TypeError(f"tool {tool_name}: needs a docstring (it is the model's description)")
    return text


class Catalogue(Mapping[str, Tool]):
    """An immutable set of tools by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            if t.name in self._tools:
                raise ValueError(f"duplicate tool name {t.name!r}")
            self._tools[t.name] = t

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"Catalogue({sorted(self._tools)})"

    def specs(self) -> tuple[ToolSpec, ...]:
        """The specs of every tool, in insertion order."""
        return tuple(t.spec for t in self._tools.values())


async def invoke(
    catalogue: Mapping[str, Tool], name: str, input: object, ctx: ToolContext[Any]
) -> ToolOutcome:
    """Run tool `name` on `input` and return its outcome; only cancellation propagates.

    Unknown tool, invalid input, a passed deadline and any exception in the tool
    all become error outcomes the model can read and act on.
    """
    found = catalogue.get(name)
    if found is None:
        # Deliberately no list of what is available: it could reveal hidden tools.
        return ToolOutcome.error(f"tool {name[:100]} is not available")
    try:
        kwargs = found.validate(input)
    except ToolInputError as exc:
        return ToolOutcome.error(str(exc))
    return await _run(found, kwargs, ctx)


async def _run(found: Tool, kwargs: dict[str, Any], ctx: ToolContext[Any]) -> ToolOutcome:
    if ctx.deadline is None:  # (no scope then: an executor's usual call, bounded outside)
        try:
            return await found.call(kwargs, ctx)
        except Exception as exc:  # the RPC edge: any tool bug becomes an error result
            return _failed(found.name, exc)
    remaining = ctx.deadline - time.time()
    if remaining <= 0:
        return ToolOutcome.error(f"{found.name}: deadline passed before the call started")
    scope = asyncio.timeout(remaining)
    try:
        async with scope:
            return await found.call(kwargs, ctx)
    except TimeoutError as exc:
        if scope.expired():
            return ToolOutcome.error(f"{found.name}: deadline exceeded")
        return _failed(found.name, exc)
    except Exception as exc:  # the RPC edge: any tool bug becomes an error result
        return _failed(found.name, exc)


def _failed(name: str, exc: Exception) -> ToolOutcome:
    log.exception("tool %s raised", name, exc_info=exc)
    return ToolOutcome.error(f"{name} failed: {type(exc).__name__}: {exc}")
