"""Memory as a folder of markdown files (``contextfold memory export --format markdown`` and
``contextfold memory import``): human-readable, diffable, kept in git, and read back exactly.

Each file is YAML front-matter between ``---`` lines, then a markdown body::

    DIR/
      store.md                         aliases and the cost log (front-matter)
      <session>/
        session.md                     the session record and its working set; the body
                                       lists the turns
        turns/000001.md                one per raw turn: seq, role, time, content hash,
                                       token count, tags, related tags, partial; the body is
                                       the message text (a message that is not one plain text
                                       block, e.g. with tool calls, is in ``message`` too)
        segments/0001.md               one per segment: its turns, tags, token counts, time
                                       and full text; the body is its summary
        tags/<tag>/index.md            the turns with the tag (links; for browsing only)
        tags/<tag>/summary.md          the tag's summary, when it has one

Folder names are the session ids and tags when they are safe as file names, else a slug with
a short hash; the real id or tag is in the front-matter. Turn vectors are not written: they
are derived from the turn text, and recall computes them again when it next needs them.

An import checks every turn: its content hash must be that of its message, and the body of a
turn kept in ``message`` must still be that message's text. An edited turn is refused, naming
the file; nothing of its session is written.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from contextfold.errors import ConfigError
from contextfold.items import Message, TextBlock
from contextfold.store.models import (
    CostEntry,
    SessionDump,
    SessionRecord,
    StoredSegment,
    StoredTurn,
    TagSummary,
    WorkingSetEntry,
    _iso,
    _message_json,
)

if TYPE_CHECKING:
    from contextfold.store.protocols import MemoryStorage

__all__ = [
    "FORMAT",
    "ExportReport",
    "ImportReport",
    "export_markdown",
    "import_markdown",
    "read_session",
    "write_session",
]

#: The ``format`` of ``store.md``: what ``import_markdown`` accepts.
FORMAT = "contextfold-markdown/1"
STORE_FILE = "store.md"
SESSION_FILE = "session.md"

_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as ``|`` blocks where YAML can keep them exactly (readable diffs)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Text with a character YAML reads as a line break (or drops) goes double-quoted, where
    # the emitter escapes it; other multi-line text is a literal block (the emitter still
    # falls back to a quoted string where a block cannot keep it exactly: trailing spaces).
    if any(c in _ESCAPE or (c != "\n" and not c.isprintable()) for c in value):
        style: str | None = '"'
    else:
        style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ESCAPE = frozenset("\r\x85\u2028\u2029\ufeff")


_Dumper.add_representer(str, _str)


def _front(data: dict[str, Any], body: str) -> str:
    head = yaml.dump(
        data,
        Dumper=_Dumper,
        allow_unicode=True,
        sort_keys=False,
        width=1 << 30,  # no folded lines: a long string stays on one line
        default_flow_style=False,
    )
    # The body ends with one newline more than the text (a file ends with a newline: diffs
    # stay clean); ``_read`` takes that one off again.
    return f"---\n{head}---\n{body}\n"


def _write(path: Path, data: dict[str, Any], body: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as handle:
        handle.write(_front(data, body))


def _read(path: Path) -> tuple[dict[str, Any], str]:
    """(front-matter, body) of one file; ``ConfigError`` naming it when it is not one."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from None
    if not text.startswith("---\n"):
        raise ConfigError(f"{path}: no YAML front-matter (the file must start with a --- line)")
    end = text.find("\n---\n", 3)
    if end < 0:
        raise ConfigError(f"{path}: the front-matter has no closing --- line")
    try:
        data = yaml.safe_load(text[4 : end + 1])
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid front-matter: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the front-matter must be a mapping")
    body = text[end + 5 :]
    if not body.endswith("\n"):
        raise ConfigError(f"{path}: the file must end with a newline (it was cut short?)")
    return data, body[:-1]


def _safe_name(name: str, taken: set[str]) -> str:
    """A file name for ``name``: itself when safe, else a slug and a hash; never one of
    ``taken`` (compared without case, for case-insensitive file systems)."""
    safe = name if _SAFE.fullmatch(name) and name not in (SESSION_FILE, STORE_FILE) else ""
    if not safe or safe.lower() in taken:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-")[:40] or "x"
        safe = f"{slug}-{hashlib.sha256(name.encode('utf-8')).hexdigest()[:10]}"
    taken.add(safe.lower())
    return safe


