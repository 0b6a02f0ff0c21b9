"""The values every memory store backend takes and returns: frozen pydantic row models
(``SessionRecord``, ``StoredTurn``, ``NewSegment``, ``StoredSegment``, ``TagSummary``,
``WorkingSetEntry``, ``CostReport``), the ``TurnRow`` tuple of the fast read path, the
``Depth`` a topic is paged in at, the ``Job`` of derived work, ``BranchMoved``, the
``match_key`` a resent message is known by, and the small helpers that turn times (``_iso``,
always UTC) and messages (``_message_json``, canonical JSON: the content hash is taken over
it) into stored text.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from contextfold.errors import ConfigError
from contextfold.items import Message, TextBlock, ToolUseBlock

__all__ = [
    "MAX_ATTEMPTS",
    "WRITE_CHUNK",
    "BranchMoved",
    "CostEntry",
    "CostReport",
    "Depth",
    "Job",
    "NewSegment",
    "PendingDerive",
    "SessionDump",
    "SessionRecord",
    "StoredRecord",
    "StoredSegment",
    "StoredTurn",
    "TagRollForward",
    "TagSummary",
    "TurnRow",
    "WorkingSetEntry",
    "check_appended",
    "check_compaction",
    "match_key",
    "message_key",
    "owner_id",
    "pid_alive",
    "retention_cut",
    "tag_roll_forward",
    "vector_matrix",
]

Depth = Literal["none", "summary", "segments", "full"]

#: Tries a job gets before it is ``failed`` for good (``fail_job``).
MAX_ATTEMPTS = 5
#: Turns per write transaction of a long history (``commit_exchange``), and of its tags.
WRITE_CHUNK = 256


class TurnRow(NamedTuple):
    """A stored turn's plain columns (no message parsing): the fast read path."""

    seq: int
    role: str
    text: str
    created_at: datetime
    token_count: int


_FROZEN = ConfigDict(frozen=True)


class SessionRecord(BaseModel):
    """A stored session; turns with ``seq < compaction_watermark`` are compacted."""

    model_config = _FROZEN
    id: str
    created_at: datetime
    metadata: dict[str, Any]
    compaction_watermark: int
    principal: str = ""
    parent_id: str | None = None
    fork_seq: int | None = None
    derived_seq: int = 0
    #: Store-wide numbers (``MemoryStorage.session_version``): drawn when the row was made,
    #: and again by each write that changed the session's derived state in place.
    born: int = 0
    generation: int = 0


def check_appended(messages: Sequence[Message], timestamps: Sequence[datetime] | None) -> None:
    """``ConfigError`` unless ``messages`` fit one ``begin_derive`` (at most ``WRITE_CHUNK``,
    with one timestamp each when timestamps are given)."""
    if len(messages) > WRITE_CHUNK:
        raise ConfigError(
            f"begin_derive appends at most {WRITE_CHUNK} turns, got {len(messages)};"
            " commit the others first (commit_exchange)"
        )
    if timestamps is not None and len(timestamps) != len(messages):
        raise ConfigError(
            f"{len(messages)} messages need as many timestamps, got {len(timestamps)}"
        )


class PendingDerive(NamedTuple):
    """What a derive starts from (``MemoryStorage.begin_derive``), read in one snapshot: the
    session, the tokens of its live turns (``active_tokens``), and (seq, role, text, content
    hash) of its turns after ``derived_seq`` less the context asked for, in order."""

    record: SessionRecord
    live_tokens: int
    turns: list[tuple[int, str, str, str]]


class StoredRecord(BaseModel):
    """One dashboard record as the store keeps it (``MemoryStorage.records.put_records``): ``body``
    is the record's JSON, opaque to the store; ``origin`` the process that wrote it
    (``owner_id``); ``change`` a store-wide number drawn each time it was written."""

    model_config = _FROZEN
    id: str
    session_id: str
    origin: str
    change: int
    body: str


class StoredTurn(BaseModel):
    """One raw turn as stored: the full message (tool calls included), its tags and counts."""

    model_config = _FROZEN
    session_id: str
    seq: int
    message: Message
    created_at: datetime
    content_hash: str
    token_count: int
    tags: dict[str, float] = Field(default_factory=dict)
    related_tags: tuple[str, ...] = ()
    partial: bool = False  # a reply cut off before it ended


class NewSegment(BaseModel):
    """A segment to store at compaction: turns ``first_seq..last_seq`` (inclusive) with their
    summary and full text; token counts left ``None`` are counted by the store's counter."""

    model_config = _FROZEN
    first_seq: int
    last_seq: int
    summary: str
    full_text: str
    tags: tuple[str, ...] = ()
    related_tags: tuple[str, ...] = ()
    summary_tokens: int | None = None
    full_tokens: int | None = None


