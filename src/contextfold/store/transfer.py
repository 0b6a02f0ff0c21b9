"""Moving memory between stores of any backend (``contextfold store migrate``): every session
(``dump_session`` → ``load_session``), the tag aliases and the cost log, then a check that the
destination holds what the source does. Only the ``MemoryStorage`` protocol is used, so an
SQLite file, a PostgreSQL database or any later backend is a source or a destination alike.

The source is only read. A destination that already holds one of the source's sessions is
refused before anything is written, unless ``skip_existing`` (a migration that stopped half way
is run again: the sessions already copied are left as they are, and the cost entries already
there are not copied twice).

>>> from contextfold.items import Message
>>> from contextfold.store import open_memory_store
>>> from contextfold.tokens import CharCounter
>>> src = open_memory_store(":memory:", counter=CharCounter())
>>> dst = open_memory_store(":memory:", counter=CharCounter())
>>> src.append_turns(src.create_session("s1"), [Message(role="user", content="hi")])
[1]
>>> report = migrate(src, dst)
>>> (report.copied, report.turns, report.problems, dst.sessions())
(['s1'], 1, [], ['s1'])
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from contextfold.errors import ConfigError
from contextfold.store.models import _message_json

if TYPE_CHECKING:
    from contextfold.store.models import CostEntry, SessionDump
    from contextfold.store.protocols import MemoryStorage

__all__ = ["MigrationReport", "check_dump", "copy_costs", "migrate", "verify"]

#: ``progress(session_id, turns)``: called after each session is copied (or skipped).
Progress = Callable[[str, int], None]


@dataclass
class MigrationReport:
    """What a migration did: the sessions copied and skipped, the turns copied, the aliases
    and cost entries written, and what the check afterwards found wrong (empty: all good)."""

    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    turns: int = 0
    aliases: int = 0
    costs: int = 0
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check_dump(dump: SessionDump) -> None:
    """Refuse a dump that would break a store's invariants: turns of another session, seqs
    that are not 1, 2, … without a gap, or a content hash that is not its message's
    (``ConfigError``). Each backend's ``load_session`` calls it before writing anything."""
    sid = dump.session.id
    for expected, turn in enumerate(dump.turns, start=1):
        if turn.session_id != sid:
            raise ConfigError(f"turn {turn.seq} of the dump of {sid!r} is {turn.session_id!r}'s")
        if turn.seq != expected:
            raise ConfigError(
                f"the turns of {sid!r} must be seqs 1, 2, … without a gap: {turn.seq} comes "
                f"where {expected} should"
            )
        digest = hashlib.sha256(_message_json(turn.message).encode("utf-8")).hexdigest()
        if digest != turn.content_hash:
            raise ConfigError(
                f"turn {turn.seq} of {sid!r}: its content hash {turn.content_hash[:12]}… is not "
                f"its message's ({digest[:12]}…)"
            )


def _cost_key(entry: CostEntry) -> tuple[object, ...]:
    return (
        entry.session_id,
        entry.at,
        entry.kind,
        entry.model,
        entry.prompt_tokens,
        entry.completion_tokens,
        entry.cost_usd,
    )


def copy_costs(entries: Iterable[CostEntry], dst: MemoryStorage) -> int:
    """Log ``entries`` in ``dst``, but not those it holds already (each entry counted: two
    identical calls stay two); returns how many were written. Running a copy twice writes
    nothing the second time."""
    there = Counter(_cost_key(e) for e in dst.costs.cost_entries())
    written = 0
    with dst.batch():
        for entry in entries:
            key = _cost_key(entry)
            if there[key] > 0:
                there[key] -= 1
                continue
            dst.costs.log_cost(
                entry.session_id,
                entry.kind,
                entry.model,
                entry.prompt_tokens,
                entry.completion_tokens,
                entry.cost_usd,
                at=entry.at,
            )
            written += 1
    return written


def migrate(
    src: MemoryStorage,
    dst: MemoryStorage,
    *,
    skip_existing: bool = False,
    progress: Progress | None = None,
) -> MigrationReport:
    """Copy every session of ``src``, its aliases and its cost log into ``dst``, then check
    the copy (``verify``); ``ConfigError`` before anything is written when ``dst`` holds one
    of the sessions already and ``skip_existing`` is false."""
    sessions = src.sessions()
    there = set(dst.sessions())
    clash = [sid for sid in sessions if sid in there]
    if clash and not skip_existing:
        shown = ", ".join(repr(s) for s in clash[:5]) + (" …" if len(clash) > 5 else "")
        raise ConfigError(
            f"the destination already holds {len(clash)} of the {len(sessions)} session(s): "
            f"{shown}; nothing was copied (--skip-existing copies the others)"
        )
    report = MigrationReport()
    for sid in sessions:
        if sid in there:
            report.skipped.append(sid)
            if progress is not None:
                progress(sid, src.last_seq(sid))
            continue
        dump = src.transfer.dump_session(sid)
        dst.transfer.load_session(dump)
        report.copied.append(sid)
        report.turns += len(dump.turns)
        if progress is not None:
            progress(sid, len(dump.turns))
    aliases = src.vocab.aliases()
    if aliases:
        with dst.batch():
            for alias, canonical in aliases.items():
                dst.vocab.set_alias(alias, canonical)
    report.aliases = len(aliases)
    report.costs = copy_costs(src.costs.cost_entries(), dst)
    report.problems = verify(src, dst, report.copied)
    report.warnings = [
        f"{p} (skipped: it was there already)" for p in verify(src, dst, report.skipped)
    ]
    return report


def verify(
    src: MemoryStorage,
    dst: MemoryStorage,
    sessions: Sequence[str] | None = None,
) -> list[str]:
    """What differs between the two stores for ``sessions`` (default: all of ``src``'s), one
    line each: sessions missing from ``dst``, a different last seq, a different content hash
    of the last turn."""
    wanted = list(src.sessions() if sessions is None else sessions)
    there = set(dst.sessions())
    problems: list[str] = []
    missing = [sid for sid in wanted if sid not in there]
    if missing:
        problems.append(
            f"{len(missing)} of {len(wanted)} session(s) missing from the destination: "
            + ", ".join(repr(s) for s in missing[:5])
        )
    for sid in wanted:
        if sid in missing:
            continue
        last, copied_last = src.last_seq(sid), dst.last_seq(sid)
        if last != copied_last:
            problems.append(
                f"session {sid!r}: last turn {copied_last} in the destination, {last} in the source"
            )
        elif last and src.turn_hash(sid, last) != dst.turn_hash(sid, last):
            problems.append(f"session {sid!r}: turn {last} differs (content hash)")
    return problems