def _plain(message: Message) -> bool:
    """Whether the message is one text block: its body alone says it all."""
    return len(message.content) == 1 and isinstance(message.content[0], TextBlock)


def _excerpt(text: str, width: int = 72) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _turn_name(seq: int) -> str:
    return f"{seq:06d}.md"


# -- writing ---------------------------------------------------------------------------------


def write_session(dump: SessionDump, folder: Path) -> None:
    """Write one session's files under ``folder`` (its own folder, made here)."""
    record = dump.session
    folder.mkdir(parents=True, exist_ok=True)
    for turn in dump.turns:
        _write_turn(folder / "turns" / _turn_name(turn.seq), turn)
    for number, seg in enumerate(dump.segments, start=1):
        _write(
            folder / "segments" / f"{number:04d}.md",
            {
                "first_seq": seg.first_seq,
                "last_seq": seg.last_seq,
                "seqs": list(seg.seqs),
                "tags": list(seg.tags),
                "related_tags": list(seg.related_tags),
                "summary_tokens": seg.summary_tokens,
                "full_tokens": seg.full_tokens,
                "created_at": _iso(seg.created_at),
                "full_text": seg.full_text,
            },
            seg.summary,
        )
    _write_tags(folder / "tags", dump)
    _write(
        folder / SESSION_FILE,
        {
            "id": record.id,
            "created_at": _iso(record.created_at),
            "principal": record.principal,
            "parent_id": record.parent_id,
            "fork_seq": record.fork_seq,
            "last_seq": dump.turns[-1].seq if dump.turns else 0,
            "compaction_watermark": record.compaction_watermark,
            "derived_seq": record.derived_seq,
            "metadata": record.metadata,
            "working_set": [
                {
                    "tag": w.tag,
                    "depth": w.depth,
                    "last_used": _iso(w.last_used),
                    "tokens": w.tokens,
                }
                for w in dump.working_set
            ],
            "aliases": dict(dump.aliases),
            "tag_splits": {tag: list(subs) for tag, subs in dump.tag_splits.items()},
        },
        _session_body(dump),
    )


def _write_turn(path: Path, turn: StoredTurn) -> None:
    message = turn.message
    data: dict[str, Any] = {"seq": turn.seq, "role": message.role}
    if message.name is not None:
        data["name"] = message.name
    data |= {
        "created_at": _iso(turn.created_at),
        "content_hash": turn.content_hash,
        "token_count": turn.token_count,
        "partial": turn.partial,
        "tags": dict(turn.tags),
        "related_tags": list(turn.related_tags),
    }
    if not _plain(message):
        data["message"] = message.model_dump(mode="json")
    _write(path, data, message.text())


def _write_tags(folder: Path, dump: SessionDump) -> None:
    tagged: dict[str, list[tuple[int, bool]]] = {}
    for turn in dump.turns:
        for tag in turn.tags:
            tagged.setdefault(tag, []).append((turn.seq, False))
        for tag in turn.related_tags:
            tagged.setdefault(tag, []).append((turn.seq, True))
    summaries = {s.tag: s for s in dump.tag_summaries}
    taken: set[str] = set()
    texts = {t.seq: (t.message.role, t.message.text()) for t in dump.turns}
    for tag in sorted(set(tagged) | set(summaries)):
        place = folder / _safe_name(tag, taken)
        lines = [f"# {tag}", ""]
        for seq, related in tagged.get(tag, []):
            role, text = texts[seq]
            mark = " (related)" if related else ""
            lines.append(f"- [{seq}](../../turns/{_turn_name(seq)}){mark} {role}: {_excerpt(text)}")
        _write(
            place / "index.md",
            {"tag": tag, "turns": len(tagged.get(tag, []))},
            "\n".join(lines),
        )
        if tag in summaries:
            s = summaries[tag]
            _write(
                place / "summary.md",
                {"tag": tag, "tokens": s.tokens, "source_watermark": s.source_watermark},
                s.summary,
            )


def _session_body(dump: SessionDump) -> str:
    lines = [f"# Session {dump.session.id}", ""]
    for turn in dump.turns:
        lines.append(
            f"- [{turn.seq}](turns/{_turn_name(turn.seq)}) {turn.message.role}: "
            f"{_excerpt(turn.message.text())}"
        )
    return "\n".join(lines)


