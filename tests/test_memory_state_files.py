"""What the state files (``memory.snapshots``) must never do: give a recall another database's
or another incarnation's state, fail a recall, a compaction or a close, leave files behind,
or hold more than the cache limit. Each test failed before its fix (a cold review's
findings)."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import contextfold.memory.engine as engine_module
from contextfold.memory import snapshots, tagging
from contextfold.memory.config import MemoryConfig
from contextfold.memory.engine import MemoryEngine
from contextfold.memory.snapshots import SessionState, StateFiles
from contextfold.memory.tagging import KeywordTagger
from contextfold.memory.turn_lengths import TurnLengths
from contextfold.store.conformance.memory_support import stored
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.testing import HashEmbedder
from contextfold.tokens import CharCounter, TiktokenCounter
from test_memory_scale import _pairs
from test_memory_snapshots import COUNTER, QUESTION, _engine, _stored, _turns


def _remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _long_turns(count: int) -> list[dict[str, str]]:
    # other texts: much longer turns, so every token count differs
    return [
        {"role": t["role"], "content": t["content"] + " " + ("and more words " * 20)}
        for t in _turns(0, count)
    ]


def _replaced(path: Path) -> None:
    """A database saved with its state, then a new one at the same path (the .state folder
    stays) whose session has other turns, closed before any recall saved over the file."""
    _stored(path)
    assert list(Path(f"{path}.state").glob("*.state"))
    _remove_db(path)
    engine = _engine(path)
    engine.on_turn_complete(_long_turns(400), new_only=True)
    engine.close()


def test_a_replaced_database_does_not_take_the_old_databases_turn_counts(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    _replaced(path)
    engine = _engine(path)
    engine.on_message_inbound(QUESTION)
    engine.recaller.start_reads()
    engine.recaller.settle()
    lengths, _ = engine.recaller.kept_state("default")
    store_counts = engine.store.turn_token_counts("default", list(range(1, 401)))
    assert lengths is not None
    kept = {s: int(lengths.array[s]) for s in range(1, 401)}
    engine.close()
    assert kept == store_counts


def test_a_replaced_database_gives_the_same_block_as_a_fresh_engine(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    _replaced(path)
    plain = _engine(path, state_files=False)
    want = plain.on_message_inbound(QUESTION).prepend_text
    plain.close()
    engine = _engine(path)
    got = engine.on_message_inbound(QUESTION).prepend_text
    engine.close()
    assert got == want


def _no_length_prior(path: Path, *, state_files: bool) -> MemoryEngine:
    """No length prior: no recall brings the kept token counts up to date itself."""
    cfg = MemoryConfig.model_validate(
        {
            "recall": {"embedder": "none", "state_files": state_files, "length_prior": 0.0},
            "context_window": 200_000,
        }
    )
    store = MemoryStore(path, counter=COUNTER)
    return MemoryEngine(cfg, store=store, embedder=None, counter=COUNTER)


def _long(count: int) -> list[dict[str, str]]:
    return [
        {"role": t["role"], "content": t["content"] + " and the kiln" * 30}
        for t in _turns(0, count)
    ]


def test_line_costs_of_another_incarnation_are_not_used(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    _stored(path)  # saved with line costs counted by cl100k_base
    engine = _no_length_prior(path, state_files=True)
    engine.on_message_inbound(QUESTION)  # adopts the saved counts and line costs
    kept = engine.recaller.kept_state("default")[0]
    assert kept is not None and kept.line_counter.startswith(COUNTER.name)
    # another process deletes the session and writes it again, with longer turns
    other = _no_length_prior(path, state_files=False)
    other.store.delete_session("default")
    other.on_turn_complete(_long(400), new_only=True)
    other.close()
    got = engine.on_message_inbound(QUESTION, budget=600)
    engine.close()
    fresh = _no_length_prior(path, state_files=False)
    want = fresh.on_message_inbound(QUESTION, budget=600)
    fresh.close()
    assert got.prepend_text == want.prepend_text


@pytest.mark.parametrize("content", ["empty", "npy"])
def test_a_bad_state_file_is_ignored(tmp_path: Path, content: str) -> None:
    path = tmp_path / "m.db"
    before = _stored(path)
    files = list((tmp_path / "m.db.state").glob("*.state"))
    assert len(files) == 1
    if content == "empty":
        files[0].write_bytes(b"")
    else:
        with files[0].open("wb") as f:
            np.save(f, np.arange(3))
    engine = _engine(path)
    try:
        assert engine.on_message_inbound(QUESTION).prepend_text == before
    finally:
        engine.close()


def test_adopted_counts_keep_the_cache_within_its_limit() -> None:
    store = MemoryStore(counter=CharCounter())
    stored(store, "a", *[f"walnut veneer shipment {i} at the north dock" for i in range(50)])
    stored(store, "b", *[f"oak shipment {i}" for i in range(50)])
    engine = MemoryEngine(
        MemoryConfig(), store=store, embedder=HashEmbedder(dim=16), counter=CharCounter()
    )
    engine.derive("a")
    engine.on_message_inbound("walnut veneer at the dock", session_id="a")
    recaller = engine.recaller
    recaller.settle()
    held = recaller.vector_cache_bytes()
    assert recaller._vectors and held > 0
    recaller.vector_cache_limit = held + 100  # what is held fits, with 100 bytes to spare
    born = store.session_version("b")[0]
    restored = TurnLengths.restored(born, 50, np.full(51, 7, np.int32))  # 408 bytes
    assert restored is not None and restored.nbytes <= recaller.vector_cache_limit
    recaller.adopt("b", restored, None)  # as MemoryEngine._restore does
    try:
        assert recaller.vector_cache_bytes() <= recaller.vector_cache_limit
    finally:
        engine.close()


def test_a_failed_rewarm_does_not_fail_the_compaction() -> None:
    config = MemoryConfig.model_validate({"compaction": {"protected_recent_turns": 4}})
    store = MemoryStore(counter=CharCounter())
    engine = MemoryEngine(config, store=store, embedder=None, counter=CharCounter())
    engine.on_turn_complete(_pairs(0, 40))

    def busy(sid: str) -> None:
        raise sqlite3.OperationalError("database is locked")

    engine.assembler.rewarm = busy  # type: ignore[method-assign]
    report = engine.compact()
    assert report is not None and report.turns_compacted > 0
    assert engine.store.session("default").compaction_watermark > 1


def test_close_survives_a_failing_state_save(tmp_path: Path) -> None:
    engine = _engine(tmp_path / "m.db")
    engine.on_turn_complete(_turns(0, 50), new_only=True)
    engine.on_message_inbound(QUESTION)
    closed: list[str] = []
    real_close = engine.recaller.close
    engine.recaller.close = lambda: (closed.append("recaller"), real_close())[1]  # type: ignore[method-assign]

    def failing(session_id: str) -> tuple[int, int] | None:
        raise sqlite3.OperationalError("disk I/O error")

    engine.store.session_version = failing  # type: ignore[method-assign]
    engine.close()  # the failed save is logged, and the rest closes
    assert closed == ["recaller"], "close() stopped before closing the recaller and store"


def test_a_failed_save_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.db"
    engine = _engine(path)
    engine.on_turn_complete(_turns(0, 300), new_only=True)
    engine.on_message_inbound(QUESTION)
    engine.recaller.settle()
    engine.on_message_inbound(QUESTION)

    def disk_full(fd: int) -> None:  # the file written, then the disk says no
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    engine.close()  # does not raise
    monkeypatch.undo()
    folder = tmp_path / "m.db.state"
    assert folder.is_dir() and list(folder.iterdir()) == []  # nothing saved, nothing left


def test_the_most_recently_recalled_session_is_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "SAVED_SESSIONS", 1)
    path = tmp_path / "m.db"
    engine = _engine(path)
    engine.on_turn_complete(_turns(0, 50), session_id="a", new_only=True)
    engine.on_message_inbound(QUESTION, session_id="a")
    engine.on_turn_complete(_turns(0, 50), session_id="b", new_only=True)
    engine.on_message_inbound(QUESTION, session_id="b")
    engine.on_message_inbound(QUESTION, session_id="a")  # the last one used
    engine.close()
    files = StateFiles(tmp_path / "m.db.state")
    assert files.load("a") is not None


def test_line_costs_are_not_shared_by_counters_of_one_name(tmp_path: Path) -> None:
    """Two counters of one name that count differently (the name rounds the safety margin:
    0.10 and 0.1049 are both ``+10%``): the line costs one counted and saved are not taken
    for the other's."""
    path = tmp_path / "m.db"
    _stored(path)
    a = TiktokenCounter("cl100k_base", safety_margin=0.05)
    b = TiktokenCounter("cl100k_base", safety_margin=0.15)
    b.name = a.name  # a collision as rounding makes, with margins far enough apart to show
    for counter in (a, b):
        engine = _engine(path)
        engine.counter = engine.assembler.counter = counter
        recalled = engine.on_message_inbound(QUESTION).recalled
        kept = engine.recaller.kept_state("default")[0]
        assert kept is not None and recalled
        key = kept.line_counter
        seqs = [r.seq for r in recalled]
        rows = engine.store.turn_rows("default", seqs)
        costs = dict(zip(seqs, kept.lines(seqs, key), strict=True))
        counted = {s: c for s, c in costs.items() if c}
        assert counted  # the packed turns' costs were kept
        assert all(counter.count(rows[s].text + "\n") == c for s, c in counted.items())
        engine.close()  # saved, under this counter's key


