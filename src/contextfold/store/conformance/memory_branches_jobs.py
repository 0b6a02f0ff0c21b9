"""Conformance: exchanges committed with their derive job, optimistic concurrency
(``BranchMoved``), branches (``fork``) and the jobs table (claimed by one worker at a time
across store objects, leases, retries, given back)."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from contextfold.errors import ConfigError
from contextfold.store.conformance.memory_support import (
    TOPICS,
    StoreFactory,
    exchange,
    filled,
    messages,
    msg,
)

# The attempt limit is part of the contract (every backend fails a job for good after as many
# attempts); the SQLite module is where it is defined today.
from contextfold.store.models import MAX_ATTEMPTS, BranchMoved, NewSegment, match_key
from contextfold.store.protocols import MemoryStorage

# -- exchanges ------------------------------------------------------------------------------------


def test_an_exchange_stores_its_turns_and_one_pending_derive_job(
    memory_store: MemoryStorage,
) -> None:
    store = memory_store
    sid = store.create_session("a")
    assert exchange(store, sid, 0) == [1, 2]
    assert store.jobs.job_counts() == {"pending": 1} and store.jobs.pending_jobs() == 1
    job = store.jobs.claim_job("w")
    assert job is not None and (job.session_id, job.kind, job.attempts) == ("a", "derive", 1)
    assert [t.message.text() for t in store.turns(sid)] == ["question 0", "ok"]
    assert store.commit_exchange(sid, [msg("user", "cut")], partial=[True]) == [3]
    assert store.turns(sid, 3, 3)[0].partial is True
    assert store.jobs.job_counts() == {"pending": 1, "running": 1}


def test_an_exchange_queues_one_pending_job_per_session(memory_store: MemoryStorage) -> None:
    store = memory_store
    a, b = store.create_session("a"), store.create_session("b")
    for n in range(3):
        exchange(store, a, n)
    exchange(store, b, 0)
    assert store.jobs.job_counts() == {"pending": 2}
    store.jobs.enqueue_job(a)  # already pending: nothing
    store.jobs.enqueue_job(a, "summaries")  # another kind: its own job
    assert store.jobs.job_counts() == {"pending": 3}
    store.jobs.drop_pending_job(a)
    assert store.jobs.job_counts() == {"pending": 2}
    store.jobs.drop_pending_job(a)  # none left: nothing
    claimed = {store.jobs.claim_job("w").kind for _ in range(2)}  # type: ignore[union-attr]
    assert claimed == {"derive", "summaries"} and store.jobs.claim_job("w") is None


def test_branch_moved_refuses_the_exchange_and_stores_nothing(
    open_store: StoreFactory,
) -> None:
    store, other = open_store(), open_store()
    sid = store.create_session("a")
    exchange(store, sid, 0)
    job = store.jobs.claim_job("w")
    assert job is not None and store.jobs.finish_job(job.id, "w")
    assert other.commit_exchange(sid, messages(["from elsewhere"]), expect_last=2) == [3]
    other_job = other.jobs.claim_job("w2")
    assert other_job is not None and other.jobs.finish_job(other_job.id, "w2")
    with pytest.raises(BranchMoved) as moved:
        store.commit_exchange(sid, messages(["stale", "reply"]), expect_last=2)
    assert isinstance(moved.value, ConfigError)
    assert (moved.value.session_id, moved.value.expected, moved.value.last) == (sid, 2, 3)
    assert store.last_seq(sid) == 3 and store.jobs.job_counts() == {}  # no turn, no job
    assert store.commit_exchange(sid, messages(["fresh"]), expect_last=3) == [4]
    assert store.commit_exchange(sid, messages(["a", "b"]), expect_last=None) == [5, 6]
    with pytest.raises(BranchMoved):
        store.commit_exchange(sid, [], expect_last=5)
    assert [t.seq for t in other.turns(sid)] == [1, 2, 3, 4, 5, 6]


def test_racing_writers_never_both_continue_the_same_turn(open_store: StoreFactory) -> None:
    """Two writers (threads, each with a store object of its own), each continuing the turn
    it last read: for every seq exactly one wins, the other gets ``BranchMoved``; the session
    ends up with consecutive seqs and the winners' turns only."""
    setup = open_store()
    setup.create_session("a")
    writers = [open_store(), open_store()]
    won: list[list[int]] = [[], []]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def write(index: int) -> None:
        store = writers[index]
        try:
            start.wait()
            for n in range(15):
                last = store.last_seq("a")
                text = f"writer{index} turn{n}"
                try:
                    won[index] += store.commit_exchange("a", [msg("user", text)], expect_last=last)
                except BranchMoved as moved:
                    assert moved.expected == last and moved.last > last
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    seqs = sorted(won[0] + won[1])
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 15
    turns = setup.turns("a")
    assert [t.seq for t in turns] == seqs
    for index in (0, 1):
        for seq in won[index]:
            assert turns[seq - 1].message.text().startswith(f"writer{index} ")
    assert setup.jobs.job_counts() == {"pending": 1}


