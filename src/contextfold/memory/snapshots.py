"""A session's recall state saved beside a file-backed SQLite store, so the first recall after
a restart reads one small file instead of the session's tag counts, related-tag counts and its
turns' token counts and authors.

A recall keeps, per session, what it would otherwise read from the store every time: the tag
counts and related-tag counts (one row per tag), the inbound vocabulary made from them, and the
turns' token counts and authors (``TurnLengths``, ``TurnAuthors``: a few bytes a turn). A new
process has none of them, and its first recall of a 10k-turn session read them — most of what
made it 2.7× the steady recall. ``MemoryEngine.close`` saves them for the ``SAVED_SESSIONS``
most recently used sessions in ``<database>.state/`` (one ``.state`` file per session: a JSON
header, then the arrays raw and one table of the tag names they point into, checked by kind,
size and CRC-32 on load: at 100k turns a new engine takes a session's state in about 3 ms, where
format 3's ``.npz`` with JSON lists took about 7), each compaction saves its session's (so a
process killed later still leaves them), and the first recall of a session in a new engine
loads its file:

- the vocabulary parts only when the store's ``(born, generation)`` for the session is still the
  one they were saved at (any write since — new turns' tags, another process's — draws a new
  generation, and they are read from the store as before);
- the token counts and authors whenever ``born`` is the same: a stored turn never changes
  while its session lives, so they hold up to the seq saved, and the turns stored since are
  read as at every recall;
- with the vocabulary parts, the inbound keyword tagger's grouping of the inbound vocabulary
  (``KeywordTagger.adopt_groups``), when made by the same rules (``GROUPS_KEY``): a new
  process's first tagging then does not group the whole vocabulary again.

A file is written to a temporary name and renamed into place, so a reader sees a whole file or
the one before; a file that cannot be read, belongs to another session, or is of another
format is ignored (and the state read from the store). Nothing here is needed for
correctness: without the files (an in-memory or PostgreSQL store, ``recall.state_files:
false``, a ``kill -9`` before any ``close``) the state is read from the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from contextfold.memory.authors import TurnAuthors
from contextfold.memory.turn_lengths import TurnLengths

__all__ = ["FORMAT", "KEPT_FILES", "SAVED_SESSIONS", "SessionState", "StateFiles"]

log = logging.getLogger(__name__)

FORMAT = 4
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
    replaced at the same path may number its sessions alike). ``groups``: the inbound
    keyword tagger's grouping of ``inbound`` (``KeywordTagger.groups``), made by the grouping
    whose rules ``groups_key`` names (``GROUPS_KEY``)."""

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
    groups: dict[str, list[str]] | None = None
    groups_key: str = ""

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
        return self.folder / f"{digest}.state"

    def save(self, state: SessionState) -> None:
        """Write the session's file whole (a temporary file renamed into place)."""
        meta: dict[str, Any] = {
            "format": FORMAT,
            "session": state.session_id,
            "born": state.born,
            "generation": state.generation,
            "lengths_last": state.lengths_last,
            "line_counter": state.line_counter,
            "authors_last": state.authors_last,
            "labels": state.labels,
            "topics_watermark": state.topics_watermark,
            "check_seq": state.check_seq,
            "check_hash": state.check_hash,
            "groups_key": state.groups_key,
        }
        # Every name once, in one text section ("tags"); the columns hold positions in it.
        table: dict[str, int] = {}

        def ids(names: list[str]) -> npt.NDArray[np.int32]:
            return np.fromiter((table.setdefault(n, len(table)) for n in names), np.int32)

        sections: list[tuple[str, list[str] | npt.NDArray[Any]]] = []
        if state.inbound is not None:
            sections.append(("inbound", ids(state.inbound)))
        for name, counts in (
            ("counts", state.counts),
            ("related", state.related),
            ("topics", state.topics),
        ):
            if counts is not None:
                sections.append((f"{name}.tags", ids(list(counts))))
                sections.append((f"{name}.values", np.fromiter(counts.values(), np.int64)))
        if state.groups is not None and state.inbound is not None:
            at = {tag: i for i, tag in enumerate(state.inbound)}
            grouped = [at.get(tag, -1) for tags in state.groups.values() for tag in tags]
            whole = len(grouped) == len(at) == len(state.inbound) == len(set(grouped))
            if whole and min(grouped, default=0) >= 0:
                sections.append(("groups.keys", list(state.groups)))
                sizes = [len(tags) for tags in state.groups.values()]
                sections.append(("groups.sizes", np.asarray(sizes, np.int64)))
                sections.append(("groups.inbound", np.asarray(grouped, np.int32)))
        sections.append(("tags", list(table)))
        if state.lengths is not None:
            sections.append(("lengths", state.lengths[: state.lengths_last + 1]))
            if state.lines is not None and state.line_counter:
                # Past the counts' last too (a derive counts a turn's line before its token
                # count is read), up to the session's last turn.
                end = max(state.lengths_last, state.check_seq) + 1
                sections.append(("lines", state.lines[:end]))
        if state.authors is not None:
            sections.append(("authors", state.authors[: state.authors_last + 1]))
        data = _pack(meta, sections)
        self.folder.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
        temporary = Path(name)
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
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
            meta, sections = _unpack(data)
        except Exception as exc:  # any damage: the state is read from the store instead
            log.warning("ignoring the unreadable state file of session %r: %s", session_id, exc)
            return None
        if meta.get("format") != FORMAT or meta.get("session") != session_id:
            return None
        try:
            lengths = _array(sections, "lengths", np.int32)
            authors = _array(sections, "authors", np.uint16)
            table = _Table(sections)
            inbound = table.names("inbound")
            state = SessionState(
                session_id=session_id,
                born=_int(meta, "born"),
                generation=_int(meta, "generation"),
                counts=table.counts("counts"),
                related=table.counts("related"),
                inbound=inbound,
                lengths=lengths,
                lengths_last=_int(meta, "lengths_last") if lengths is not None else 0,
                lines=_array(sections, "lines", np.int32) if lengths is not None else None,
                line_counter=_str(meta, "line_counter"),
                authors=authors,
                authors_last=_int(meta, "authors_last") if authors is not None else 0,
                labels=_labels(meta["labels"]),
                topics=table.counts("topics"),
                topics_watermark=_int(meta, "topics_watermark"),
                check_seq=_int(meta, "check_seq"),
                check_hash=None if meta["check_hash"] is None else _str(meta, "check_hash"),
            )
        except Exception as exc:  # any inconsistency: the state is read from the store instead
            log.warning("ignoring the inconsistent state file of session %r: %s", session_id, exc)
            return None
        try:  # groups that do not add up cost only themselves (the tagger groups again)
            state.groups = table.groups(inbound)
            state.groups_key = _str(meta, "groups_key") if state.groups is not None else ""
        except Exception as exc:
            log.warning("ignoring the saved tag groups of session %r: %s", session_id, exc)
        return state

    def trim(self, keep: int | None = None) -> int:
        """Delete all but the ``keep`` (default ``KEPT_FILES``) most recently written files,
        and the temporary files a crashed writer left (older than ``STALE_TEMPORARY_S``): the
        folder does not grow with every session ever saved. Returns how many were deleted."""
        try:
            entries = [(p, p.stat().st_mtime) for p in self.folder.iterdir() if p.is_file()]
        except OSError:
            return 0
        keep = KEPT_FILES if keep is None else keep
        states = sorted((e for e in entries if e[0].suffix == ".state"), key=lambda e: -e[1])
        oldest = time.time() - STALE_TEMPORARY_S
        stale = [p for p, mtime in entries if p.suffix == ".tmp" and mtime < oldest]
        stale += [p for p, _ in entries if p.suffix == ".npz"]  # format 3's, never read now
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