def test_the_folder_keeps_only_the_most_recently_written_files(tmp_path: Path) -> None:
    files = StateFiles(tmp_path)
    for n in range(10):
        files.save(SessionState(f"s{n}", 1, 1, counts={"kiln": n}))
        os.utime(files.path(f"s{n}"), (1_000 + n, 1_000 + n))  # written in that order
    crashed = tmp_path / "abc.tmp"
    crashed.write_bytes(b"half a file")
    os.utime(crashed, (1_000, 1_000))
    fresh = tmp_path / "def.tmp"  # a writer's, still writing
    fresh.write_bytes(b"being written")
    assert files.trim(keep=4) == 7
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".tmp") == ["def.tmp"]
    kept = [n for n in range(10) if files.load(f"s{n}") is not None]
    assert kept == [6, 7, 8, 9]


def test_close_trims_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "KEPT_FILES", 2)
    path = tmp_path / "m.db"
    engine = _engine(path)
    for sid in ("a", "b", "c"):
        engine.on_turn_complete(_turns(0, 30), session_id=sid, new_only=True)
        engine.on_message_inbound(QUESTION, session_id=sid)
    engine.close()
    assert len(list((tmp_path / "m.db.state").glob("*.state"))) == 2


def _rewritten(files: StateFiles, session: str, change: Any) -> None:
    """Unpack the session's file, let ``change(meta, sections)`` alter it, pack it again (a
    well-formed file, CRC included, holding what ``change`` left)."""
    meta, sections = snapshots._unpack(files.path(session).read_bytes())
    meta = {k: v for k, v in meta.items() if k not in ("sections", "crc")}
    change(meta, sections)
    files.path(session).write_bytes(snapshots._pack(meta, list(sections.items())))


