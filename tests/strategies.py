"""Hypothesis strategies for the packer: candidates, budgets, formatters and counters.

Candidates cover every ``SourceType``: pinned instructions and queries, ranked free items with
priorities, scores, ``group_id`` groups and explicit sections, and a conversation whose tool
exchanges are sometimes complete, sometimes missing a result or a call, and sometimes split by
an unrelated turn. Ids are unique and every timestamp is explicit, so a drawn candidate list
packs the same way every time. ``histories`` (``contextfold.store.conformance.histories``,
re-exported here with the texts) draws plain message lists with the same tool
exchanges, for history filtering.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import strategies as st

from contextfold.budget import (
    OverflowStrategy,
    SectionBudget,
    TokenBudget,
    default_agent_budget,
    default_chat_budget,
    default_rag_budget,
    fixed5_budget,
    graph_budget,
)
from contextfold.formats import (
    AnthropicFormatter,
    BaseFormatter,
    GeminiFormatter,
    GenericTextFormatter,
    OpenAIFormatter,
)
from contextfold.items import ContextItem, Message, SourceType

# Message histories and texts live with the store's property tests, which draw them too.
from contextfold.store.conformance.histories import _exchange as _exchange
from contextfold.store.conformance.histories import _names, _text_blocks
from contextfold.store.conformance.histories import _user_messages as _user_messages
from contextfold.store.conformance.histories import histories as histories
from contextfold.store.conformance.histories import sentences as sentences
from contextfold.store.conformance.histories import short_texts as short_texts
from contextfold.store.conformance.histories import texts as texts
from contextfold.tokens import CharCounter, TokenCounter

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)

FORMATTERS: tuple[BaseFormatter, ...] = (
    OpenAIFormatter(),
    AnthropicFormatter(),
    GeminiFormatter(),
    GenericTextFormatter(),
    OpenAIFormatter(memory_as_system=True),
    AnthropicFormatter(memory_as_system=True),
    GeminiFormatter(memory_as_system=True),
    GenericTextFormatter(memory_as_system=True),
)
formatters = st.sampled_from(FORMATTERS)
char_counters: st.SearchStrategy[TokenCounter] = st.sampled_from(
    [CharCounter(), CharCounter(1), CharCounter(3)]
)

_scores = st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(-10, 10, allow_nan=False))
_priorities = st.integers(1, 10)
_groups = st.sampled_from([None, None, None, None, None, "g1", "g2"])


# --------------------------------------------------------------------------- candidates
# Strategies are built once at module level: building them inside a draw costs more than
# drawing from them.

_SECTION_NAMES = ["entry_points", "expanded", "entities", "memory", "retrieval", "tools", "nope"]

_free_items = st.fixed_dictionaries(
    {
        "content": texts,
        "source": st.sampled_from(
            [
                SourceType.RETRIEVAL,
                SourceType.RETRIEVAL,
                SourceType.MEMORY,
                SourceType.TOOL,
                SourceType.SYSTEM,
                SourceType.USER,
            ]
        ),
        "section": st.one_of(st.none(), st.none(), st.sampled_from(_SECTION_NAMES)),
        "priority": _priorities,
        "score": _scores,
        "metadata": st.fixed_dictionaries(
            {}, optional={"title": short_texts, "tool_name": st.sampled_from(["grep", "ls"])}
        ),
        "created_at": st.integers(0, 10_000).map(lambda m: EPOCH + timedelta(minutes=m)),
        "group_id": _groups,
    }
)
_rank = st.fixed_dictionaries({"priority": _priorities, "score": _scores, "group_id": _groups})
_text_messages = st.builds(
    Message,
    role=st.sampled_from(["user", "assistant", "system"]),
    content=_text_blocks,
    name=_names,
)
_bare_turns = st.fixed_dictionaries(
    {"content": texts, "metadata": st.sampled_from([{"role": "user"}, {"role": "assistant"}])}
)
_turn_kinds = st.sampled_from(["text", "text", "bare", "tool", "tool"])
_fates = st.sampled_from(["ok", "ok", "ok", "no_result", "no_call", "interleaved"])
_coin = st.integers(0, 1)


def _conversation(draw: st.DrawFn, max_turns: int, conv_groups: bool) -> list[dict[str, Any]]:
    """Conversation candidates, oldest first, tool exchanges included."""
    out: list[dict[str, Any]] = []
    calls = 0

    def turn(message: Message | None = None, **fields: Any) -> None:
        fields.update(draw(_rank))
        if not conv_groups:
            fields["group_id"] = None
        fields.update(
            source=SourceType.CONVERSATION, created_at=EPOCH + timedelta(minutes=len(out))
        )
        if message is not None:
            fields["message"] = message
        out.append(fields)

    for _ in range(draw(st.integers(0, max_turns))):
        kind = draw(_turn_kinds)
        if kind == "text":
            turn(draw(_text_messages))
        elif kind == "bare":  # a plain conversation item: the role comes from metadata
            bare: dict[str, Any] = draw(_bare_turns)
            turn(**bare)
        else:
            exchange, used = _exchange(draw, calls, _fates)
            calls += used
            for message in exchange:
                turn(message)
    return out


@st.composite
def candidates(
    draw: st.DrawFn,
    *,
    max_free: int = 6,
    max_turns: int = 6,
    conv_groups: bool = True,
    pinned_texts: st.SearchStrategy[str] = short_texts,
    pinned_groups: bool = True,
) -> list[ContextItem]:
    """A candidate list: pinned instructions and query, free items and a conversation, with
    the conversation's order kept and everything else interleaved at random."""
    ordered = _conversation(draw, max_turns, conv_groups)
    extra = draw(st.lists(_free_items, max_size=max_free))
    pinned = [SourceType.SYSTEM] * draw(st.integers(0, 2)) + [SourceType.USER] * draw(_coin)
    for source in pinned:  # a pinned item's group is kept with it (orphaned tool traffic aside)
        group = draw(_groups) if pinned_groups else None
        extra.append(
            {"content": draw(pinned_texts), "source": source, "pinned": True, "group_id": group}
        )
    for fields in extra:
        ordered.insert(draw(st.integers(0, len(ordered))), fields)
    return [
        ContextItem(id=f"c{i}", **{"created_at": EPOCH, **fields})
        for i, fields in enumerate(ordered)
    ]