_MAGIC = b"CFSTATE\n"
_HEAD = struct.Struct("<8sII")  # the magic, the CRC-32 of all that follows, the header's length
_SEP = "\x00"  # between the strings of a text section (a string holding it fails the count)


def _kind(name: str) -> str:
    """The one kind section ``name`` may have: text, positions in a text section (int32),
    counts (int64), token counts and line costs (int32), author ids (uint16)."""
    if name in ("tags", "groups.keys"):
        return "text"
    if name in ("inbound", "groups.inbound", "lengths", "lines") or name.endswith(".tags"):
        return "<i4"
    if name == "authors":
        return "<u2"
    return "<i8"  # ``<name>.values``, ``groups.sizes``


def _pack(meta: dict[str, Any], sections: list[tuple[str, list[str] | npt.NDArray[Any]]]) -> bytes:
    """One file: the magic, the CRC-32 of everything after the prefix, the header's length, the
    header (JSON: ``meta`` and each section's name, kind, item count and byte size), then the
    sections' bytes: an array's raw little-endian items (of its ``_kind``), a text section's
    strings joined by ``_SEP`` (UTF-8)."""
    parts: list[bytes] = []
    table: list[list[Any]] = []
    for name, values in sections:
        kind = _kind(name)
        if isinstance(values, list):
            raw = _SEP.join(values).encode()
        else:
            raw = values.astype(kind, copy=False).tobytes()
        parts.append(raw)
        table.append([name, kind, len(values), len(raw)])
    header = json.dumps({**meta, "sections": table}).encode()
    rest = header + b"".join(parts)
    return _HEAD.pack(_MAGIC, zlib.crc32(rest), len(header)) + rest


