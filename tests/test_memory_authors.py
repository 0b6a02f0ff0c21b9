"""The author prior (``memory.authors``, ``recall.author_weight``): a message that names the
author of turns stored as ``"Name: text"`` ranks that author's turns first."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import contextfold.memory.engine as engine_module
from contextfold.items import Message
from contextfold.memory.authors import (
    MAX_AUTHORS,
    OPENING_CHARS,
    TurnAuthors,
    author_of,
    names_named,
)
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.memory.recall import Recaller
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.tokens import TiktokenCounter

COUNTER = TiktokenCounter("cl100k_base")

# Bo talks about Ann's hiking more than Ann does: without the prior his turn leads.
BO = "Bo: Ann, hiking hiking hiking in the hills is what I did, hiking all day."
ANN = "Ann: I went hiking in the hills with my sister last weekend, it was lovely."
FILLER = [
    *(f"Cy: The choir rehearses on Thursday, song {n}." for n in range(19)),
    "Dee: The shop near the station sells boots for hiking, cheap this week, and tents.",
]


@pytest.mark.parametrize(
    ("text", "author"),
    [
        ("Melanie: I'm off to go swimming.", "melanie"),
        ("Dr. Smith: take two a day.", "dr. smith"),
        ("Mary Ann Lee: hello there", "mary ann lee"),
        ("no author: here", None),  # not capitalised
        ("Note:x", None),  # no white space after the colon
        ("A B C D: too many words", None),
        ("I think so: yes", None),  # 'think' is not capitalised
        ("plain text", None),
        ("**Bob**: hi", "bob"),  # markdown
        ("[10:30] Bob: hi", "bob"),  # a chat export's stamp
        ("Note: the meeting moved to Friday.", None),  # field labels are no authors
        ("URL: https://example.com/x", None),
        ("TODO: fix the kiln timer", None),
        ("Q: where is the kiln?", None),  # nor one-letter ones
        ("10:30 the kiln", None),
    ],
)
def test_author_of(text: str, author: str | None) -> None:
    assert author_of(text) == author


def test_turn_authors_by_seq_and_by_name() -> None:
    authors = TurnAuthors(born=1)
    authors.extend([(1, "Ann: hi"), (2, "Dr. Smith: hey"), (4, "no one")])
    authors.extend([(7, "Ann: again")])
    assert authors.last == 7
    assert authors.authored([1, 2, 3, 4, 7, 8, -1], authors.named(["ann"])).tolist() == [
        True, False, False, False, True, False, False,
    ]  # fmt: skip
    assert authors.authored([1, 2], authors.named(["smith"])).tolist() == [False, True]
    assert authors.named(["zed"]) == frozenset()


def test_turn_authors_keep_at_most_max_authors() -> None:
    authors = TurnAuthors(born=1)
    rows = [(n, f"Person{n}: hi") for n in range(1, MAX_AUTHORS + 3)]
    authors.extend(rows)
    assert authors.authored([MAX_AUTHORS], authors.named([f"person{MAX_AUTHORS}"])).tolist() == [
        True
    ]
    late = MAX_AUTHORS + 2
    assert authors.named([f"person{late}"]) == frozenset()  # past the cap: no author


def _store(texts: list[str]) -> MemoryStore:
    store = MemoryStore(counter=COUNTER)
    store.create_session("s")
    store.append_turns("s", [Message(role="user", content=t) for t in texts])
    return store


def _order(recaller: Recaller, question: str) -> list[int]:
    return [r.seq for r in recaller.rank("s", question)]


def test_a_named_authors_turn_leads_with_the_prior_and_not_without() -> None:
    store = _store([*FILLER, BO, ANN])
    bo, ann = len(FILLER) + 1, len(FILLER) + 2
    question = "Where did Ann go hiking?"
    without = _order(Recaller(store), question)
    assert without.index(bo) < without.index(ann)
    with_prior = _order(Recaller(store, author_weight=1.0), question)
    assert with_prior.index(ann) < with_prior.index(bo)
    # the parts of a decomposed message are lifted alike (the name-less part most of all)
    parted = _order(Recaller(store, author_weight=1.0, decompose=True), question)
    assert parted.index(ann) < parted.index(bo)


def test_a_message_naming_no_author_is_ranked_as_without_the_prior() -> None:
    store = _store([*FILLER, BO, ANN])
    for question in ("where did they go hiking?", "Where did Dee go hiking?"):
        assert _order(Recaller(store, author_weight=1.0), question) == _order(
            Recaller(store), question
        )


def test_turns_stored_after_a_recall_and_a_session_written_again_are_seen() -> None:
    store = _store([*FILLER, BO])
    recaller = Recaller(store, author_weight=1.0)
    question = "Where did Ann go hiking?"
    assert _order(recaller, question)[0] == len(FILLER) + 1  # Bo's: no Ann turn yet
    store.append_turns("s", [Message(role="user", content=ANN)])
    assert _order(recaller, question)[0] == len(FILLER) + 2  # appended since: read
    # deleted and written again, Ann's words now Bo's and the other way round
    store.delete_session("s")
    store.create_session("s")
    swapped = [ANN.replace("Ann:", "Bo:"), BO.replace("Bo:", "Ann:")]
    store.append_turns("s", [Message(role="user", content=t) for t in [*FILLER, *swapped]])
    order = _order(recaller, question)
    assert order.index(len(FILLER) + 2) < order.index(len(FILLER) + 1)


def test_a_large_sessions_authors_are_read_by_the_worker_after_the_recall() -> None:
    """The first recall of a large session ranks with the prior from its candidates' own
    openings; the session's authors are read whole by the worker, only once the recall is
    done (``start_reads``), never inside it."""
    import threading

    store = _store([*FILLER, BO, ANN])
    recaller = Recaller(store, author_weight=1.0)
    recaller.lengths_later_min = 5  # this session counts as large
    question = "Where did Ann go hiking?"
    whole: list[str] = []
    real = store.turn_openings_with_incarnation

    def spy(session_id: str, after: int, chars: int) -> tuple[int | None, list[tuple[int, str]]]:
        if after == 0:
            whole.append(threading.current_thread().name)
        return real(session_id, after, chars)

    store.turn_openings_with_incarnation = spy  # type: ignore[method-assign]
    ranked = recaller.rank("s", question, defer_reads=True)
    first = [r.seq for r in ranked]
    assert first.index(len(FILLER) + 2) < first.index(len(FILLER) + 1)  # the prior, already
    recaller.settle()
    assert whole == []  # nothing read whole during the recall, nor before start_reads
    recaller.start_reads()
    recaller.settle()
    assert len(whole) == 1 and whole[0] != threading.current_thread().name  # the worker's
    assert "s" in recaller._authors
    assert _order(recaller, question) == first  # the kept authors rank alike
    assert len(whole) == 1
    recaller.close()


def _from_store(store: MemoryStore, session_id: str = "s") -> TurnAuthors:
    """The session's authors as a recall reads them whole (``turn_openings_with_incarnation``)."""
    born, rows = store.turn_openings_with_incarnation(session_id, 0, OPENING_CHARS)
    assert born is not None
    authors = TurnAuthors(born)
    authors.extend(rows)
    return authors