def test_branch_moved_for_a_new_session_expecting_turns(memory_store: MemoryStorage) -> None:
    store = memory_store
    store.create_session("a")
    with pytest.raises(BranchMoved):
        store.commit_exchange("a", messages(["x"]), expect_last=1)
    assert store.commit_exchange("a", messages(["x"]), expect_last=0) == [1]


def test_a_long_history_is_committed_in_order_with_its_job(memory_store: MemoryStorage) -> None:
    store = memory_store
    store.create_session("a")
    history = messages([f"message {n}" for n in range(600)])  # several write chunks
    assert store.commit_exchange("a", history, expect_last=0) == list(range(1, 601))
    assert [t.message.text() for t in store.turns("a")] == [m.text() for m in history]
    assert store.jobs.job_counts() == {"pending": 1}


def test_an_exchange_rolled_back_in_a_batch_leaves_no_job(memory_store: MemoryStorage) -> None:
    store = memory_store
    store.create_session("a")
    with pytest.raises(RuntimeError), store.batch():
        exchange(store, "a", 0)
        raise RuntimeError("crash before the commit")
    assert store.last_seq("a") == 0 and store.jobs.job_counts() == {}


def test_mark_derived_only_moves_forward(memory_store: MemoryStorage) -> None:
    store = filled(memory_store)
    store.mark_derived("s1", 4)
    store.mark_derived("s1", 2)
    assert store.session("s1").derived_seq == 4


# -- branches -------------------------------------------------------------------------------------


def _parent(store: MemoryStorage) -> MemoryStorage:
    store.create_session("p", {"user": "ada"}, principal="alice")
    store.append_turns("p", messages(TOPICS))  # 6 turns
    store.set_tags_many(
        "p",
        {seq: ({f"tag{seq}": 1.0}, [f"rel{seq}"]) for seq in range(1, 7)},
    )
    vectors = np.arange(12, dtype=np.float32).reshape(6, 2)
    store.add_turn_vectors("p", "m", list(range(1, 7)), vectors)
    store.compact(
        "p",
        [
            NewSegment(
                first_seq=1, last_seq=2, summary="kubernetes deploy", full_text="a", tags=("tag1",)
            ),
            NewSegment(first_seq=3, last_seq=5, summary="lunch and invoices", full_text="b"),
        ],
        6,
    )
    store.mark_derived("p", 6)
    return store


