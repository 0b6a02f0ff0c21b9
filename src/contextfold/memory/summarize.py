"""Summarizers: turn a segment's turns (or a tag's segment summaries) into a shorter text.

Two implementations of one protocol:

* ``ExtractiveSummarizer`` (the offline default) keeps whole sentences, preferring the ones that
  carry names, numbers and dates, up to a target share of the input's tokens. Every sentence it
  keeps is verbatim, so a number or a name in the summary is never altered.
* ``LLMSummarizer`` asks a chat model (per-tag instructions; numbers, dates and names kept
  verbatim) and splits its own input into pieces that fit the model's window, summarising the
  pieces and then the joined piece summaries. When the model fails it falls back to the
  extractive summary, logs it, and says so in ``fallbacks`` — nothing is lost.

>>> from contextfold.tokens import CharCounter
>>> s = ExtractiveSummarizer(counter=CharCounter(), ratio=0.5, min_tokens=0)
>>> turn = "user: We met Dana Reyes on 3 May 2024. It was nice. We talked a lot."
>>> s.summarize([turn], max_tokens=40)
'user: We met Dana Reyes on 3 May 2024.'
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from contextfold._bounded import BoundedMemo, clip, text_size
from contextfold.errors import ContextfoldError
from contextfold.llm.openai_compat import ChatResult, Usage
from contextfold.tokens import TokenCounter
from contextfold.truncation import sentence_ends

__all__ = ["ChatModel", "ExtractiveSummarizer", "LLMSummarizer", "Summarizer"]

logger = logging.getLogger(__name__)


@runtime_checkable
class Summarizer(Protocol):
    """Summarises texts (in order) into at most ``max_tokens`` tokens.

    An implementation must keep numbers, dates and names verbatim, return at most ``max_tokens``
    tokens by its counter, never return an empty string for non-empty input, and be safe to
    call from several threads at once (the compactor summarises segments concurrently)."""

    def summarize(
        self,
        texts: Sequence[str],
        *,
        max_tokens: int,
        tags: Sequence[str] = (),
        instructions: str | None = None,
    ) -> str: ...


class ChatModel(Protocol):
    """What the LLM summarizer needs from a client (every contextfold chat client has it)."""

    def chat(self, messages: Sequence[dict[str, Any]], model: str, **params: Any) -> ChatResult: ...


_NUMBER = re.compile(r"\d")
_MONTH = re.compile(
    r"\b(jan(uary)?|feb(ruary)?|mar(ch)?|apr(il)?|may|june?|july?|aug(ust)?|sep(tember)?|"
    r"oct(ober)?|nov(ember)?|dec(ember)?|monday|tuesday|wednesday|thursday|friday|saturday|"
    r"sunday|yesterday|tomorrow|today|last (week|month|year)|next (week|month|year))\b",
    re.IGNORECASE,
)
# A capitalised word that is not the first word of its sentence (after an optional "name:").
_ENTITY = re.compile(r"(?<![.!?:]\s)(?<!^)\b[A-Z][a-zA-Z'’-]+")
_WORD = re.compile(r"\w+")
_SPEAKER = re.compile(r"^([^:\n]{1,40}):\s")


def _sentences(text: str) -> list[str]:
    out, start = [], 0
    for end in sentence_ends(text):
        piece = text[start:end].strip()
        if piece:
            out.append(piece)
        start = end
    return out


#: One text's scored sentences: ``(score, sentence with its speaker, lower-cased words)``.
_Scored = tuple[tuple[float, str, tuple[str, ...]], ...]


def _entry_size(scored: _Scored) -> int:
    """The bytes a memo entry's value holds, near enough (CPython: a tuple is 40 bytes and 8
    per item, a float 24, each sentence and word its own str), plus the memo's own entry."""
    size = 160 + 8 * len(scored)  # the tuple, the memo's (value, size) pair and its slot
    for _, sentence, words in scored:
        size += 64 + 24 + text_size(sentence) + 40 + 8 * len(words)
        size += sum(text_size(w) for w in words)
    return size


