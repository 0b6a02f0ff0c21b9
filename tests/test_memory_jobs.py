"""The jobs table of ``MemoryStore``: derived work kept in the store, claimed one session at a
time, given back at a stop or after a crash, and never lost between a claim and its outcome."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from contextfold.items import Message
from contextfold.store.sqlite.memory import MemoryStore
from contextfold.store.sqlite.memory_branches import MAX_ATTEMPTS
from contextfold.tokens import CharCounter


def exchange(store: MemoryStore, sid: str, n: int) -> None:
    store.commit_exchange(
        sid,
        [Message(role="user", content=f"question {n}"), Message(role="assistant", content="ok")],
    )


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    return MemoryStore(tmp_path / "m.db", counter=CharCounter())


def test_an_exchange_queues_one_pending_job_per_session(store: MemoryStore) -> None:
    a, b = store.create_session("a"), store.create_session("b")
    for n in range(3):
        exchange(store, a, n)
    exchange(store, b, 0)
    assert store.job_counts() == {"pending": 2}


def test_a_session_runs_one_job_at_a_time_and_others_go_on(store: MemoryStore) -> None:
    a, b = store.create_session("a"), store.create_session("b")
    exchange(store, a, 0)
    first = store.claim_job("w1")
    assert first is not None and first.session_id == a
    exchange(store, a, 1)  # queued while a's job runs
    exchange(store, b, 0)
    second = store.claim_job("w2")
    assert second is not None and second.session_id == b  # a's new job waits for the first
    assert store.claim_job("w2") is None
    assert store.finish_job(first.id, "w1")
    third = store.claim_job("w2")
    assert third is not None and third.session_id == a


def test_a_job_whose_lease_ran_out_is_claimed_again(store: MemoryStore) -> None:
    sid = store.create_session("a")
    exchange(store, sid, 0)
    lost = store.claim_job("dead-worker", lease=-1.0)  # its lease is already over
    assert lost is not None
    again = store.claim_job("w2")
    assert again is not None and again.id == lost.id and again.attempts == 2


def test_a_job_given_back_at_a_stop_survives_its_late_outcome(store: MemoryStore) -> None:
    """A stop gives back the jobs still running; a worker thread that ends after the stop
    must not delete the row, which now stands for work queued since its claim."""
    sid = store.create_session("a")
    exchange(store, sid, 0)
    job = store.claim_job("w1")
    assert job is not None
    exchange(store, sid, 1)  # new turns while the job runs
    assert store.release_jobs("w1") == 1
    assert not store.finish_job(job.id, "w1")
    assert not store.fail_job(job.id, "late error", owner="w1")
    assert store.job_counts() == {"pending": 1}
    redo = store.claim_job("w2")
    assert redo is not None and redo.session_id == sid


def test_an_outcome_after_another_worker_reclaimed_the_job_leaves_it_to_that_worker(
    store: MemoryStore,
) -> None:
    sid = store.create_session("a")
    exchange(store, sid, 0)
    slow = store.claim_job("w1", lease=-1.0)
    assert slow is not None
    fresh = store.claim_job("w2")
    assert fresh is not None and fresh.id == slow.id
    assert not store.finish_job(slow.id, "w1")
    assert store.job_counts() == {"running": 1}
    assert store.finish_job(fresh.id, "w2")
    assert store.job_counts() == {}


def test_a_failing_job_is_retried_then_kept_as_failed_with_its_error(
    store: MemoryStore,
) -> None:
    sid = store.create_session("a")
    exchange(store, sid, 0)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        job = store.claim_job("w1")
        assert job is not None and job.attempts == attempt
        assert store.fail_job(job.id, f"boom {attempt}", owner="w1")
    assert store.claim_job("w1") is None
    assert store.job_counts() == {"failed": 1}
    assert store.pending_jobs() == 0


def test_jobs_of_a_dead_process_are_given_back(store: MemoryStore) -> None:
    sid = store.create_session("a")
    exchange(store, sid, 0)
    owner = f"{socket.gethostname()}:4242"
    assert store.claim_job(owner) is not None
    assert store.release_jobs_of_dead(alive=lambda pid: pid != 4242) == 1
    assert store.job_counts() == {"pending": 1}


def test_turn_keys_follow_appends_deletes_and_other_connections(tmp_path: Path) -> None:
    """``turn_keys`` is served from a per-session chain read incrementally; it must see turns
    appended here or by another process, and a session deleted and written again."""
    from contextfold.store.models import match_key

    path = tmp_path / "m.db"
    store, other = (
        MemoryStore(path, counter=CharCounter()),
        MemoryStore(path, counter=CharCounter()),
    )
    sid = store.create_session("a")
    exchange(store, sid, 0)
    assert store.turn_keys(sid, 1, 9) == {
        1: match_key("user", "question 0"),
        2: match_key("assistant", "ok"),
    }
    exchange(other, sid, 1)  # another connection (process) appends
    assert store.turn_keys(sid, 3, 3) == {3: match_key("user", "question 1")}
    assert store.turn_keys(sid, 2, 4) == {
        2: match_key("assistant", "ok"),
        3: match_key("user", "question 1"),
        4: match_key("assistant", "ok"),
    }
    other.delete_session(sid)
    other.create_session("a")
    other.commit_exchange(
        sid, [Message(role="user", content="new"), Message(role="assistant", content="start")]
    )
    assert store.turn_keys(sid, 1, 9) == {
        1: match_key("user", "new"),
        2: match_key("assistant", "start"),
    }
    other.delete_session(sid)
    assert store.turn_keys(sid, 1, 9) == {}


def test_background_work_waits_for_a_quiet_moment_but_not_forever() -> None:
    """``Foreground``: derived work waits while requests do their memory work (so it does not
    take the interpreter from them), and runs anyway once the wait limit has passed."""
    import threading
    import time

    from contextfold.server.jobs import Foreground

    foreground = Foreground()
    assert foreground.wait_quiet(0.0)  # nothing running: no wait
    waited: list[float] = []

    def background() -> None:
        start = time.monotonic()
        foreground.wait_quiet(5.0)
        waited.append(time.monotonic() - start)

    with foreground:
        thread = threading.Thread(target=background)
        thread.start()
        time.sleep(0.3)
        assert not waited  # still waiting while a request works
    thread.join(5)
    assert waited and 0.25 <= waited[0] < 4.0
    with foreground:
        start = time.monotonic()
        assert not foreground.wait_quiet(0.2)  # the limit passed: go on anyway
        assert time.monotonic() - start < 2.0
