"""What one request takes of the model's window (``memory.context_window``), counted once on
the request path, and what that leaves for memory.

A request may take the window less its reply's reserve (``reply_reserve``: the request's own
``max_tokens`` / ``max_completion_tokens`` / ``max_output_tokens`` / ``maxOutputTokens``, else
``proxy.reply_reserve_tokens``; at most half the window). ``measure`` counts the rest of it
before the recall: each parsed message as its format counts it (``message_cost``: the record
reuses these counts, so the history is counted once per request, and a resent history's texts
hit a shared memo), the tools' JSON (the memory tools included) and the per-request framing.
From that:

- ``Fit.room``: what memory may take beside the history sent (``memory.Room``: the history
  the filter keeps, and what the proxy cannot leave out besides — ``recall.sent_history``):
  memory never pushes the request past the window;
- ``Fit.overhead``: what every request of the session carries besides its history (the system
  prompt, the tools, the memory budget, the reply's reserve), noted on the engine
  (``note_fixed_tokens``) so compaction starts early enough that the history fits beside it;
- ``forwarded``: the tokens of the body as it goes upstream, memory included — memory is cut
  to its topic hint, or left out, where the request would pass the window with it all the
  same (``recall.add_memory``);
- ``tool_round``: each follow-up round of the proxy's own tool loop (the memory tools' calls
  and results appended), counted the same way, its results cut to what the window leaves;
- ``overflow``: the note (and warning) for a request that is over the window all the same
  (compaction has not caught up yet, one message is that large, or the turns the provider
  holds for a chained Responses request fill it): it goes upstream whole, as nothing of a
  history the proxy has not stored is dropped.

Counts are estimates where the provider's are unknown: Anthropic's and Gemini's framing
(``OVERHEADS``), tools counted as their JSON, and parts the proxy does not read (images,
documents, audio) not counted at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from contextfold._bounded import BoundedMemo, text_size
from contextfold.formats import formatter_for
from contextfold.items import Message, ToolResultBlock, ToolUseBlock
from contextfold.memory.assemble import Room
from contextfold.tokens import OVERHEADS, MessageOverhead, TokenCounter

if TYPE_CHECKING:
    from contextfold.formats.base import BaseFormatter
    from contextfold.server.proxy.record import Plan
    from contextfold.server.state import ServerState

__all__ = [
    "CUT",
    "Fit",
    "count",
    "forwarded",
    "measure",
    "message_costs",
    "note",
    "overflow",
    "tool_round",
]

#: ``counter.count(text)``, remembered: a chat client resends its history every turn. Bounded
#: by entries and by the bytes of the texts it keeps alive.
_COUNTS: BoundedMemo[tuple[str, str], int] = BoundedMemo(entries=50_000, max_bytes=8 << 20)

#: The reply's own maximum, by format: the keys a request names it with (the first found wins).
_REPLY_KEYS: dict[str, tuple[str, ...]] = {
    "openai": ("max_completion_tokens", "max_tokens"),
    "anthropic": ("max_tokens",),
    "responses": ("max_output_tokens",),
}


def count(counter: TokenCounter, text: str) -> int:
    """``counter.count(text)``, memoised by text (shared with the dashboard record)."""
    return _COUNTS.get(
        (counter.name, text), lambda: counter.count(text), size=text_size(text) + 200
    )


class _Memoised:
    """``counter`` with its counts memoised by text (``count``): a formatter counts through it."""

    __slots__ = ("counter", "estimated", "name")

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.name = counter.name
        self.estimated = counter.estimated

    def count(self, text: str) -> int:
        return count(self.counter, text)

    def cut(self, text: str, max_tokens: int, *, from_end: bool = False) -> str:
        return self.counter.cut(text, max_tokens, from_end=from_end)


@cache
def _formatter(fmt: str) -> BaseFormatter:
    return formatter_for(fmt if fmt in OVERHEADS else "openai")


def overheads(fmt: str) -> MessageOverhead:
    """The framing a format adds (the Responses API is counted as OpenAI's)."""
    return OVERHEADS.get(fmt, OVERHEADS["openai"])


def message_costs(messages: Sequence[Message], counter: TokenCounter, fmt: str) -> list[int]:
    """Each message's tokens as its format counts it in a payload (``message_cost``: the
    framing, the role where the format counts it, every text, tool call and result), its
    texts' counts memoised."""
    formatter, memoised = _formatter(fmt), _Memoised(counter)
    return [formatter.message_cost(m, memoised) for m in messages]


def reply_reserve(fmt: str, body: dict[str, Any], default: int, window: int) -> int:
    """The tokens kept for the reply: the request's own maximum, else ``default``; at most half
    the window (a larger maximum would leave the history no room)."""
    asked: object = None
    if fmt == "gemini":
        config = body.get("generationConfig") or body.get("generation_config")
        if isinstance(config, dict):
            asked = config.get("maxOutputTokens", config.get("max_output_tokens"))
    else:
        for key in _REPLY_KEYS.get(fmt, ()):
            if key in body:
                asked = body[key]
                break
    if not isinstance(asked, int) or isinstance(asked, bool) or asked <= 0:
        asked = default
    return min(asked, window // 2)


@dataclass(slots=True)
class Fit:
    """One request against the window: ``fixed`` (its framing, tools and the memory block's
    seam), ``costs`` (each parsed message), ``system`` (the system messages among them),
    ``held`` (the earlier turns the provider holds for a chained Responses request: counted
    in ``costs``, never left out); ``sent``: the body's tokens as forwarded, memory included
    (``forwarded``; after the proxy's tool loop, its last and largest round: ``tool_round``)."""

    window: int
    reserve: int
    fixed: int
    costs: list[int]
    system: int
    held: int = 0
    sent: int | None = None

    @property
    def limit(self) -> int:
        """What the prompt may take: the window less the reply's reserve."""
        return self.window - self.reserve

    def room(self, sent: Callable[[list[int]], Iterable[int]] | None = None) -> Room:
        """What the history and memory may take together (``on_message_inbound``'s ``room``);
        ``sent``: the history the request sends when the filter keeps some (``Room.sent``)."""
        return Room(tokens=self.limit - self.fixed, history=self.costs, sent=sent)

    def overhead(self, memory_budget: int) -> int:
        """What every request of the session takes besides its history: its system prompt,
        tools and framing, the memory budget and the reply's reserve. (The turns a provider
        holds for a chain are not among them: they are stored turns, live until compacted,
        and compaction cannot shrink what the provider holds.)"""
        return self.fixed + self.system + memory_budget + self.reserve


def measure(
    state: ServerState,
    fmt: str,
    body: dict[str, Any],
    messages: Sequence[Message],
    *,
    extra_tools: Sequence[dict[str, Any]] = (),
    held: int = 0,
) -> Fit:
    """Count the request ``body`` (its ``messages`` as parsed, its tools with ``extra_tools``,
    the ones the proxy adds) against the window, before the recall. ``held``: how many of the
    first ``messages`` the provider holds (a chained Responses request's earlier turns)."""
    counter = state.memory.counter
    window = state.memory.config.context_window
    framing = overheads(fmt)
    costs = message_costs(messages, counter, fmt)
    tools = body.get("tools")
    listed = [*(tools if isinstance(tools, list) else ()), *extra_tools]
    tool_tokens = count(counter, json.dumps(listed)) if listed else 0
    # Memory goes in as a text block or part, or as a message of its own after tool results.
    seam = framing.per_message + framing.per_part + 2
    return Fit(
        window=window,
        reserve=reply_reserve(fmt, body, state.config.proxy.reply_reserve_tokens, window),
        fixed=framing.per_request + tool_tokens + seam,
        costs=costs,
        system=sum(c for c, m in zip(costs, messages, strict=True) if m.role == "system"),
        held=sum(costs[:held]),
    )


def note(state: ServerState, plan: Plan, session_id: str | None) -> None:
    """Note the request's overhead on the engine for its session (``note_fixed_tokens``), so
    the session's next compaction is judged with it."""
    if plan.fit is None or session_id is None:
        return
    budget = state.memory.config.assembly.memory_budget
    state.memory.note_fixed_tokens(plan.fit.overhead(budget), session_id=session_id)


def forwarded(plan: Plan, memory_tokens: int) -> int:
    """The tokens of the body as forwarded: its fixed parts, the messages not left out, and
    ``memory_tokens``; kept in ``plan.fit.sent``."""
    fit = plan.fit
    assert fit is not None
    dropped = set(plan.dropped)
    history = sum(c for i, c in enumerate(fit.costs) if i not in dropped)
    fit.sent = fit.fixed + history + memory_tokens
    return fit.sent


#: Ends a memory tool's result cut to what the window leaves it (``tool_round``).
CUT = "\n[cut: the model's window has no room for the rest]"


def tool_round(
    plan: Plan,
    counter: TokenCounter,
    call: Message,
    results: list[tuple[ToolUseBlock, str]],
) -> list[tuple[ToolUseBlock, str]]:
    """A follow-up round of the proxy's tool loop: the round before with the model's ``call``
    (its memory tool calls) and their ``results`` appended (``stream.continuation``). The
    results are cut (ending in ``CUT``) to an equal share each of what the window leaves them
    beside the rest, and ``plan.fit.sent`` becomes the round's tokens (``overflow`` then says
    whether it is over all the same). Unchanged where the request was not counted."""
    fit = plan.fit
    if fit is None or fit.sent is None or not results:
        return results
    fmt = plan.format
    asked = message_costs([call], counter, fmt)[0]
    framing = overheads(fmt)
    # Each result's own framing: a message of its own (OpenAI) or a part, and its call's id.
    seam = framing.per_message + framing.per_part + 8
    share = (fit.limit - (fit.sent - _stubbed(plan) + asked)) // len(results) - seam
    fitted = [(c, _cut(counter, text, share)) for c, text in results]
    blocks = [ToolResultBlock(tool_use_id=c.id, content=text) for c, text in fitted]
    if fmt == "openai":  # one tool message per result
        added = [Message(role="tool", content=(b,)) for b in blocks]
    else:  # one message holding them all
        added = [Message(role="tool", content=tuple(blocks))]
    fit.sent += asked + sum(message_costs(added, counter, fmt))
    return fitted


def _cut(counter: TokenCounter, text: str, tokens: int) -> str:
    """``text`` within ``tokens`` (``CUT`` included), else unchanged."""
    if count(counter, text) <= tokens:
        return text
    return counter.cut(text, max(tokens - count(counter, CUT), 0)) + CUT


def _stubbed(plan: Plan) -> int:
    """The tokens the proxy took off the tool outputs it stubbed (``outputs``), estimated."""
    if plan.compaction is None:
        return 0
    return max(0, plan.compaction.tokens_before - plan.compaction.tokens_after)


def overflow(plan: Plan, *, round_: int = 0) -> str | None:
    """The note for a request that goes upstream over the window (logged as a warning), or
    ``None`` when it fits (or was not counted: its memory path did not finish). Tool outputs
    the proxy stubbed (``outputs``) are taken off at their estimate. ``round_``: a follow-up
    round of the proxy's tool loop (``tool_round``), counted from 1."""
    fit = plan.fit
    if fit is None or fit.sent is None:
        return None
    sent = fit.sent - _stubbed(plan)
    over = sent - fit.limit
    if over <= 0:
        return None
    if round_:
        return (
            f"memory tool round {round_} over the model's window: about {sent:,} tokens +"
            f" {fit.reserve:,} kept for the reply > {fit.window:,} (context_window),"
            f" {over:,} tokens over though its tool results were cut (the request and the"
            " model's calls fill the window); forwarded whole"
        )
    held = (
        f"{fit.held:,} of its tokens are earlier turns the provider holds for the chain"
        " (previous_response_id), which the proxy cannot leave out"
    )
    if fit.held >= over:  # the chain alone: compaction cannot help
        why = f"{held} and compaction cannot shrink; start a new chain, or send truncation: auto"
    elif fit.fixed + fit.system >= fit.limit:  # nothing of the history could make it fit
        why = (
            f"the system prompt and tools alone take about {fit.fixed + fit.system:,} tokens"
            " of it; raise context_window to the model's, or shorten them"
        )
    else:
        why = "compaction has not caught up with this conversation, or one message is that large"
        if fit.held:
            why += f"; {held}"
    return (
        f"request over the model's window: about {sent:,} tokens + {fit.reserve:,} kept for"
        f" the reply > {fit.window:,} (context_window), {over:,} tokens over; forwarded"
        f" whole ({why}; nothing unstored is left out)"
    )
