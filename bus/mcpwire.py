"""The messages of what MCP servers ask and offer beyond tool calls: prompts fetched for a
new session, a server's questions to the user (elicitation). Registered in `bus.messages`
like every type; each docstring is its protocol documentation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from bus.envelope import Body


@dataclass(frozen=True, slots=True)
class GetPrompt(Body):
    """Client -> supervisor `api`: the messages of MCP server `server`'s prompt `prompt`
    filled with `arguments` (`prompts/get`), from an executor of `agent`'s machine.
    Reply: `PromptResult` or `ErrorReply` (`unknown_agent`, `mcp` with the server's
    words, `timeout`)."""

    KIND: ClassVar[str] = "get_prompt"
    server: str
    prompt: str
    arguments: dict[str, str] = field(default_factory=dict)
    agent: str = ""


@dataclass(frozen=True, slots=True)
class PromptJob(Body):
    """Supervisor -> executor: `prompts/get` of `server`'s `prompt` with `arguments`.
    Answered by `PromptResult` or `JobFailed`."""

    KIND: ClassVar[str] = "prompt_job"
    server: str
    prompt: str
    arguments: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PromptResult(Body):
    """Executor -> supervisor (the answer to a `PromptJob`), then supervisor `api` ->
    client (to a `GetPrompt`): the prompt's messages, each `{role, text}` (role
    "user" or "assistant")."""

    KIND: ClassVar[str] = "prompt_result"
    messages: list[dict[str, str]]


@dataclass(frozen=True, slots=True)
class Elicit(Body):
    """Executor -> supervisor `work`, for the tool job in flight (`envelope.job`): an MCP
    server asks the user for input (`elicitation/create`). `id` names it; `message` is
    the server's question; `schema` the form's JSON schema (form mode) or `url` the page
    to open (URL mode); `wait_s` how long the call can still wait for an answer. The
    supervisor makes it an `ELICITATION_REQUESTED` event; the answer comes back as
    `ElicitAnswer`. No reply."""

    KIND: ClassVar[str] = "elicit"
    id: str
    server: str
    message: str
    schema: dict[str, Any] = field(default_factory=dict)
    url: str = ""
    wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ElicitAnswer(Body):
    """Supervisor `work` -> the executor holding job `envelope.job`: the answer to its
    `Elicit` `id`: `action` "accept" (with `content`, the form's values), "decline" or
    "cancel". No reply."""

    KIND: ClassVar[str] = "elicit_answer"
    id: str
    action: str
    content: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AnswerElicitation(Body):
    """Client -> supervisor `control`: answer `session`'s elicitation `id` (its
    `ELICITATION_REQUESTED`): `action` "accept" with `content` (values are checked
    against the request's schema; a string is read as the number or boolean the schema
    wants), "decline" or "cancel". The local user and `control` keys may answer, a
    `viewer` key may not. Reply: `ElicitationAck` or `ErrorReply` (nothing sent: an
    unknown session or id, one answered already, content the schema refuses)."""

    KIND: ClassVar[str] = "answer_elicitation"
    session: str
    id: str
    action: str
    content: dict[str, Any] = field(default_factory=dict)
    #: Set by a host of the same store forwarding this to the session's owner
    #: (`actors.supervisor.forwarding`): who asked there ("local" or a key's name).
    #: Honoured from the owner's own user and the store's other hosts (their keys) only;
    #: a forwarded request is never forwarded again.
    by: str = ""


@dataclass(frozen=True, slots=True)
class ElicitationAck(Body):
    """Supervisor `control` -> client: the answer went to the server; who `by` is said
    to be."""

    KIND: ClassVar[str] = "elicitation_ack"
    session: str
    id: str
    by: str


@dataclass(frozen=True, slots=True)
class Sample(Body):
    """Executor -> supervisor `work`, for the tool job in flight: an MCP server with
    `sampling = true` asks for a model call (`sampling/createMessage`). `request` is a
    Messages-API request without its model (`system`, `messages`, `max_tokens`, and
    `temperature`, `stop_sequences` when given); `wait_s` how long the call can still
    wait. The supervisor asks for approval under the agent's rules, makes the call
    through its llm callers, and answers `SampleAnswer`. No reply."""

    KIND: ClassVar[str] = "sample"
    id: str
    server: str
    request: dict[str, Any]
    wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SampleAnswer(Body):
    """Supervisor `work` -> the executor holding job `envelope.job`: the model's reply to
    `Sample` `id` (a Messages-API message), or `error` saying why there is none (denied,
    declined, the model failed). No reply."""

    KIND: ClassVar[str] = "sample_answer"
    id: str
    message: dict[str, Any] = field(default_factory=dict)
    error: str = ""