def _unpack(data: bytes) -> tuple[dict[str, Any], dict[str, list[str] | npt.NDArray[Any]]]:
    """``_pack`` read back, the CRC, every section's kind, count and size checked
    (``ValueError`` otherwise)."""
    if len(data) < _HEAD.size:
        raise ValueError("shorter than its header")
    magic, crc, size = _HEAD.unpack_from(data)
    if magic != _MAGIC:
        raise ValueError("not a contextfold state file")
    if zlib.crc32(memoryview(data)[_HEAD.size :]) != crc:
        raise ValueError("damaged (its checksum differs)")
    meta = json.loads(data[_HEAD.size : _HEAD.size + size])
    if not isinstance(meta, dict):
        raise ValueError("a header that is not an object")
    view = memoryview(data)[_HEAD.size + size :]
    sections: dict[str, list[str] | npt.NDArray[Any]] = {}
    at = 0
    for name, kind, count, length in meta.get("sections", ()):
        if not isinstance(name, str) or kind != _kind(name) or name in sections:
            raise ValueError(f"section {name!r} of another kind than its name's, or twice")
        chunk = view[at : at + length]
        at += length
        if len(chunk) != length:
            raise ValueError(f"section {name!r} cut short")
        if kind == "text":
            sections[name] = str(chunk, "utf-8").split(_SEP) if count else []
        else:
            sections[name] = np.frombuffer(chunk, np.dtype(kind))
        if len(sections[name]) != count:
            raise ValueError(f"section {name!r} holds another count than its header says")
    if at != len(view):
        raise ValueError("bytes after the last section")
    return meta, sections


def _array(
    sections: dict[str, list[str] | npt.NDArray[Any]], name: str, dtype: type[np.generic]
) -> npt.NDArray[Any] | None:
    """An array section as ``dtype`` (a writable copy), or ``None`` when not saved."""
    values = sections.get(name)
    if values is None:
        return None
    if isinstance(values, list):
        raise ValueError(f"section {name!r} is text")
    return values.astype(dtype)


class _Table:
    """A file's name columns read back: positions (int32) in its one text section ``tags``."""

    def __init__(self, sections: dict[str, list[str] | npt.NDArray[Any]]) -> None:
        self.sections = sections
        tags = sections.get("tags", [])
        if not isinstance(tags, list):
            raise ValueError("section 'tags' is not text")
        self.tags = _objects(tags)

    def positions(self, name: str, size: int) -> npt.NDArray[np.int64] | None:
        """Section ``name``'s positions, each checked to be below ``size``."""
        at = _array(self.sections, name, np.int64)
        if at is not None and len(at) and (int(at.min()) < 0 or int(at.max()) >= size):
            raise ValueError(f"section {name!r} points past its table")
        return at

    def names(self, name: str) -> list[str] | None:
        at = self.positions(name, len(self.tags))
        return None if at is None else self.tags[at].tolist()

    def counts(self, name: str) -> dict[str, int] | None:
        """The ``<name>.tags`` and ``<name>.values`` sections as one mapping (``None`` when not
        saved; ``ValueError`` when only one is, or they differ in length)."""
        names = self.names(f"{name}.tags")
        values = _array(self.sections, f"{name}.values", np.int64)
        if names is None and values is None:
            return None
        if names is None or values is None or len(names) != len(values):
            raise ValueError(f"{name}: names and counts that do not pair")
        return dict(zip(names, values.tolist(), strict=True))

    def groups(self, inbound: list[str] | None) -> dict[str, list[str]] | None:
        """The inbound tagger's groups (``SessionState.groups``): ``groups.keys`` with their
        ``groups.sizes``, over ``groups.inbound`` (positions in ``inbound``, each once)."""
        keys = self.sections.get("groups.keys")
        sizes = _array(self.sections, "groups.sizes", np.int64)
        if inbound is None or keys is None or sizes is None:
            return None
        at = self.positions("groups.inbound", len(inbound))
        if not isinstance(keys, list) or at is None or len(keys) != len(sizes):
            raise ValueError("groups that do not pair")
        if len(at) != len(inbound) or sum(sizes.tolist()) != len(at) or (sizes < 0).any():
            raise ValueError("groups that do not hold the vocabulary")
        if len(at) and int(np.bincount(at, minlength=len(at)).max()) != 1:
            raise ValueError("groups that hold a tag twice")
        grouped = _objects(inbound)[at].tolist()
        starts = [0, *np.cumsum(sizes).tolist()]
        return {key: grouped[starts[i] : starts[i + 1]] for i, key in enumerate(keys)}


def _objects(names: list[str]) -> npt.NDArray[np.object_]:
    """``names`` as a one-dimensional object array, to be indexed by an array of positions."""
    out = np.empty(len(names), object)
    out[:] = names
    return out


def _int(meta: dict[str, Any], key: str) -> int:
    """Header scalar ``key``, an integer (``ValueError`` for anything else)."""
    value = meta[key]
    if type(value) is not int:
        raise ValueError(f"{key}: not an integer")
    return value


def _str(meta: dict[str, Any], key: str) -> str:
    """Header scalar ``key``, a string (``ValueError`` for anything else)."""
    value = meta[key]
    if not isinstance(value, str):
        raise ValueError(f"{key}: not a string")
    return value


def _labels(values: object) -> list[str] | None:
    if values is None:
        return None
    if not isinstance(values, list) or not set(map(type, values)) <= {str}:
        raise ValueError("labels that are not strings")
    return values
