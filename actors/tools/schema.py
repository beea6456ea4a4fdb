"""Tool input schemas derived from Python signatures, and input validation.

A tool is written as a plain async function with type hints; pydantic turns the
signature into both the JSON schema the model sees and the validator its input
goes through, so the two can never disagree. (The built-in tools, which an
executor runs, state theirs by hand instead: `plain.PlainInput`, no pydantic.)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, get_type_hints

import pydantic

from .plain import ToolInputError

__all__ = ["InputModel", "ToolInputError"]


class InputModel:
    """The input contract of one tool: its JSON schema and a validator for it.

    Built from the function's parameters, minus those in `exclude` (the injected
    context). Unknown keys are rejected, because a misspelled optional key silently
    falling back to its default hides the model's mistake from it.
    """

    def __init__(self, tool: str, fn: Callable[..., Any], exclude: frozenset[str]) -> None:
        self.tool = tool
        self._model = _model_from_signature(tool, fn, exclude)
        self.fields: tuple[str, ...] = tuple(self._model.model_fields)
        self.json_schema: dict[str, Any] = _clean_schema(self._model.model_json_schema())

    def validate(self, data: object) -> dict[str, Any]:
        """Return the validated keyword arguments for `data`, or raise ToolInputError."""
        if not isinstance(data, Mapping):
            raise ToolInputError(
                self.tool, None, f"input must be an object, got {type(data).__name__}"
            )
        unknown = [str(k) for k in data if k not in self._model.model_fields]
        if unknown:
            names = ", ".join(repr(k) for k in unknown)
            expected = ", ".join(self.fields) or "no keys"
            raise ToolInputError(
                self.tool, unknown[0], f"unknown input key(s) {names}; expected {expected}"
            )
        try:
            validated = self._model.model_validate(dict(data))
        except pydantic.ValidationError as exc:
            raise _input_error(self.tool, exc) from exc
        # Attribute access, not model_dump(): the function gets the validated
        # Python values (e.g. nested models stay models).
        return {name: getattr(validated, name) for name in self.fields}


def _model_from_signature(
    tool: str, fn: Callable[..., Any], exclude: frozenset[str]
) -> type[pydantic.BaseModel]:
    hints = get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.name in exclude:
            continue
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise TypeError(f"tool {tool}: parameter {param.name!r} must be a named parameter")
        if param.name not in hints:
            raise TypeError(f"tool {tool}: parameter {param.name!r} needs a type hint")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints[param.name], default)
    config = pydantic.ConfigDict(extra="forbid")
    model: type[pydantic.BaseModel] = pydantic.create_model(
        f"{tool}_input", __config__=config, **fields
    )
    return model


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's generated titles: noise in every tool definition sent each turn."""
    cleaned: dict[str, Any] = _strip_titles(schema)
    cleaned.setdefault("properties", {})
    return cleaned


def _strip_titles(node: Any) -> Any:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "title" and isinstance(value, str):
                continue
            if key in ("properties", "$defs") and isinstance(value, dict):
                # Keys here are names (a property may be called "title"), values schemas.
                out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
            else:
                out[key] = _strip_titles(value)
        return out
    if isinstance(node, list):
        return [_strip_titles(item) for item in node]
    return node


def _input_error(tool: str, exc: pydantic.ValidationError) -> ToolInputError:
    """Name the first bad field; mention the others so the model can fix all at once."""
    problems = [
        (".".join(str(part) for part in err["loc"]) or None, _lower_first(err["msg"]))
        for err in exc.errors(include_url=False)
    ]
    field, message = problems[0]
    rest = "; ".join(f"'{f}': {m}" if f else m for f, m in problems[1:])
    return ToolInputError(tool, field, f"{message}; {rest}" if rest else message)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