class StoredSegment(BaseModel):
    """A stored segment; ``seqs`` are its source turns."""

    model_config = _FROZEN
    id: int
    session_id: str
    first_seq: int
    last_seq: int
    summary: str
    full_text: str
    tags: tuple[str, ...]
    summary_tokens: int
    full_tokens: int
    created_at: datetime
    seqs: tuple[int, ...]
    related_tags: tuple[str, ...] = ()


class TagSummary(BaseModel):
    """One summary per tag; ``stale`` when the tag has turns after ``source_watermark``."""

    model_config = _FROZEN
    session_id: str
    tag: str
    summary: str
    tokens: int
    source_watermark: int
    stale: bool


class TagRollForward(BaseModel):
    """What a tag's summary has not taken in yet, read at one moment: the summary as it is
    (``summary`` and ``source_watermark`` ``None`` when the tag has none), the summaries of
    the tag's segments past that watermark (earliest first) and the largest ``last_seq``
    among them, the watermark a summary rolled forward from these covers."""

    model_config = _FROZEN
    tag: str
    summary: str | None
    source_watermark: int | None
    segments: tuple[str, ...]
    last_seq: int


def tag_roll_forward(rows: Iterable[Sequence[Any]]) -> dict[str, TagRollForward]:
    """``segments_since_summary``'s answer from the rows of its one statement: per tag with
    newer segments one row ``(0, tag, summary, watermark, …)`` (both ``None`` when it has no
    summary), and per segment and tag one ``(1, tag, segment summary, last_seq, …)``,
    earliest first. A tag with no segment row is left out."""
    current: dict[str, tuple[str | None, int | None]] = {}
    segments: dict[str, list[str]] = {}
    newest: dict[str, int] = {}
    for row in rows:
        part, tag, text, seq = row[0], row[1], row[2], row[3]
        if part == 0:
            current[tag] = (text, seq)
        else:
            segments.setdefault(tag, []).append(text)
            newest[tag] = max(newest.get(tag, seq), seq)
    return {
        tag: TagRollForward(
            tag=tag,
            summary=current[tag][0],
            source_watermark=current[tag][1],
            segments=tuple(texts),
            last_seq=newest[tag],
        )
        for tag, texts in segments.items()
    }


class WorkingSetEntry(BaseModel):
    """A topic of a session's working set and the depth it is paged in at."""

    model_config = _FROZEN
    tag: str
    depth: Depth
    last_used: datetime
    tokens: int


class CostReport(BaseModel):
    """Sums over the cost log (``by_kind`` maps a kind to its cost in USD)."""

    model_config = _FROZEN
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    by_kind: dict[str, float]


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(moment: datetime) -> str:
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).isoformat(timespec="microseconds")


