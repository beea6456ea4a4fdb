"""A server's model calls (`sampling/createMessage`), made through the session's model.

Only for a server with `sampling = true`: its `ClientSession` then declares the
sampling capability with `callback` as the handler (others declare none, and the
SDK refuses the request). The request becomes a Messages-API request without its
model (`request_of`), sent as a `Sample` for the job of the session whose call is in
flight on that server (`Elicitations.ask`: the same rule as questions); the
supervisor asks for approval under the agent's rules, calls the session's model and
answers with its reply (`result_of`). Refused (an `ErrorData` the server sees):
tool use in sampling, audio, a request with no session to charge, a denial, a
failed call.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.client.session import ClientRequestContext

from bus.mcpwire import Sample, SampleAnswer

from .elicitation import Elicitations

#: MCP's stop reasons for the Messages API's.
STOP_REASONS = {"end_turn": "endTurn", "max_tokens": "maxTokens",
                "stop_sequence": "stopSequence"}


class Unsupported(ValueError):
    """A sampling request oploop does not serve (the message says what)."""


def request_of(params: types.CreateMessageRequestParams) -> dict[str, Any]:
    """The Messages-API request (no model) of a `sampling/createMessage`."""
    if params.tools or params.tool_choice:
        raise Unsupported("tool use in sampling is not supported")
    messages = []
    for message in params.messages:
        content = []
        for block in message.content_as_list:
            if isinstance(block, types.TextContent):
                content.append({"type": "text", "text": block.text})
            elif isinstance(block, types.ImageContent):
                content.append({"type": "image", "source": {
                    "type": "base64", "media_type": block.mime_type, "data": block.data}})
            else:
                raise Unsupported(f"{block.type} content in sampling is not supported")
        messages.append({"role": message.role, "content": content})
    request: dict[str, Any] = {"messages": messages, "max_tokens": params.max_tokens}
    if params.system_prompt:
        request["system"] = params.system_prompt
    if params.temperature is not None:
        request["temperature"] = params.temperature
    if params.stop_sequences:
        request["stop_sequences"] = list(params.stop_sequences)
    return request


def result_of(message: dict[str, Any]) -> types.CreateMessageResult:
    """The model's reply as MCP's result: its text (one block), model and stop reason."""
    text = "".join(b.get("text", "") for b in message.get("content") or []
                   if isinstance(b, dict) and b.get("type") == "text")
    stop = str(message.get("stop_reason") or "end_turn")
    return types.CreateMessageResult(role="assistant",
                                     content=types.TextContent(type="text", text=text),
                                     model=str(message.get("model") or "unknown"),
                                     stop_reason=STOP_REASONS.get(stop, stop))


def callback(asks: Elicitations, server: str) -> Any:
    """The `sampling_callback` of `server`'s `ClientSession`."""

    async def sample(context: ClientRequestContext, params: types.CreateMessageRequestParams
                     ) -> types.CreateMessageResult | types.ErrorData:
        try:
            request = request_of(params)
        except Unsupported as exc:
            return types.ErrorData(code=types.INVALID_PARAMS, message=str(exc))
        answer = await asks.ask(server, "sampling",
                                lambda ask_id, wait_s: Sample(ask_id, server, request, wait_s))
        if not isinstance(answer, SampleAnswer):
            return types.ErrorData(code=types.INTERNAL_ERROR,
                                   message="no model call: no session to make it for, "
                                           "no answer in time, or its call ended")
        if answer.error:
            return types.ErrorData(code=types.INTERNAL_ERROR, message=answer.error)
        return result_of(answer.message)

    return sample