def test_a_branch_holds_its_parents_turns_up_to_the_fork_and_nothing_later(
    memory_store: MemoryStorage,
) -> None:
    store = _parent(memory_store)
    parent_turns = store.turns("p")
    branch = store.fork("p", 4, session_id_new="b")
    assert branch == "b"
    record = store.session("b")
    assert (record.parent_id, record.fork_seq, record.principal) == ("p", 4, "alice")
    assert record.metadata == {"user": "ada", "forked_from": "p"}
    assert record.derived_seq == 4  # min(parent's, upto)
    assert record.compaction_watermark == 3  # the reach of the segments it holds
    turns = store.turns("b")
    assert [t.seq for t in turns] == [1, 2, 3, 4] and store.last_seq("b") == 4
    for mine, theirs in zip(turns, parent_turns, strict=False):
        assert mine.model_dump(exclude={"session_id"}) == theirs.model_dump(exclude={"session_id"})
        assert mine.session_id == "b"
    # Vectors of the copied turns only.
    seqs, vectors = store.turn_vectors("b", "m")
    assert seqs == [1, 2, 3, 4]
    assert vectors.tobytes() == np.arange(8, dtype=np.float32).tobytes()
    assert store.last_vector_seq("b", "m") == 4
    # The segment wholly inside 1..4, not the one that runs past it.
    [segment] = store.segments("b")
    parent_segment = store.segments("p")[0]
    assert segment.model_dump(exclude={"id", "session_id", "created_at"}) == (
        parent_segment.model_dump(exclude={"id", "session_id", "created_at"})
    )
    assert segment.session_id == "b" and segment.id not in {s.id for s in store.segments("p")}
    assert store.tag_counts("b") == {f"tag{n}": 1 for n in range(1, 5)}
    # Nothing the parent said later: not in search, keys, tags or segments.
    assert store.search_turns("b", "rotate keys upgrade") == []
    assert [t.seq for t, _ in store.search_turns("b", "invoices")] == [2]
    assert store.search_segments("b", "lunch") == []
    assert [s.id for s, _ in store.search_segments("b", "kubernetes")] == [segment.id]
    assert store.turn_keys("b", 1, 9) == {
        seq: match_key(t.message.role, t.message.text()) for seq, t in enumerate(turns, 1)
    }
    assert store.turns_tagged("b", ["tag5", "rel6"]) == {}
    # The branch goes on from 5, and the parent is unchanged by it.
    assert store.append_turns("b", messages(["branch reply"])) == [5]
    assert [t.message.text() for t in store.turns("p")] == TOPICS
    assert store.last_seq("p") == 6 and store.search_turns("p", "branch") == []
    assert store.session("p").parent_id is None
    # A copied turn is found in both, by the principal only.
    key = match_key("user", TOPICS[0])
    assert sorted(store.turns_with_key("alice", key)) == [("b", 1), ("p", 1)]
    assert store.turns_with_key("", key) == []


def test_a_branch_queues_its_derive_job(memory_store: MemoryStorage) -> None:
    store = _parent(memory_store)
    assert store.jobs.job_counts() == {}
    store.fork("p", 2, session_id_new="b")
    job = store.jobs.claim_job("w")
    assert job is not None and (job.session_id, job.kind) == ("b", "derive")


def test_a_branch_at_zero_is_empty(memory_store: MemoryStorage) -> None:
    store = _parent(memory_store)
    branch = store.fork("p", 0)
    record = store.session(branch)
    assert (record.parent_id, record.fork_seq, record.compaction_watermark) == ("p", 0, 0)
    assert store.turns(branch) == [] and store.segments(branch) == []
    assert store.turn_vectors(branch, "m")[0] == [] and store.tag_counts(branch) == {}
    assert store.append_turns(branch, messages(["new start"])) == [1]
    other = store.fork("p", 6)
    assert other not in {"p", branch} and len(store.turns(other)) == 6
    assert [s.first_seq for s in store.segments(other)] == [1, 3]
    assert store.session(other).compaction_watermark == 6


def test_a_fork_refuses_a_missing_turn_or_session(memory_store: MemoryStorage) -> None:
    store = _parent(memory_store)
    before = store.sessions()
    with pytest.raises(ConfigError, match="no turn 7"):
        store.fork("p", 7)
    with pytest.raises(ConfigError, match="unknown session"):
        store.fork("nope", 0)
    assert store.sessions() == before


def test_a_fork_to_an_existing_id_is_a_config_error(memory_store: MemoryStorage) -> None:
    store = _parent(memory_store)
    store.create_session("taken")
    store.append_turns("taken", messages(["mine"]))
    before = (store.sessions(), store.jobs.job_counts(), store.segments("taken"))
    try:
        with pytest.raises(ConfigError, match="already exists"):
            store.fork("p", 3, session_id_new="taken")
    finally:
        assert [t.message.text() for t in store.turns("taken")] == ["mine"]
        assert store.session("taken").parent_id is None
        assert store.tag_counts("taken") == {} and store.turn_vectors("taken", "m")[0] == []
        assert (store.sessions(), store.jobs.job_counts(), store.segments("taken")) == before


def test_branches_of_branches_keep_their_own_ancestry(memory_store: MemoryStorage) -> None:
    store = _parent(memory_store)
    b = store.fork("p", 5, session_id_new="b")
    store.append_turns("b", messages(["b6", "b7"]))
    c = store.fork("b", 6, session_id_new="c")
    assert [t.message.text() for t in store.turns(c)] == [*TOPICS[:5], "b6"]
    assert (store.session(c).parent_id, store.session(c).fork_seq) == ("b", 6)
    assert [t.seq for t, _ in store.search_turns(c, "b7")] == []
    assert store.last_seq(b) == 7 and store.last_seq("p") == 6


