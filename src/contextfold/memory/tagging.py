"""Topic tags for conversation turns: the ``Tagger`` protocol and its three implementations.

Tags emerge from the conversation; nothing is configured up front. Each tagger returns a
``TagResult`` — canonical tags, most important first, alternate terms for recall, and two
intent flags that switch memory recall to another path:

- ``broad`` — the message asks about the conversation as a whole ("what did we discuss?",
  "summarize everything"): recall loads every tag summary instead of filtering by tag.
- ``temporal`` — the message points at a position in time ("at the beginning", "the first thing
  I asked"): recall reads segment summaries, earliest first.

The taggers:

- ``KeywordTagger`` — deterministic, offline, fast (thousands of turns a second): configured
  keywords, tags already in the session's vocabulary, and salient keyphrases of the text
  itself (``support-group``, ``caroline``), rare words favoured. The default.
- ``EmbeddingTagger`` — closed set: ranks the session's existing tags by cosine similarity to
  the message. It can only return tags that exist, so it suits inbound messages, where a wrong
  tag would page unrelated history into the prompt.
- ``LLMTagger`` — one chat call per turn; the richest tags, reusing known ones (vocabulary
  feedback). It suits the response pass (after the model answered) and falls back to the
  keyword tagger on any failure.

Where the pieces live: ``TagResult``, ``Tagger``, ``KeywordTagger`` and ``EmbeddingTagger``
here; ``LLMTagger`` in ``tagging_llm.py``; ``detect_broad`` and ``detect_temporal``, the
deterministic regexes every tagger ORs in, in ``intent.py``. All of them are importable from
this module.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, computed_field, model_validator

from contextfold.analysis import _stemmer, _stopwords
from contextfold.errors import ConfigError, ContextfoldError
from contextfold.memory.canonical import IRREGULAR_PLURALS, TagCanonicalizer
from contextfold.memory.intent import detect_broad, detect_temporal
from contextfold.retrieval.base import Embedder

if TYPE_CHECKING:
    import numpy.typing as npt

    from contextfold.memory.tagging_llm import LLMTagger, SupportsChat

__all__ = [
    "GROUPS_KEY",
    "GROUPS_VERSION",
    "EmbeddingTagger",
    "KeywordTagger",
    "LLMTagger",
    "SupportsChat",
    "TagResult",
    "Tagger",
    "detect_broad",
    "detect_temporal",
]

logger = logging.getLogger(__name__)


class TagResult(BaseModel):
    """What a tagger says about one text.

    ``tags`` are canonical, most important first; ``primary`` is ``tags[0]`` (or ``None``).
    ``related_tags`` are alternate terms for cross-vocabulary recall, never in ``tags``.
    ``source`` names the tagger that produced the tags (``"keyword"``, ``"embedding"``,
    ``"llm"``, or ``"keyword-fallback"`` with ``fallback_reason`` saying why).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    tags: tuple[str, ...] = ()
    related_tags: tuple[str, ...] = ()
    broad: bool = False
    temporal: bool = False
    source: str = "keyword"
    fallback_reason: str | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def primary(self) -> str | None:
        return self.tags[0] if self.tags else None

    @model_validator(mode="after")
    def _check(self) -> TagResult:
        if len(set(self.tags)) != len(self.tags) or "" in self.tags:
            raise ValueError(f"tags must be distinct and non-empty, got {self.tags}")
        overlap = set(self.tags) & set(self.related_tags)
        if overlap:
            raise ValueError(f"related_tags repeat tags: {sorted(overlap)}")
        return self


@runtime_checkable
class Tagger(Protocol):
    """Tags a text by topic.

    Implementations must guarantee: ``tag`` never raises on any string (``""`` gives a result
    with no tags); returned tags are canonical, distinct and non-empty; ``related_tags`` are
    disjoint from ``tags``; ``broad`` and ``temporal`` are at least what ``detect_broad`` and
    ``detect_temporal`` say about ``text``; the arguments are never mutated.

    ``vocabulary`` is the tags already known in the session, so the tagger can reuse them (an
    embedding tagger returns only these); ``context`` is a few preceding turn texts, oldest
    first, used when ``text`` alone is too short to tag ("yes, do that").
    """

    def tag(
        self, text: str, *, vocabulary: Sequence[str] = (), context: Sequence[str] = ()
    ) -> TagResult: ...


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# -- keyword tagger ------------------------------------------------------------------------

