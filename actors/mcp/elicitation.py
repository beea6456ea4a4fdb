"""A server's questions to the user (`elicitation/create`), asked through the session.

The executor's `ClientSession`s declare the elicitation capability (form and URL
modes) with `Elicitations.callback` as their handler. A request is the question of
the session whose call is in flight on that server (`calling`): it goes to the
supervisor as an `Elicit` for that call's job, which makes it an
`ELICITATION_REQUESTED` event; any viewer with control rights answers (`oploop
answer`), and the answer comes back as an `ElicitAnswer` (`answered`), which the
server gets as its `ElicitResult`.

The protocol does not say which call a request belongs to (over stdio nothing ties
them), so: a server with calls of one session in flight asks that session (the
latest call's job carries it); with none, or calls of several sessions at once, the
request is declined (said in the log): a question must not reach a person who did
not cause it. An answer that does not come while the call can still wait (its
`timeout_s`, `WAIT_S` at most) is a decline. A call that ends first (cancelled, past its
bound, or aborted by a restarted supervisor that no longer waits for it) answers its
questions "cancel" at once: the server is told, and nothing waits on for an answer that
cannot come. A question still waiting when the executor announces itself to a restarted
supervisor is asked again (`ask_again`), with the time it has left: the run that adopts
its call says it again, and the answer comes back as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.client.session import ClientRequestContext

from bus.mcpwire import Elicit, ElicitAnswer, SampleAnswer
from bus.messages import Envelope

log = logging.getLogger("oploop.mcp")

#: Longest wait for a person's answer (a call's own bound may be shorter).
WAIT_S = 600.0
#: Kept from a call's remaining time, so the answer reaches the server before the call
#: itself times out.
MARGIN_S = 2.0

#: Sends a message for the job of an envelope (the worker's `progress`).
Send = Callable[[Envelope, Any], None]


@dataclass(slots=True)
class _Call:
    env: Envelope
    deadline: float  # time.monotonic()


class Elicitations:
    """The calls in flight per server, and the questions waiting for an answer."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._calls: dict[str, list[_Call]] = {}
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        #: The call each waiting question was asked for (its end cancels them).
        self._asked_by: dict[str, _Call] = {}
        #: Each waiting elicitation as sent, and when its wait ends (time.monotonic()).
        self._elicits: dict[str, tuple[Elicit, float]] = {}
        self._ids = itertools.count(1)
        self._prefix = secrets.token_hex(3)

    @contextlib.contextmanager
    def calling(self, server: str, env: Envelope, timeout_s: float | None) -> Iterator[None]:
        """While a call of job `env` on `server` is in flight (bounded by `timeout_s`)."""
        call = _Call(env, time.monotonic() + (timeout_s if timeout_s is not None else WAIT_S))
        self._calls.setdefault(server, []).append(call)
        try:
            yield
        finally:
            calls = self._calls.get(server, [])
            with contextlib.suppress(ValueError):
                calls.remove(call)
            if not calls:
                self._calls.pop(server, None)
            self._cancel_questions(call)

    def _cancel_questions(self, call: _Call) -> None:
        """The call's questions still waiting are answered "cancel" (the call is over)."""
        for ask_id in [a for a, c in self._asked_by.items() if c is call]:
            waiting = self._waiting.get(ask_id)
            if waiting is not None and not waiting.done():
                waiting.set_result(ElicitAnswer(ask_id, "cancel", {}))

    def callback(self, server: str) -> Any:
        """The `elicitation_callback` of `server`'s `ClientSession`."""

        async def elicit(context: ClientRequestContext, params: types.ElicitRequestParams
                         ) -> types.ElicitResult | types.ErrorData:
            return await self._elicit(server, params)

        return elicit

    def answered(self, answer: ElicitAnswer | SampleAnswer) -> None:
        """The supervisor's answer (`ElicitAnswer`, `SampleAnswer`): wake the question
        (one that ended meanwhile is ignored)."""
        waiting = self._waiting.get(answer.id)
        if waiting is not None and not waiting.done():
            waiting.set_result(answer)

    async def ask(self, server: str, what: str, make: Callable[[str, float], Any]) -> Any:
        """Send the body `make(id, wait_s)` for the one session whose calls are in flight
        on `server`, and wait (`wait_s`) for the supervisor's answer; None if there is
        no such session, or no answer in time. `what` names the request in the log."""
        calls = self._calls.get(server, [])
        sessions = {c.env.sid for c in calls}
        if len(sessions) != 1:
            why = "no call of a session is in flight" if not sessions else \
                f"calls of {len(sessions)} sessions are in flight: whose request it is is unknown"
            log.warning("MCP server %s asked for %s while %s: refused", server, what, why)
            return None
        call = calls[-1]
        wait_s = min(WAIT_S, call.deadline - time.monotonic() - MARGIN_S)
        if wait_s <= 0:
            return None
        ask_id = f"{what[:2]}-{self._prefix}-{next(self._ids)}"
        waiting: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[ask_id] = waiting
        self._asked_by[ask_id] = call
        body = make(ask_id, wait_s)
        if isinstance(body, Elicit):
            self._elicits[ask_id] = (body, time.monotonic() + wait_s)
        try:
            self._send(call.env, body)
            async with asyncio.timeout(wait_s):
                return await waiting
        except TimeoutError:
            return None
        finally:
            self._waiting.pop(ask_id, None)
            self._asked_by.pop(ask_id, None)
            self._elicits.pop(ask_id, None)

    def ask_again(self) -> int:
        """Send every elicitation still waiting again, with the time it has left (the
        supervisor that had it restarted: the next says it again when it adopts the
        call). Returns how many."""
        now = time.monotonic()
        again = 0
        for ask_id, (body, until) in list(self._elicits.items()):
            call = self._asked_by.get(ask_id)
            if call is None or until - now <= 0:
                continue
            self._send(call.env, dataclasses.replace(body, wait_s=round(until - now, 3)))
            again += 1
        return again

    async def _elicit(self, server: str, params: types.ElicitRequestParams
                      ) -> types.ElicitResult:
        url = params.url if isinstance(params, types.ElicitRequestURLParams) else ""

        def make(ask_id: str, wait_s: float) -> Elicit:
            if isinstance(params, types.ElicitRequestURLParams):
                return Elicit(ask_id, server, params.message, url=params.url, wait_s=wait_s)
            return Elicit(ask_id, server, params.message, dict(params.requested_schema),
                          wait_s=wait_s)

        answer = await self.ask(server, "elicitation", make)
        if not isinstance(answer, ElicitAnswer):
            return types.ElicitResult(action="decline")
        if answer.action == "accept" and not url:
            return types.ElicitResult(action="accept", content=dict(answer.content))
        if answer.action in ("accept", "decline", "cancel"):
            return types.ElicitResult(action=answer.action)  # type: ignore[arg-type]
        return types.ElicitResult(action="decline")