# -- jobs -----------------------------------------------------------------------------------------


def test_a_session_runs_one_job_at_a_time_and_others_go_on(memory_store: MemoryStorage) -> None:
    store = memory_store
    a, b = store.create_session("a"), store.create_session("b")
    exchange(store, a, 0)
    first = store.jobs.claim_job("w1")
    assert first is not None and first.session_id == a
    exchange(store, a, 1)  # queued while a's job runs
    exchange(store, b, 0)
    second = store.jobs.claim_job("w2")
    assert second is not None and second.session_id == b  # a's new job waits for the first
    assert store.jobs.claim_job("w2") is None
    assert store.jobs.finish_job(first.id, "w1")
    third = store.jobs.claim_job("w2")
    assert third is not None and third.session_id == a


def test_claims_take_the_oldest_job_and_skip_the_sessions_asked(
    memory_store: MemoryStorage,
) -> None:
    store = memory_store
    for sid in ("a", "b", "c"):
        store.create_session(sid)
        exchange(store, sid, 0)
    job = store.jobs.claim_job("w", skip={"a"})
    assert job is not None and job.session_id == "b"
    job = store.jobs.claim_job("w", skip={"a", "c"})
    assert job is None
    assert [store.jobs.claim_job("w").session_id for _ in range(2)] == ["a", "c"]  # type: ignore[union-attr]
    assert store.jobs.job_counts() == {"running": 3} and store.jobs.pending_jobs() == 3


def test_a_job_whose_lease_ran_out_is_claimed_again(memory_store: MemoryStorage) -> None:
    store = memory_store
    sid = store.create_session("a")
    exchange(store, sid, 0)
    lost = store.jobs.claim_job("dead-worker", lease=-1.0)  # its lease is already over
    assert lost is not None
    again = store.jobs.claim_job("w2")
    assert again is not None and again.id == lost.id and again.attempts == 2
    assert store.jobs.claim_job("w3") is None  # w2's lease holds


def test_a_job_given_back_at_a_stop_survives_its_late_outcome(
    memory_store: MemoryStorage,
) -> None:
    """A stop gives back the jobs still running; a worker thread that ends after the stop
    must not delete the row, which now stands for work queued since its claim."""
    store = memory_store
    sid = store.create_session("a")
    exchange(store, sid, 0)
    job = store.jobs.claim_job("w1")
    assert job is not None
    exchange(store, sid, 1)  # new turns while the job runs
    assert store.jobs.release_jobs("w1") == 1
    assert not store.jobs.finish_job(job.id, "w1")
    assert not store.jobs.fail_job(job.id, "late error", owner="w1")
    assert store.jobs.job_counts() == {"pending": 1}
    redo = store.jobs.claim_job("w2")
    assert redo is not None and redo.session_id == sid


def test_release_jobs_gives_back_only_the_owners_jobs(memory_store: MemoryStorage) -> None:
    store = memory_store
    for sid in ("a", "b", "c"):
        store.create_session(sid)
        exchange(store, sid, 0)
    mine = [store.jobs.claim_job("w1"), store.jobs.claim_job("w1")]
    theirs = store.jobs.claim_job("w2")
    assert all(mine) and theirs is not None
    assert store.jobs.release_jobs("w1") == 2
    assert store.jobs.release_jobs("w1") == 0 and store.jobs.release_jobs("nobody") == 0
    assert store.jobs.job_counts() == {"pending": 2, "running": 1}
    again = store.jobs.claim_job("w3")
    assert again is not None and again.id == mine[0].id and again.attempts == 2  # type: ignore[union-attr]
    assert store.jobs.finish_job(theirs.id, "w2")


def test_an_outcome_after_another_worker_reclaimed_the_job_leaves_it_to_that_worker(
    memory_store: MemoryStorage,
) -> None:
    store = memory_store
    sid = store.create_session("a")
    exchange(store, sid, 0)
    slow = store.jobs.claim_job("w1", lease=-1.0)
    assert slow is not None
    fresh = store.jobs.claim_job("w2")
    assert fresh is not None and fresh.id == slow.id
    assert not store.jobs.finish_job(slow.id, "w1")
    assert store.jobs.job_counts() == {"running": 1}
    assert store.jobs.finish_job(fresh.id, "w2")
    assert store.jobs.job_counts() == {}


