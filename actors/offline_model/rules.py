"""The offline model's mind: a deterministic rule-based operator, as pure functions.

`respond(request)` looks at the request's last user message:

- tool results answering the previous assistant's tool calls → a short text
  reporting them (first lines, truncated), `end_turn`; text sent in with them
  (a message said into the run) is read as below, its tool calls added;
- otherwise its text is read as tool calls (`intents.parse_tool_calls`), kept
  only for tools the request offers → `tool_use` blocks, `tool_use`; a tool it
  would need but was not given is named honestly in text;
- nothing recognised → a short help text, `end_turn`.

With `thinking` enabled a short thinking block (with a signature) comes first.
`max_tokens` is honoured by counting words: past it the reply is cut and
stops with `max_tokens`.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from actors.digests import sha256
from actors.offline_model.intents import SHELL, ToolCall, parse_tool_calls
from actors.offline_model.typed import example_value, requested_schema
from actors.offline_model.wire import Reply, count_tokens, text_chunks

HELP_TEXT = (
    "I'm `offline`, the offline model (free: $0.00): no API key is configured, so I follow "
    'simple rules instead of thinking. I can run a command ("run `uname -a`"), read a '
    'file ("read README.md"), list a directory ("list /tmp") or write a file '
    '("write HELLO to notes.txt"), and '
    'several at once ("list /tmp and read README.md, then run `date`"). Set '
    "ANTHROPIC_API_KEY to talk to a real model."
)

#: How much of a tool's output the summary quotes.
MAX_LINES, MAX_LINE_CHARS, MAX_CHARS = 8, 160, 1200

# Context the host injects in messages is not the user's words.
_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)


#: How an intent-router classification request begins (actors.core.router).
ROUTER_MARK = "Classify the user's latest request for an operator agent."
#: Every tool a prompt's intents could ask for, to tell DIRECT from AGENT.
_ANY_TOOL = frozenset({"read_file", "list_dir", "write_file", "shell"})


#: How a compaction's summary request begins (actors.core.context.SUMMARY_MARK).
SUMMARY_MARK = "You are compacting a conversation between a user and an operator agent."
#: What a summary line names the tools by, and the most requests it quotes.
_TOOLS_LINE = "Tools called so far: "
_REQUESTS_LINE = "Requests: "
_MAX_REQUESTS = 3


def is_summary_request(request: Mapping[str, Any]) -> bool:
    """Whether `request` asks for a compaction's summary (the offline model writes it)."""
    return _system_text(request).startswith(SUMMARY_MARK)


def respond(request: Mapping[str, Any]) -> Reply:
    """The rule engine's whole answer to one Messages-API request."""
    messages = request.get("messages") or []
    if _system_text(request).startswith(ROUTER_MARK):
        return classify(messages)
    if is_summary_request(request):
        text = summarise_transcript(user_text(messages[-1]) if messages else "")
        return Reply((text_block(text),), "end_turn", max(1, count_tokens(text)))
    index = last_user_index(messages)
    user = messages[index] if index is not None else {}
    results = tool_results(user)
    if results:
        calls = tool_uses(messages[index - 1]) if index else {}
        blocks = [text_block(summarise_results(results, calls))]
        stop = "end_turn"
        plan = "report the tool results"
        said = user_text(user)  # words sent in with the results (`oploop say`): heeded
        if said:
            more, more_stop, _ = plan_tool_calls(
                said, offered_tools(request), f"{said}|{results[0].get('tool_use_id')}")
            if more_stop == "tool_use":  # one text (the report, then the plan), the calls
                blocks = [text_block(f"{blocks[0]['text']}\n\n{more[0]['text']}"), *more[1:]]
                stop, plan = "tool_use", "report the tool results, then do what was said"
    else:
        blocks, stop, plan = plan_tool_calls(user_text(user), offered_tools(request))
    schema = requested_schema(_system_text(request)) if stop == "end_turn" else None
    if schema is not None:  # a typed run's final answer: a value of its schema
        said = blocks[0].get("text", "") if results else ""
        blocks = [text_block(json.dumps(example_value(schema, said)))]
    if thinking_enabled(request):
        blocks.insert(0, thinking_block(user_text(user), plan))
    return limit_tokens(blocks, stop, int(request.get("max_tokens") or 1))


def _system_text(request: Mapping[str, Any]) -> str:
    system = request.get("system")
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "".join(b.get("text", "") for b in system if isinstance(b, Mapping))
    return ""