# -- reading ---------------------------------------------------------------------------------


def _need(data: dict[str, Any], key: str, path: Path) -> Any:
    if key not in data:
        raise ConfigError(f"{path}: the front-matter has no {key!r}")
    return data[key]


def _time(value: Any, path: Path) -> datetime:
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        raise ConfigError(f"{path}: {value!r} is not an ISO time") from None


def read_session(folder: Path) -> SessionDump:
    """The session stored under ``folder`` (its ``session.md``, turns, segments and tag
    summaries); ``ConfigError`` naming the file at fault when one is not as written."""
    path = folder / SESSION_FILE
    data, body = _read(path)
    try:
        record = SessionRecord(
            id=_need(data, "id", path),
            created_at=_time(_need(data, "created_at", path), path),
            metadata=data.get("metadata") or {},
            compaction_watermark=data.get("compaction_watermark", 0),
            principal=data.get("principal", ""),
            parent_id=data.get("parent_id"),
            fork_seq=data.get("fork_seq"),
            derived_seq=data.get("derived_seq", 0),
        )
        working = [
            WorkingSetEntry(
                tag=w["tag"],
                depth=w["depth"],
                last_used=_time(w["last_used"], path),
                tokens=w["tokens"],
            )
            for w in data.get("working_set") or []
        ]
        aliases = {str(k): str(v) for k, v in (data.get("aliases") or {}).items()}
        splits = {
            str(tag): tuple(str(s) for s in subs)
            for tag, subs in (data.get("tag_splits") or {}).items()
        }
    except (ValidationError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path}: invalid session record: {exc}") from None
    sid = record.id
    turns = [_read_turn(p, sid) for p in _numbered(folder / "turns")]
    for expected, turn in enumerate(turns, start=1):
        if turn.seq != expected:
            raise ConfigError(
                f"{folder / 'turns'}: turn {expected} is missing (found {turn.seq} next)"
            )
    segments = [_read_segment(p, sid, i) for i, p in enumerate(_numbered(folder / "segments"))]
    _check_complete(folder, data, body, record, len(turns), segments)
    summaries = [_read_summary(p, sid) for p in sorted((folder / "tags").glob("*/summary.md"))]
    summaries.sort(key=lambda s: s.tag)
    return SessionDump(
        session=record,
        turns=turns,
        segments=segments,
        tag_summaries=summaries,
        working_set=working,
        aliases=aliases,
        tag_splits=splits,
    )


_LISTED = re.compile(r"^- \[(\d+)\]\(turns/", re.MULTILINE)


def _turns(first: int, last: int, state: str) -> str:
    """``turn 8 is missing`` / ``turns 5–8 are missing`` (with ``state`` ``missing``)."""
    return f"turn {first} is {state}" if first == last else f"turns {first}–{last} are {state}"


def _check_complete(
    folder: Path,
    data: dict[str, Any],
    body: str,
    record: SessionRecord,
    found: int,
    segments: Sequence[StoredSegment],
) -> None:
    """``ConfigError`` unless the turn files, ``1..found``, are the turns ``session.md``
    records: its ``last_seq`` (in an export written before it had one, the last turn its body
    lists), and at least every turn it counts as derived, compacted, forked from or in a
    segment. A session that lost its last turns would load short, and the seqs of its next
    turns would be taken as derived already (never tagged)."""
    path, held = folder / SESSION_FILE, f"{folder / 'turns'} holds {found}"
    sid = record.id
    recorded = data.get("last_seq")
    if recorded is None:
        recorded = max((int(n) for n in _LISTED.findall(body)), default=None)
    elif isinstance(recorded, bool) or not isinstance(recorded, int) or recorded < 0:
        raise ConfigError(f"{path}: last_seq must be a whole number, got {recorded!r}")
    if recorded is not None and recorded != found:
        problem = (
            _turns(found + 1, recorded, "missing")
            if recorded > found
            else _turns(recorded + 1, found, "not part of it")
        )
        raise ConfigError(f"{path}: session {sid!r} records {recorded} turn(s), {held}: {problem}")
    reaches = [
        (record.derived_seq, "as derived (derived_seq)"),
        (record.compaction_watermark - 1, "as compacted (compaction_watermark)"),
        (record.fork_seq or 0, "from its parent (fork_seq)"),
        *(
            (max([seg.last_seq, *seg.seqs]), f"in segment {number:04d}")
            for number, seg in enumerate(segments, start=1)
        ),
    ]
    need, what = max(reaches, key=lambda r: r[0])
    if need > found:
        raise ConfigError(
            f"{path}: session {sid!r} counts turns up to {need} {what}, {held}: "
            f"{_turns(found + 1, need, 'missing')}"
        )