# --------------------------------------------------------------------------- histories

# --------------------------------------------------------------------------- budgets

_sizes = st.one_of(st.integers(24, 500), st.integers(24, 3_000))  # small ones overflow more
_OVERFLOWS = [OverflowStrategy.DROP, OverflowStrategy.TRUNCATE, OverflowStrategy.TRUNCATE_OLDEST]


def summarize_first_sentences(
    items: Sequence[ContextItem], max_tokens: int, counter: TokenCounter
) -> list[ContextItem]:
    """A deterministic summarize hook: the start of the misfits' text, as one memory item."""
    text = counter.cut(" ".join(i.content for i in items), max(1, max_tokens // 4))
    summary = ContextItem(
        id=f"summary-of-{items[0].id}", content=text, source=SourceType.MEMORY, created_at=EPOCH
    )
    return [summary]


def failing_hook(
    items: Sequence[ContextItem], max_tokens: int, counter: TokenCounter
) -> list[ContextItem]:
    raise RuntimeError("summarizer offline")


@st.composite
def random_budgets(draw: st.DrawFn, *, summarize: bool = False) -> TokenBudget:
    """A random valid ``TokenBudget``: sections with random sources, mins, maxes, priorities and
    overflow strategies; strict or not."""
    max_tokens = draw(_sizes)
    reserve = draw(st.integers(0, max_tokens // 3))
    available = max_tokens - reserve
    names = draw(st.lists(st.sampled_from(_SECTION_NAMES[:-1]), unique=True, max_size=5))
    owners = {
        source: draw(st.integers(-1, len(names) - 1)) if names else -1 for source in SourceType
    }
    overflows = [*_OVERFLOWS, *[OverflowStrategy.SUMMARIZE] * 3] if summarize else _OVERFLOWS
    sections = []
    for k, name in enumerate(names):
        low = draw(st.integers(0, available // (2 * len(names))))
        overflow = draw(st.sampled_from(overflows))
        hook = None
        if overflow is OverflowStrategy.SUMMARIZE:
            hook = draw(st.sampled_from([summarize_first_sentences, failing_hook]))
        sections.append(
            SectionBudget(
                name=name,
                sources=tuple(s for s, owner in owners.items() if owner == k),
                min=low,
                max=draw(st.one_of(st.none(), st.integers(low, available))),
                priority=draw(st.integers(1, 10)),
                overflow=overflow,
                summarize=hook,
            )
        )
    return TokenBudget(
        max_tokens=max_tokens,
        reserve_output=reserve,
        sections=tuple(sections),
        strict=draw(st.booleans()),
    )


preset_budgets = st.one_of(
    st.builds(default_chat_budget, _sizes),
    st.builds(default_rag_budget, _sizes),
    st.builds(default_agent_budget, _sizes),
    st.builds(
        fixed5_budget,
        reserve_output=st.integers(0, 300),
        scale=st.floats(0.03, 1.5, allow_nan=False),
    ),
    _sizes.flatmap(
        lambda n: st.builds(graph_budget, st.just(n), reserve_output=st.integers(0, n // 2))
    ),
)


def budgets(*, summarize: bool = False) -> st.SearchStrategy[TokenBudget]:
    """The five presets (10 % each) and random budgets (50 %)."""
    # one_of flattens nested one_ofs and picks a branch uniformly: five random branches.
    return st.one_of(preset_budgets, *[random_budgets(summarize=summarize)] * 5)
