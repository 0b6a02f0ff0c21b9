"""A session's vocabulary over time: tags split when they grow too broad, spellings merged into
one, aliases scoped to a session, and tags that have expired.

``Vocabulary`` is the engine's keeper of these (``MemoryEngine.vocab``); it runs after each
derive (``evolve``) and in front of every inbound tagging (``inbound``):

- **splitting** (``tagger.splitting``): a tag on at least ``frequency_threshold`` turns *and*
  ``frequency_pct_threshold`` of the session's turns (``splitting.find_overbroad``) is examined
  once — at most ``max_splits_per_turn`` tags per derive. With an LLM configured, one chat call
  groups the tag's turns into sub-topics (``llm_groups``); otherwise, or when the call fails,
  ``splitting.split_tag`` groups them by shared keyphrases. Each turn then carries its sub-tag,
  and keeps the old tag as a related tag; the store records the split (``record_split``) so it
  never runs again for that tag, and the old tag becomes a *split alias*: an inbound message
  that names it is matched to every sub-tag. A tag the LLM (or the keyphrases) find uniform is
  recorded with no sub-tags and left as it is. Sub-tags never reuse a tag the session has.
- **automatic aliases** (``tagger.aliases``): a new tag whose spelling is within
  ``min_similarity`` (normalized Levenshtein similarity) of a tag the session has, or the same
  letters hyphenated differently, is made an alias of the more frequent one — scoped to the
  session, and its stored turns retagged (``kubernetez`` → ``kubernetes``). Tags whose digits
  differ (``windows-10`` / ``windows-11``) and the tags of a split are never merged.
- **session aliases**: ``contextfold memory aliases add -s SESSION`` aliases apply to that
  session's tagging and lookups only, on top of the store-wide ones.
- **expiry** (``tag_rules[].ttl_days``): ``expired`` names the session's tags whose TTL has run
  out since their last mention; recall leaves their turns and summaries out (they stay stored
  and exportable).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from contextfold._bounded import SessionLRU, clip
from contextfold.errors import ConfigError
from contextfold.memory.canonical import TagCanonicalizer
from contextfold.memory.config import TaggerSettings
from contextfold.memory.rules import TagRules
from contextfold.memory.splitting import find_overbroad, split_tag
from contextfold.memory.tagging import KeywordTagger, TagResult
from contextfold.memory.tagging_llm import _json_object
from contextfold.store.protocols import MemoryStorage

__all__ = ["SplitReport", "Vocabulary"]

logger = logging.getLogger(__name__)

_DIGITS = re.compile(r"\D+")

#: Turns shown to the LLM when it splits a tag, and characters of each.
_LLM_TURNS = 120
_LLM_CHARS = 300

_SPLIT_PROMPT = """\
A topic tag of a conversation's memory is on too many turns to tell them apart. Decide \
whether the turns below span distinct sub-topics. Reply with one JSON object and nothing else:
{{"uniform": false, "groups": [{{"tag": "...", "turns": [1, 2]}}, ...]}}

