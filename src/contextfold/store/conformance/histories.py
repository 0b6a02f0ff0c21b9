"""Message histories for property tests (Hypothesis): text messages of every role and tool
exchanges whose calls and results are sometimes complete, sometimes missing one side, split
over two assistant messages or interleaved with a user turn. The memory store's properties
(``memory_properties.py``) store them; contextfold's own tests of history filtering and
packing draw them too (``tests/strategies.py``).
"""

from __future__ import annotations

from hypothesis import strategies as st

from contextfold.items import Message, TextBlock, ToolResultBlock, ToolUseBlock

__all__ = ["histories", "sentences", "short_texts", "texts"]

_WORDS = (
    "alpha",
    "Beta",
    "gamma",
    "Paris",
    "naïve",
    "café",
    "数据",
    "東京",
    "🙂",
    "Ω",
    "x",
    "42",
    "tool",
    "résumé",
    "\t",
    "line\nbreak",
)
_ENDS = (".", "!", "?", "…", "。", ".\n", "", '."', ".)")
# A fixed corpus of sentences of 1–8 words with every kind of ending; prose is a slice of it,
# so a long text costs two draws instead of hundreds.
_CORPUS = tuple(
    " ".join(_WORDS[(k * 7 + j * 3) % len(_WORDS)] for j in range(1 + k % 8))
    + _ENDS[k % len(_ENDS)]
    for k in range(61)
)


def _prose(min_sentences: int, max_sentences: int) -> st.SearchStrategy[str]:
    return st.builds(
        lambda start, n: " ".join(_CORPUS[(start + k) % len(_CORPUS)] for k in range(n)),
        st.integers(0, len(_CORPUS) - 1),
        st.integers(min_sentences, max_sentences),
    )


sentences = _prose(1, 1)
short_texts = st.one_of(st.just(""), st.text(max_size=12), _prose(1, 2))
texts = st.one_of(
    st.just(""),
    st.text(max_size=30),
    _prose(1, 5),
    _prose(8, 24),  # long
    _prose(3, 12),
)

_tool_args = st.dictionaries(
    st.sampled_from(["q", "city", "n", "ünï"]),
    st.one_of(st.integers(-5, 500), st.text(max_size=10), st.booleans(), st.none()),
    max_size=3,
)

_text_blocks = st.lists(texts.map(lambda t: TextBlock(text=t)), min_size=1, max_size=2).map(tuple)

_names = st.sampled_from([None, None, "ann"])

_user_messages = st.builds(Message, role=st.just("user"), content=_text_blocks)

_calls = st.lists(
    st.tuples(
        st.sampled_from(["search", "get_weather", "ls"]),  # function name
        _tool_args,
        texts,  # the result
        st.booleans(),  # the result names its function (Gemini style)
        st.booleans(),  # is_error
    ),
    min_size=1,
    max_size=3,
)
_leads = st.one_of(st.none(), texts)


def _exchange(
    draw: st.DrawFn, first_id: int, fates: st.SearchStrategy[str]
) -> tuple[list[Message], int]:
    """One tool exchange, its call ids numbered from ``first_id``, and how many ids it used: an
    assistant message with 1–3 calls, then their results in one tool message or one each. Its
    fate may drop some results (``no_result``) or the call (``no_call``), put a user turn
    between call and results (``interleaved``), or spread the calls over two assistant
    messages answered by one tool message, linking them (``split``)."""
    drawn = draw(_calls)
    uses = [
        ToolUseBlock(id=f"call_{first_id + j}", name=name, input=args)
        for j, (name, args, *_) in enumerate(drawn)
    ]
    results = [
        ToolResultBlock(
            tool_use_id=u.id, content=text, name=u.name if named else None, is_error=error
        )
        for u, (_, _, text, named, error) in zip(uses, drawn, strict=True)
    ]
    out: list[Message] = []
    fate = draw(fates)
    if fate == "no_result":
        results = results[: draw(st.integers(0, len(results) - 1))]
    if fate != "no_call":
        lead = draw(_leads)
        text = (TextBlock(text=lead),) if lead is not None else ()
        cut = draw(st.integers(1, len(uses) - 1)) if fate == "split" and len(uses) > 1 else 0
        if cut:
            out.append(Message(role="assistant", content=(*text, *uses[:cut])))
            out.append(Message(role="assistant", content=tuple(uses[cut:])))
        else:
            out.append(Message(role="assistant", content=(*text, *uses)))
    if fate == "interleaved":
        out.append(draw(_user_messages))
    if results:
        if fate == "split" or draw(st.booleans()):
            out.append(Message(role="tool", content=tuple(results)))
        else:
            out.extend(Message(role="tool", content=(r,)) for r in results)
    return out, len(uses)


_history_texts = st.builds(
    Message,
    role=st.sampled_from(["user", "user", "assistant", "assistant", "system"]),
    content=_text_blocks,
    name=_names,
)
_history_fates = st.sampled_from(["ok", "ok", "ok", "split", "interleaved", "no_result", "no_call"])
_paired_fates = st.sampled_from(["ok", "ok", "split", "interleaved"])
_mostly_text = st.sampled_from([True, True, False])


@st.composite
def histories(draw: st.DrawFn, *, max_turns: int = 14, paired: bool = False) -> list[Message]:
    """A message list, oldest first: text messages of every role (system ones included, a
    ``name`` now and then, same-role neighbours common) and tool exchanges (see
    ``_exchange``). With ``paired``, every tool call has its result and every result its
    call."""
    fates = _paired_fates if paired else _history_fates
    out: list[Message] = []
    calls = 0
    for _ in range(draw(st.integers(0, max_turns))):
        if draw(_mostly_text):  # an exchange brings two to five messages
            out.append(draw(_history_texts))
        else:
            exchange, used = _exchange(draw, calls, fates)
            calls += used
            out.extend(exchange)
    return out