class ExtractiveSummarizer:
    """Keeps the sentences that carry entities, numbers and dates, to ``ratio`` of the input's
    tokens (never more than ``max_tokens``), in their original order.

    A turn written ``"speaker: text"`` keeps its speaker on each sentence taken from it, so
    who said what survives. Sentences are scored by their dates/times (3 each), numbers (2),
    names (1.5), words shared with the segment's tags (1) and the first sentence of a turn (1);
    ties keep the earlier sentence."""

    def __init__(
        self,
        counter: TokenCounter,
        *,
        ratio: float = 0.3,
        min_tokens: int = 24,
        cache_bytes: int = 16 * 2**20,
    ) -> None:
        if not 0 < ratio <= 1:
            raise ContextfoldError(f"ratio must be in (0, 1], got {ratio}")
        self.counter = counter
        self.ratio = ratio
        self.min_tokens = min_tokens
        # Bounded by entries and by ``cache_bytes``: each entry measured whole (its key, its
        # sentences and their words, ``_entry_size``), not by its key's text alone, which
        # is a quarter of it or less.
        self._cache: BoundedMemo[str, _Scored] = BoundedMemo(entries=50_000, max_bytes=cache_bytes)

    def __repr__(self) -> str:
        return f"ExtractiveSummarizer(ratio={self.ratio})"

    def _scored(self, text: str) -> _Scored:
        """The sentences of one text as ``(score without the tag bonus, sentence with its
        speaker, lower-cased words)``. Cached: tag summaries see the same segment-summary
        lines again at every compaction."""
        return self._cache.get(
            text, lambda: self._score(text), size=lambda v: text_size(text) + _entry_size(v)
        )

    def _score(self, text: str) -> _Scored:
        match = _SPEAKER.match(text)
        speaker = match.group(1) if match else None
        body = text[match.end() :] if match else text
        out = []
        for i, sentence in enumerate(_sentences(body)):
            words = tuple(_WORD.findall(sentence.lower()))
            score = 3.0 * len(_MONTH.findall(sentence))
            score += 2.0 * min(len(_NUMBER.findall(sentence)), 3)
            score += 1.5 * len(_ENTITY.findall(sentence))
            score += 1.0 if i == 0 else 0.0
            if len(words) < 4:
                score -= 1.0
            out.append((score, f"{speaker}: {sentence}" if speaker else sentence, words))
        return tuple(out)

    def _candidates(self, texts: Sequence[str], tags: Sequence[str]) -> list[tuple[float, str]]:
        tag_words = {w for tag in tags for w in _WORD.findall(tag.lower())}
        return [
            (score + sum(1.0 for w in words if w in tag_words), sentence)
            for text in texts
            for score, sentence, words in self._scored(text)
        ]

    def summarize(
        self,
        texts: Sequence[str],
        *,
        max_tokens: int,
        tags: Sequence[str] = (),
        instructions: str | None = None,
    ) -> str:
        del instructions  # an extractive summary has no prompt
        candidates = self._candidates(texts, tags)
        if not candidates:
            return ""
        total = sum(self.counter.count(t) for t in texts)
        target = min(max_tokens, max(self.min_tokens, int(total * self.ratio)))
        order = sorted(range(len(candidates)), key=lambda i: (-candidates[i][0], i))
        best = candidates[order[0]][1]
        used = self.counter.count(best) + 1
        if used > max_tokens:  # not even the best sentence fits: cut it, marked
            return self.counter.cut(best, max(1, max_tokens - 1)) + "…"
        chosen = [order[0]]  # the best sentence is always kept when it fits max_tokens
        for i in order[1:]:
            cost = self.counter.count(candidates[i][1]) + 1
            if used + cost <= target:
                chosen.append(i)
                used += cost
        return "\n".join(candidates[i][1] for i in sorted(chosen))