def test_a_saved_state_reads_back_whole(tmp_path: Path) -> None:
    files = StateFiles(tmp_path)
    state = SessionState(
        "s",
        3,
        7,
        counts={"kiln": 1, "glaze": 2, "zoë": 5},
        related={"clay": 4},
        inbound=["kiln", "glaze", "zoë", "clay"],
        lengths=np.array([0, 5, 9], np.int32),
        lengths_last=2,
        lines=np.array([0, 6, 10, 4], np.int32),
        line_counter="cl100k_base/0.0",
        authors=np.array([0, 1, 2], np.uint16),
        authors_last=2,
        labels=["", "Ann", "Bo"],
        topics={"kiln": 1},
        topics_watermark=2,
        check_seq=3,
        check_hash="abc",
        groups={"ki": ["kiln"], "gl": ["glaze"], "": ["zoë"], "cl": ["clay"]},
        groups_key="k1",
    )
    files.save(state)
    got = files.load("s")
    assert got is not None
    for name in ("born", "generation", "counts", "related", "inbound", "lengths_last"):
        assert getattr(got, name) == getattr(state, name), name
    for name in ("line_counter", "authors_last", "labels", "topics", "topics_watermark"):
        assert getattr(got, name) == getattr(state, name), name
    assert (got.check_seq, got.check_hash, got.groups_key) == (3, "abc", "k1")
    assert got.groups == state.groups
    assert got.lengths is not None and got.lengths.tolist() == [0, 5, 9]
    assert got.lines is not None and got.lines.tolist() == [0, 6, 10, 4]
    assert got.authors is not None and got.authors.tolist() == [0, 1, 2]
    got.lengths[0] = 1  # writable: the recaller grows and fills them
    assert files.load("other") is None  # no file
    files.path("other").write_bytes(files.path("s").read_bytes())
    assert files.load("other") is None  # another session's