def summarise_transcript(text: str) -> str:
    """A deterministic summary of a summary request's transcript: the user's requests
    (the first and latest), every tool called with counts (those of an earlier summary
    added), errors, the latest result and the assistant's latest words. Bounded: a
    summary of summaries does not grow."""
    tools: dict[str, int] = {}
    requests: list[str] = []
    errors, messages = 0, 0
    last_result = last_words = ""
    for line in text.splitlines():
        if line.startswith(_TOOLS_LINE):  # an earlier summary's counts
            for part in line[len(_TOOLS_LINE):].rstrip(".").split(", "):
                name, _, n = part.rpartition(" x")
                if name and n.isdigit():
                    tools[name] = tools.get(name, 0) + int(n)
        elif line.startswith(_REQUESTS_LINE):
            requests.extend(r for r in line[len(_REQUESTS_LINE):].split(" | ") if r)
        elif line.startswith("[user] ") and "[This conversation was compacted" not in line:
            messages += 1
            requests.append(_REMINDER.sub("", line[7:]).strip()[:160])
        elif line.startswith("[assistant called "):
            messages += 1
            name = line[len("[assistant called "):].split("]", 1)[0]
            tools[name] = tools.get(name, 0) + 1
        elif line.startswith("[assistant] "):
            messages += 1
            last_words = line[12:212]
        elif line.startswith("[tool result"):
            errors += line.startswith("[tool result (error)]")
            last_result = line.split("] ", 1)[-1][:200]
    requests = [r for r in requests if r]
    if len(requests) > _MAX_REQUESTS:
        requests = [requests[0], *requests[-(_MAX_REQUESTS - 1):]]
    out = [f"Summary by the offline model of {messages} earlier message(s)."]
    if requests:
        out.append(_REQUESTS_LINE + " | ".join(requests))
    if tools:
        out.append(_TOOLS_LINE + ", ".join(f"{n} x{c}" for n, c in sorted(tools.items())) + ".")
    if errors:
        out.append(f"Tool errors in this part: {errors}.")
    if last_result:
        out.append(f"Latest tool result began: {last_result}")
    if last_words:
        out.append(f"The assistant last said: {last_words}")
    return "\n".join(out)


def classify(messages: Sequence[Any]) -> Reply:
    """The router's answer: AGENT when the prompt asks for anything a tool does."""
    index = last_user_index(messages)
    prompt = user_text(messages[index]) if index is not None else ""
    route = "AGENT" if parse_tool_calls(prompt) else "DIRECT"
    return Reply((text_block(route),), "end_turn", 1)


def last_user_index(messages: Sequence[Any]) -> int | None:
    """The index of the last user message, if any."""
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], Mapping) and messages[i].get("role") == "user":
            return i
    return None


def _blocks(message: Any) -> list[Mapping[str, Any]]:
    """A message's content as a list of block mappings (a string is one text block)."""
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, Mapping)]
    return []


def user_text(message: Any) -> str:
    """The words of a user message, without injected reminders."""
    texts = [b.get("text") for b in _blocks(message) if b.get("type") == "text"]
    return _REMINDER.sub("", "\n".join(t for t in texts if isinstance(t, str))).strip()


def tool_results(message: Any) -> list[Mapping[str, Any]]:
    """The `tool_result` blocks of a message."""
    return [b for b in _blocks(message) if b.get("type") == "tool_result"]


def tool_uses(message: Any) -> dict[str, Mapping[str, Any]]:
    """An assistant message's `tool_use` blocks by id."""
    return {
        str(b.get("id")): b
        for b in _blocks(message)
        if b.get("type") == "tool_use" and isinstance(b.get("id"), str)
    }


def offered_tools(request: Mapping[str, Any]) -> frozenset[str]:
    """Names of the tools the request offers."""
    tools = request.get("tools") or []
    return frozenset(t["name"] for t in tools if isinstance(t, Mapping) and "name" in t)


def thinking_enabled(request: Mapping[str, Any]) -> bool:
    """Whether the request asks for extended thinking."""
    thinking = request.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")


def text_block(text: str) -> dict[str, Any]:
    """A text content block."""
    return {"type": "text", "text": text}


def signature_for(thinking: str) -> str:
    """A deterministic stand-in for the API's opaque thinking signature."""
    return base64.b64encode(sha256(thinking.encode()).digest()).decode()


def thinking_block(prompt: str, plan: str) -> dict[str, Any]:
    """A short thinking block saying what the rules made of the prompt."""
    asked = " ".join(prompt.split())
    asked = asked if len(asked) <= 80 else asked[:77] + "..."
    text = f'The user wrote: "{asked}". My rules say: {plan}.'
    return {"type": "thinking", "thinking": text, "signature": signature_for(text)}


def tool_use_id(call: ToolCall, position: int, context: str) -> str:
    """A deterministic `toolu_` id: the same request always gets the same ids."""
    seed = json.dumps([context, position, call.name, call.input], sort_keys=True)
    return "toolu_" + sha256(seed.encode()).hexdigest()[:24]