def _message_json(message: Message) -> str:
    return json.dumps(
        message.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def match_key(role: str, text: str) -> str:
    """How a message is recognised when a client sends it again: a hash of its role and its
    text with runs of whitespace made one space (clients re-indent and trim replies).

    >>> match_key("assistant", "Hello  there.\\n") == match_key("assistant", "Hello there.")
    True
    """
    normal = " ".join(text.split())
    return hashlib.sha256(f"{role}\x00{normal}".encode()).hexdigest()[:32]


def message_key(message: Message) -> str:
    """``match_key`` of a message, its tool calls read without the arguments set to false or
    null: a client may resend a call with the tool's unset options filled in (Claude Code adds
    ``"replace_all": false`` to every Edit call it resends), and that is the same call.

    >>> from contextfold.items import ToolUseBlock
    >>> call = ToolUseBlock(id="t1", name="Edit", input={"path": "a.py", "new": "x"})
    >>> resent = call.model_copy(update={"input": {**call.input, "replace_all": False}})
    >>> one, two = (Message(role="assistant", content=[c]) for c in (call, resent))
    >>> message_key(one) == message_key(two) != match_key("assistant", two.text())
    True
    """
    if not any(isinstance(b, ToolUseBlock) for b in message.content):
        return match_key(message.role, message.text())
    parts: list[str] = []
    for block in message.content:
        if isinstance(block, ToolUseBlock):
            given = {k: v for k, v in block.input.items() if v is not None and v is not False}
            block = block.model_copy(update={"input": given})
            parts.append(f"[tool call {block.name}({block.arguments_json()})]")
        elif isinstance(block, TextBlock):
            parts.append(block.text)
        else:  # (a tool result: never beside a call, see ``Message``)
            parts.append(f"[tool result {block.tool_use_id}] {block.content}")
    return match_key(message.role, "\n".join(parts))


def owner_id() -> str:
    """This process, as a job owner: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a job owner's, ``owner_id``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


class Job(BaseModel):
    """One unit of derived work for one session."""

    model_config = ConfigDict(frozen=True)
    id: int
    session_id: str
    kind: str
    attempts: int


class BranchMoved(ConfigError):
    """The branch an exchange was to continue has a newer last turn than expected."""

    def __init__(self, session_id: str, expected: int, last: int) -> None:
        super().__init__(
            f"session {session_id!r} moved on: its last turn is {last}, expected {expected}"
        )
        self.session_id = session_id
        self.expected = expected
        self.last = last


class CostEntry(BaseModel):
    """One row of the cost log: an LLM call the memory made."""

    model_config = _FROZEN
    session_id: str | None
    at: datetime
    kind: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


@dataclass
class SessionDump:
    """Everything a store holds for one session, as ``dump_session`` reads it and
    ``load_session`` writes it back (into the same backend or another): the session record
    (watermark, principal, branch, derived seq), its raw turns with their tags, hashes and
    times, its segments, tag summaries and working set, its turn vectors by model
    (seqs, float32 matrix), its own aliases and the tags the splitter examined."""

    session: SessionRecord
    turns: list[StoredTurn]
    segments: list[StoredSegment] = field(default_factory=list)
    tag_summaries: list[TagSummary] = field(default_factory=list)
    working_set: list[WorkingSetEntry] = field(default_factory=list)
    vectors: dict[str, tuple[list[int], npt.NDArray[np.float32]]] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)  # scoped to the session
    tag_splits: dict[str, tuple[str, ...]] = field(default_factory=dict)


def check_compaction(
    current: int, last: int, segments: Sequence[NewSegment], watermark: int
) -> None:
    """Refuse a compaction (``ConfigError``) whose watermark moves back or past the last turn
    ``last`` + 1, or whose segments lie outside the turns it compacts (``current`` is the
    session's watermark now): every backend checks the same, before it writes."""
    if watermark < current:
        raise ConfigError(
            f"the compaction watermark only moves forward: {watermark} < current {current}"
        )
    if watermark > last + 1:
        raise ConfigError(
            f"watermark {watermark} is beyond the last turn ({last}); at most {last + 1}"
        )
    for seg in segments:
        if not max(current, 1) <= seg.first_seq <= seg.last_seq < watermark:
            raise ConfigError(
                f"segment {seg.first_seq}..{seg.last_seq} is not within the turns being "
                f"compacted ({max(current, 1)}..{watermark - 1})"
            )


def retention_cut(newest_first: Iterable[tuple[int, int]], keep: int, max_bytes: int) -> int | None:
    """The position at and below which request records go: ``newest_first`` yields
    (position, size) from the newest record back; the newest ``keep`` records within
    ``max_bytes`` stay (the newest one always does). ``None`` when all stay.

    >>> retention_cut([(5, 10), (4, 10), (3, 10)], keep=2, max_bytes=100)
    3
    >>> retention_cut([(5, 500), (4, 10)], keep=10, max_bytes=100)
    4
    """
    kept, kept_bytes = 0, 0
    for pos, size in newest_first:
        if kept and (kept >= keep or kept_bytes + size > max_bytes):
            return pos
        kept, kept_bytes = kept + 1, kept_bytes + size
    return None


#: Rows of vectors read from a store at a time (``vector_matrix``).
VECTOR_CHUNK = 4096


def vector_matrix(
    fetchmany: Callable[[int], Sequence[Sequence[Any]]], count: int
) -> tuple[list[int], npt.NDArray[np.float32]]:
    """The seqs and the matrix of (seq, float32 bytes) rows, ``count`` of them expected, read
    ``VECTOR_CHUNK`` at a time (``fetchmany``: a cursor's) into one matrix. Read whole and
    stacked, 100k vectors of 384 floats took the matrix's size three times over at once (the
    rows as Python objects, the stack, the cache's copy of it), which the heap then kept: 325 MB
    more RSS than the vectors' 146 MB."""
    seqs: list[int] = []
    matrix: npt.NDArray[np.float32] | None = None
    while rows := fetchmany(VECTOR_CHUNK):
        blob = b"".join(bytes(row[1]) for row in rows)
        chunk = np.frombuffer(blob, dtype=np.float32).reshape(len(rows), -1)
        if matrix is None:
            matrix = np.empty((max(count, len(rows)), chunk.shape[1]), np.float32)
        at = len(seqs)
        if at + len(rows) > len(matrix):  # more than counted
            matrix = np.concatenate([matrix[:at], chunk])
        else:
            matrix[at : at + len(rows)] = chunk
        seqs.extend(int(row[0]) for row in rows)
    if matrix is None:
        return [], np.zeros((0, 0), dtype=np.float32)
    return seqs, matrix if len(matrix) == len(seqs) else matrix[: len(seqs)]
