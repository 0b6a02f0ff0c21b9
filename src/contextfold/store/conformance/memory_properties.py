"""Conformance properties (Hypothesis): whatever the sequence of appends, exchanges, stale
exchanges and rolled-back batches, a session's seqs run 1, 2, 3 … without a gap and its turns
are the messages sent, hashed canonically; a branch never shows what its parent said after
the fork; vectors come back bit for bit.

Each property runs against the test's one store, a new session per example. Its example
count is the profile's (100 locally, 1,000 in CI) up to ``SQLITE_EXAMPLES`` on SQLite (each
example is a dozen write transactions) and up to ``PG_EXAMPLES`` on PostgreSQL (as many round
trips to the server).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from contextfold.errors import ConfigError
from contextfold.items import Message
from contextfold.store.conformance.histories import histories
from contextfold.store.conformance.memory_support import is_sqlite
from contextfold.store.models import _message_json
from contextfold.store.protocols import MemoryStorage

#: The most examples per property against SQLite, and against PostgreSQL.
SQLITE_EXAMPLES = 300
PG_EXAMPLES = 25


def _run(
    store: MemoryStorage, strategy: st.SearchStrategy[Any], check: Callable[[Any], None]
) -> None:
    """Run ``check`` over ``strategy`` with the backend's example count."""
    limit = SQLITE_EXAMPLES if is_sqlite(store) else PG_EXAMPLES
    examples = min(settings().max_examples, limit)

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(strategy)
    def run(value: Any) -> None:
        check(value)

    run()


_messages = histories(max_turns=3)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), _messages),
        st.tuples(st.just("commit"), _messages),
        st.tuples(st.just("commit_expecting"), _messages),
        st.tuples(st.just("stale"), _messages),
        st.tuples(st.just("rolled_back"), _messages),
    ),
    max_size=6,
)


def test_seqs_stay_consecutive_and_turns_are_what_was_sent(memory_store: MemoryStorage) -> None:
    store = memory_store

    def check(ops: list[tuple[str, list[Message]]]) -> None:
        sid = store.create_session(f"p-{uuid.uuid4().hex}")
        sent: list[Message] = []
        committed = False
        for op, batch in ops:
            last = len(sent)
            if op == "append":
                got = store.append_turns(sid, batch)
                assert got == list(range(last + 1, last + len(batch) + 1))
            elif op in ("commit", "commit_expecting"):
                expect = last if op == "commit_expecting" else None
                got = store.commit_exchange(sid, batch, expect_last=expect)
                assert got == list(range(last + 1, last + len(batch) + 1))
                committed = committed or bool(batch)
            elif op == "stale":
                with pytest.raises(ConfigError):  # BranchMoved
                    store.commit_exchange(sid, batch, expect_last=last + 1)
                continue
            else:
                with pytest.raises(RuntimeError), store.batch():
                    store.append_turns(sid, batch)
                    raise RuntimeError("rolled back")
                continue
            sent.extend(batch)
        turns = store.turns(sid)
        assert [t.seq for t in turns] == list(range(1, len(sent) + 1))
        assert store.last_seq(sid) == len(sent)
        assert [t.message for t in turns] == sent
        assert [t.content_hash for t in turns] == [
            hashlib.sha256(_message_json(m).encode("utf-8")).hexdigest() for m in sent
        ]
        pending = store.jobs.job_counts().get("pending", 0)
        store.jobs.drop_pending_job(sid)  # the next examples count only their own job
        assert pending - store.jobs.job_counts().get("pending", 0) == int(committed)

    _run(store, _ops, check)


_forks = st.tuples(
    st.lists(st.integers(0, 9), min_size=1, max_size=10),  # the parent's turns (word ids)
    st.integers(0, 10),  # where to fork (clamped to the parent's length)
    st.lists(st.integers(0, 9), max_size=4),  # the parent's turns after the fork
    st.lists(st.integers(0, 9), max_size=4),  # the branch's own turns
)


def test_a_branch_never_shows_its_parents_later_turns(memory_store: MemoryStorage) -> None:
    store = memory_store

    def text(who: str, n: int, word: int) -> str:
        return f"{who}{n} word{word}"

    def check(case: tuple[list[int], int, list[int], list[int]]) -> None:
        before, upto, later, own = case
        upto = min(upto, len(before))
        parent = store.create_session(f"p-{uuid.uuid4().hex}")
        store.append_turns(
            parent,
            [Message(role="user", content=text("early", n, w)) for n, w in enumerate(before)],
        )
        store.set_tags_many(parent, {seq: ({f"t{w}": 1.0}, []) for seq, w in enumerate(before, 1)})
        branch = store.fork(parent, upto)
        store.append_turns(
            parent, [Message(role="user", content=text("late", n, w)) for n, w in enumerate(later)]
        )
        store.append_turns(
            branch, [Message(role="user", content=text("own", n, w)) for n, w in enumerate(own)]
        )
        turns = store.turns(branch)
        expected = [text("early", n, w) for n, w in enumerate(before[:upto])]
        expected += [text("own", n, w) for n, w in enumerate(own)]
        assert [t.message.text() for t in turns] == expected
        assert [t.seq for t in turns] == list(range(1, len(expected) + 1))
        assert store.session(branch).fork_seq == upto
        assert store.session(branch).parent_id == parent
        assert store.search_turn_seqs(branch, "late", limit=50) == []
        assert store.tag_counts(branch) == store.tag_counts(parent, before=upto + 1)
        for w in set(later) | set(before):
            hits = store.search_turns(branch, f"word{w}", limit=50)
            assert all(not t.message.text().startswith("late") for t, _ in hits)
        store.jobs.drop_pending_job(branch)

    _run(store, _forks, check)


_vectors = hnp.arrays(
    np.float32,
    st.tuples(st.integers(1, 5), st.integers(1, 8)),
    elements=st.floats(width=32, allow_nan=False, allow_subnormal=True),
)


def test_vectors_come_back_bit_for_bit(memory_store: MemoryStorage) -> None:
    store = memory_store

    def check(matrix: np.ndarray[Any, np.dtype[np.float32]]) -> None:
        sid = store.create_session(f"v-{uuid.uuid4().hex}")
        rows = len(matrix)
        store.append_turns(sid, [Message(role="user", content=f"t{n}") for n in range(rows + 1)])
        seqs = list(range(2, rows + 2))  # after turn 1
        store.add_turn_vectors(sid, "m", seqs, matrix)
        got_seqs, got = store.turn_vectors(sid, "m")
        assert got_seqs == seqs and got.dtype == np.float32
        assert got.tobytes() == np.ascontiguousarray(matrix).tobytes()
        assert store.last_vector_seq(sid, "m") == rows + 1
        tail_seqs, tail = store.turn_vectors(sid, "m", after=2)
        assert tail_seqs == seqs[1:] and tail.reshape(-1).tobytes() == matrix[1:].tobytes()
        assert store.turns_without_vectors(sid, "m") == [(1, "t0")]

    _run(store, _vectors, check)
