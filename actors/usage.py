"""Tokens and cost: what each model call used, the totals, and a price estimate.

One shape travels everywhere, the Messages API's own usage fields plus the
estimate, as the dict `Usage.to_dict` gives::

    {"input_tokens": 1200, "output_tokens": 85, "cache_creation_input_tokens": 0,
     "cache_read_input_tokens": 3000, "cost_usd": 0.00574}

The llm caller puts the four token counts of each reply in its `usage`; the
supervisor prices the reply on arrival (`priced`, from the `[prices]` table of
`oploop.toml`) and the run's events carry the result: `ROUTE` and `TURN_END`
the usage of the model call they close, `DONE`/`ERROR`/`CANCELLED` the run's
totals. A session's totals are the fold of those events (`Meter`), so they
survive a restart.

`cost_usd` is None when a call's model has no price: tokens are reported, a
price is never guessed. A total with any such call has no cost either (a sum
of the priced part alone would look like the whole).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bus.vocab import TERMINAL, EventType

#: The events that close one model call and carry its usage (`SAMPLING`: a call an MCP
#: server asked for).
CLOSES_CALL = frozenset({EventType.ROUTE, EventType.TURN_END, EventType.SAMPLING})
#: (Bound once: a member looked up on its enum costs ~0.5 µs in Python 3.11, and every
#: event of a session is counted here.)
_SESSION_START = EventType.SESSION_START
_COMPACTED = EventType.COMPACTED

#: Token fields of the Messages API's `usage`, in `Usage` field order.
API_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens",
              "cache_read_input_tokens")


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens of one model: input, output, cache writes, cache reads."""

    input: float
    output: float
    cache_write: float
    cache_read: float


#: Anthropic's list prices (USD per million tokens; cache writes at the 5-minute TTL)
#: for current Claude models. Override or extend with `[prices."MODEL"]` in
#: `oploop.toml`. Not modelled: long-context (> 200k input) rates, batch discounts,
#: 1-hour cache writes.
OFFLINE_MODEL = "offline"
"""The model id the offline model answers with (`actors/offline_model`): it costs nothing."""