def _numbered(folder: Path) -> list[Path]:
    found = []
    for path in folder.glob("*.md") if folder.is_dir() else ():
        if not path.stem.isdigit():
            raise ConfigError(f"{path}: not a numbered file (like {_turn_name(1)})")
        found.append((int(path.stem), path))
    return [p for _, p in sorted(found)]


def _read_turn(path: Path, sid: str) -> StoredTurn:
    data, body = _read(path)
    try:
        role = _need(data, "role", path)
        if "message" in data:
            message = Message.model_validate(data["message"])
            if message.text() != body:
                raise ConfigError(
                    f"{path}: the text was edited (it is no longer the text of the message in "
                    "the front-matter); raw turns are immutable"
                )
            if message.role != role:
                raise ConfigError(f"{path}: role {role!r} is not the message's {message.role!r}")
        else:
            message = Message(role=role, content=(TextBlock(text=body),), name=data.get("name"))
        expected = str(_need(data, "content_hash", path))
        digest = hashlib.sha256(_message_json(message).encode("utf-8")).hexdigest()
        if digest != expected:
            raise ConfigError(
                f"{path}: the turn was changed: its content hash is {digest[:12]}…, the "
                f"front-matter says {expected[:12]}…; raw turns are immutable, so the import "
                "refuses it (restore the file)"
            )
        return StoredTurn(
            session_id=sid,
            seq=_need(data, "seq", path),
            message=message,
            created_at=_time(_need(data, "created_at", path), path),
            content_hash=expected,
            token_count=_need(data, "token_count", path),
            tags=data.get("tags") or {},
            related_tags=tuple(data.get("related_tags") or ()),
            partial=bool(data.get("partial", False)),
        )
    except ValidationError as exc:
        raise ConfigError(f"{path}: invalid turn: {exc}") from None


def _read_segment(path: Path, sid: str, index: int) -> StoredSegment:
    data, body = _read(path)
    try:
        return StoredSegment(
            id=index + 1,  # ids are the store's: a load gives new ones
            session_id=sid,
            first_seq=_need(data, "first_seq", path),
            last_seq=_need(data, "last_seq", path),
            summary=body,
            full_text=data.get("full_text", ""),
            tags=tuple(data.get("tags") or ()),
            related_tags=tuple(data.get("related_tags") or ()),
            summary_tokens=_need(data, "summary_tokens", path),
            full_tokens=_need(data, "full_tokens", path),
            created_at=_time(_need(data, "created_at", path), path),
            seqs=tuple(data.get("seqs") or ()),
        )
    except ValidationError as exc:
        raise ConfigError(f"{path}: invalid segment: {exc}") from None


def _read_summary(path: Path, sid: str) -> TagSummary:
    data, body = _read(path)
    try:
        return TagSummary(
            session_id=sid,
            tag=_need(data, "tag", path),
            summary=body,
            tokens=_need(data, "tokens", path),
            source_watermark=_need(data, "source_watermark", path),
            stale=False,  # computed by the store from the tags
        )
    except ValidationError as exc:
        raise ConfigError(f"{path}: invalid tag summary: {exc}") from None


# -- whole stores ----------------------------------------------------------------------------


@dataclass
class ExportReport:
    """What an export wrote: the sessions (and the folder each went to), their turns, the
    aliases and cost entries of ``store.md``."""

    folders: dict[str, str] = field(default_factory=dict)
    turns: int = 0
    aliases: int = 0
    costs: int = 0


@dataclass
class ImportReport:
    """What an import loaded: the sessions, their turns, the aliases and the cost entries
    written (those the store held already are not written twice)."""

    sessions: list[str] = field(default_factory=list)
    turns: int = 0
    aliases: int = 0
    costs: int = 0


def _cost_dict(entry: CostEntry) -> dict[str, Any]:
    data = entry.model_dump(mode="json")
    data["at"] = _iso(entry.at)
    return data


