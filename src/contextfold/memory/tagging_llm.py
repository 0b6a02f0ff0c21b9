"""``LLMTagger``: topic tags from one chat-model call per text, falling back to keywords.

The model is shown the session's known tags (vocabulary feedback) and answers one JSON object;
its tags are canonicalized and filtered, and the regex intent detectors (``intent.py``) are
ORed in. Any failure — the call raises, no JSON, the wrong shape, no usable tag — is logged
and answered by the fallback tagger (a ``KeywordTagger`` by default), never raised.
``SupportsChat`` is what the tagger needs from a client.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contextfold._bounded import clip
from contextfold.errors import ConfigError
from contextfold.memory.canonical import TagCanonicalizer
from contextfold.memory.intent import detect_broad, detect_temporal
from contextfold.memory.tagging import KeywordTagger, Tagger, TagResult, _words

if TYPE_CHECKING:
    from contextfold.llm.openai_compat import Usage

__all__ = ["LLMTagger", "SupportsChat"]

# The logger of ``tagging.py``, where this tagger used to live: logging set up for the
# taggers keeps covering it.
logger = logging.getLogger("contextfold.memory.tagging")


class _ChatReply(Protocol):
    @property
    def text(self) -> str: ...

    @property
    def usage(self) -> Usage: ...


class SupportsChat(Protocol):
    """What ``LLMTagger`` needs from a client: ``chat(messages, model, **params)`` returning
    something with ``.text`` and ``.usage`` (``OpenAICompatibleClient`` qualifies)."""

    def chat(self, messages: list[dict[str, Any]], model: str, **params: Any) -> _ChatReply: ...


_GENERIC = _words(
    "general misc miscellaneous other others none unknown na n-a null untagged no-topic "
    "default topic tag"
)
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_MAX_TAG_CHARS = 48
_MAX_TAG_PARTS = 5


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tags: list[str]
    primary: str | None = None
    related_tags: list[str] = Field(default_factory=list)
    broad: bool = False
    temporal: bool = False


def _json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text``: inside a ``` fence if there is one, else anywhere."""
    decoder = json.JSONDecoder()
    for source in [*_FENCE.findall(text), text]:
        start = source.find("{")
        while start != -1:
            try:
                value, _ = decoder.raw_decode(source, start)
            except ValueError:
                value = None
            if isinstance(value, dict):
                return value
            start = source.find("{", start + 1)
    return None


_SYSTEM_PROMPT = """\
You tag the turns of a conversation by topic, for a memory system that later finds earlier \
turns by their tags. Reply with one JSON object and nothing else:
{{"tags": [...], "primary": "...", "related_tags": [...], "broad": false, "temporal": false}}

- "tags": {min_tags} to {max_tags} short topic tags, lower-case, words joined by hyphens \
(like "database", "support-group", "marathon-training"), most important first. Name the \
subject matter (people, places, projects, technologies, activities), not the form of the \
message: never "question", "request", "general" or "misc".
- Reuse a known tag whenever the message is about that topic; create a new tag only for a \
topic no known tag covers.
- "primary": the single most important of your tags.
- "related_tags": up to {max_tags} other words someone might use for the same topics \
(synonyms, broader or narrower terms), none of them repeated from "tags".
- "broad": true when the message asks about the whole conversation ("what did we discuss?", \
"summarize everything").
- "temporal": true when the message points at a time in the conversation ("at the \
beginning", "the first thing I asked", "last time")."""