# Function words, conversational filler, vague adjectives and time words: never a topic.
# bm25s's 33 English stop words are added to these. Published long lists were considered and
# rejected: they drop topic words ("group", "system", "computer", "research").
_CHATTER = _words(
    """
    a about above actually after again against ago all almost already also although always am
    among an and another any anybody anyone anything anyway anywhere are aren around as at away
    awesome back basically be became because become been before being below best better between
    big bit both but by can cannot certain clear cool could couldn currently day days definitely
    did didn different do does doesn doing don done down due during each earlier easy either
    else enough especially even ever every everybody everyone everything exactly few fine first
    folks for from full further glad good great guy guys had hadn hard has hasn have haven
    having he hello her here hers herself hey hi high him himself his honestly how however huge
    i idea if im important in indeed instead interesting into is isn it its itself ive just
    kind kinda large last lately later least less like likely literally little long lot lots
    low many may maybe me might mine month months more morning most much must my myself neither
    never new next nice night no nobody none nor not nothing now of off often oh ok okay old on
    once one ones only onto or other others otherwise our ours ourselves out over own part
    people perhaps person please possible pretty previous probably question quick quite rather
    re real really recently right same second several she short should shouldn similar simple
    since small so some somebody someone something sometimes somewhat soon sorry sort specific
    still stuff such super sure than that thats the their theirs them themselves then there
    these they thing things third this those though through thus time times to today together
    tomorrow tonight too totally toward under until up upon us usually very via was wasn way
    ways we week weeks well were weren what whatever when whenever where whether which while
    who whom whose why will with within without won wonderful would wouldn wow yeah year years
    yes yesterday yet you your yours yourself yourselves ll ve
    came felt gave got kept knew made said saw told took thought went mr mrs ms dr prof
    true false absolutely amazing incredible fantastic lovely beautiful happy excited exciting
    proud fun cute crazy sweet thanks thankful thankfully agree agreed totally anyways
    """
)
# Verbs of conversation itself, removed in every inflection (compared by stem: "talked").
_CHATTER_VERBS = _words(
    """
    add appreciate ask be bring call check come consider decide describe discuss do explain
    feel figure find forget get give go guess happen have hear help hope keep know learn let like
    look love make mean mention mind need put realize recommend remember say see seem set show
    sound start suggest suppose take talk tell thank think try understand use want wish
    wonder worry write
    """
)
# How many vocabularies' indexes a keyword tagger keeps (``KeywordTagger._known_index``).
_KNOWN_INDEXES = 4
#: The version of a keyword tagger's grouping of a vocabulary (``KeywordTagger._bucket``):
#: raise it whenever ``_bucket`` would put some tag in another group. ``GROUPS_KEY`` (below)
#: adds the rules' data to it; groups saved under another key are not adopted
#: (``KeywordTagger.adopt_groups``).
GROUPS_VERSION = 1
# Stemmers whose stem of a word keeps the word's first two letters, except where the second
# letter ``y`` became ``i`` (``dying`` -> ``die``) or the stem is shorter than two letters
# (``s``; ``aing`` -> ``a``, and in porter ``as`` -> ``a``, ``s`` -> ``""``): checked over
# every word of up to four letters and inflections of every three-letter start
# (``test_memory_tagging``). With one of these, a known tag is looked up only among the
# vocabulary's tags that start like one of the text's stems (``KeywordTagger._known_index``).
_PREFIX_STEMMERS = frozenset({"english", "porter"})
# What follows a stem shorter than two letters in the words stemmed to it.
_SHORT_STEM_NEXT = ("", "e", "i", "s")
# A tag whose canonical form starts with its own first two letters whatever the aliases: one
# already normalized (lower-case ASCII letters and digits, single hyphens inside).
_PLAIN_TAG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
# The lines of a newline-joined vocabulary that are not plain tags (found in one scan).
_ODD_LINES = re.compile(r"^(?![a-z0-9]+(?:-[a-z0-9]+)*$).*$", re.MULTILINE)
#: What a saved grouping must have been made by: ``GROUPS_VERSION`` and the rules' data.
GROUPS_KEY = hashlib.sha256(
    json.dumps(
        [GROUPS_VERSION, sorted(IRREGULAR_PLURALS), _PLAIN_TAG.pattern, _ODD_LINES.pattern]
    ).encode()
).hexdigest()[:16]
_WORD_OR_BREAK = re.compile(r"\w+|[.!?;:,()\[\]{}\"“”]|\n")
_SENTENCE_END = frozenset(".!?\n")
_TITLES = ("mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "etc")
_NAME_BONUS = 1.5
_BIGRAM_BONUS = 1.25
_KEEP_FRACTION = 0.35  # a keyphrase must score at least this share of the best one
_CACHE_LIMIT = 200_000


def _common_start(a: list[str], b: list[str]) -> int:
    """How many leading items ``a`` and ``b`` share (list compares at C speed, halving)."""
    high = min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    low = 0  # a[:low] == b[:low] holds; a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle
    return low


# Token info: (stem, is_content, may end a pair, weight); ``None`` marks a break.
_Info = tuple[str, bool, bool, float]


class KeywordTagger:
    """Deterministic tags from keywords, the session vocabulary and the text's own keyphrases.

    Ranking, highest tier first:

    1. **configured tags** — ``vocabulary`` maps a tag to keywords or phrases, matched as whole
       words, case-insensitively and stem-aware (keyword ``filing`` matches "filings");
    2. **known tags** — tags in the ``vocabulary`` argument of ``tag()`` whose every part
       occurs in the text (stem-aware), so "databases" reuses the known tag ``database``;
    3. **keyphrases** (``keyphrases=True``) — content words and adjacent content-word pairs
       (``support-group``), scored by count, rarity across the texts seen so far (a running
       document frequency, updated by ``observe`` and by every ``tag`` call when ``learn``),
       and a bonus for capitalised names and acronyms; numbers are skipped.

    ``related_tags`` holds the parts of chosen pairs and the next keyphrases down. A text with
    no content word and fewer than ``lookback_words`` words ("ok, do that") takes the topics of
    its ``context`` turns. A capitalised word ending in "s" met mid-sentence is a name
    (``Jones``): it is registered with the canonicalizer as never plural-folded. Results
    depend only on the constructor arguments and the texts seen before, in order.

    >>> tagger = KeywordTagger({"legal": ["court", "filing"]})
    >>> tagger.tag("The court filings are due Friday.").tags
    ('legal', 'friday')
    >>> KeywordTagger().tag("When did Caroline go to the support group?").tags
    ('caroline', 'support-group')
    """

    def __init__(
        self,
        vocabulary: Mapping[str, Sequence[str]] | None = None,
        *,
        keyphrases: bool = True,
        max_tags: int = 5,
        canonicalizer: TagCanonicalizer | None = None,
        learn: bool = True,
        lookback_words: int = 8,
        language: str = "english",
        cache_limit: int = _CACHE_LIMIT,
    ) -> None:
        if max_tags < 1:
            raise ConfigError(f"max_tags must be >= 1, got {max_tags}")
        self.keyphrases = keyphrases
        self.max_tags = max_tags
        self.canonicalizer = canonicalizer if canonicalizer is not None else TagCanonicalizer()
        self.learn = learn
        self.lookback_words = lookback_words
        self._stem_word = _stemmer(language).stemWord
        self._stems: dict[str, str] = {}  # at most _CACHE_LIMIT words
        self._stop = _CHATTER | _stopwords("en")
        self._stop_stems = frozenset(self._stem(w) for w in _CHATTER_VERBS)
        self._info: dict[str, _Info | None] = {}
        self._names: set[str] = set()
        self._titles = frozenset(self._stem(w) for w in _TITLES)
        self._surface: dict[str, str] = {}
        if cache_limit < 1:
            raise ConfigError(f"cache_limit must be >= 1, got {cache_limit}")
        self.cache_limit = cache_limit
        # The last few vocabularies, newest first, each with its tags grouped by their first
        # two letters (``_buckets``): the stored turns' tagging and the inbound tagging pass
        # different ones (the inbound one adds related tags and aliases), and each keeps its
        # own. The groups depend on the tags' spelling alone, not on the canonicalizer.
        self._known: list[tuple[list[str], dict[str, list[str]]]] = []
        self._known_lock = threading.Lock()
        # Known-tag entries (canonical name, stems of its parts) by tag, made as a text's
        # lookup needs them, at most ``cache_limit``; valid for the canonicalizer (and its
        # version) in ``_entries_by``.
        self._entries: dict[str, tuple[str, tuple[str, ...]] | None] = {}
        self._entries_by = (self.canonicalizer, self.canonicalizer.version)
        # The entries' tags by ``TagCanonicalizer.last_part``: protecting a name drops only
        # the entries of the tags ending in it.
        self._entries_by_last: dict[str, list[str]] = {}
        self._prefix_stems = language in _PREFIX_STEMMERS
        self._df: dict[str, int] = {}
        self._docs = 0
        self._lock = threading.Lock()
        # The configured tags as given and their keywords' stems; their canonical names follow
        # the canonicalizer (an alias added later renames them), made again when it changes.
        self._keyword_specs: list[tuple[str, list[tuple[str, ...]]]] = []
        for tag, words in (vocabulary or {}).items():
            if not self.canonicalizer.canonical(tag):
                raise ConfigError(f"configured tag {tag!r} is empty after normalization")
            stems = [tuple(self._stem(w) for w in re.findall(r"\w+", p.lower())) for p in words]
            self._keyword_specs.append((tag, [s for s in stems if s]))
        self._keywords_by: tuple[TagCanonicalizer, int] | None = None
        self._keyword_index: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        self._configured: list[str] = []
        self._configured_keywords()

    def __repr__(self) -> str:
        return (
            f"KeywordTagger({len(self._configured)} configured tags, keyphrases={self.keyphrases},"
            f" {self._docs} texts seen)"
        )

    @property
    def documents_seen(self) -> int:
        return self._docs

    def _configured_keywords(self) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
        """The configured keywords by the stem of their first word, each with its tag's
        canonical name under the canonicalizer now (made again when it changed)."""
        by = (self.canonicalizer, self.canonicalizer.version)
        if self._keywords_by != by:
            index: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
            configured: list[str] = []
            for tag, phrases in self._keyword_specs:
                name = by[0].canonical(tag)
                configured.append(name)
                for stems in phrases:
                    index.setdefault(stems[0], []).append((name, stems))
            self._keyword_index, self._configured, self._keywords_by = index, configured, by
        return self._keyword_index

    def _stem(self, word: str) -> str:
        found = self._stems.get(word)
        if found is None:
            if len(self._stems) >= _CACHE_LIMIT:
                self._stems.clear()
            found = self._stems[word] = str(self._stem_word(word))
        return found

    def _token(self, token: str) -> _Info | None:
        """Cached facts about one raw token; ``None`` for punctuation. The first spelling
        seen of a stem becomes its tag's surface form, so a tag stays stable."""
        try:
            return self._info[token]
        except KeyError:
            pass
        if len(self._info) >= _CACHE_LIMIT:
            self._info.clear()
        if token in _SENTENCE_END or not (token[0].isalnum() or token[0] == "_"):
            self._info[token] = None
            return None
        low = token.lower()
        stem = self._stem(low)
        content = (
            len(low) > 1
            and low not in self._stop
            and stem not in self._stop_stems
            and not any(c.isdigit() for c in low)
        )
        if content and stem not in self._surface:
            if len(self._surface) >= _CACHE_LIMIT:
                self._surface.clear()
            self._surface[stem] = low
        # "Melanie painted": a past-tense verb is rarely a topic, and after a word it starts a
        # clause, not a phrase.
        past = len(low) > 4 and low.endswith("ed") and stem != low
        found = (stem, content, not past, 0.5 if past else 1.0)
        self._info[token] = found
        return found

    def _terms(self, text: str) -> tuple[list[str], list[tuple[str, float]]]:
        """Every word's stem (for keyword matching) and the weighted keyphrase candidates as
        ``(key, weight)``: a single word's key is its stem, a pair's ``"stem1 stem2"``."""
        stems: list[str] = []
        candidates: list[tuple[str, float]] = []
        previous: tuple[str, float] | None = None
        sentence_start = True
        for token in _WORD_OR_BREAK.findall(text):
            info = self._token(token)
            if info is None:
                previous = None
                if token in _SENTENCE_END and not (stems and stems[-1] in self._titles):
                    sentence_start = True  # but not after "Dr." or "Mrs."
                continue
            stem, content, ends_pair, weight = info
            stems.append(stem)
            if not content:
                previous = None
                sentence_start = False
                continue
            if (token[0].isupper() and not sentence_start) or (len(token) > 1 and token.isupper()):
                weight *= _NAME_BONUS
                if token[-1] == "s" and token[1:].islower() and token not in self._names:
                    self._names.add(token)
                    self.canonicalizer.protect(token)  # Jones, Jenkins: never "jone"
            sentence_start = False
            candidates.append((stem, weight))
            if previous is not None and ends_pair:
                candidates.append((f"{previous[0]} {stem}", min(previous[1], weight)))
            previous = (stem, weight)
        return stems, candidates

    def observe(self, text: str) -> None:
        """Count ``text`` in the running document frequencies (words common across the
        conversation then weigh less)."""
        _, candidates = self._terms(text)
        self._observe({key for key, _ in candidates if " " not in key})

    def _observe(self, keys: set[str]) -> None:
        with self._lock:
            self._docs += 1
            df = self._df
            for key in keys:
                df[key] = df.get(key, 0) + 1
            if len(df) > _CACHE_LIMIT:  # forget the words seen only once
                self._df = {k: v for k, v in df.items() if v > 1}

    def _rank(self, candidates: list[tuple[str, float]]) -> list[tuple[str, float]]:
        """Candidates merged by key and scored, best first: a word weighs its count times its
        rarity, a pair 1.25 times its weaker word (times its count, at most 2)."""
        weights: dict[str, float] = {}
        for key, weight in candidates:
            weights[key] = weights.get(key, 0.0) + weight
        docs, df, log = self._docs + 2, self._df, math.log
        scores: dict[str, float] = {}
        for key, weight in weights.items():
            if " " not in key:
                scores[key] = weight * log(docs / (df.get(key, 0) + 1))
        for key, weight in weights.items():
            if " " in key:
                first, second = key.split(" ")
                scores[key] = _BIGRAM_BONUS * min(scores[first], scores[second]) * min(weight, 2.0)
        # sorted() is stable: equal scores keep the text's order
        return sorted(scores.items(), key=lambda item: -item[1])

    def _name(self, key: str) -> str:
        """The canonical tag for a candidate key (stems shown in their first-seen spelling)."""
        surface = self._surface
        if " " in key:
            first, second = key.split(" ")
            return self.canonicalizer.canonical(
                f"{surface.get(first, first)}-{surface.get(second, second)}"
            )
        return self.canonicalizer.canonical(surface.get(key, key))

    def keyphrases_of(self, text: str) -> list[tuple[str, float]]:
        """The text's keyphrases as ``(tag, score)``, best first, without learning from it."""
        _, candidates = self._terms(text)
        named = ((self._name(key), score) for key, score in self._rank(candidates))
        return list({tag: score for tag, score in reversed(list(named)) if tag}.items())[::-1]

    def _known_entry(self, tag: str) -> tuple[str, tuple[str, ...]] | None:
        name = self.canonicalizer.canonical(tag)
        parts = tuple(self._stem(p) for p in name.split("-") if p)
        return (name, parts) if parts else None

    @staticmethod
    def _bucket(tag: str) -> str:
        """The group of ``tag`` in a vocabulary's ``_buckets``: the first two letters of its
        first part when its canonical form starts with them (whatever the aliases, which are
        looked up apart), else ``""``, the group every lookup reads."""
        if tag in IRREGULAR_PLURALS or not _PLAIN_TAG.fullmatch(tag):
            return ""  # "mice" -> "mouse"; " DB" -> "db"
        return tag[:2].rstrip("-")  # "x-ray": "x"

    def _group(self, buckets: dict[str, list[str]], tags: Sequence[str]) -> None:
        """Add ``tags`` to their ``_bucket`` groups (the tags that are not plain are found
        in one regex scan of the vocabulary, not one match per tag)."""
        if not tags:
            return
        joined = "\n".join(tags)
        if joined.count("\n") != len(tags) - 1:  # a tag holding a newline: one by one
            for tag in tags:
                buckets.setdefault(self._bucket(tag), []).append(tag)
            return
        odd = set(_ODD_LINES.findall(joined)) | IRREGULAR_PLURALS.intersection(tags)
        for tag in tags:
            buckets.setdefault("" if tag in odd else tag[:2].rstrip("-"), []).append(tag)

    def _buckets(self, vocabulary: Sequence[str]) -> dict[str, list[str]]:
        """The vocabulary's tags grouped by ``_bucket``. A vocabulary grows by appending (a
        session's tags in first-seen order), so the groups of the one sharing the longest
        start with it are carried over: the tags after that start are taken out and the new
        ones added, instead of grouping every tag again (a vocabulary that lost a tag, merged
        or split, still shares most of its start)."""
        words = list(vocabulary)
        with self._known_lock:
            base: tuple[list[str], dict[str, list[str]]] = ([], {})
            shared = 0
            for entry in self._known:
                common = _common_start(entry[0], words)
                if common > shared:
                    base, shared = entry, common
            seen, buckets = base
            # A vocabulary that grew takes its base's place: the vocabulary that grew has one
            # entry however often it grew (a derive's tagging grows its vocabulary turn by
            # turn; kept beside each other, those pushed the inbound tagging's out). One that
            # lost tags is kept beside its base, which may be another caller's.
            grown = shared == len(seen)
            others = [e for e in self._known if e is not base] if grown else list(self._known)
            if shared < len(seen) or shared < len(words):
                # New groups, not the old ones changed: a caller holding the old ones (on
                # another thread) never sees the change.
                buckets = {key: list(tags) for key, tags in buckets.items()}
                for tag in seen[shared:]:
                    group = buckets.get(self._bucket(tag))
                    if group is not None and tag in group:
                        group.remove(tag)
                self._group(buckets, words[shared:])
                seen = words
            self._known = [(seen, buckets), *others[: _KNOWN_INDEXES - 1]]
            return buckets

    def groups(self, vocabulary: Sequence[str]) -> dict[str, list[str]]:
        """``vocabulary``'s groups: the ones this tagger keeps for it (``known_groups``), else
        made apart (``_group``, about 2 ms for a 100k-turn session's 6,350 tags) and not kept,
        so no other vocabulary's are pushed out. What a session's state file saves
        (``memory.snapshots``): a session derived but never recalled is not grouped again by
        the first recall after a restart."""
        known = self.known_groups(vocabulary)
        if known is not None:
            return known
        buckets: dict[str, list[str]] = {}
        self._group(buckets, list(vocabulary))
        return buckets

    def known_groups(self, vocabulary: Sequence[str]) -> dict[str, list[str]] | None:
        """The groups this tagger keeps for exactly ``vocabulary`` (``_buckets``), or
        ``None``."""
        words = list(vocabulary)
        with self._known_lock:
            for seen, buckets in self._known:
                if seen == words:
                    return buckets
        return None

    def adopt_groups(
        self, vocabulary: Sequence[str], groups: dict[str, list[str]], key: str | None
    ) -> bool:
        """Keep ``groups``, ``vocabulary``'s grouping as an earlier process made it (saved with
        the session's state, with ``key``: the ``GROUPS_KEY`` of the rules it was made by), so
        this process's first lookup does not group the whole vocabulary again. The caller
        vouches that they hold each of its tags once (the state file checks they are a
        permutation of the vocabulary); not kept (``False``) when ``key`` names other rules
        than this process's, when they hold another count of tags, when the first or last tag
        of a group is not of that group here, or when this tagger already keeps a grouping
        sharing the vocabulary's start."""
        if key != GROUPS_KEY:
            return False
        words = list(vocabulary)
        if sum(len(group) for group in groups.values()) != len(words):
            return False
        for key, group in groups.items():
            if group and (self._bucket(group[0]) != key or self._bucket(group[-1]) != key):
                return False
        with self._known_lock:
            if any(_common_start(seen, words) for seen, _ in self._known):
                return False
            self._known = [(words, groups), *self._known[: _KNOWN_INDEXES - 1]]
            return True

    def _entries_for(self, tags: Iterable[str]) -> list[tuple[str, tuple[str, ...]]]:
        """The known-tag entries of ``tags`` (those with a non-empty canonical form), made once
        per canonicalizer version and kept at most ``cache_limit`` at a time."""
        with self._known_lock:
            canonicalizer = self.canonicalizer
            by = (canonicalizer, canonicalizer.version)
            if by[0] is not self._entries_by[0] or by[1] != self._entries_by[1]:
                # Some canonical forms changed: a protected name changes only the tags ending
                # in it (dropped); an alias, any tag (all dropped). Made again as needed.
                changed = (
                    by[0].changed_since(self._entries_by[1])
                    if by[0] is self._entries_by[0]
                    else None
                )
                if changed is None:
                    self._entries, self._entries_by_last = {}, {}
                for part in changed or ():
                    for tag in self._entries_by_last.pop(part, ()):
                        self._entries.pop(tag, None)
                self._entries_by = by
            entries, by_last = self._entries, self._entries_by_last
            last_part = canonicalizer.last_part
            out = []
            for tag in tags:
                try:
                    entry = entries[tag]
                except KeyError:
                    if len(entries) >= self.cache_limit:
                        entries.clear()
                        by_last.clear()
                    entry = entries[tag] = self._known_entry(tag)
                    by_last.setdefault(last_part(tag), []).append(tag)
                if entry is not None:
                    out.append(entry)
            return out

    def _known_index(
        self, vocabulary: Sequence[str], present: Collection[str] | None = None
    ) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
        """Known tags by the stem of their first part: every tag of the vocabulary, or with
        ``present`` (a text's stems) only those whose first stem is one of them, which is all
        a text's lookup needs. Only those tags' canonical forms and stems are made: with a
        prefix-keeping stemmer (``_PREFIX_STEMMERS``) a tag whose first stem is ``s`` starts
        with ``s``'s first two letters, so only the tags starting like one of the text's
        stems are looked at (besides the ones an alias may rename, and the ``""`` group). The
        first lookup in a fresh process costs what the text touches, not the vocabulary's
        size."""
        buckets = self._buckets(vocabulary)
        if present is None or not self._prefix_stems:
            candidates: Iterable[str] = [t for group in buckets.values() for t in group]
        else:
            keys = {""}
            for stem in present:
                if len(stem) < 2:  # "s"; "a" from "aing"; "" from "s" (porter)
                    keys.update(stem + after for after in _SHORT_STEM_NEXT)
                    continue
                keys.add(stem[:2])
                if stem[1] == "i":  # "dying" -> "die", "ay" -> "ai" (porter)
                    keys.add(stem[0] + "y")
            # A tag whose folded form is an alias starts like the alias (folding keeps a
            # plain tag's first two letters), and its canonical form is the alias's target.
            keys.update(a[:2].rstrip("-") for a in self.canonicalizer.alias_sources)
            candidates = [t for key in keys for t in buckets.get(key, ())]
        index: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        for name, parts in self._entries_for(candidates):
            if present is None or parts[0] in present:
                index.setdefault(parts[0], []).append((name, parts))
        return index

    def tag(
        self, text: str, *, vocabulary: Sequence[str] = (), context: Sequence[str] = ()
    ) -> TagResult:
        stems, candidates = self._terms(text)
        if self.learn and candidates:
            self._observe({key for key, _ in candidates if " " not in key})
        if context and not candidates and len(stems) < self.lookback_words:
            # "ok, do that": nothing to tag here, so the turn takes its context's topics.
            for previous in context[-3:]:
                more_stems, more = self._terms(previous)
                stems += more_stems
                candidates += more
        chosen: list[str] = []
        related: list[str] = []
        consumed: set[str] = set()  # stems explained by a chosen keyword, known tag or pair
        taken: set[str] = set()  # stems of chosen single-word keyphrases
        keywords = self._configured_keywords() if self._keyword_specs else None
        if keywords:
            hits: dict[str, int] = {}
            for i, stem in enumerate(stems):
                for name, sequence in keywords.get(stem, ()):
                    if tuple(stems[i : i + len(sequence)]) == sequence:
                        hits[name] = hits.get(name, 0) + 1
                        consumed.update(sequence)
            chosen += sorted(hits, key=lambda name: -hits[name])
        if vocabulary:
            present = set(stems)
            index = self._known_index(vocabulary, present)
            known = [
                (name, parts)
                for stem in present
                for name, parts in index.get(stem, ())
                if all(p in present for p in parts)
            ]
            known.sort(key=lambda k: (-len(k[1]), k[0]))  # longest match first, then by name
            for name, parts in known:
                if name not in chosen:
                    chosen.append(name)
                    consumed.update(parts)
        if self.keyphrases and candidates:
            ranked = self._rank(candidates)
            floor = ranked[0][1] * _KEEP_FRACTION
            limit = self.max_tags
            for key, score in ranked:
                if len(chosen) >= limit and len(related) >= limit:
                    break
                tag = self._name(key)
                if not tag or tag in chosen:
                    continue
                words = key.split(" ")
                blocked = (consumed | taken) if len(words) > 1 else consumed
                if len(chosen) < limit and score >= floor and blocked.isdisjoint(words):
                    chosen.append(tag)
                    if len(words) > 1:
                        consumed.update(words)
                        related += [self._name(w) for w in words]
                    else:
                        taken.update(words)
                else:
                    related.append(tag)
        tags = tuple(chosen[: self.max_tags])
        extra = [t for t in dict.fromkeys(related + chosen[self.max_tags :]) if t and t not in tags]
        return TagResult(
            tags=tags,
            related_tags=tuple(extra[: self.max_tags]),
            broad=detect_broad(text),
            temporal=detect_temporal(text),
            source="keyword",
        )


# -- embedding tagger ----------------------------------------------------------------------


class EmbeddingTagger:
    """Closed-set tags: the session's known tags ranked by cosine similarity to the text.

    Only tags in the ``vocabulary`` argument are ever returned, spelled as given there; no
    vocabulary, no tags. A tag goes in ``tags`` when its cosine is at least ``threshold`` and
    within ``margin`` of the best tag's (at most ``max_tags``); the next ones at or above
    ``related_threshold`` (default: ``threshold``) go in ``related_tags``. The margin keeps a
    clear winner from dragging a weak runner-up along ("arduino circuits": ``electronics``
    0.53, ``database`` 0.26). A tag is embedded as its words (``support-group`` →
    "support group"), once. A text of fewer than ``lookback_words`` words is embedded together
    with its last ``context`` turns.

    The defaults are tuned for all-MiniLM-L6-v2, where a message's right tag scores about
    0.2–0.55 and a greeting scores about 0.2 against everything.

    >>> from contextfold.testing import HashEmbedder
    >>> tagger = EmbeddingTagger(HashEmbedder())
    >>> tagger.tag("my database is slow", vocabulary=["database", "cooking"]).tags
    ('database',)
    """

    def __init__(
        self,
        embedder: Embedder,
        *,
        threshold: float = 0.25,
        margin: float = 0.1,
        max_tags: int = 3,
        related_threshold: float | None = None,
        lookback_words: int = 8,
    ) -> None:
        if max_tags < 1:
            raise ConfigError(f"max_tags must be >= 1, got {max_tags}")
        if margin < 0:
            raise ConfigError(f"margin must be >= 0, got {margin}")
        self.embedder = embedder
        self.threshold = threshold
        self.margin = margin
        self.max_tags = max_tags
        self.related_threshold = threshold if related_threshold is None else related_threshold
        self.lookback_words = lookback_words
        self._vectors: dict[str, npt.NDArray[np.float32]] = {}

    def __repr__(self) -> str:
        return f"EmbeddingTagger({self.embedder.name!r}, threshold={self.threshold})"

    def _tag_vectors(self, tags: list[str]) -> npt.NDArray[np.float32]:
        missing = [t for t in tags if t not in self._vectors]
        if missing:
            vectors = self.embedder.embed([t.replace("-", " ").replace("_", " ") for t in missing])
            self._vectors.update(zip(missing, vectors, strict=True))
        return np.stack([self._vectors[t] for t in tags])

    def tag(
        self, text: str, *, vocabulary: Sequence[str] = (), context: Sequence[str] = ()
    ) -> TagResult:
        broad, temporal = detect_broad(text), detect_temporal(text)
        known = [t for t in dict.fromkeys(vocabulary) if t and t.strip()]
        if not known or not text.strip():
            return TagResult(broad=broad, temporal=temporal, source="embedding")
        query = text
        if context and len(text.split()) < self.lookback_words:
            query = "\n".join([*context[-3:], text])
        try:
            vector = self.embedder.embed([query])[0]
            scores = self._tag_vectors(known) @ vector
        except ContextfoldError as exc:  # a broken embedder must not break the request
            logger.warning("embedding tagger %s failed, no tags: %s", self.embedder.name, exc)
            return TagResult(
                broad=broad, temporal=temporal, source="embedding", fallback_reason=str(exc)
            )
        order = sorted(range(len(known)), key=lambda i: (-float(scores[i]), i))
        floor = max(self.threshold, float(scores[order[0]]) - self.margin)
        tags = [known[i] for i in order if scores[i] >= floor][: self.max_tags]
        related = [
            known[i] for i in order if known[i] not in tags and scores[i] >= self.related_threshold
        ][: self.max_tags]
        return TagResult(
            tags=tuple(tags),
            related_tags=tuple(related),
            broad=broad,
            temporal=temporal,
            source="embedding",
        )


# ``LLMTagger`` and ``SupportsChat`` live in ``tagging_llm.py``, which imports this module;
# they are loaded from there on first access, so this module never imports that one at import
# time and there is no cycle (``contextfold.memory`` imports them, so they load with it).
_LLM_NAMES = frozenset({"LLMTagger", "SupportsChat"})


def __getattr__(name: str) -> Any:
    if name not in _LLM_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from contextfold.memory import tagging_llm

    value = getattr(tagging_llm, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LLM_NAMES)