def test_a_failing_job_is_retried_then_kept_as_failed_with_its_error(
    memory_store: MemoryStorage,
) -> None:
    store = memory_store
    sid = store.create_session("a")
    exchange(store, sid, 0)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        job = store.jobs.claim_job("w1")
        assert job is not None and job.attempts == attempt
        assert store.jobs.fail_job(job.id, f"boom {attempt}", owner="w1")
    assert store.jobs.claim_job("w1") is None
    assert store.jobs.job_counts() == {"failed": 1}
    assert store.jobs.pending_jobs() == 0
    exchange(store, sid, 1)  # a failed job does not block the session's next one
    job = store.jobs.claim_job("w1")
    assert job is not None and job.attempts == 1


def test_a_job_failed_without_retry_is_failed_at_once(memory_store: MemoryStorage) -> None:
    store = memory_store
    sid = store.create_session("a")
    exchange(store, sid, 0)
    job = store.jobs.claim_job("w")
    assert job is not None
    assert store.jobs.fail_job(job.id, "bad input", retry=False, owner="w")
    assert store.jobs.job_counts() == {"failed": 1} and store.jobs.claim_job("w") is None
    assert not store.jobs.fail_job(10**9, "no such job")
    assert not store.jobs.finish_job(10**9)


def test_a_retried_job_merges_with_the_one_queued_meanwhile(memory_store: MemoryStorage) -> None:
    store = memory_store
    sid = store.create_session("a")
    exchange(store, sid, 0)
    job = store.jobs.claim_job("w")
    assert job is not None
    exchange(store, sid, 1)  # queued while the job runs
    assert store.jobs.job_counts() == {"pending": 1, "running": 1}
    assert store.jobs.fail_job(job.id, "boom", owner="w")
    assert store.jobs.job_counts() == {"pending": 1}  # still one pending job of the kind


def test_jobs_of_a_dead_process_are_given_back(memory_store: MemoryStorage) -> None:
    store = memory_store
    sid = store.create_session("a")
    exchange(store, sid, 0)
    owner = f"{socket.gethostname()}:4242"
    assert store.jobs.claim_job(owner) is not None
    assert store.jobs.release_jobs_of_dead(alive=lambda pid: pid != 4242) == 1
    assert store.jobs.job_counts() == {"pending": 1}


def test_jobs_of_live_or_foreign_processes_are_kept(memory_store: MemoryStorage) -> None:
    store = memory_store
    for sid in ("a", "b"):
        store.create_session(sid)
        exchange(store, sid, 0)
    assert store.jobs.claim_job(f"{socket.gethostname()}:4242") is not None
    assert store.jobs.claim_job("some-other-host:4243") is not None
    assert store.jobs.release_jobs_of_dead(alive=lambda pid: True) == 0
    assert store.jobs.release_jobs_of_dead(alive=lambda pid: False) == 1  # this host's only
    assert store.jobs.job_counts() == {"pending": 1, "running": 1}


def test_each_job_is_claimed_once_by_workers_with_their_own_store_objects(
    open_store: StoreFactory,
) -> None:
    """Two workers (threads, each with a store object of its own: two processes' view),
    claiming in a loop: every job is claimed exactly once, and none is lost."""
    setup = open_store()
    total = 40
    for n in range(total):
        sid = setup.create_session(f"s{n:02d}")
        exchange(setup, sid, n)
    workers = [open_store(), open_store()]
    claimed: list[list[tuple[int, str]]] = [[], []]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def work(index: int) -> None:
        store, owner = workers[index], f"worker-{index}"
        try:
            start.wait()
            while (job := store.jobs.claim_job(owner)) is not None:
                claimed[index].append((job.id, job.session_id))
                assert store.jobs.finish_job(job.id, owner)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    every = claimed[0] + claimed[1]
    assert len(every) == total == len(set(every))
    assert sorted(sid for _, sid in every) == [f"s{n:02d}" for n in range(total)]
    assert setup.jobs.job_counts() == {}