def _same(kept: TurnAuthors | None, read: TurnAuthors) -> None:
    assert kept is not None
    assert (kept.born, kept.last) == (read.born, read.last)
    seqs = list(range(read.last + 2))
    for names in (["ann"], ["bo"], ["cy"], ["dee"], ["zed"]):
        assert kept.authored(seqs, kept.named(names)).tolist() == (
            read.authored(seqs, read.named(names)).tolist()
        ), names


def test_derives_keep_the_authors_of_a_session_they_start() -> None:
    """Derived in three writes and never recalled, the session's authors are kept as a recall
    would read them whole; a derive that does not start the session keeps none, and kept
    ones of another incarnation are not extended."""
    cfg = MemoryConfig.model_validate({"recall": {"embedder": "none"}})
    engine = MemoryEngine(cfg, store=MemoryStore(counter=COUNTER), embedder=None, counter=COUNTER)
    texts = [
        *FILLER,
        BO,
        ANN,
        "plain words, no author",
        "[10:30]" + " " * 95 + "Cy: the name is past a recall's opening",
        "[1\x002] Ann: a NUL ends SQLite's substr",
        "Zed: late",
    ]
    for start, stop in ((0, 9), (9, 20), (20, len(texts))):
        engine.store_turns("s", [Message(role="user", content=t) for t in texts[start:stop]])
        engine.derive("s")
    _same(engine.recaller.kept_state("s")[1], _from_store(engine.store))
    # Kept ones are extended by the next derive, only from where they end.
    engine.store_turns("s", [Message(role="user", content="Dee: one more")])
    engine.derive("s")
    _same(engine.recaller.kept_state("s")[1], _from_store(engine.store))
    # None kept, and the derive does not start the session: nothing kept.
    engine.recaller.forget("s")
    engine.store_turns("s", [Message(role="user", content="Ann: and another")])
    engine.derive("s")
    assert engine.recaller.kept_state("s")[1] is None
    engine.close()