class LLMTagger:
    """Tags from one chat-model call per text, with the session vocabulary in the prompt.

    The model answers JSON (a ```json fence or prose around it is fine); tags are
    canonicalized, generic ones ("general", "misc") and overlong ones dropped, and the regex
    detectors are OR-ed into ``broad``/``temporal``. On any failure — the call raises (HTTP
    error after retries, timeout), no JSON, a reply of the wrong shape, no usable tag — the
    ``fallback`` tagger (a ``KeywordTagger`` by default) answers instead, with
    ``source="keyword-fallback"`` and ``fallback_reason``; the failure is logged, never
    raised. ``on_usage(model, usage)`` is called after every completed call.

    ``min_tags``/``max_tags`` are asked for in the prompt; more than ``max_tags`` are cut.
    Texts of fewer than ``lookback_words`` words get up to three ``context`` turns in the
    prompt. ``params`` go into every chat request (default ``temperature=0``).
    """

    def __init__(
        self,
        client: SupportsChat,
        model: str,
        *,
        fallback: Tagger | None = None,
        min_tags: int = 1,
        max_tags: int = 6,
        lookback_words: int = 8,
        on_usage: Callable[[str, Usage], None] | None = None,
        canonicalizer: TagCanonicalizer | None = None,
        max_vocabulary: int = 200,
        max_chars: int = 6000,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        if not 1 <= min_tags <= max_tags:
            raise ConfigError(f"need 1 <= min_tags <= max_tags, got {min_tags} and {max_tags}")
        self.client = client
        self.model = model
        self.canonicalizer = canonicalizer if canonicalizer is not None else TagCanonicalizer()
        self.fallback: Tagger = (
            fallback if fallback is not None else KeywordTagger(canonicalizer=self.canonicalizer)
        )
        self.min_tags, self.max_tags = min_tags, max_tags
        self.lookback_words = lookback_words
        self.on_usage = on_usage
        self.max_vocabulary = max_vocabulary
        self.max_chars = max_chars
        self.params: dict[str, Any] = {"temperature": 0.0, **(params or {})}

    def __repr__(self) -> str:
        return f"LLMTagger(model={self.model!r}, fallback={type(self.fallback).__name__})"

    def messages(
        self, text: str, *, vocabulary: Sequence[str] = (), context: Sequence[str] = ()
    ) -> list[dict[str, Any]]:
        """The chat messages sent for ``text`` (exposed for inspection and tests)."""
        system = _SYSTEM_PROMPT.format(min_tags=self.min_tags, max_tags=self.max_tags)
        known = list(dict.fromkeys(t for t in vocabulary if t))[: self.max_vocabulary]
        parts = [f"Known tags: {', '.join(known)}" if known else "Known tags: (none yet)"]
        if context and len(text.split()) < self.lookback_words:
            earlier = "\n".join(f"- {turn[:500]}" for turn in context[-3:])
            parts.append(f"Earlier turns, for context only (tag the message below):\n{earlier}")
        parts.append(f"Message to tag:\n{text[: self.max_chars]}")
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": "\n\n".join(parts)},
        ]

    def tag(
        self, text: str, *, vocabulary: Sequence[str] = (), context: Sequence[str] = ()
    ) -> TagResult:
        if not text.strip():
            return TagResult(broad=False, temporal=False, source="llm")
        messages = self.messages(text, vocabulary=vocabulary, context=context)
        try:
            reply = self.client.chat(messages, self.model, **self.params)
        except Exception as exc:  # any client, any failure: fall back, never raise
            return self._fall_back(text, vocabulary, context, f"LLM call failed: {exc}")
        if self.on_usage is not None:
            self.on_usage(self.model, reply.usage)
        raw = _json_object(reply.text)
        if raw is None:
            return self._fall_back(
                text, vocabulary, context, f"no JSON object in the reply: {reply.text[:200]!r}"
            )
        try:
            parsed = _Reply.model_validate(raw)
        except ValidationError as exc:
            reason = f"reply has the wrong shape: {exc.errors()[0]['msg']} in {raw!r}"[:300]
            return self._fall_back(text, vocabulary, context, reason)
        tags = self._clean(parsed.tags)
        if not tags:
            return self._fall_back(
                text, vocabulary, context, f"no usable tags in the reply: {parsed.tags!r}"
            )
        primary = self.canonicalizer.canonical(parsed.primary or "")
        if primary in tags:
            tags.remove(primary)
            tags.insert(0, primary)
        tags = tags[: self.max_tags]
        related = [t for t in self._clean(parsed.related_tags) if t not in tags]
        return TagResult(
            tags=tuple(tags),
            related_tags=tuple(related[: self.max_tags]),
            broad=parsed.broad or detect_broad(text),
            temporal=parsed.temporal or detect_temporal(text),
            source="llm",
        )

    def _clean(self, tags: Sequence[str]) -> list[str]:
        kept = []
        for tag in tags:
            name = self.canonicalizer.canonical(str(tag))
            if (
                name
                and name not in _GENERIC
                and len(name) <= _MAX_TAG_CHARS
                and name.count("-") < _MAX_TAG_PARTS
            ):
                kept.append(name)
        return list(dict.fromkeys(kept))

    def _fall_back(
        self, text: str, vocabulary: Sequence[str], context: Sequence[str], reason: str
    ) -> TagResult:
        logger.warning("LLM tagging with %s fell back to keywords: %s", self.model, clip(reason))
        result = self.fallback.tag(text, vocabulary=vocabulary, context=context)
        return result.model_copy(update={"source": "keyword-fallback", "fallback_reason": reason})
