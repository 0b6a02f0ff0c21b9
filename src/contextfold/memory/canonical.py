"""Tag canonicalization: one spelling per topic, so ``DB``, ``databases`` and ``database`` meet.

``TagCanonicalizer.canonical(tag)`` runs three steps:

1. **normalize** — lower-case, trim, spaces / underscores / slashes to hyphens, ``+`` and ``#``
   spelled out (``c++`` → ``cplusplus``, ``c#`` → ``csharp``), every other punctuation mark
   dropped, repeated hyphens collapsed: ``" Support_Group/Notes! "`` → ``support-group-notes``.
   A tag with no letter or digit normalizes to ``""``; callers drop empty tags (nothing
   raises).
2. **fold plurals** of the last hyphen-part: ``databases`` → ``database``, ``queries`` →
   ``query``, ``classes`` → ``class``, ``support-groups`` → ``support-group``. Words that only
   look plural stay: ``status``, ``analysis``, ``news``, ``physics``, ``kubernetes``, ``devops``,
   and anything ``protect``-ed (names such as ``james``).
3. **aliases** — ``db`` → ``database``; chains resolve to their end, a cycle is refused.

``suggest`` proposes aliases from a tag list (near-identical spellings by edit distance,
numeronyms like ``k8s`` and initialisms of multi-part tags like ``ml``); nothing is applied
until ``add_alias``.

>>> canon = TagCanonicalizer({"db": "database"})
>>> [canon.canonical(t) for t in ["Databases", "DB", "support groups", "status"]]
['database', 'database', 'support-group', 'status']
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping

from pydantic import BaseModel, ConfigDict

from contextfold.errors import ConfigError

__all__ = [
    "IRREGULAR_PLURALS",
    "AliasSuggestion",
    "TagCanonicalizer",
    "fold_plural",
    "normalize_tag",
]

_SEPARATORS = re.compile(r"[\s_/\\]+")
_PUNCTUATION = re.compile(r"[^\w-]+")
_HYPHENS = re.compile(r"-{2,}")
_VOWEL = re.compile(r"[aeiouy]")
_NUMERONYM = re.compile(r"([a-z])(\d{1,2})([a-z])")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Irregular plurals worth knowing in tags; every value is a fixed point of ``fold_plural``.
_IRREGULAR = {
    "analyses": "analysis",
    "diagnoses": "diagnosis",
    "hypotheses": "hypothesis",
    "theses": "thesis",
    "crises": "crisis",
    "indices": "index",
    "matrices": "matrix",
    "vertices": "vertex",
    "appendices": "appendix",
    "criteria": "criterion",
    "phenomena": "phenomenon",
    "children": "child",
    "mice": "mouse",
    "feet": "foot",
    "teeth": "tooth",
    "geese": "goose",
    "women": "woman",
    "men": "man",
    "leaves": "leaf",
    "knives": "knife",
    "wolves": "wolf",
    "lives": "life",
    "wives": "wife",
    "halves": "half",
    "shelves": "shelf",
    "thieves": "thief",
    "calves": "calf",
    "loaves": "loaf",
    "scarves": "scarf",
    "potatoes": "potato",
    "tomatoes": "tomato",
    "heroes": "hero",
    "echoes": "echo",
    "vetoes": "veto",
    "volcanoes": "volcano",
    "torpedoes": "torpedo",
}
#: The plurals folded to a word of another start (``mice`` -> ``mouse``); every other fold
#: only shortens the end of a word of four or more letters, keeping its first two.
IRREGULAR_PLURALS = frozenset(_IRREGULAR)
# Singular words ending in "s" (their plural adds "es": aliases, statuses, gases).
_S_SINGULARS = _words(
    "alias atlas bias canvas gas status virus bonus campus bus census corpus focus chorus "
    "circus consensus stimulus radius surplus genus nexus syllabus apparatus cactus octopus "
    "plus minus thesaurus walrus fungus hiatus sinus iris lens"
)
# Words that look plural but are not (or are names that must keep their "s").
_INVARIANT = _S_SINGULARS | _words(
    "news series species means kudos chaos cosmos ethos logos pathos thermos asbestos macos "
    "ios centos chromeos ipados tvos watchos paxos kubernetes postgres jenkins diabetes herpes "
    "rabies measles mumps shingles christmas texas pandas vegas kansas arkansas athens wales "
    "mars venus james hermes sales thanks pants jeans scissors billiards headquarters "
    "saas paas iaas faas dbaas yes always perhaps axis redis tennis pelvis paris chris elvis "
    "travis memphis jarvis dennis lewis davis trellis mantis debris marquis ibis cannabis "
    "hubris epidermis osiris artemis this his"
)
# Singular nouns ending in "ie" / "che": their plurals must not lose the "e".
_IE_SINGULARS = _words(
    "cookie movie zombie calorie selfie rookie hoodie brownie smoothie genie pixie prairie "
    "auntie freebie goalie newbie sortie lingerie boogie"
)
_CHE_SINGULARS = _words("cache niche headache avalanche quiche moustache ache creche")
# Endings of singular words (or of names) that a final "s" does not make plural.
_KEEP_ENDINGS = ("ss", "us", "sis", "itis", "polis", "ics", "ops", "fs", "js")


#: A tag ``normalize_tag`` leaves as it is (most tags: stored canonical), told by one match.
_NORMALIZED = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def normalize_tag(tag: str) -> str:
    """Lower-case, trim and hyphenate ``tag``; ``""`` when nothing word-like is left.

    >>> normalize_tag("  Support_Group / Notes!! ")
    'support-group-notes'
    >>> normalize_tag("C++"), normalize_tag("???")
    ('cplusplus', '')
    """
    if _NORMALIZED.fullmatch(tag):
        return tag
    text = tag.strip().lower().replace("+", "plus").replace("#", "sharp")
    text = _SEPARATORS.sub("-", text)
    text = _PUNCTUATION.sub("", text)
    return _HYPHENS.sub("-", text).strip("-")


_PLAIN = re.compile(r"[a-z0-9-]*")
#: How many changes a canonicalizer remembers for ``changed_since``.
_CHANGES_KEPT = 64


def _last_part(tag: str) -> str:
    """The last hyphen-part of ``normalize_tag(tag)`` (a plain tag skips the regexes)."""
    if _PLAIN.fullmatch(tag):  # already lower-case, hyphenated and mark-free
        return tag.rstrip("-").rpartition("-")[2]
    return normalize_tag(tag).rpartition("-")[2]


def _fold_word(word: str, protected: Collection[str]) -> str:
    if word in _IRREGULAR:
        return _IRREGULAR[word]
    if len(word) <= 3 or not word.endswith("s") or word in _INVARIANT or word in protected:
        return word
    if _VOWEL.search(word) is None:  # an acronym: rdbms, dbms, llms
        return word
    if word.endswith("ies"):  # ties -> tie, cookies -> cookie, queries -> query
        short_or_ie = len(word) == 4 or word[:-1] in _IE_SINGULARS
        return word[:-1] if short_or_ie else word[:-3] + "y"
    if word.endswith("es") and word[:-2] in _S_SINGULARS:
        return word[:-2]
    if word.endswith("sses"):
        return word[:-2]
    if word.endswith(("xes", "shes", "zzes")):
        return word[:-2]
    if word.endswith("ches"):
        return word[:-1] if word[:-1] in _CHE_SINGULARS else word[:-2]
    return word if word.endswith(_KEEP_ENDINGS) else word[:-1]


def fold_plural(tag: str, *, protected: Iterable[str] = ()) -> str:
    """The singular of a normalized tag's last hyphen-part (rules plus exception lists).

    ``fold_plural(fold_plural(t)) == fold_plural(t)`` for every ``t``.

    >>> [fold_plural(t) for t in ["databases", "queries", "classes", "status", "news"]]
    ['database', 'query', 'class', 'status', 'news']
    """
    head, _, last = tag.rpartition("-")
    keep = protected if isinstance(protected, (set, frozenset)) else frozenset(protected)
    folded = _fold_word(last, keep)
    return f"{head}-{folded}" if head else folded


class AliasSuggestion(BaseModel):
    """A proposed ``alias`` → ``canonical`` pair with the evidence for it.

    ``distance`` is the Levenshtein distance between the two spellings; ``reason`` says which
    rule matched (``"edit distance 1"``, ``"hyphenation"``, ``"numeronym"``, ``"initialism"``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    alias: str
    canonical: str
    distance: int
    reason: str


class TagCanonicalizer:
    """Maps every spelling of a tag to one canonical form (see the module docstring).

    ``aliases`` maps alias → canonical (both are normalized and plural-folded first; chains
    are fine, cycles raise ``ConfigError``). ``protected`` lists words never plural-folded
    (names such as ``james`` or ``jenkins``; the common ones are built in).

    >>> canon = TagCanonicalizer()
    >>> canon.add_alias("k8s", "kubernetes")
    >>> canon.add_alias("kube", "k8s")
    >>> canon.canonical("Kube"), canon.aliases
    ('kubernetes', {'k8s': 'kubernetes', 'kube': 'kubernetes'})
    """

    def __init__(
        self, aliases: Mapping[str, str] | None = None, *, protected: Iterable[str] = ()
    ) -> None:
        self._aliases: dict[str, str] = {}
        self._protected: set[str] = {normalize_tag(w) for w in protected}
        self._cache: dict[str, str] = {}
        self._version = 0
        # The last changes, oldest first: (the version it made, the last parts it changed the
        # canonical forms of; ``None``: an alias, any tag's).
        self._changes: list[tuple[int, frozenset[str] | None]] = []
        for alias, canonical in (aliases or {}).items():
            self.add_alias(alias, canonical)

    def __repr__(self) -> str:
        return f"TagCanonicalizer({len(self._aliases)} aliases)"

    @property
    def version(self) -> int:
        """Grows whenever ``canonical`` may answer differently for some tag (an alias added or
        removed, a word protected that could fold): what a caller caching canonical forms
        compares to know its cache is still good."""
        return self._version

    def _changed(self, parts: frozenset[str] | None) -> None:
        self._version += 1
        self._changes.append((self._version, parts))
        del self._changes[:-_CHANGES_KEPT]

    def changed_since(self, version: int) -> frozenset[str] | None:
        """What may answer differently from ``canonical`` since ``version``: the tags whose
        ``last_part`` is one of the returned words (only names were protected since), or any
        tag (``None``: an alias changed, or ``version`` is older than the changes kept)."""
        if version == self._version:
            return frozenset()
        since = [parts for made, parts in self._changes if made > version]
        if len(since) != self._version - version or any(p is None for p in since):
            return None
        return frozenset().union(*since)  # type: ignore[arg-type]

    @staticmethod
    def last_part(tag: str) -> str:
        """The last hyphen-part of the normalized ``tag``: what protecting a name changes
        the canonical forms of (``changed_since``)."""
        return _last_part(tag)

    def normalize(self, tag: str) -> str:
        """``normalize_tag(tag)``: lower-case, hyphenated, punctuation-free; may be ``""``."""
        return normalize_tag(tag)

    def fold(self, tag: str) -> str:
        """Normalize ``tag`` and fold a plural last part: ``support-groups`` → ``support-group``."""
        return fold_plural(normalize_tag(tag), protected=self._protected)

    def protect(self, *words: str) -> None:
        """Never plural-fold these words (a name seen capitalised, e.g. ``Jenkins``)."""
        new = {normalize_tag(w) for w in words} - self._protected
        if new:
            self._protected |= new
            # Only a tag whose last part is one of these words can fold differently now: the
            # cached tags whose normalized last part is one are dropped, not the whole cache
            # (a conversation protects a name now and then, and each full clear made every
            # tag of the vocabulary pay for its canonical form again). The normalized form,
            # not the raw tag: ``Ree'ves`` holds no ``reeves`` but normalizes to it.
            folding = {w for w in new if _fold_word(w, ()) != _fold_word(w, (w,))}
            if folding:
                self._changed(frozenset(folding))
                self._cache = {
                    tag: found
                    for tag, found in self._cache.items()
                    if _last_part(tag) not in folding
                }

    def canonical(self, tag: str) -> str:
        """Normalize, fold, then follow aliases to the end: the one spelling to store.

        Idempotent: ``canonical(canonical(t)) == canonical(t)``. ``""`` stays ``""``.
        """
        found = self._cache.get(tag)
        if found is None:
            found = self._resolve(self.fold(tag))
            if len(self._cache) >= 65_536:
                self._cache.clear()
            self._cache[tag] = found
        return found

    def canonical_all(self, tags: Iterable[str]) -> list[str]:
        """``canonical`` of each tag, empty ones dropped, duplicates removed, order kept."""
        return list(dict.fromkeys(c for c in map(self.canonical, tags) if c))

    def _resolve(self, tag: str) -> str:
        seen = {tag}
        while tag in self._aliases:
            tag = self._aliases[tag]
            if tag in seen:  # unreachable through add_alias; kept as a guard
                break
            seen.add(tag)
        return tag

    def add_alias(self, alias: str, canonical: str) -> None:
        """Make ``alias`` resolve to ``canonical`` (and to wherever ``canonical`` resolves).

        Raises ``ConfigError`` when either side is empty after normalization or when the
        alias would close a cycle (``canonical`` already resolves to ``alias``).
        """
        source, target = self.fold(alias), self.fold(canonical)
        if not source or not target:
            raise ConfigError(
                f"an alias needs two non-empty tags, got {alias!r} -> {canonical!r} "
                f"(normalized: {source!r} -> {target!r})"
            )
        end = self._resolve(target)
        if end == source:
            raise ConfigError(
                f"alias {source!r} -> {target!r} would make a cycle ({target!r} already "
                f"resolves to {source!r}); remove the other alias first"
            )
        self._aliases[source] = target
        self._changed(None)
        self._cache.clear()

    def remove_alias(self, alias: str) -> bool:
        """Forget the alias ``alias``; whether there was one."""
        found = self._aliases.pop(self.fold(alias), None) is not None
        if found:
            self._changed(None)
        self._cache.clear()
        return found

    @property
    def alias_sources(self) -> frozenset[str]:
        """The aliases' own (folded) spellings, the tags whose canonical form is another."""
        return frozenset(self._aliases)

    @property
    def aliases(self) -> dict[str, str]:
        """Every alias with the tag it finally resolves to, sorted by alias."""
        return {alias: self._resolve(alias) for alias in sorted(self._aliases)}

    def suggest(
        self,
        tags: Iterable[str] | Mapping[str, int],
        *,
        max_distance: int = 2,
        min_length: int = 4,
    ) -> list[AliasSuggestion]:
        """Propose aliases among ``tags`` (a list with repeats, or a tag → count mapping).

        Tags are canonicalized first (so plurals and existing aliases already merge). Then:

        - **hyphenation**: ``data-base`` / ``database`` — same letters;
        - **edit distance**: both at least ``min_length`` long and at most
          ``min(max_distance, len(shorter) // 4)`` edits apart (``kubernetes`` /
          ``kubernets``; a short word gets fewer edits, so ``auth`` / ``math`` is not proposed);
        - **numeronym**: ``k8s`` → ``kubernetes`` (first letter, count, last letter);
        - **initialism**: ``ml`` → ``machine-learning`` when exactly one tag has those initials.

        The canonical side is the full form for numeronyms and initialisms, otherwise the more
        frequent tag, then the longer, then the alphabetically first. Sorted by distance, then
        alias.
        """
        from rapidfuzz import process
        from rapidfuzz.distance import Levenshtein

        counts: Counter[str] = Counter()
        items = tags.items() if isinstance(tags, Mapping) else ((t, 1) for t in tags)
        for tag, count in items:
            canonical = self.canonical(tag)
            if canonical:
                counts[canonical] += count
        names = sorted(counts)
        found: dict[str, AliasSuggestion] = {}

        def propose(a: str, b: str, reason: str, *, full: str | None = None) -> None:
            if full is None:  # the more frequent, then longer, then alphabetically first
                full = min((a, b), key=lambda t: (-counts[t], -len(t), t))
            alias = b if full == a else a
            if alias not in found:
                distance = Levenshtein.distance(alias, full)
                found[alias] = AliasSuggestion(
                    alias=alias, canonical=full, distance=distance, reason=reason
                )

        by_letters: dict[str, list[str]] = {}
        for name in names:
            by_letters.setdefault(name.replace("-", ""), []).append(name)
        for group in by_letters.values():
            for other in group[1:]:
                propose(group[0], other, "hyphenation")
        for i, a in enumerate(names):
            if len(a) < min_length:
                continue
            # ``extract`` scans every name in C; the rule on length is applied afterwards.
            near = process.extract(
                a, names, scorer=Levenshtein.distance, score_cutoff=max_distance, limit=None
            )
            for b, distance, j in near:
                allowed = min(max_distance, min(len(a), len(b)) // 4)
                if j > i and len(b) >= min_length and 0 < distance <= allowed:
                    propose(a, b, f"edit distance {int(distance)}")
        for short in names:
            match = _NUMERONYM.fullmatch(short)
            if match:
                first, middle, last = match[1], int(match[2]), match[3]
                full = [
                    n
                    for n in names
                    if "-" not in n and len(n) == middle + 2 and n[0] == first and n[-1] == last
                ]
                if len(full) == 1:
                    propose(short, full[0], "numeronym", full=full[0])
            elif "-" not in short and 2 <= len(short) <= 5:
                full = [
                    n for n in names if n.count("-") == len(short) - 1 and _initials(n) == short
                ]
                if len(full) == 1:
                    propose(short, full[0], "initialism", full=full[0])
        return sorted(found.values(), key=lambda s: (s.distance, s.alias))


def _initials(tag: str) -> str:
    return "".join(part[:1] for part in tag.split("-"))