def _forged(path: Path, edit: Any) -> None:
    """Let ``edit(header)`` change the file's JSON header (its section table included), then
    write the file again with a CRC that matches: a file that lies, not a damaged one."""
    data = path.read_bytes()
    _, _, size = snapshots._HEAD.unpack_from(data)
    start = snapshots._HEAD.size
    header = json.loads(data[start : start + size])
    edit(header)
    raw = json.dumps(header).encode()
    rest = raw + data[start + size :]
    path.write_bytes(snapshots._HEAD.pack(snapshots._MAGIC, zlib.crc32(rest), len(raw)) + rest)


def _section(header: dict[str, Any], name: str) -> list[Any]:
    return next(entry for entry in header["sections"] if entry[0] == name)


def _saved_with_groups(files: StateFiles) -> None:
    state = SessionState("s", 1, 1, counts={"kiln": 1, "glaze": 2}, inbound=["kiln", "glaze"])
    state.lengths, state.lengths_last = np.array([0, 5, 9], np.int32), 2
    state.groups, state.groups_key = {"ki": ["kiln"], "gl": ["glaze"]}, "k1"
    files.save(state)
    loaded = files.load("s")
    assert loaded is not None and loaded.groups is not None


@pytest.mark.parametrize(
    "damage",
    [
        "unpaired",
        "short tags",
        "past the table",
        "count",
        "kind",
        "infinite scalar",
        "float scalar",
        "flipped body byte",
        "flipped header byte",
        "cut",
        "trailing",
        "magic",
        "text",
    ],
)
def test_a_damaged_or_inconsistent_file_is_ignored(tmp_path: Path, damage: str) -> None:
    files = StateFiles(tmp_path)
    _saved_with_groups(files)
    path = files.path("s")
    if damage == "unpaired":
        _rewritten(files, "s", lambda meta, sections: sections.pop("counts.values"))
    elif damage == "short tags":
        _rewritten(files, "s", lambda m, sections: sections.update({"counts.tags": np.arange(1)}))
    elif damage == "past the table":
        _rewritten(files, "s", lambda m, sections: sections.update(inbound=np.array([0, 2])))
    elif damage == "text":  # text where positions belong
        _rewritten(files, "s", lambda m, sections: sections.update(inbound=["kiln", "glaze"]))
    elif damage == "count":  # the header says another count than the section holds
        _forged(path, lambda header: _section(header, "tags").__setitem__(2, 3))
    elif damage == "kind":  # the counts read as floats: every one would come back 0
        _forged(path, lambda header: _section(header, "counts.values").__setitem__(1, "<f8"))
    elif damage == "infinite scalar":
        _forged(path, lambda header: header.update(born=float("inf")))
    elif damage == "float scalar":
        _forged(path, lambda header: header.update(check_seq=2.5))
    elif damage in ("flipped body byte", "flipped header byte"):
        data = bytearray(path.read_bytes())
        data[-1 if damage == "flipped body byte" else snapshots._HEAD.size + 3] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "cut":
        path.write_bytes(path.read_bytes()[:-3])
    elif damage == "trailing":
        path.write_bytes(path.read_bytes() + b"\x00")
    else:
        path.write_bytes(b"XX" + path.read_bytes()[2:])
    assert files.load("s") is None


