"""Tag rules: per-tag-family priority, time-to-live and summary prompt, matched by fnmatch pattern.

A rule's ``match`` is a shell-style pattern (``architecture*``, ``debug-*``, ``*-meeting``)
tested against the canonical tag; the first matching rule wins, and a tag no rule matches gets
the default rule (``*``, priority 5, no expiry, the standard summary prompt).

>>> rules = TagRules([TagRule(match="debug*", priority=7, ttl_days=7), TagRule(match="arch*")])
>>> rules.priority("debugging"), rules.priority("architecture"), rules.priority("recipes")
(7, 5, 5)
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field

from contextfold.errors import ConfigError

__all__ = ["DEFAULT_RULE", "TagRule", "TagRules"]


class TagRule(BaseModel):
    """How tags matching ``match`` (an fnmatch pattern, case-insensitive) are treated.

    ``priority`` ranks tag families when memory must choose what to keep or page in (higher
    first); ``ttl_days`` is how long after its last mention a tag counts as expired (``None``:
    never); ``summary_prompt`` replaces the default instructions when the tag is summarized.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    match: str = Field(min_length=1)
    priority: int = 5
    ttl_days: float | None = Field(default=None, gt=0)
    summary_prompt: str | None = None


DEFAULT_RULE = TagRule(match="*")


class TagRules:
    """An ordered list of ``TagRule``; ``for_tag`` returns the first that matches.

    Lookups are cached per tag, so asking for the same tag on every turn is a dictionary hit.
    Validate rules from YAML with ``TagRules.from_config([{"match": "debug*", ...}, ...])``.
    """

    def __init__(self, rules: Sequence[TagRule] = ()) -> None:
        self._rules = tuple(rules)
        self._patterns = tuple(
            re.compile(fnmatch.translate(rule.match.lower())) for rule in self._rules
        )
        self._lookup = lru_cache(maxsize=4096)(self._first_match)
        #: Whether any rule has a TTL: without one no tag expires, and a caller looking for
        #: the tags that may need not ask about each tag of a session.
        self.has_ttl = any(rule.ttl_days is not None for rule in self._rules)

    @classmethod
    def from_config(cls, rules: Sequence[dict[str, object]]) -> TagRules:
        """Rules from plain mappings (a YAML ``tag_rules`` list); bad fields raise pydantic's
        ``ValidationError`` naming the field."""
        return cls([TagRule.model_validate(rule) for rule in rules])

    def __repr__(self) -> str:
        return f"TagRules({list(self._rules)!r})"

    def __len__(self) -> int:
        return len(self._rules)

    @property
    def rules(self) -> tuple[TagRule, ...]:
        return self._rules

    def _first_match(self, tag: str) -> TagRule:
        name = tag.lower()
        for rule, pattern in zip(self._rules, self._patterns, strict=True):
            if pattern.match(name):
                return rule
        return DEFAULT_RULE

    def for_tag(self, tag: str) -> TagRule:
        """The first rule whose pattern matches ``tag``; ``DEFAULT_RULE`` when none does."""
        return self._lookup(tag) if self._rules else DEFAULT_RULE

    def priority(self, tag: str) -> int:
        return self.for_tag(tag).priority

    def expired(self, tag: str, last_seen: datetime, now: datetime) -> bool:
        """Whether more than the rule's ``ttl_days`` have passed between ``last_seen`` and
        ``now`` (never, for a rule without a TTL). Both datetimes must be timezone-aware, or
        both naive."""
        ttl = self.for_tag(tag).ttl_days
        if ttl is None:
            return False
        if (last_seen.tzinfo is None) != (now.tzinfo is None):
            raise ConfigError(
                f"expired({tag!r}) got one timezone-aware and one naive datetime "
                f"(last_seen={last_seen.isoformat()}, now={now.isoformat()}); use aware "
                "datetimes (datetime.now(UTC)) for both"
            )
        return now - last_seen > timedelta(days=ttl)
