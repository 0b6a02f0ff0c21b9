"""History filtering: compacted and off-topic turns removed with a reason, tool chains kept or
removed whole, the protected zone and system messages always kept, and same-role neighbours
that a removal leaves merged (see ``contextfold.memory.history``)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold.conversation import tool_units
from contextfold.errors import ConfigError
from contextfold.items import Message, TextBlock, ToolResultBlock, ToolUseBlock
from contextfold.memory.history import FilteredHistory, HistoryMerge, filter_history
from contextfold.tokens import CharCounter
from strategies import histories


def user(text: str, name: str | None = None) -> Message:
    return Message(role="user", content=text, name=name)


def assistant(text: str) -> Message:
    return Message(role="assistant", content=text)


def system(text: str) -> Message:
    return Message(role="system", content=text)


def call(*ids: str, lead: str | None = None) -> Message:
    text = [TextBlock(text=lead)] if lead is not None else []
    return Message(role="assistant", content=[*text, *(ToolUseBlock(id=i, name="f") for i in ids)])


def result(*ids: str) -> Message:
    return Message(role="tool", content=[ToolResultBlock(tool_use_id=i, content="ok") for i in ids])


def reject_all(index: int, message: Message) -> bool:
    return False


def only(*indices: int) -> Callable[[int, Message], bool]:
    return lambda index, message: index in indices


def kept(out: FilteredHistory) -> list[int]:
    return [i for idxs in out.kept_indices for i in idxs]


def reasons(out: FilteredHistory) -> dict[int, str]:
    return {r.index: r.reason for r in out.removed}


TALK = [user(f"u{k}") if k % 2 == 0 else assistant(f"a{k}") for k in range(10)]


# --------------------------------------------------------------------------- examples


@pytest.mark.parametrize(("protected", "expected"), [(4, [6, 7, 8, 9]), (1, [9]), (0, [9])])
def test_the_protected_zone_survives_a_predicate_that_rejects_everything(
    protected: int, expected: list[int]
) -> None:
    out = filter_history(TALK, protected_recent=protected, keep=reject_all)
    assert kept(out) == expected
    assert out.messages == [TALK[i] for i in expected]
    assert reasons(out) == {i: "off-topic" for i in range(10) if i not in expected}
    assert out.protected_start == expected[0]


def test_compacted_messages_are_removed_and_the_rest_kept() -> None:
    out = filter_history(TALK, protected_recent=2, compacted=4)
    assert out.messages == TALK[4:]
    assert reasons(out) == {0: "compacted", 1: "compacted", 2: "compacted", 3: "compacted"}
    assert [r.role for r in out.removed] == ["user", "assistant", "user", "assistant"]
    assert out.removed[0].preview == "u0" and out.removed[0].tokens is None


def test_the_protected_zone_wins_over_a_watermark_that_reaches_into_it() -> None:
    out = filter_history(TALK, protected_recent=3, compacted=9)
    assert kept(out) == [7, 8, 9]
    assert set(reasons(out).values()) == {"compacted"}


def test_off_topic_messages_are_removed_and_keep_is_asked_only_about_undecided_ones() -> None:
    asked: list[int] = []

    def keep(index: int, message: Message) -> bool:
        asked.append(index)
        return index in (4, 5)

    out = filter_history(TALK, protected_recent=2, compacted=2, keep=keep)
    assert kept(out) == [4, 5, 8, 9]
    assert reasons(out) == {0: "compacted", 1: "compacted", 2: "off-topic", 3: "off-topic"} | {
        6: "off-topic",
        7: "off-topic",
    }
    assert asked == [2, 3, 4, 5, 6, 7]  # never the compacted or protected ones, each once


def test_a_broad_query_skips_relevance_but_not_compaction() -> None:
    out = filter_history(TALK, protected_recent=2, compacted=3, keep=only(), broad=True)
    assert kept(out) == list(range(3, 10))
    assert reasons(out) == {0: "compacted", 1: "compacted", 2: "compacted"}


def test_system_messages_are_kept_even_when_compacted_or_off_topic() -> None:
    messages = [system("rules"), user("old"), system("more rules"), assistant("a"), user("now")]
    out = filter_history(messages, protected_recent=1, compacted=3, keep=reject_all)
    assert kept(out) == [0, 2, 4]
    assert reasons(out) == {1: "compacted", 3: "off-topic"}


@pytest.mark.parametrize(
    ("messages", "protected", "expected_start"),
    [
        # the zone (last 2) would start at the result: it moves back to the call
        ([user("q"), assistant("a"), user("q2"), call("c1"), result("c1"), assistant("x")], 2, 3),
        # a user turn between call and result is inside the zone once it reaches the call
        ([user("q"), assistant("a"), call("c1"), user("wait"), result("c1"), user("y")], 2, 2),
        # two chains interleaved: extending over one reaches into the other
        ([user("q"), call("c1"), call("c2"), result("c1"), result("c2"), user("y")], 2, 1),
    ],
    ids=["result", "interleaved-turn", "interleaved-chains"],
)
def test_a_chain_straddling_the_protected_boundary_is_kept_whole(
    messages: list[Message], protected: int, expected_start: int
) -> None:
    out = filter_history(messages, protected_recent=protected, keep=reject_all)
    assert out.protected_start == expected_start
    assert kept(out) == list(range(expected_start, len(messages)))


@pytest.mark.parametrize("relevant", [2, 3])  # the result alone, the call alone
def test_a_chain_is_kept_whole_when_any_of_its_messages_is_relevant(relevant: int) -> None:
    messages = [user("q"), assistant("a"), call("c1"), result("c1"), assistant("b"), user("y")]
    out = filter_history(messages, protected_recent=1, keep=only(relevant))
    assert kept(out) == [2, 3, 5]
    assert reasons(out) == {0: "off-topic", 1: "off-topic", 4: "off-topic"}


def test_chains_linked_through_a_shared_result_message_travel_together() -> None:
    messages = [user("q"), call("c1"), call("c2"), result("c1", "c2"), user("y"), user("z")]
    out = filter_history(messages, protected_recent=1, keep=only(1))
    assert kept(out) == [1, 2, 3, 5]  # c2's call and the joint result came with c1
    out = filter_history(messages, protected_recent=1, keep=only(0))
    assert kept(out) == [0, 5]
    assert reasons(out) == dict.fromkeys([1, 2, 3, 4], "off-topic")


@pytest.mark.parametrize(("keep", "expected"), [(None, [2, 3, 4, 5]), (reject_all, [4, 5])])
def test_a_chain_straddling_the_watermark_is_judged_as_uncompacted(
    keep: Callable[[int, Message], bool] | None, expected: list[int]
) -> None:
    messages = [user("q"), assistant("a"), call("c1"), result("c1"), assistant("b"), user("y")]
    out = filter_history(messages, protected_recent=2, compacted=3, keep=keep)
    assert kept(out) == expected
    assert reasons(out)[0] == "compacted"
    assert reasons(out).get(2) == reasons(out).get(3) == (None if keep is None else "off-topic")


def test_same_role_neighbours_left_by_a_removal_are_merged() -> None:
    messages = [user("first"), assistant("noise"), user("second"), assistant("more noise")]
    messages += [user("third"), assistant("reply")]
    out = filter_history(messages, protected_recent=1, keep=only(0, 2, 4))
    assert [m.role for m in out.messages] == ["user", "assistant"]
    assert out.messages[0].content == (TextBlock(text="first\n\nsecond\n\nthird"),)
    assert out.kept_indices == [(0, 2, 4), (5,)]
    assert out.merged == [HistoryMerge(output_index=0, indices=(0, 2, 4), role="user")]


def test_neighbours_the_client_sent_side_by_side_are_left_alone() -> None:
    messages = [user("one"), user("two"), assistant("noise"), user("three"), assistant("a")]
    out = filter_history(messages, protected_recent=1, keep=only(0, 1, 3))
    assert out.kept_indices == [(0,), (1, 3), (4,)]  # only the gap left by the removal closes
    assert out.messages[1].text() == "two\n\nthree"


def test_a_text_reply_merges_with_a_later_call_but_a_call_never_takes_content_after_it() -> None:
    before = [user("q"), assistant("let me look"), user("noise"), call("c1"), result("c1")]
    out = filter_history([*before, user("y")], protected_recent=1, keep=only(0, 1, 3))
    assert out.messages[1] == call("c1", lead="let me look")  # the call stays last
    assert out.kept_indices[1] == (1, 3)
    after = [user("q"), call("c1"), user("noise"), assistant("a"), result("c1"), user("y")]
    out = filter_history(after, protected_recent=1, keep=only(0, 1, 3))
    assert out.kept_indices == [(0,), (1,), (3,), (4,), (5,)]
    assert out.merged == []


def test_results_separated_by_a_removal_merge_into_one_tool_message() -> None:
    messages = [user("q"), call("c1", "c2"), result("c1"), user("noise"), result("c2")]
    out = filter_history([*messages, user("y")], protected_recent=1, keep=only(0, 1))
    assert out.messages[2] == result("c1", "c2")
    assert out.kept_indices == [(0,), (1,), (2, 4), (5,)]


@pytest.mark.parametrize(
    "messages",
    [
        [system("a"), user("noise"), system("b"), user("y")],
        [user("hi", name="ann"), assistant("noise"), user("hi", name="bob"), assistant("a")],
    ],
    ids=["system", "different-names"],
)
def test_system_messages_and_different_speakers_are_never_merged(
    messages: list[Message],
) -> None:
    out = filter_history(messages, protected_recent=1, keep=only(0, 2))
    assert out.messages == [messages[0], messages[2], messages[3]]
    assert out.merged == []


@pytest.mark.parametrize(
    ("messages", "compacted", "leading"),
    [
        (TALK, 1, True),
        (TALK, 2, False),
        ([system("s"), *TALK], 2, True),
        ([assistant("hello"), user("hi")], 0, True),
        ([system("s")], 0, False),
        ([], 0, False),
    ],
)
def test_a_leading_assistant_message_is_reported_and_kept(
    messages: list[Message], compacted: int, leading: bool
) -> None:
    out = filter_history(messages, protected_recent=2, compacted=compacted)
    assert out.leading_assistant is leading
    first = next((m for m in out.messages if m.role != "system"), None)
    assert first is None or first == messages[compacted]


def test_a_removal_records_a_short_preview_and_its_tokens_with_a_counter() -> None:
    long = user("word  \n" * 40)
    out = filter_history(
        [long, user("y")], protected_recent=1, keep=reject_all, counter=CharCounter()
    )
    (removal,) = out.removed
    assert removal.preview == ("word " * 16)[:79] + "…"
    assert len(removal.preview) == 80
    assert removal.tokens == CharCounter().count(long.text())


@pytest.mark.parametrize(("protected", "compacted"), [(-1, 0), (6, -2)])
def test_negative_arguments_are_refused(protected: int, compacted: int) -> None:
    name = "protected_recent" if protected < 0 else "compacted"
    with pytest.raises(ConfigError, match=f"{name} must be >= 0, got -"):
        filter_history(TALK, protected_recent=protected, compacted=compacted)


# --------------------------------------------------------------------------- properties

# A predicate's verdicts, cycled over the indices. Mixed ones (some kept, some not) leave the
# gaps that merging and unit-keeping are about; all-true or all-false verdicts leave none.
_mixed = st.builds(
    lambda more, turn: [True, False, *more][turn:] + [True, False, *more][:turn],
    st.lists(st.booleans(), max_size=6),
    st.integers(0, 7),
)
_verdicts = st.one_of(st.none(), _mixed, _mixed)


def _keep(verdicts: list[bool] | None) -> Callable[[int, Message], bool] | None:
    if verdicts is None:
        return None
    return lambda index, message: verdicts[index % len(verdicts)]


def _run(
    messages: list[Message],
    protected: int,
    compacted: int,
    verdicts: list[bool] | None,
    broad: bool,
) -> FilteredHistory:
    return filter_history(
        messages,
        protected_recent=protected,
        compacted=compacted,
        keep=_keep(verdicts),
        broad=broad,
    )


_filters = {
    "protected": st.one_of(st.integers(0, 2), st.integers(0, 8)),
    "compacted": st.one_of(st.just(0), st.integers(0, 4), st.integers(0, 16)),
    "verdicts": _verdicts,
    "broad": st.sampled_from([False, False, True]),
}


def _squeezed(messages: Sequence[Message]) -> tuple[str, list[ToolUseBlock | ToolResultBlock]]:
    """Text without whitespace, and the tool blocks in order: what a merge must preserve."""
    text = "".join(b.text for m in messages for b in m.content if isinstance(b, TextBlock))
    tools = [b for m in messages for b in m.content if not isinstance(b, TextBlock)]
    return "".join(text.split()), tools


@given(messages=histories(), **_filters)
def test_every_input_message_is_kept_or_removed_with_a_reason_exactly_once(
    messages: list[Message],
    protected: int,
    compacted: int,
    verdicts: list[bool] | None,
    broad: bool,
) -> None:
    out = _run(messages, protected, compacted, verdicts, broad)
    removed = [r.index for r in out.removed]
    assert sorted(kept(out) + removed) == list(range(len(messages)))
    assert len(out.messages) == len(out.kept_indices)
    assert set(range(out.protected_start, len(messages))) <= set(kept(out))
    for idxs in tool_units(messages):  # the zone never starts inside a chain
        assert idxs[0] >= out.protected_start or idxs[-1] < out.protected_start
    for r in out.removed:
        assert r.role == messages[r.index].role != "system"
        if r.reason == "compacted":
            assert r.index < compacted
        else:
            assert verdicts is not None and not broad
    assert out.merged == [
        HistoryMerge(output_index=k, indices=idxs, role=out.messages[k].role)
        for k, idxs in enumerate(out.kept_indices)
        if len(idxs) > 1
    ]


@given(messages=histories(paired=True), **_filters)
def test_no_tool_call_is_sent_without_its_result_nor_a_result_without_its_call(
    messages: list[Message],
    protected: int,
    compacted: int,
    verdicts: list[bool] | None,
    broad: bool,
) -> None:
    out = _run(messages, protected, compacted, verdicts, broad)
    calls = [t for m in out.messages for t in m.tool_use_ids]
    results = [t for m in out.messages for t in m.tool_result_ids]
    assert sorted(calls) == sorted(results)


@given(messages=histories(), **_filters)
def test_units_are_kept_or_removed_whole_and_no_new_orphans_appear(
    messages: list[Message],
    protected: int,
    compacted: int,
    verdicts: list[bool] | None,
    broad: bool,
) -> None:
    out = _run(messages, protected, compacted, verdicts, broad)
    survivors = set(kept(out))
    for idxs in tool_units(messages):
        assert len(survivors.intersection(idxs)) in (0, len(idxs))

    def orphans(ms: Sequence[Message]) -> set[str]:
        calls = {t for m in ms for t in m.tool_use_ids}
        return calls ^ {t for m in ms for t in m.tool_result_ids}

    assert orphans(out.messages) <= orphans(messages)
    for message in out.messages:  # merging never puts content after an assistant's calls
        kinds = [type(b) for b in message.content]
        if ToolUseBlock in kinds:
            assert TextBlock not in kinds[kinds.index(ToolUseBlock) :]


@given(messages=histories(), **_filters)
def test_the_protected_messages_arrive_in_order_with_their_content(
    messages: list[Message],
    protected: int,
    compacted: int,
    verdicts: list[bool] | None,
    broad: bool,
) -> None:
    out = _run(messages, protected, compacted, verdicts, broad)
    order = kept(out)
    assert order == sorted(order)
    tail = range(max(0, len(messages) - max(protected, 1)), len(messages))
    assert set(tail) <= set(order)
    for message, idxs in zip(out.messages, out.kept_indices, strict=True):
        assert {messages[i].role for i in idxs} == {message.role}
        assert _squeezed([message]) == _squeezed([messages[i] for i in idxs])


@given(messages=histories(), **_filters)
def test_filtering_adds_no_same_role_neighbours_except_the_documented_ones(
    messages: list[Message],
    protected: int,
    compacted: int,
    verdicts: list[bool] | None,
    broad: bool,
) -> None:
    out = _run(messages, protected, compacted, verdicts, broad)
    outputs = zip(out.messages, out.kept_indices, strict=True)
    for (a, a_idxs), (b, b_idxs) in itertools.pairwise(outputs):
        if a.role != b.role:
            continue
        sent_together = a_idxs[-1] + 1 == b_idxs[0]
        calls_last = a.role == "assistant" and bool(a.tool_use_ids)
        assert sent_together or a.role == "system" or a.name != b.name or calls_last
    for idxs in out.kept_indices:  # and a merge joins only what the exceptions allow
        if len(idxs) > 1:
            sources = [messages[i] for i in idxs]
            assert all(j - i > 1 for i, j in itertools.pairwise(idxs))
            assert len({(m.role, m.name) for m in sources}) == 1
            assert sources[0].role != "system"
            assert not any(m.tool_use_ids for m in sources[:-1])


@given(messages=histories(), **_filters)
def test_the_input_is_not_mutated(
    messages: list[Message],
    protected: int,
    compacted: int,
    verdicts: list[bool] | None,
    broad: bool,
) -> None:
    snapshot = [m.model_dump() for m in messages]
    sequence = list(messages)
    _run(messages, protected, compacted, verdicts, broad)
    assert messages == sequence
    assert [m.model_dump() for m in messages] == snapshot


@given(messages=histories(), protected=st.integers(0, 8), verdicts=_verdicts)
def test_without_a_predicate_or_watermark_the_output_is_the_input(
    messages: list[Message], protected: int, verdicts: list[bool] | None
) -> None:
    # keep=None, or any predicate under a broad query: nothing to remove
    out = _run(messages, protected, 0, verdicts, broad=True)
    plain = _run(messages, protected, 0, None, broad=False)
    for filtered in (out, plain):
        assert filtered.messages == messages
        assert filtered.removed == [] and filtered.merged == []
        assert filtered.kept_indices == [(i,) for i in range(len(messages))]