@pytest.mark.parametrize("damage", ["twice", "overflowing sizes", "unpaired keys"])
def test_groups_that_do_not_add_up_cost_only_themselves(tmp_path: Path, damage: str) -> None:
    files = StateFiles(tmp_path)
    _saved_with_groups(files)
    if damage == "twice":
        _rewritten(files, "s", lambda m, s: s.update({"groups.inbound": np.array([0, 0])}))
    elif damage == "overflowing sizes":  # int64 sums wrap to 2: two groups of both tags
        sizes = np.array([2**63 - 1, 2**63 - 1, 4], np.int64)
        _rewritten(files, "s", lambda m, s: s.update({"groups.keys": ["a", "b", "c"]}))
        _rewritten(files, "s", lambda m, s: s.update({"groups.sizes": sizes}))
    else:
        _rewritten(files, "s", lambda m, s: s.update({"groups.keys": ["ki"]}))
    loaded = files.load("s")
    assert loaded is not None and loaded.groups is None
    assert loaded.counts == {"kiln": 1, "glaze": 2} and loaded.inbound == ["kiln", "glaze"]


def test_a_tag_holding_the_separator_fails_the_count_not_the_recall(tmp_path: Path) -> None:
    files = StateFiles(tmp_path)
    files.save(SessionState("s", 1, 1, counts={"kiln\x00glaze": 1}, inbound=["kiln\x00glaze"]))
    assert files.load("s") is None  # read from the store instead, never split wrongly


def test_format_3_files_are_deleted_by_the_trim(tmp_path: Path) -> None:
    old = tmp_path / "abc.npz"
    old.write_bytes(b"PK")
    files = StateFiles(tmp_path)
    files.save(SessionState("s", 1, 1, counts={"kiln": 1}))
    assert files.trim() == 1
    assert not old.exists() and files.load("s") is not None


def _groupings(monkeypatch: pytest.MonkeyPatch, tagger: KeywordTagger) -> list[int]:
    """Spy on the tagger grouping tags itself: the count of each call's tags."""
    calls: list[int] = []
    group = tagger._group

    def spy(buckets: dict[str, list[str]], tags: list[str]) -> None:
        calls.append(len(tags))
        group(buckets, tags)

    monkeypatch.setattr(tagger, "_group", spy)
    return calls


def test_a_restarted_engine_adopts_the_saved_grouping_and_tags_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.db"
    _stored(path)
    engine = _engine(path)
    tagger = engine.inbound_tagger
    assert isinstance(tagger, KeywordTagger)
    grouped = _groupings(monkeypatch, tagger)
    engine.on_message_inbound(QUESTION)
    assert grouped == []  # adopted from the file, not grouped by the recall
    inbound = engine.vocab.kept("default", engine.store.session_version("default")[1])[1]
    assert inbound is not None
    adopted = tagger.known_groups(inbound)
    assert adopted is not None
    fresh = KeywordTagger(canonicalizer=engine.canonicalizer)
    assert {k: sorted(v) for k, v in adopted.items()} == {
        k: sorted(v) for k, v in fresh._buckets(inbound).items()
    }
    got = engine.tag_message("Ann's glaze and the kiln, then the pottery class")
    engine.close()
    plain = _engine(path, state_files=False)
    want = plain.tag_message("Ann's glaze and the kiln, then the pottery class")
    plain.close()
    assert got.tags == want.tags and got.related_tags == want.related_tags