DEFAULT_PRICES: Mapping[str, Price] = {
    OFFLINE_MODEL: Price(0.0, 0.0, 0.0, 0.0),
    "claude-opus-4-5": Price(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-1": Price(15.0, 75.0, 18.75, 1.50),
    "claude-opus-4-0": Price(15.0, 75.0, 18.75, 1.50),
    "claude-sonnet-4-5": Price(3.0, 15.0, 3.75, 0.30),
    "claude-sonnet-4-0": Price(3.0, 15.0, 3.75, 0.30),
    "claude-3-7-sonnet": Price(3.0, 15.0, 3.75, 0.30),
    "claude-haiku-4-5": Price(1.0, 5.0, 1.25, 0.10),
    "claude-3-5-haiku": Price(0.80, 4.0, 1.0, 0.08),
    "claude-3-haiku": Price(0.25, 1.25, 0.30, 0.03),
}

# A model id as the API reports it may carry a snapshot date (`claude-sonnet-4-5-20250929`)
# or `-latest`; the price table names the model without it.
_SNAPSHOT = re.compile(r"-(\d{8}|latest)$")


def price_for(model: str, prices: Mapping[str, Price]) -> Price | None:
    """The price of `model`: its exact id, else its id without the snapshot date;
    None if neither is in the table (no guess from a similar name)."""
    found = prices.get(model)
    if found is None:
        found = prices.get(_SNAPSHOT.sub("", model))
    return found


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens of one or more model calls, and their cost in USD (None: not known)."""

    input: int = 0
    output: int = 0
    cache_write: int = 0
    cache_read: int = 0
    cost: float | None = 0.0

    @property
    def tokens(self) -> int:
        """All tokens, of every kind."""
        return self.input + self.output + self.cache_write + self.cache_read

    def __add__(self, other: Usage) -> Usage:
        if other is ZERO:  # (often: a value is never edited, so this one will do)
            return self
        if self is ZERO:
            return other
        cost = None if self.cost is None or other.cost is None else self.cost + other.cost
        return Usage(self.input + other.input, self.output + other.output,
                     self.cache_write + other.cache_write, self.cache_read + other.cache_read,
                     cost)

    def to_dict(self) -> dict[str, Any]:
        """The wire form: the API's four token fields and `cost_usd`."""
        cost = None if self.cost is None else round(self.cost, 6)
        return {"input_tokens": self.input, "output_tokens": self.output,
                "cache_creation_input_tokens": self.cache_write,
                "cache_read_input_tokens": self.cache_read, "cost_usd": cost}

    @classmethod
    def from_dict(cls, raw: Any) -> Usage:
        """A usage dict (an API reply's, or `to_dict`'s) as `Usage`; anything malformed
        counts as nothing. A dict without `cost_usd` has an unknown cost, unless it
        counts no tokens at all."""
        if not isinstance(raw, Mapping):
            return ZERO
        get = raw.get  # (a few times a turn: the usual shape is checked in one test)
        i, o, w, r = (get("input_tokens"), get("output_tokens"),
                      get("cache_creation_input_tokens"), get("cache_read_input_tokens"))
        if not (type(i) is int and type(o) is int and type(w) is int and type(r) is int
                and i >= 0 and o >= 0 and w >= 0 and r >= 0):
            i, o, w, r = _count(i), _count(o), _count(w), _count(r)
        cost = get("cost_usd")
        if type(cost) is float and cost >= 0:
            return cls(i, o, w, r, cost)
        if not isinstance(cost, int | float) or isinstance(cost, bool) or cost < 0:
            cost = None if i or o or w or r else 0.0
        return cls(i, o, w, r, float(cost) if cost is not None else None)

    def priced(self, price: Price | None) -> Usage:
        """These tokens with their cost at `price` (None: cost unknown, unless no tokens)."""
        if price is None:
            cost: float | None = 0.0 if not self.tokens else None
        else:
            cost = (self.input * price.input + self.output * price.output
                    + self.cache_write * price.cache_write
                    + self.cache_read * price.cache_read) / 1_000_000
        return Usage(self.input, self.output, self.cache_write, self.cache_read, cost)


ZERO = Usage()


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def of_reply(reply: Mapping[str, Any]) -> Usage:
    """The usage a model reply (an assistant message dict) carries."""
    return Usage.from_dict(reply.get("usage"))


def priced(reply: dict[str, Any], prices: Mapping[str, Price]) -> dict[str, Any]:
    """`reply` with its `usage` priced by its `model` (a new dict; the reply's tokens
    kept as the API gave them)."""
    usage = of_reply(reply).priced(price_for(str(reply.get("model") or ""), prices))
    return {**reply, "usage": usage.to_dict()}


# -- the run's and the session's counts, from events ----------------------------------

def event_usage(type_: str, run: Usage, pending: Usage) -> Usage | None:
    """The usage an event of a run carries: the calls it closes (`ROUTE`, `TURN_END`:
    `pending`, the calls answered since the last such event), the run's totals
    (a terminal event: `run` plus `pending`), or nothing."""
    if type_ in CLOSES_CALL:
        return pending
    if type_ in TERMINAL:
        return run + pending
    return None


def with_usage(type_: str, data: dict[str, Any], run: Usage, pending: Usage) -> dict[str, Any]:
    """An event's data with its usage (`event_usage`) added, or `data` as is."""
    usage = event_usage(type_, run, pending)
    return data if usage is None else {**data, "usage": usage.to_dict()}


def after_event(type_: str, data: Mapping[str, Any], run: Usage,
                pending: Usage) -> tuple[Usage, Usage]:
    """The run's counts (`run`, `pending`) once an event has gone out: a start
    clears them, a call-closing event moves its usage into `run`, a terminal one
    ends the run."""
    if type_ == _SESSION_START or type_ in TERMINAL:
        return ZERO, ZERO
    if type_ in CLOSES_CALL:
        return run + Usage.from_dict(data.get("usage")), ZERO
    return run, pending


@dataclass
class Meter:
    """A session's tokens as its events report them: its ended runs (`ended`, from
    their terminal events) and the open run so far (`run`, from its `ROUTE` and
    `TURN_END` events). The same fold live (each event as it is emitted) and from
    the log, so the totals survive a restart. A call whose `TURN_END` has not gone
    out yet is not counted: its usage travels with that event."""

    ended: Usage = ZERO
    run: Usage = ZERO

    def apply(self, type_: str, data: Mapping[str, Any]) -> None:
        """Count one event of the session."""
        if type_ in TERMINAL or type_ == _COMPACTED:  # (one between runs)
            self.ended = self.ended + Usage.from_dict(data.get("usage"))
        # `after_event(type_, data, self.run, ZERO)[0]`, without its pair, every event:
        if type_ in CLOSES_CALL:
            self.run = self.run + Usage.from_dict(data.get("usage"))
        elif type_ == _SESSION_START or type_ in TERMINAL:
            self.run = ZERO

    def total(self) -> Usage:
        """Everything the session used so far."""
        return self.ended + self.run

    def to_state(self) -> list[dict[str, Any]]:
        """What a snapshot keeps (`ended`, `run`: what the log says)."""
        return [self.ended.to_dict(), self.run.to_dict()]

    @classmethod
    def from_state(cls, raw: Any) -> Meter:
        """The meter a `to_state` describes (anything else: an empty one)."""
        if not isinstance(raw, list | tuple) or len(raw) != 2:
            return cls()
        return cls(Usage.from_dict(raw[0]), Usage.from_dict(raw[1]))


# -- showing it -----------------------------------------------------------------------

def short_count(n: int) -> str:
    """A token count for people: 950, 12.3k, 4.1M."""
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.1f}k".replace(".0k", "k")
    return f"{n / 1_000_000:.1f}M".replace(".0M", "M")


def money(cost: float | None) -> str:
    """A cost for people: $0.04, $0.0012, $12.30; "" if unknown."""
    if cost is None:
        return ""
    if cost == 0:
        return "$0.00"
    if cost < 0.01:
        return f"${cost:.4f}"
    return f"${cost:.2f}"


def total_line(data: Mapping[str, Any]) -> str:
    """What a run's end adds to the human output: its totals on a line of their own
    (`  tokens: 12.3k in · 1.2k out · $0.04`), or "" if its event has none."""
    raw = data.get("usage")
    return f"\n  tokens: {describe(raw)}" if isinstance(raw, Mapping) else ""


def describe(raw: Any) -> str:
    """A usage dict in one line: `12.3k in · 1.2k out · 3k cache read · $0.04`
    (cache parts only when there are any; no price when it is not known); "" for
    None (a session listed by an older host)."""
    if raw is None:
        return ""
    u = raw if isinstance(raw, Usage) else Usage.from_dict(raw)
    parts = [f"{short_count(u.input)} in", f"{short_count(u.output)} out"]
    if u.cache_write:
        parts.append(f"{short_count(u.cache_write)} cache write")
    if u.cache_read:
        parts.append(f"{short_count(u.cache_read)} cache read")
    if u.cost is not None:
        parts.append(money(u.cost))
    return " · ".join(parts)