def export_markdown(
    store: MemoryStorage,
    folder: Path,
    sessions: Sequence[str] | None = None,
    *,
    overwrite: bool = False,
    progress: Callable[[str, int], None] | None = None,
) -> ExportReport:
    """Write ``sessions`` (default: all) of ``store`` under ``folder``, with ``store.md`` (the
    aliases, and the cost log of those sessions — all of it for a whole store). A session folder
    or ``store.md`` already there is a ``ConfigError`` unless ``overwrite`` (then it is replaced,
    so a re-export into a git checkout shows what changed)."""
    known = store.sessions()
    wanted = list(known if sessions is None else sessions)
    unknown = [s for s in wanted if s not in set(known)]
    if unknown:
        raise ConfigError(f"no session {unknown[0]!r} in {store.path}")
    taken: set[str] = {"store.md"}
    names = {sid: _safe_name(sid, taken) for sid in wanted}
    targets = [folder / STORE_FILE, *(folder / n for n in names.values())]
    there = [p for p in targets if p.exists()]
    if there and not overwrite:
        raise ConfigError(
            f"{there[0]} exists already ({len(there)} of the export's files and folders are "
            "there); export into an empty folder, or pass --overwrite to replace them"
        )
    folder.mkdir(parents=True, exist_ok=True)
    report = ExportReport()
    for sid in wanted:
        dump = store.transfer.dump_session(sid)
        place = folder / names[sid]
        if place.exists():
            shutil.rmtree(place)
        write_session(dump, place)
        report.folders[sid] = names[sid]
        report.turns += len(dump.turns)
        if progress is not None:
            progress(sid, len(dump.turns))
    everything = sessions is None
    costs = [
        e for e in store.costs.cost_entries() if everything or (e.session_id in report.folders)
    ]
    aliases = store.vocab.aliases()
    _write(
        folder / STORE_FILE,
        {
            "format": FORMAT,
            "aliases": aliases,
            "costs": [_cost_dict(e) for e in costs],
        },
        "# contextfold memory\n\nOne folder per session; see its session.md. Import with "
        "`contextfold memory import DIR`.",
    )
    report.aliases, report.costs = len(aliases), len(costs)
    return report


def session_folders(folder: Path) -> list[Path]:
    """The session folders of an export (those with a ``session.md``), in name order."""
    return sorted(p.parent for p in folder.glob(f"*/{SESSION_FILE}"))


def import_markdown(
    store: MemoryStorage,
    folder: Path,
    *,
    progress: Callable[[str, int], None] | None = None,
) -> ImportReport:
    """Load an export into ``store``: every session under ``folder`` (``ConfigError`` naming
    the file when a turn was edited, or when the store holds one of the sessions already —
    checked for all of them before anything is written), then the aliases and cost log of
    ``store.md``."""
    from contextfold.store.transfer import copy_costs

    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such folder")
    meta, _ = _read(folder / STORE_FILE) if (folder / STORE_FILE).exists() else ({}, "")
    if meta and meta.get("format") != FORMAT:
        raise ConfigError(
            f"{folder / STORE_FILE}: format {meta.get('format')!r}, expected {FORMAT!r}"
        )
    places = session_folders(folder)
    if not places and not meta:
        raise ConfigError(f"{folder}: no {STORE_FILE} and no session folders: not an export")
    dumps = [read_session(place) for place in places]
    try:
        costs = [CostEntry.model_validate(c) for c in meta.get("costs") or []]
    except ValidationError as exc:
        raise ConfigError(f"{folder / STORE_FILE}: invalid cost entry: {exc}") from None
    there = set(store.sessions())
    clash = [d.session.id for d in dumps if d.session.id in there]
    if clash:
        raise ConfigError(
            f"{store.path} already holds session {clash[0]!r} ({len(clash)} of the "
            f"{len(dumps)} in {folder}); nothing was imported"
        )
    report = ImportReport()
    for dump in dumps:
        store.transfer.load_session(dump)
        report.sessions.append(dump.session.id)
        report.turns += len(dump.turns)
        if progress is not None:
            progress(dump.session.id, len(dump.turns))
    aliases = meta.get("aliases") or {}
    if aliases:
        with store.batch():
            for alias, canonical in aliases.items():
                store.vocab.set_alias(str(alias), str(canonical))
    report.aliases = len(aliases)
    report.costs = copy_costs(costs, store)
    return report