def _join(phrases: Sequence[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def plan_tool_calls(prompt: str, offered: frozenset[str],
                    context: str = "") -> tuple[list[dict[str, Any]], str, str]:
    """Blocks, stop reason and a one-line plan for a prompt that is not tool results
    (`context` seeds the tool_use ids: the prompt itself unless given)."""
    calls = parse_tool_calls(prompt)
    if not calls:
        return [text_block(HELP_TEXT)], "end_turn", "nothing I recognise, so explain what I can do"
    usable = [c for c in calls if c.name in offered]
    missing = [c for c in calls if c.name not in offered]
    sentences = []
    if usable:
        sentences.append(f"I'll {_join([c.describe() for c in usable])}.")
    if missing:
        names = sorted({c.name for c in missing})
        sentences.append(
            f"I can't {_join([c.describe() for c in missing])}: the "
            f"{_join([f'`{n}`' for n in names])} tool{'s are' if len(names) > 1 else ' is'} "
            "not available in this session."
        )
    blocks = [text_block(" ".join(sentences))]
    blocks += [
        {"type": "tool_use", "id": tool_use_id(c, i, context or prompt), "name": c.name,
         "input": c.input}
        for i, c in enumerate(usable)
    ]
    plan = f"call {_join([c.name for c in usable])}" if usable else "say the tools are missing"
    return blocks, "tool_use" if usable else "end_turn", plan


def result_text(block: Mapping[str, Any]) -> str:
    """A tool_result's content as text (non-text parts are named, not shown)."""
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, Mapping):
                parts.append(f"[{part.get('type', 'content')}]")
        return "\n".join(parts)
    return ""


def excerpt(text: str) -> str:
    """The first lines of an output, each cut short, with a note of what was left out."""
    lines = text.strip("\n").splitlines()
    shown = [ln if len(ln) <= MAX_LINE_CHARS else ln[: MAX_LINE_CHARS - 3] + "..." for ln in lines]
    shown = shown[:MAX_LINES]
    while len(shown) > 1 and sum(len(s) + 1 for s in shown) > MAX_CHARS:
        shown.pop()
    out = "\n".join(shown)
    if len(shown) < len(lines):
        out += f"\n... ({len(lines) - len(shown)} more lines)"
    return out


def _label(call: Mapping[str, Any] | None) -> str:
    """How a summary names the call a result answers."""
    if call is None:
        return "A tool"
    inp = call.get("input")
    inp = inp if isinstance(inp, Mapping) else {}
    subject = inp.get("command") if call.get("name") == SHELL else inp.get("path")
    return f"`{subject}`" if isinstance(subject, str) else f"`{call.get('name')}`"


def summarise_result(block: Mapping[str, Any], call: Mapping[str, Any] | None) -> str:
    """One result, reported: what ran and the first lines of what it gave."""
    label, text = _label(call), result_text(block)
    name = call.get("name") if call else None
    if block.get("is_error"):
        return f"{label} failed:\n```\n{excerpt(text) or '(no message)'}\n```"
    if not text.strip():
        return f"{label} finished with no output."
    verb = {"shell": "printed", "read_file": "contains", "list_dir": "holds"}.get(str(name))
    if verb is None:  # write_file and unknown tools: their own words suffice
        return f"{label}: {excerpt(text)}"
    return f"{label} {verb}:\n```\n{excerpt(text)}\n```"


def summarise_results(
    results: Sequence[Mapping[str, Any]], calls: Mapping[str, Mapping[str, Any]]
) -> str:
    """All results of a turn as one short report."""
    parts = [summarise_result(r, calls.get(str(r.get("tool_use_id")))) for r in results]
    return "\n\n".join(parts)


def _block_tokens(block: Mapping[str, Any]) -> int:
    """The words a block costs."""
    if block["type"] == "text":
        return count_tokens(block["text"])
    if block["type"] == "thinking":
        return count_tokens(block["thinking"])
    return 1 + count_tokens(json.dumps(block.get("input", {})))


def _cut_words(text: str, words: int) -> str:
    """The first `words` words of a text, spacing kept."""
    kept, seen = [], 0
    for chunk in text_chunks(text):
        seen += 1 if chunk.strip() else 0
        if seen > words:
            break
        kept.append(chunk)
    return "".join(kept).rstrip()


def limit_tokens(blocks: list[dict[str, Any]], stop: str, max_tokens: int) -> Reply:
    """The reply cut to `max_tokens` words; a cut reply stops with `max_tokens`."""
    kept: list[dict[str, Any]] = []
    used = 0
    for block in blocks:
        cost = _block_tokens(block)
        if used + cost <= max_tokens:
            kept.append(block)
            used += cost
            continue
        room = max_tokens - used
        if block["type"] in ("text", "thinking") and room > 0:
            key = block["type"]
            kept.append({**block, key: _cut_words(block[key], room)})
            used = max_tokens
        # a tool call is never sent half-made: it is dropped whole
        return Reply(tuple(kept), "max_tokens", max(1, used))
    return Reply(tuple(kept), stop, max(1, used))