- "uniform": true when the turns are about one topic that merely comes up often (then \
"groups" is empty).
- Otherwise 2 to {max_groups} groups: each a new specific compound tag (lower-case, words \
joined by hyphens, like "{tag}-availability-search" or "browser-connection-{tag}") and the \
numbers of its turns. Never use "{tag}" itself or any of these existing tags: {existing}.
- Turns that fit no group may be left out; they get "{tag}-general"."""


class SplitReport(BaseModel):
    """One examined tag: its sub-tags with their turns (none: kept whole) and who decided."""

    model_config = ConfigDict(frozen=True)
    tag: str
    sub_tags: dict[str, list[int]]
    source: str  # "llm", "keyword" (or "keyword-fallback" after a failed LLM call)


class _SplitReply(BaseModel):
    model_config = ConfigDict(extra="ignore")
    uniform: bool = False
    groups: list[dict[str, Any]] = []


class Vocabulary:
    """See the module docstring. ``llm`` is a chat client (``None``: keyword splits only) with
    its ``model``; ``on_usage(model, usage)`` is called after each LLM call."""

    def __init__(
        self,
        store: MemoryStorage,
        settings: TaggerSettings,
        canonicalizer: TagCanonicalizer,
        rules: TagRules,
        *,
        llm: Any = None,
        model: str | None = None,
        on_usage: Callable[[str, Any], None] | None = None,
        sessions: int = 1000,
    ) -> None:
        self.store = store
        self.settings = settings
        self.canonicalizer = canonicalizer
        self.rules = rules
        self.llm = llm
        self.model = model
        self.on_usage = on_usage
        self._keyword = KeywordTagger(canonicalizer=canonicalizer)
        # Per session, keyed by its generation (``MemoryStorage.session_version``).
        self._state: SessionLRU[tuple[int, dict[str, str], dict[str, tuple[str, ...]]]] = (
            SessionLRU(sessions)
        )
        self._related: SessionLRU[tuple[int, dict[str, int]]] = SessionLRU(sessions)
        self._seen: SessionLRU[set[str]] = SessionLRU(sessions)
        self._pinned = threading.local()  # (session, generation) of ``pinned``
        # The last inbound vocabulary handed out per session, with the generation and the
        # counts it was made from: the same is handed out again, and the next keeps its order.
        self._inbound: SessionLRU[tuple[int, Mapping[str, int], list[str]]] = SessionLRU(sessions)
        self._last_seen: SessionLRU[tuple[int, dict[str, datetime]]] = SessionLRU(sessions)
        self._held: SessionLRU[tuple[tuple[int, tuple[str, ...]], set[int]]] = SessionLRU(sessions)

    # -- reads ----------------------------------------------------------------------------------

    def _generation(self, sid: str) -> int:
        pinned = getattr(self._pinned, "value", None)
        if pinned is not None and pinned[0] == sid:
            return int(pinned[1])
        version = self.store.session_version(sid)
        return version[1] if version is not None else 0

    @contextmanager
    def pinned(self, sid: str, generation: int) -> Iterator[None]:
        """Reads of ``sid`` inside (on this thread) take its generation to be ``generation``,
        one the caller has just read with its data, instead of asking the store again (a
        round trip on a database server)."""
        outer = getattr(self._pinned, "value", None)
        self._pinned.value = (sid, generation)
        try:
            yield
        finally:
            self._pinned.value = outer

    def advance(self, sid: str, before: int, after: int, related: Iterable[str]) -> None:
        """The session's generation went from ``before`` to ``after`` by a write of new turns'
        tags alone (``MemoryStorage.write_derived``), read under that write's lock: what is
        cached at ``before`` is carried to ``after`` instead of read again, the related-tag
        counts with the new turns' ``related`` tags (one per turn carrying it) added."""
        state = self._state.peek(sid)
        if state is not None and state[0] == before:
            self._state.put(sid, (after, state[1], state[2]))
        cached = self._related.peek(sid)
        if cached is not None and cached[0] == before:
            counts = dict(cached[1])
            for tag in related:
                counts[tag] = counts.get(tag, 0) + 1
            self._related.put(sid, (after, counts))

    def _session_state(self, sid: str) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
        generation = self._generation(sid)
        cached = self._state.peek(sid)
        if cached is None or cached[0] != generation:
            cached = (generation, self.store.vocab.aliases(sid), self.store.vocab.tag_splits(sid))
            self._state.put(sid, cached)
        return cached[1], cached[2]

    def kept(self, sid: str, generation: int) -> tuple[dict[str, int] | None, list[str] | None]:
        """The session's related-tag counts and inbound vocabulary if kept at ``generation``
        (``None`` each otherwise), for ``memory.snapshots``."""
        related = self._related.peek(sid)
        inbound = self._inbound.peek(sid)
        return (
            related[1] if related is not None and related[0] == generation else None,
            inbound[2] if inbound is not None and inbound[0] == generation else None,
        )

    def adopt(
        self,
        sid: str,
        generation: int,
        counts: Mapping[str, int],
        related: dict[str, int] | None,
        inbound: list[str] | None,
    ) -> None:
        """Keep the related-tag counts and inbound vocabulary (made from ``counts``, the tag
        counts the caller keeps) an earlier process saved at ``generation``, the session's
        generation now (``memory.snapshots``), where none are kept."""
        if related is not None and self._related.peek(sid) is None:
            self._related.put(sid, (generation, related))
        if inbound is not None and self._inbound.peek(sid) is None:
            self._inbound.put(sid, (generation, counts, inbound))

    def forget(self, sid: str) -> None:
        """Read the session's aliases and splits again on next use (after writing them)."""
        self._state.put(sid, (-1, {}, {}))
        inbound = self._inbound.peek(sid)
        if inbound is not None:  # made again, in the order it had
            self._inbound.put(sid, (-1, inbound[1], inbound[2]))

    def session_aliases(self, sid: str) -> dict[str, str]:
        """The aliases scoped to the session (not the store-wide ones)."""
        return dict(self._session_state(sid)[0])

    def splits(self, sid: str) -> dict[str, tuple[str, ...]]:
        """The tags the splitter examined, with their sub-tags (``()``: kept whole)."""
        return dict(self._session_state(sid)[1])

    def related_counts(self, sid: str) -> dict[str, int]:
        """Turns per related tag (cached per generation)."""
        generation = self._generation(sid)
        cached = self._related.peek(sid)
        if cached is None or cached[0] != generation:
            cached = (generation, self.store.vocab.related_tag_counts(sid))
            self._related.put(sid, cached)
        return cached[1]

    def resolve(self, sid: str, tags: Sequence[str]) -> list[str]:
        """``tags`` with the session's scoped aliases applied (order kept, no repeats)."""
        scoped = self._session_state(sid)[0]
        if not scoped:
            return list(tags)
        return list(dict.fromkeys(_follow(scoped, t) for t in tags))

    def resolve_result(self, sid: str, result: TagResult) -> TagResult:
        """A new turn's tagging with the session's scoped aliases applied, and a split tag
        made a related tag where the turn carries one of its sub-tags too (as on the turns
        the split retagged)."""
        scoped, splits = self._session_state(sid)
        if not scoped and not splits:
            return result
        tags = self.resolve(sid, result.tags)
        demoted = [t for t in tags if set(splits.get(t, ())) & set(tags)]
        tags = [t for t in tags if t not in demoted]
        related = [t for t in self.resolve(sid, [*result.related_tags, *demoted]) if t not in tags]
        return result.model_copy(
            update={"tags": tuple(tags), "related_tags": tuple(dict.fromkeys(related))}
        )

    def inbound_vocabulary(self, sid: str, counts: Mapping[str, int]) -> list[str]:
        """What an inbound message may be tagged with: the session's tags, its related tags,
        the tags it split (their split aliases) and its scoped aliases."""
        generation = self._generation(sid)
        previous = self._inbound.peek(sid)
        if previous is not None and previous[0] == generation and previous[1] is counts:
            # the same generation and counts: the same vocabulary (a list the size of the
            # session's vocabulary, made once per generation, not per message)
            return previous[2]
        scoped, splits = self._session_state(sid)
        extra = [t for t in self.related_counts(sid) if t not in counts]
        split = [t for t, subs in splits.items() if subs and t not in counts]
        current = list(dict.fromkeys([*counts, *extra, *split, *scoped]))
        # The words known already keep their order and new ones follow, so the tagger extends
        # its index of a vocabulary that grew instead of rebuilding it (its results do not
        # depend on the order).
        if previous is not None:
            present = set(current)
            kept = [t for t in previous[2] if t in present]
            known = set(kept)
            current = [*kept, *(t for t in current if t not in known)]
        self._inbound.put(sid, (generation, counts, current))
        return current

    def inbound(self, sid: str, raw: TagResult, counts: Mapping[str, int]) -> TagResult:
        """An inbound tagging narrowed to the session (closed set): scoped aliases applied, a
        split tag widened to its sub-tags, and a tag that only stored turns' related tags
        carry moved to ``related_tags`` (matched at ``recall.related_weight``)."""
        _, splits = self._session_state(sid)
        related_vocab = self.related_counts(sid)
        tags: list[str] = []
        related: list[str] = []
        for tag in self.resolve(sid, raw.tags):
            subs = splits.get(tag, ())
            if tag in counts:
                tags.append(tag)
            elif tag in related_vocab:
                related.append(tag)
            tags.extend(s for s in subs if s in counts)
        for tag in self.resolve(sid, raw.related_tags):
            if tag in counts or tag in related_vocab:
                related.append(tag)
            related.extend(s for s in splits.get(tag, ()) if s in counts)
        tags = list(dict.fromkeys(tags))
        related = [t for t in dict.fromkeys(related) if t not in tags]
        return raw.model_copy(
            update={
                "tags": tuple(tags),
                "related_tags": tuple(related),
                "primary": tags[0] if tags else None,
            }
        )

    # -- aliases --------------------------------------------------------------------------------

    def add_alias(self, alias: str, canonical: str, *, session_id: str | None = None) -> None:
        """``alias`` → ``canonical`` in every session (the canonicalizer's and the store's), or
        only in ``session_id`` (``ConfigError`` for an empty tag, a cycle or no session)."""
        if session_id is None:
            self.canonicalizer.add_alias(alias, canonical)
            self.store.vocab.set_alias(
                self.canonicalizer.normalize(alias), self.canonicalizer.canonical(canonical)
            )
            return
        source, target = self.canonicalizer.fold(alias), self.canonicalizer.canonical(canonical)
        if not source or not target:
            raise ConfigError(f"an alias needs two non-empty tags, got {alias!r} -> {canonical!r}")
        scoped = self._session_state(session_id)[0]
        if _follow(scoped, target) == source or source == target:
            raise ConfigError(
                f"alias {source!r} -> {target!r} would make a cycle in session {session_id!r}"
            )
        self.store.vocab.set_alias(source, target, session_id=session_id)
        self.forget(session_id)

    def remove_alias(self, alias: str, *, session_id: str | None = None) -> bool:
        """Remove a store-wide (or ``session_id``-scoped) alias; whether there was one."""
        names = dict.fromkeys([self.canonicalizer.normalize(alias), self.canonicalizer.fold(alias)])
        if session_id is not None:
            found = [self.store.vocab.remove_alias(n, session_id=session_id) for n in names]
            self.forget(session_id)
            return any(found)
        found = [self.store.vocab.remove_alias(n) for n in names]
        return self.canonicalizer.remove_alias(alias) or any(found)

    # -- expiry ---------------------------------------------------------------------------------

    def expired(
        self, sid: str, counts: Mapping[str, int], now: datetime | None = None
    ) -> list[str]:
        """The session's tags whose ``ttl_days`` ran out since they were last on a turn (when
        each was last seen is read once per generation of the session)."""
        now = now or datetime.now(UTC)
        if not self.rules.has_ttl:  # no tag can expire: none of the session's is asked about
            return []
        ttl = [tag for tag in counts if self.rules.for_tag(tag).ttl_days is not None]
        if not ttl:
            return []
        generation = self._generation(sid)
        cached = self._last_seen.peek(sid)
        if cached is None or cached[0] != generation:
            cached = (generation, self.store.tag_last_seen(sid, tags=ttl))
            self._last_seen.put(sid, cached)
        return sorted(t for t, seen in cached[1].items() if self.rules.expired(t, seen, now))

    def hold_back(
        self, sid: str, tags: TagResult, counts: Mapping[str, int], now: datetime | None = None
    ) -> tuple[TagResult, tuple[str, ...], set[int]]:
        """An inbound tagging without the expired tags (so their summaries and topics are not
        loaded), the expired tags, and the turns that carry one of them as a tag (recall
        leaves them out; they stay stored and exportable)."""
        expired = self.expired(sid, counts, now)
        if not expired:
            return tags, (), set()
        gone = set(expired)
        key = (self._generation(sid), tuple(expired))
        cached = self._held.peek(sid)
        if cached is None or cached[0] != key:
            cached = (
                key,
                {
                    seq
                    for seq, pairs in self.store.turns_tagged(sid, expired).items()
                    if any(not related for _, related in pairs)
                },
            )
            self._held.put(sid, cached)
        held = cached[1]
        # A tag of the message whose every turn is held back is expired content too: its
        # summary (and paged topic) would bring those turns back.
        others = [t for t in (*tags.tags, *tags.related_tags) if t not in gone]
        if others and held:
            seqs: dict[str, set[int]] = {}
            for seq, pairs in self.store.turns_tagged(sid, others).items():
                for tag, related in pairs:
                    if not related:
                        seqs.setdefault(tag, set()).add(seq)
            gone |= {tag for tag, on in seqs.items() if on <= held}
        kept = tuple(t for t in tags.tags if t not in gone)
        narrowed = tags.model_copy(
            update={
                "tags": kept,
                "related_tags": tuple(t for t in tags.related_tags if t not in gone),
                "primary": kept[0] if kept else None,
            }
        )
        return narrowed, tuple(expired), set(held)

    # -- evolution ------------------------------------------------------------------------------

    def evolve(self, sid: str, counts: Mapping[str, int], total: int) -> list[SplitReport]:
        """After a derive: merge new near-duplicate spellings, then split over-broad tags.
        Returns the splits made (an empty list when none)."""
        if self.settings.aliases.auto:
            self._auto_aliases(sid, counts)
        splitting = self.settings.splitting
        if not splitting.enabled:
            return []
        examined = self.splits(sid)
        # A sub-tag is never split in turn (no cascades): it names one sub-topic already.
        made = {sub for subs in examined.values() for sub in subs}
        broad = find_overbroad(
            counts,
            total,
            min_count=splitting.frequency_threshold,
            min_fraction=splitting.frequency_pct_threshold,
            exclude=examined.keys() | made,
        )
        reports = []
        for tag in broad[: splitting.max_splits_per_turn]:
            reports.append(self.split(sid, tag, counts))
        return reports

    def split(self, sid: str, tag: str, counts: Mapping[str, int]) -> SplitReport:
        """Examine ``tag`` now (see the module docstring) and record the outcome."""
        seqs = sorted(
            seq
            for seq, pairs in self.store.turns_tagged(sid, [tag]).items()
            if any(t == tag and not related for t, related in pairs)
        )
        rows = self.store.turn_rows(sid, seqs)
        turns = [(seq, rows[seq].text) for seq in seqs if seq in rows]
        scoped, splits = self._session_state(sid)
        existing = {
            *counts,
            *self.related_counts(sid),
            *splits,
            *(s for subs in splits.values() for s in subs),
            *scoped,
            *self.canonicalizer.aliases,
        }
        groups, source = None, "keyword"
        if self.llm is not None and self.model is not None:
            groups, reason = self.llm_groups(tag, turns, existing)
            source = "llm" if groups is not None else "keyword-fallback"
            if groups is None:
                logger.warning("LLM split of %r fell back to keyphrases: %s", tag, clip(reason))
        if groups is None:
            groups = split_tag(tag, turns, existing=existing, tagger=self._keyword)
        if len(groups) < 2:
            groups = {}  # one sub-topic is the tag under another name: kept whole
        if groups:
            moves = {seq: [(sub, tag)] for sub, members in groups.items() for seq in members}
            self._retag(sid, moves, keep_old=True)
        self.store.vocab.record_split(sid, tag, list(groups))
        self.forget(sid)
        return SplitReport(tag=tag, sub_tags=groups, source=source)

    def llm_groups(
        self, tag: str, turns: Sequence[tuple[int, str]], existing: set[str]
    ) -> tuple[dict[str, list[int]] | None, str]:
        """The LLM's grouping of ``turns`` under new sub-tags (``{}``: uniform), or ``None``
        with the reason when the call or its reply fails."""
        shown = list(turns[-_LLM_TURNS:])
        listing = "\n".join(f"[{seq}] {' '.join(text.split())[:_LLM_CHARS]}" for seq, text in shown)
        others = ", ".join(sorted(t for t in existing if t != tag)[:100]) or "(none)"
        messages = [
            {
                "role": "system",
                "content": _SPLIT_PROMPT.format(tag=tag, max_groups=6, existing=others),
            },
            {"role": "user", "content": f"Tag: {tag}\n\nTurns:\n{listing}"},
        ]
        try:
            reply = self.llm.chat(messages, self.model, temperature=0.0)
        except Exception as exc:  # any client, any failure: keyphrases instead
            return None, f"LLM call failed: {exc}"
        if self.on_usage is not None and self.model is not None:
            self.on_usage(self.model, reply.usage)
        raw = _json_object(reply.text)
        if raw is None:
            return None, f"no JSON object in the reply: {reply.text[:200]!r}"
        try:
            parsed = _SplitReply.model_validate(raw)
        except Exception as exc:
            return None, f"reply has the wrong shape: {exc}"
        if parsed.uniform:
            return {}, ""
        valid = {seq for seq, _ in turns}
        taken = set(existing) | {tag}
        groups: dict[str, list[int]] = {}
        placed: set[int] = set()
        for group in parsed.groups:
            name = self.canonicalizer.canonical(str(group.get("tag", "")))
            members = [
                int(s)
                for s in group.get("turns", [])
                if isinstance(s, int | str) and str(s).isdigit() and int(s) in valid
            ]
            members = [s for s in dict.fromkeys(members) if s not in placed]
            if not name or not members:
                continue
            name = _fresh(name, taken)
            groups[name] = sorted(members)
            placed.update(members)
        if not groups:
            return None, f"no usable group in the reply: {raw!r}"[:300]
        rest = sorted(valid - placed)
        if rest:
            groups[_fresh(self.canonicalizer.canonical(f"{tag}-general"), taken)] = rest
        return groups, ""

    def _retag(
        self, sid: str, moves: Mapping[int, Sequence[tuple[str, str]]], *, keep_old: bool
    ) -> None:
        """Give each turn of ``moves`` (seq → its (new tag, old tag) pairs) the new tags in
        place of the old ones, at the old one's weight; with ``keep_old`` (a split) the old tag
        stays on the turn as a related tag (for queries by the old name), else (an alias) it
        goes."""
        if not moves:
            return
        tagged: dict[int, tuple[dict[str, float], list[str]]] = {}
        for turn in self.store.turns(sid, min(moves), max(moves)):
            pairs = moves.get(turn.seq)
            if not pairs:
                continue
            tags = dict(turn.tags)
            related = list(turn.related_tags)
            for new, old in pairs:
                weight = tags.pop(old, 1.0)
                tags[new] = max(weight, tags.get(new, 0.0))
                if keep_old:
                    related.append(old)
            kept = [t for t in dict.fromkeys(related) if t not in tags]
            tagged[turn.seq] = (tags, kept)
        self.store.set_tags_many(sid, tagged)

    def _auto_aliases(self, sid: str, counts: Mapping[str, int]) -> dict[str, str]:
        """Alias each new tag that is a near spelling of another tag of the session (see the
        module docstring); the aliases applied, alias → canonical."""
        seen = self._seen.peek(sid)
        new = [t for t in counts if seen is None or t not in seen]
        self._seen.put(sid, set(counts))
        if not new or len(counts) < 2:
            return {}
        from rapidfuzz import process
        from rapidfuzz.distance import Levenshtein

        threshold = self.settings.aliases.min_similarity
        names = sorted(counts)
        letters: dict[str, list[str]] = {}
        for name in names:
            letters.setdefault(name.replace("-", ""), []).append(name)
        applied: dict[str, str] = {}
        # A split's tags are kept apart on purpose (a sub-tag may be ``name-2``).
        examined = self.splits(sid)
        split = set(examined) | {sub for subs in examined.values() for sub in subs}
        for tag in new:
            if tag in applied or len(tag) < self.settings.aliases.min_length:
                continue
            near = [n for n in letters.get(tag.replace("-", ""), []) if n != tag]
            near += [
                name
                for name, _, _ in process.extract(
                    tag,
                    names,
                    scorer=Levenshtein.normalized_similarity,
                    score_cutoff=threshold,
                    limit=None,
                )
                if name != tag and len(name) >= self.settings.aliases.min_length
            ]
            for other in near:
                if other in applied or tag in applied or {tag, other} & split:
                    continue
                if _DIGITS.sub("", tag) != _DIGITS.sub("", other):
                    continue  # windows-10 / windows-11, python-2 / python-3: not one topic
                canonical = min((tag, other), key=lambda t: (-counts[t], -len(t), t))
                alias = other if canonical == tag else tag
                applied[alias] = canonical
        if not applied:
            return {}
        for alias, canonical in applied.items():
            self.store.vocab.set_alias(alias, _follow(applied, canonical), session_id=sid)
        moves = {
            seq: [(_follow(applied, tag), tag) for tag, related in pairs if not related]
            for seq, pairs in self.store.turns_tagged(sid, list(applied)).items()
        }
        self._retag(sid, moves, keep_old=False)
        self.forget(sid)
        logger.info("session %r: tags aliased %s", sid, json.dumps(applied))
        return applied


def _follow(aliases: Mapping[str, str], tag: str) -> str:
    seen = {tag}
    while tag in aliases and aliases[tag] not in seen:
        tag = aliases[tag]
        seen.add(tag)
    return tag


def _fresh(name: str, taken: set[str]) -> str:
    """``name``, or ``name-2``, ``name-3``… when taken; the result is added to ``taken``."""
    new, n = name, 1
    while new in taken:
        n += 1
        new = f"{name}-{n}"
    taken.add(new)
    return new