_SYSTEM_PROMPT = (
    "You summarise part of a conversation for a memory system. Keep every number, date, time, "
    "amount, name, place and decision exactly as written (copy them verbatim). Keep who said "
    "what. Write plain sentences, no preamble, at most {words} words."
)


class LLMSummarizer:
    """Summaries from a chat model, with the input split to fit the model's own window.

    ``context_window`` is the summarising model's window in tokens (by ``counter``); the input
    is cut into pieces of at most ``context_window - reserve`` tokens, each summarised, and
    the joined piece summaries are summarised again until one call covers them all.
    ``on_usage(model, usage)`` is called after each successful call (cost accounting)."""

    concurrent = True  # the compactor summarises segments in parallel threads

    def __init__(
        self,
        client: ChatModel,
        model: str,
        *,
        counter: TokenCounter,
        context_window: int = 8192,
        reserve: int = 1024,
        fallback: Summarizer | None = None,
        on_usage: Callable[[str, Usage], None] | None = None,
        temperature: float = 0.0,
    ) -> None:
        if context_window <= reserve + 64:
            raise ContextfoldError(
                f"context_window {context_window} leaves no room for input after the "
                f"{reserve}-token reserve; raise context_window or lower reserve"
            )
        self.client = client
        self.model = model
        self.counter = counter
        self.context_window = context_window
        self.reserve = reserve
        self.fallback = fallback if fallback is not None else ExtractiveSummarizer(counter)
        self.on_usage = on_usage
        self.temperature = temperature
        self._lock = threading.Lock()
        self.fallbacks: list[str] = []

    def __repr__(self) -> str:
        return f"LLMSummarizer(model={self.model!r}, context_window={self.context_window})"

    def _pieces(self, texts: Sequence[str]) -> list[list[str]]:
        room = self.context_window - self.reserve
        pieces: list[list[str]] = [[]]
        used = 0
        for text in texts:
            cost = self.counter.count(text) + 1
            if cost > room:  # one text alone is too long: cut it into windows of its own
                head = text
                while head:
                    part = self.counter.cut(head, room - 1)
                    if not part:
                        break
                    pieces.append([part])
                    head = head[len(part) :].lstrip()
                pieces.append([])
                used = 0
                continue
            if used + cost > room and pieces[-1]:
                pieces.append([])
                used = 0
            pieces[-1].append(text)
            used += cost
        return [p for p in pieces if p]

    def _call(self, texts: Sequence[str], max_tokens: int, tags: Sequence[str], extra: str) -> str:
        words = max(10, int(max_tokens * 0.7))
        system = _SYSTEM_PROMPT.format(words=words)
        if tags:
            system += f" The topics are: {', '.join(tags)}."
        if extra:
            system += "\n" + extra
        result = self.client.chat(
            [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(texts)}],
            self.model,
            max_tokens=max_tokens,
            temperature=self.temperature,
        )
        if self.on_usage is not None:
            self.on_usage(result.model, result.usage)
        text = result.text.strip()
        if not text:
            raise ContextfoldError("the model returned an empty summary")
        if self.counter.count(text) > max_tokens:
            text = self.counter.cut(text, max_tokens)
        return text

    def summarize(
        self,
        texts: Sequence[str],
        *,
        max_tokens: int,
        tags: Sequence[str] = (),
        instructions: str | None = None,
    ) -> str:
        if not any(t.strip() for t in texts):
            return ""
        try:
            layer = list(texts)
            while True:
                pieces = self._pieces(layer)
                if len(pieces) == 1:
                    return self._call(pieces[0], max_tokens, tags, instructions or "")
                layer = [self._call(p, max_tokens, tags, instructions or "") for p in pieces]
        except ContextfoldError as exc:
            reason = f"{type(exc).__name__}: {clip(str(exc))}"
            logger.warning("LLM summary failed, using the extractive summary: %s", reason)
            with self._lock:
                self.fallbacks.append(reason)
            return self.fallback.summarize(texts, max_tokens=max_tokens, tags=tags)