def test_groups_of_another_version_or_vocabulary_are_not_adopted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tagger = KeywordTagger()
    vocabulary = ["kiln", "glaze", "clay"]
    key = tagging.GROUPS_KEY
    assert not tagger.adopt_groups(vocabulary, {"ki": ["kiln"], "gl": ["glaze"]}, key)  # part
    other = {"po": ["pottery"], "ki": ["kiln"], "gl": ["glaze"]}  # as many tags, not these
    assert not tagger.adopt_groups(vocabulary, {"zz": ["pottery", "kiln", "glaze"]}, key)
    assert not tagger.adopt_groups(["kiln", "glaze", "clay"], {**other, "ki": ["clay"]}, key)
    whole = {"ki": ["kiln"], "gl": ["glaze"], "cl": ["clay"]}
    assert not tagger.adopt_groups(vocabulary, whole, "another")  # made by other rules
    assert not tagger.adopt_groups(vocabulary, whole, None)  # by rules not named
    assert tagger.known_groups(vocabulary) is None
    assert tagger.adopt_groups(vocabulary, whole, key)
    assert tagger.known_groups(vocabulary) is not None
    path = tmp_path / "m.db"
    _stored(path)
    monkeypatch.setattr(tagging, "GROUPS_KEY", "another")  # a newer grouping
    engine = _engine(path)
    tagger = engine.inbound_tagger
    assert isinstance(tagger, KeywordTagger)
    grouped = _groupings(monkeypatch, tagger)
    engine.on_message_inbound(QUESTION)
    engine.close()
    assert grouped and grouped[0] > 10  # grouped here, the saved groups not adopted


def test_a_session_never_recalled_restarts_with_its_grouping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Derived, compacted (which reads the inbound vocabulary again) and closed without a
    recall, the tagger holding no grouping of that vocabulary (it keeps 4, its derives'
    own vocabularies first: a 1,500-turn LoCoMo ingest left none of the inbound one): the
    close makes and saves it (about 2 ms at 100k turns), so the first recall after a restart
    groups nothing (at 10k turns the grouping and the canonical forms were half of it)."""
    path = tmp_path / "m.db"
    engine = _engine(path)
    engine.on_turn_complete(_turns(0, 400), new_only=True)
    assert engine.compact() is not None
    tagger = engine.inbound_tagger
    assert isinstance(tagger, KeywordTagger)
    tagger._known.clear()  # (the derives' groupings took the places)
    engine.close()
    saved = StateFiles(Path(f"{path}.state")).load("default")
    assert saved is not None and saved.inbound and saved.groups is not None
    engine = _engine(path)
    tagger = engine.inbound_tagger
    assert isinstance(tagger, KeywordTagger)
    grouped = _groupings(monkeypatch, tagger)
    got = engine.tag_message("Ann's glaze and the kiln, then the pottery class")
    engine.close()
    assert grouped == []
    plain = _engine(path, state_files=False)
    want = plain.tag_message("Ann's glaze and the kiln, then the pottery class")
    plain.close()
    assert got.tags == want.tags and got.related_tags == want.related_tags


def test_groups_made_for_a_state_file_push_no_kept_grouping_out() -> None:
    """``groups`` of a vocabulary the tagger keeps none for: made apart, as ``_buckets`` makes
    them from scratch, and the tagger's kept groupings (at most 4) stay as they were."""
    tagger = KeywordTagger()
    for n in range(4):
        tagger._buckets([f"kiln{n}", f"glaze{n}", f"clay{n}"])
    kept = list(tagger._known)
    vocabulary = ["zebra", "mice", " DB", "x-ray", "kiln"]
    got = tagger.groups(vocabulary)
    assert tagger._known == kept and all(a is b for a, b in zip(tagger._known, kept, strict=True))
    assert got == KeywordTagger()._buckets(vocabulary)
    assert tagger.groups(["kiln0", "glaze0", "clay0"]) is kept[-1][1]  # a kept one: as kept
