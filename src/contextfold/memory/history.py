"""History filtering: which of a conversation's messages go on to the model.

``filter_history`` is a pure function over values. The proxy runs it over the message list a
client sends; ``MemoryEngine`` runs it over its own turns. It removes the messages whose content
already lives in memory summaries ("compacted") and, for a focused query, the messages a
relevance predicate rejects ("off-topic"), while keeping tool chains whole, the recent turns
and the system messages, and merging the same-role neighbours a removal leaves behind. Every
input message is accounted for in the result: kept (possibly merged) or removed with a reason.

>>> history = [
...     Message(role="user", content="Plan a trip to Paris."),
...     Message(role="assistant", content="Paris, day 1: the Louvre."),
...     Message(role="user", content="Unrelated: fix my regex."),
...     Message(role="assistant", content="Use a raw string."),
...     Message(role="user", content="And day 2?"),
... ]
>>> def on_topic(index: int, message: Message) -> bool:
...     return "Paris" in message.text()
>>> out = filter_history(history, protected_recent=1, keep=on_topic)
>>> [m.text() for m in out.messages]
['Plan a trip to Paris.', 'Paris, day 1: the Louvre.', 'And day 2?']
>>> [(r.index, r.reason) for r in out.removed]
[(2, 'off-topic'), (3, 'off-topic')]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from contextfold.conversation import tool_units
from contextfold.errors import ConfigError
from contextfold.items import ContentBlock, Message, Role, TextBlock, ToolUseBlock
from contextfold.tokens import TokenCounter

__all__ = ["FilteredHistory", "HistoryMerge", "HistoryRemoval", "filter_history"]

RemovalReason = Literal["compacted", "off-topic"]
PREVIEW_CHARS = 80
_JOIN = "\n\n"  # between the text of merged messages

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class HistoryRemoval(BaseModel):
    """One input message left out, and why. ``tokens`` is set when a counter was given."""

    model_config = _FROZEN
    index: int
    role: Role
    reason: RemovalReason
    tokens: int | None = None
    preview: str


class HistoryMerge(BaseModel):
    """Input messages (``indices``, ascending) sent as the one output message at
    ``output_index``, because removals between them left same-role neighbours."""

    model_config = _FROZEN
    output_index: int
    indices: tuple[int, ...]
    role: Role


class FilteredHistory(BaseModel):
    """What ``filter_history`` returns: the messages to send and how they came about.

    ``kept_indices[k]`` lists the input indices behind ``messages[k]`` (more than one when
    merged); every input index appears exactly once, either there or in ``removed``.
    ``protected_start`` is the first index of the protected zone (after extending it over tool
    chains). ``leading_assistant`` is true when the first non-system message is an assistant
    message (see ``filter_history``).
    """

    model_config = _FROZEN
    messages: list[Message]
    removed: list[HistoryRemoval]
    merged: list[HistoryMerge]
    kept_indices: list[tuple[int, ...]]
    protected_start: int
    leading_assistant: bool


def filter_history(
    messages: Sequence[Message],
    *,
    protected_recent: int = 6,
    compacted: int = 0,
    keep: Callable[[int, Message], bool] | None = None,
    broad: bool = False,
    counter: TokenCounter | None = None,
) -> FilteredHistory:
    """Filter ``messages`` (oldest first) down to the ones to send.

    What is decided, unit by unit. A *unit* is a tool chain (an assistant message with
    ``tool_use`` blocks, the messages carrying the matching results, and every message linked
    to those transitively) or a single other message; a unit is kept or removed whole, so
    filtering never separates a call from its result.

    1. Always kept: units holding a system message, or a message of the protected zone. The
       zone is the last ``protected_recent`` messages, and never fewer than the last message;
       when it would start inside a tool chain it is extended back to the chain's first
       message (and again, should that start inside another chain), so it stays a contiguous
       suffix.
    2. Removed as ``"compacted"``: units lying wholly before ``compacted``, the number of
       leading messages whose content already lives in memory summaries (a watermark past the
       end compacts everything). A chain straddling the watermark is kept whole rather than
       cut: it is treated as uncompacted, and its later part is not yet in any summary.
       "Always kept" wins over compaction: a lagging watermark costs tokens, never content.
    3. Removed as ``"off-topic"``: the remaining units none of whose messages ``keep(index,
       message)`` accepts. ``keep`` is called at most once per message, in unit order, and not
       for messages already decided; it is never called when ``broad`` is true (broad and
       temporal queries skip relevance filtering; compaction still applies) or for the
       compacted units.

    Tool traffic the input already breaks (a call whose result is missing, or the reverse) is
    passed through as it came: filtering repairs nothing but never creates an orphan.

    Role alternation. Removing messages can leave two messages of one role side by side; such
    neighbours are merged into one output message (content blocks in order, the text at the
    seam joined by a blank line) and each merge is recorded in ``merged``. Messages that were
    already adjacent in the input are left as the client sent them (with nothing removed the
    output equals the input). Not merged, by design:

    * system messages: OpenAI accepts them anywhere, the Anthropic and Gemini formatters lift
      them out of the turns, and the client's own instructions are never rewritten;
    * messages with different ``name`` (different speakers);
    * an assistant message carrying ``tool_use`` blocks with a later assistant message: its
      calls must stay the last thing before their results (a text-only assistant message
      *followed* by one with calls merges fine — the calls stay last).

    ``tool`` messages hold only results, so two of them merge safely: OpenAI sends one
    ``tool`` message per result anyway, and Anthropic wants all the results answering one
    assistant turn in a single user message. A ``tool`` message beside a ``user`` message is
    left alone here; the Anthropic formatter sends both as one user message, results first.

    A leading assistant message. When the first non-system message of the result is an
    assistant message, ``leading_assistant`` says so and the message is kept as it is (no
    message is invented). Anthropic requires the first message to be a user message: the
    caller can put a user message in front (its memory context, say), widen the protected
    zone or lower the watermark so the user turn before it stays, or leave the assistant
    message out itself.

    The input is never mutated; kept messages are passed through as the same objects. With
    ``counter``, each removal records the tokens of the message's text.
    Raises ``ConfigError`` for a negative ``protected_recent`` or ``compacted``.
    """
    if protected_recent < 0:
        raise ConfigError(f"protected_recent must be >= 0, got {protected_recent}")
    if compacted < 0:
        raise ConfigError(f"compacted must be >= 0, got {compacted}")
    n = len(messages)
    units = tool_units(messages)
    first_of = [0] * n  # each message's unit's first index
    for idxs in units:
        for i in idxs:
            first_of[i] = idxs[0]
    start = _protected_start(first_of, protected_recent)

    kept = [False] * n
    reasons: dict[int, RemovalReason] = {}
    for idxs in units:
        if idxs[-1] >= start or any(messages[i].role == "system" for i in idxs):
            verdict: RemovalReason | None = None
        elif idxs[-1] < compacted:
            verdict = "compacted"
        elif keep is None or broad or any(keep(i, messages[i]) for i in idxs):
            verdict = None
        else:
            verdict = "off-topic"
        for i in idxs:
            if verdict is None:
                kept[i] = True
            else:
                reasons[i] = verdict

    out: list[Message] = []
    sources: list[list[int]] = []
    previous = -1  # the input index of the last kept message
    for i, message in enumerate(messages):
        if not kept[i]:
            continue
        if out and previous != i - 1 and _mergeable(out[-1], message):
            out[-1] = _merge(out[-1], message)
            sources[-1].append(i)
        else:
            out.append(message)
            sources.append([i])
        previous = i

    first_turn = next((m for m in out if m.role != "system"), None)
    # Every field is built here from validated values: no need to validate each message again
    # (the proxy filters a long history on every request).
    return FilteredHistory.model_construct(
        messages=out,
        removed=[
            _removal(i, messages[i], reason, counter) for i, reason in sorted(reasons.items())
        ],
        merged=[
            HistoryMerge(output_index=k, indices=tuple(idxs), role=out[k].role)
            for k, idxs in enumerate(sources)
            if len(idxs) > 1
        ],
        kept_indices=[tuple(idxs) for idxs in sources],
        protected_start=start,
        leading_assistant=first_turn is not None and first_turn.role == "assistant",
    )


def _protected_start(first_of: list[int], protected_recent: int) -> int:
    """The first index of the protected zone: the last ``protected_recent`` messages (at least
    one), extended back until no tool chain reaching into it starts before it."""
    n = len(first_of)
    start = max(0, n - max(protected_recent, 1))
    j = n - 1
    while j >= start:  # ``start`` only moves back, and every index from it on is checked
        start = min(start, first_of[j])
        j -= 1
    return start


def _mergeable(earlier: Message, later: Message) -> bool:
    if earlier.role != later.role or earlier.name != later.name or earlier.role == "system":
        return False
    return not any(isinstance(b, ToolUseBlock) for b in earlier.content)


def _merge(earlier: Message, later: Message) -> Message:
    """``later`` appended to ``earlier``: blocks in order, the two texts that meet at the seam
    joined by a blank line (an empty one adds nothing)."""
    head: list[ContentBlock] = list(earlier.content)
    tail: list[ContentBlock] = list(later.content)
    if head and tail and isinstance(head[-1], TextBlock) and isinstance(tail[0], TextBlock):
        parts = [t for t in (head[-1].text, tail[0].text) if t]
        head[-1] = TextBlock(text=_JOIN.join(parts))
        tail = tail[1:]
    return Message(role=earlier.role, content=(*head, *tail), name=earlier.name)


def _removal(
    index: int, message: Message, reason: RemovalReason, counter: TokenCounter | None
) -> HistoryRemoval:
    text = message.text()
    preview = " ".join(text.split())
    if len(preview) > PREVIEW_CHARS:
        preview = preview[: PREVIEW_CHARS - 1] + "…"
    return HistoryRemoval(
        index=index,
        role=message.role,
        reason=reason,
        tokens=counter.count(text) if counter is not None else None,
        preview=preview,
    )
