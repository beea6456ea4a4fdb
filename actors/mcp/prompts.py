"""A session started from an MCP server's prompt (`oploop run --prompt SERVER/PROMPT
key=value ...`): the reference and arguments as the CLI takes them, and the first
message made of the prompt's messages. No SDK here: the CLI imports it."""

from __future__ import annotations


class PromptRefError(ValueError):
    """A `--prompt` reference or argument the CLI cannot take (the message says why)."""


def parse_ref(ref: str, pairs: list[str]) -> tuple[str, str, dict[str, str]]:
    """`SERVER/PROMPT` and `key=value` words: (server, prompt, arguments)."""
    server, slash, prompt = ref.partition("/")
    if not slash or not server or not prompt:
        raise PromptRefError(f"--prompt: expected SERVER/PROMPT, got {ref!r}")
    arguments: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise PromptRefError(f"--prompt: expected key=value arguments, got {pair!r}")
        if key in arguments:
            raise PromptRefError(f"--prompt: argument {key!r} given twice")
        arguments[key] = value
    return server, prompt, arguments


def prompt_text(messages: list[dict[str, str]]) -> str:
    """The first user message of a session started from a prompt: the messages' texts in
    order, an assistant's said as such (a session starts with the user's word)."""
    parts = []
    for message in messages:
        text = str(message.get("text", ""))
        if message.get("role") == "assistant":
            parts.append(f"(The assistant said:)\n{text}")
        else:
            parts.append(text)
    return "\n\n".join(parts)
