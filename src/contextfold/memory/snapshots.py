"""A session's recall state saved beside a file-backed SQLite store, so the first recall after
a restart reads one small file instead of the session's tag counts, related-tag counts and its
turns' token counts and authors.

A recall keeps, per session, what it would otherwise read from the store every time: the tag
counts and related-tag counts (one row per tag), the inbound vocabulary made from them, and the
turns' token counts and authors (``TurnLengths``, ``TurnAuthors``: a few bytes a turn). A new
process has none of them, and its first recall of a 10k-turn session read them — most of what
made it 2.7× the steady recall. ``MemoryEngine.close`` saves them for the ``SAVED_SESSIONS``
most recently used sessions in ``<database>.state/`` (one ``.npz`` per session: the arrays, and
the rest as JSON), each compaction saves its session's (so a process killed later still leaves
them), and the first recall of a session in a new engine loads its file:

- the vocabulary parts only when the store's ``(born, generation)`` for the session is still the
  one they were saved at (any write since — new turns' tags, another process's — draws a new
  generation, and they are read from the store as before);
- the token counts and authors whenever ``born`` is the same: a stored turn never changes
  while its session lives, so they hold up to the seq saved, and the turns stored since are
  read as at every recall.

A file is written to a temporary name and renamed into place, so a reader sees a whole file or
the one before; a file that cannot be read, belongs to another session, or is of another
format is ignored (and the state read from the store). Nothing here is needed for
correctness: without the files (an in-memory or PostgreSQL store, ``recall.state_files:
false``, a ``kill -9`` before any ``close``) the state is read from the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from contextfold.memory.authors import TurnAuthors
from contextfold.memory.turn_lengths import TurnLengths

__all__ = ["FORMAT", "KEPT_FILES", "SAVED_SESSIONS", "SessionState", "StateFiles"]

log = logging.getLogger(__name__)

FORMAT = 3
SAVED_SESSIONS = 64  # the most recently used sessions saved at close
KEPT_FILES = 4 * SAVED_SESSIONS  # files kept in the folder (the most recently written)
STALE_TEMPORARY_S = 3600  # a temporary file this old is a crashed writer's


@dataclass
class SessionState:
    """What one session's recall keeps: ``counts`` (tag -> turns, in the order the engine
    keeps them), ``related`` and ``inbound`` (the inbound vocabulary, in its order) as of the
    session's ``generation``; ``lengths`` / ``authors`` (``None`` when not kept) as of
    ``lengths_last`` / ``authors_last`` (the highest seq they cover), with the authors'
    ``labels`` by id (id 0: no author), and the turns' line costs (``lines``, 0: not counted)
    as the counter named ``line_counter`` counted them (``TurnLengths.lines``); ``topics``: the
    compacted topics' counts at ``topics_watermark`` (as ``counts``, while the generation
    holds). ``check_hash``: the content hash of turn ``check_seq`` when saved, compared with
    the store's on load (``born`` and ``generation`` are drawn per database: a database
    replaced at the same path may number its sessions alike)."""

    session_id: str
    born: int
    generation: int
    counts: dict[str, int] | None = None
    related: dict[str, int] | None = None
    inbound: list[str] | None = None
    lengths: npt.NDArray[np.int32] | None = None
    lengths_last: int = 0
    lines: npt.NDArray[np.int32] | None = None
    line_counter: str = ""
    authors: npt.NDArray[np.uint16] | None = None
    authors_last: int = 0
    labels: list[str] | None = None
    topics: dict[str, int] | None = None
    topics_watermark: int = 0
    check_seq: int = 0
    check_hash: str | None = None

    def keep_turns(self, lengths: TurnLengths | None, authors: TurnAuthors | None) -> None:
        """Take the session's kept token counts (with line costs) and authors, those of its
        incarnation ``born`` only."""
        if lengths is not None and lengths.born == self.born:
            self.lengths, self.lengths_last = lengths.array, lengths.last
            self.lines, self.line_counter = lengths.line_array, lengths.line_counter
        if authors is not None and authors.born == self.born:
            with authors.lock:
                self.authors, self.authors_last = authors.array.copy(), authors.last
                self.labels = authors.labels()

    def turns(self) -> tuple[TurnLengths | None, TurnAuthors | None]:
        """The saved token counts and authors as the recaller keeps them (``None`` each when
        not saved, or not whole)."""
        lengths = (
            TurnLengths.restored(
                self.born, self.lengths_last, self.lengths, self.lines, self.line_counter
            )
            if self.lengths is not None
            else None
        )
        authors = (
            TurnAuthors.restored(self.born, self.authors_last, self.authors, self.labels)
            if self.authors is not None and self.labels is not None
            else None
        )
        return lengths, authors


class StateFiles:
    """The session state files in ``folder`` (created when the first is written)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def path(self, session_id: str) -> Path:
        digest = hashlib.sha256(session_id.encode()).hexdigest()[:24]
        return self.folder / f"{digest}.npz"

    def save(self, state: SessionState) -> None:
        """Write the session's file whole (a temporary file renamed into place)."""
        meta = {
            "format": FORMAT,
            "session": state.session_id,
            "born": state.born,
            "generation": state.generation,
            "counts": _columns(state.counts),
            "related": _columns(state.related),
            "inbound": state.inbound,
            "lengths_last": state.lengths_last,
            "line_counter": state.line_counter,
            "authors_last": state.authors_last,
            "labels": state.labels,
            "topics": _columns(state.topics),
            "topics_watermark": state.topics_watermark,
            "check_seq": state.check_seq,
            "check_hash": state.check_hash,
        }
        arrays: dict[str, npt.NDArray[np.generic]] = {
            "meta": np.frombuffer(json.dumps(meta).encode(), np.uint8)
        }
        if state.lengths is not None:
            arrays["lengths"] = state.lengths[: state.lengths_last + 1]
            if state.lines is not None and state.line_counter:
                # Past the counts' last too (a derive counts a turn's line before its token
                # count is read), up to the session's last turn.
                arrays["lines"] = state.lines[: max(state.lengths_last, state.check_seq) + 1]
        if state.authors is not None:
            arrays["authors"] = state.authors[: state.authors_last + 1]
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        self.folder.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
        temporary = Path(name)
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(buffer.getvalue())
                out.flush()
                os.fsync(out.fileno())  # whole on disk before it is renamed into place
            temporary.replace(self.path(state.session_id))
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise

    def load(self, session_id: str) -> SessionState | None:
        """The session's saved state, or ``None`` (no file, not readable, another session's or
        another format's)."""
        try:
            data = self.path(session_id).read_bytes()
        except OSError:
            return None
        try:
            loaded = np.load(io.BytesIO(data), allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                raise ValueError("not an .npz archive")
            with loaded as arrays:
                meta = json.loads(arrays["meta"].tobytes())
                lengths = arrays["lengths"].astype(np.int32) if "lengths" in arrays else None
                lines = arrays["lines"].astype(np.int32) if "lines" in arrays else None
                authors = arrays["authors"].astype(np.uint16) if "authors" in arrays else None
        except Exception as exc:  # any damage: the state is read from the store instead
            log.warning("ignoring the unreadable state file of session %r: %s", session_id, exc)
            return None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            return None
        if meta.get("session") != session_id:
            return None
        try:
            return SessionState(
                session_id=session_id,
                born=int(meta["born"]),
                generation=int(meta["generation"]),
                counts=_pairs(meta["counts"]),
                related=_pairs(meta["related"]),
                inbound=_strings(meta["inbound"]),
                lengths=lengths,
                lengths_last=int(meta["lengths_last"]) if lengths is not None else 0,
                lines=lines if lengths is not None else None,
                line_counter=str(meta.get("line_counter") or ""),
                authors=authors,
                authors_last=int(meta["authors_last"]) if authors is not None else 0,
                labels=[str(x) for x in meta["labels"]] if meta["labels"] is not None else None,
                topics=_pairs(meta.get("topics")),
                topics_watermark=int(meta.get("topics_watermark") or 0),
                check_seq=int(meta["check_seq"]),
                check_hash=None if meta["check_hash"] is None else str(meta["check_hash"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def trim(self, keep: int | None = None) -> int:
        """Delete all but the ``keep`` (default ``KEPT_FILES``) most recently written files,
        and the temporary files a crashed writer left (older than ``STALE_TEMPORARY_S``): the
        folder does not grow with every session ever saved. Returns how many were deleted."""
        try:
            entries = [(p, p.stat().st_mtime) for p in self.folder.iterdir() if p.is_file()]
        except OSError:
            return 0
        keep = KEPT_FILES if keep is None else keep
        states = sorted((e for e in entries if e[0].suffix == ".npz"), key=lambda e: -e[1])
        oldest = time.time() - STALE_TEMPORARY_S
        stale = [p for p, mtime in entries if p.suffix == ".tmp" and mtime < oldest]
        deleted = 0
        for path in [p for p, _ in states[keep:]] + stale:
            with contextlib.suppress(OSError):
                path.unlink()
                deleted += 1
        return deleted

    def discard(self, session_id: str) -> None:
        """Delete the session's file, if any."""
        with contextlib.suppress(OSError):
            self.path(session_id).unlink()


def _columns(counts: dict[str, int] | None) -> list[list[Any]] | None:
    """``counts`` as its keys and its values, two JSON lists (read back faster than pairs)."""
    return None if counts is None else [list(counts), list(counts.values())]


def _pairs(columns: object) -> dict[str, int] | None:
    """``_columns`` read back (``ValueError`` when they are not two lists of names and
    counts of one length)."""
    if columns is None:
        return None
    if not isinstance(columns, list) or len(columns) != 2:
        raise ValueError("not two columns")
    keys, values = columns
    names, numbers = _strings(keys), values
    if names is None or not isinstance(numbers, list) or len(names) != len(numbers):
        raise ValueError("columns of different lengths")
    if not set(map(type, numbers)) <= {int}:
        raise ValueError("a count that is not an integer")
    return dict(zip(names, numbers, strict=True))


def _strings(values: object) -> list[str] | None:
    """A JSON list of strings, checked (``ValueError`` otherwise); ``None`` for ``None``."""
    if values is None:
        return None
    if not isinstance(values, list) or not set(map(type, values)) <= {str}:
        raise ValueError("not a list of strings")
    return values