def test_a_derive_chunk_after_one_not_kept_keeps_no_authors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each chunk of a derive's write is noted with the seq before it: a chunk after one whose
    authors were not kept (the worker reading them then) does not start the session, so it
    keeps none (they would lack the first chunk's turns)."""
    monkeypatch.setattr(engine_module, "WRITE_CHUNK", 5)
    cfg = MemoryConfig.model_validate({"recall": {"embedder": "none"}})
    engine = MemoryEngine(cfg, store=MemoryStore(counter=COUNTER), embedder=None, counter=COUNTER)
    engine.store_turns("s", [Message(role="user", content=t) for t in [*FILLER[:10], ANN, BO]])
    recaller = engine.recaller
    real = recaller.note_authors
    afters: list[int] = []

    def first_skipped(sid: str, born: int, after: int, rows: Any) -> None:
        afters.append(after)
        if len(afters) == 1:
            recaller._reading_authors.add(sid)  # the worker reading them: not kept
        try:
            real(sid, born, after, rows)
        finally:
            recaller._reading_authors.discard(sid)

    monkeypatch.setattr(recaller, "note_authors", first_skipped)
    engine.derive("s")
    assert afters == [0, 5, 10]
    assert recaller.kept_state("s")[1] is None
    engine.close()


def test_note_authors_extends_only_what_it_covers() -> None:
    recaller = Recaller(_store(["Ann: a", "Bo: b"]), author_weight=1.0)
    recaller.note_authors("s", 1, 0, [(1, "Ann: a"), (2, "Bo: b")])
    kept = recaller.kept_state("s")[1]
    assert kept is not None and kept.last == 2
    recaller.note_authors("s", 1, 3, [(4, "Cy: c")])  # turn 3 not among them: a gap
    recaller.note_authors("s", 2, 2, [(3, "Cy: c")])  # another incarnation
    assert kept.last == 2
    recaller.note_authors("s", 1, 1, [(2, "Bo: b"), (3, "Cy: c")])  # overlaps: goes on
    assert kept.last == 3 and kept.authored([1, 2, 3], kept.named(["cy"])).tolist() == [
        False,
        False,
        True,
    ]
    recaller.cached_sessions = 1  # a new session's push the least recently kept out
    recaller.note_authors("t", 1, 0, [(1, "Dee: d")])
    assert list(recaller._authors) == ["t"]
    off = Recaller(_store(["Ann: a"]), author_weight=0.0)
    off.note_authors("s", 1, 0, [(1, "Ann: a")])
    assert off.kept_state("s")[1] is None  # the prior off: nothing kept
    recaller.close()
    off.close()


def test_a_closing_recaller_skips_the_whole_reads_not_started() -> None:
    store = _store([*FILLER, BO, ANN])
    recaller = Recaller(store, author_weight=1.0)
    recaller.lengths_later_min = 5
    recaller.rank("s", "Where did Ann go hiking?", defer_reads=True)
    recaller._closing.set()
    recaller.start_reads()
    recaller.settle()
    assert "s" not in recaller._authors and "s" not in recaller._lengths
    recaller.close()


def _engine(author_weight: float | None) -> MemoryEngine:
    recall: dict[str, object] = {"embedder": "none"}
    if author_weight is not None:
        recall["author_weight"] = author_weight
    cfg = MemoryConfig.model_validate({"recall": recall})
    eng = MemoryEngine(cfg, store=MemoryStore(counter=COUNTER), embedder=None, counter=COUNTER)
    eng.on_turn_complete(
        [{"role": "user", "content": t} for t in [*FILLER, BO, ANN]], new_only=True
    )
    return eng


def test_the_engine_packs_the_named_authors_turn_by_default() -> None:
    question = "Where did Ann go hiking?"
    assert MemoryConfig().recall.author_weight == 1.0
    on = _engine(None).on_message_inbound(question, budget=40).prepend_text
    off = _engine(0.0).on_message_inbound(question, budget=40).prepend_text
    assert ANN in on and BO not in on
    assert BO in off and ANN not in off


def _doctors() -> MemoryStore:
    return _store(
        [
            "Dr. Smith: I prescribe two aspirin a day.",
            "Dr. Jones: I prescribe a week of rest.",
            "Mrs. Smith: the garden needs water.",
            "Mrs. Brown: the garden needs sun.",
            "a garden hose lay by the long old fence near the shed all week",
            *(f"unrelated filler turn number {i}" for i in range(10)),
        ]
    )


def test_a_title_names_the_person_after_it_not_everyone_with_the_title() -> None:
    """ "Dr. Jones" names Jones (``names_in`` takes a capital after "Dr." for a sentence's
    start, and "dr" is every doctor's title)."""
    assert names_named("What did Dr. Jones prescribe?") == {"jones"}
    recaller = Recaller(_doctors(), author_weight=1.0)
    found = recaller._named_authors("s", "What did Dr. Jones prescribe?")
    assert found is not None
    lifted = recaller._authored("s", np.array([1, 2, 3, 4]), *found)
    assert lifted is not None and lifted.tolist() == [False, True, False, False]
    question = "What did Mrs. Brown say about the garden?"
    off = {h.seq: h.score for h in Recaller(_doctors()).rank("s", question)}
    on = {h.seq: h.score for h in Recaller(_doctors(), author_weight=1.0).rank("s", question)}
    assert on[3] == off[3] and on[4] == 2 * off[4]  # Mrs. Smith's as before, Mrs. Brown's x2


def test_a_field_label_is_not_lifted_as_if_its_author_were_named() -> None:
    store = _store(
        [
            "Caroline: the kiln is ready.",
            "Note: the kiln class moved to Friday.",
            "we fired pottery in the old kiln out back behind the long shed",
            *(f"filler {i}" for i in range(10)),
        ]
    )
    question = "Did Caroline leave a Note about the kiln?"
    off = {h.seq: h.score for h in Recaller(store).rank("s", question)}
    on = {h.seq: h.score for h in Recaller(store, author_weight=1.0).rank("s", question)}
    assert on[2] == off[2] and on[1] == 2 * off[1]


def test_a_concurrent_recall_keeps_the_cached_authors_and_reads_only_new_turns() -> None:
    """The cached authors stay in the cache while a recall reads the turns stored since, so
    a recall of the same session meanwhile neither ranks without the prior nor reads the
    whole session again."""
    import threading

    store = _store(["Ann: the kiln is hot", "Bo: the kiln is cold"] * 5)
    question = "What did Ann say about the kiln?"
    recaller = Recaller(store, author_weight=1.0)
    recaller.lengths_later_min = 5  # the session counts as large: the worker reads it first
    found = recaller._named_authors("s", question)
    assert found is not None and found[0] is None  # not kept yet: the candidates' openings
    recaller.start_reads()
    recaller.settle()
    found = recaller._named_authors("s", question)
    assert found is not None and found[0] is not None
    inside, release = threading.Event(), threading.Event()
    real = store.turn_openings_with_incarnation
    whole: list[int] = []

    def slow(session_id: str, after: int, chars: int) -> tuple[int | None, list[tuple[int, str]]]:
        if after == 0:
            whole.append(after)
        if threading.current_thread().name == "first":
            inside.set()
            release.wait(5)
        return real(session_id, after, chars)

    store.turn_openings_with_incarnation = slow  # type: ignore[method-assign]
    first = threading.Thread(target=recaller._named_authors, args=("s", question), name="first")
    first.start()
    assert inside.wait(5)
    threading.Timer(0.2, release.set).start()  # the second recall waits for the first's read
    try:
        other = recaller._named_authors("s", question)
    finally:
        release.set()
        first.join()
    assert other is not None and other[0] is not None  # ranked with the kept authors
    assert whole == []  # and the session was not read whole again
    recaller.close()
