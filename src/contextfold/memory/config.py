"""``contextfold.yaml``: the memory engine's configuration, validated by pydantic.

Every section has defaults, so an empty file is a valid configuration (the offline default:
keyword tagging, extractive summaries, MiniLM embeddings, SQLite in ``$CONTEXTFOLD_HOME``).
Unknown keys are errors — a misspelt option never silently does nothing.

>>> cfg = MemoryConfig.model_validate({"compaction": {"soft_threshold": 0.6}})
>>> cfg.compaction.soft_threshold, cfg.compaction.hard_threshold
(0.6, 0.85)
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from contextfold._envnames import check_env_name
from contextfold.config_loading import Float, Int, load_yaml
from contextfold.errors import ConfigError
from contextfold.memory.delegation import DEFAULT_TIERS
from contextfold.memory.rules import TagRule

__all__ = [
    "TEMPLATES",
    "AliasSettings",
    "AssemblySettings",
    "CompactionSettings",
    "HistorySettings",
    "LLMSettings",
    "MemoryConfig",
    "PagingSettings",
    "RecallSettings",
    "SplittingSettings",
    "TaggerSettings",
    "load_config",
    "template",
]

TEMPLATES = ("chat", "coding", "rag")


class _Section(BaseModel):
    # Errors never echo the input: a key pasted where a variable name belongs must not be
    # printed back (pydantic takes this setting from the outermost model validated).
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


class LLMSettings(_Section):
    """An optional LLM for tagging and summaries (any OpenAI-compatible endpoint, Anthropic or
    Gemini). The API key is read from the environment variable ``api_key_env``."""

    provider: Literal["openai", "ollama", "anthropic", "gemini"]
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    context_window: Int = Field(8192, gt=1088)
    timeout: Float = Field(60.0, gt=0)
    prompt_price_per_million: Float = Field(0.0, ge=0)
    completion_price_per_million: Float = Field(0.0, ge=0)

    @field_validator("api_key_env")
    @classmethod
    def _a_name_not_a_key(cls, value: str | None) -> str | None:
        return None if value is None else check_env_name(value)


class SplittingSettings(_Section):
    """Over-broad tags split into sub-tags (``memory/vocabulary.py``): a tag on at least
    ``frequency_threshold`` turns and ``frequency_pct_threshold`` of them is examined once,
    at most ``max_splits_per_turn`` tags per ``on_turn_complete``."""

    enabled: bool = False
    frequency_threshold: Int = Field(15, ge=2)
    frequency_pct_threshold: Float = Field(0.15, gt=0, le=1)
    max_splits_per_turn: Int = Field(1, ge=1)


class AliasSettings(_Section):
    """Automatic aliases: a new tag at least ``min_similarity`` alike (normalized Levenshtein
    similarity; or the same letters hyphenated otherwise) to a tag of the session, both at
    least ``min_length`` characters, becomes a session alias of the more frequent one
    (``kubernetez`` → ``kubernetes``). ``auto: false`` turns it off."""

    auto: bool = True
    min_similarity: Float = Field(0.9, gt=0, le=1)
    min_length: Int = Field(5, ge=2)


class TaggerSettings(_Section):
    """``type`` tags stored turns; ``inbound`` tags new messages before recall (closed set:
    only tags already stored, as tags or related tags, can match; ``llm`` also asks the model
    for related tags of the message, and needs an ``llm:`` section)."""

    type: Literal["keyword", "llm"] = "keyword"
    inbound: Literal["keyword", "embedding", "llm"] = "keyword"
    keywords: dict[str, list[str]] = Field(default_factory=dict)
    max_tags: Int = Field(5, ge=1, le=20)
    embedding_threshold: Float = Field(0.25, ge=-1, le=1)
    lookback_words: Int = Field(8, ge=0)
    # Known-tag entries (a tag's canonical form and stems) the keyword tagger keeps, made as
    # messages need them; all are dropped when the limit is reached or an alias changes.
    known_tag_cache: Int = Field(200_000, ge=1)
    splitting: SplittingSettings = SplittingSettings()
    aliases: AliasSettings = AliasSettings()


class CompactionSettings(_Section):
    soft_threshold: Float = Field(0.70, gt=0, le=1)
    hard_threshold: Float = Field(0.85, gt=0, le=1)
    protected_recent_turns: Int = Field(6, ge=0)
    max_concurrent_summaries: Int = Field(4, ge=1)
    summarizer: Literal["extractive", "llm"] = "extractive"
    summary_ratio: Float = Field(0.3, gt=0, le=1)
    tag_summary_tokens: Int = Field(200, ge=16)
    max_segment_tokens: Int = Field(2000, ge=64)
    # The extractive summarizer's memo of scored sentences (segment summaries come back at
    # every tag summary's roll-forward), in MB as really held (keys, sentences, words).
    summary_cache_mb: Float = Field(16, ge=0)
    # A compaction ``on_turn_complete`` trips: ``inline`` (the default: the library's two
    # hooks are synchronous, and the call returns its report) runs it inside the call;
    # ``background`` keeps it as a store-kept job that the engine's background thread runs
    # (a process stopped first leaves it to the next derive or job worker).
    run: Literal["inline", "background"] = "inline"

    @model_validator(mode="after")
    def _ordered(self) -> CompactionSettings:
        if self.soft_threshold > self.hard_threshold:
            raise ValueError(
                f"soft_threshold {self.soft_threshold} is above hard_threshold "
                f"{self.hard_threshold}; the soft one must come first"
            )
        return self


QUESTION_DEMOTION = 2.0
"""The default ``assembly.question_demotion``: on LoCoMo's tune split (conversations 1–5),
1.43, 1.67 and 2 gave the same recall 1–4 at 2,048 tokens (0.9156 / 0.9144 / 0.9155, against
0.9119 without it) and 2.5 less (0.9119); 2 is the round one of that plateau (docs/memory.md,
"Questions packed later")."""


class AssemblySettings(_Section):
    """``memory_budget``: tokens memory may add to one request (hint, paged topics,
    summaries and recalled turns together). The ``<context-topics>`` hint gets at most
    ``context_hint_max_tokens`` and at most ``context_hint_share`` of the request's budget,
    and lists at most ``context_hint_topics`` topics (the most discussed first).

    ``question_demotion``: a recalled turn that is a question (its text ends with ``?``) is
    packed as if recall had ranked it that many times further down (1 turns it off). A
    question echoes what is asked, so recall finds it, while the answer is in the turns
    around it (chosen on LoCoMo's tune split, docs/memory.md)."""

    memory_budget: Int = Field(2048, ge=64)
    context_hint_enabled: bool = True
    context_hint_max_tokens: Int = Field(200, ge=16, le=1000)
    context_hint_share: Float = Field(0.05, ge=0, le=1)
    context_hint_topics: Int = Field(12, ge=1, le=200)
    summary_share: Float = Field(0.6, ge=0, le=1)
    question_demotion: Float = Field(QUESTION_DEMOTION, ge=1)


RELEVANCE_FLOOR = 0.41
"""The default ``recall.relevance_floor`` (``true`` in a config file means this value): the
highest cosine floor whose recall loss at 2,048 tokens was at most half a point on LoCoMo's
tune split (conversations 1–5), with the default MiniLM embedder
(``benchmarks/calibrate_memory_floor.py``)."""

UNKNOWN_NAME_FLOOR = 0.54
"""The default ``recall.unknown_name_floor``: on LoCoMo's tune split, the lowest floor at which
the negative set's mean injected tokens at 2,048 fell to at most 25 (half the 50-token bar);
it cost 0.13 points of recall beyond ``RELEVANCE_FLOOR``
(``benchmarks/calibrate_memory_floor.py``)."""


COMMON_LIMIT = 300
"""The default ``recall.common_limit``: a query word or tag on more than this many of the
session's turns is left out of the full-text and tag signals. Chosen on LoCoMo's tune split
(conversations 1–5) against the issue's speed bar: the rows of such words are what a recall at
100k turns read beyond one at 1k, and at 300 the keyword recall at 100k fell from 1.9–2.7× the
1k figure to 1.26–1.46× on stored sessions (1.55× in one growth run,
``benchmarks/bench_memory_scale.py``). Applied at every size, recall 1–4 at 2,048 tokens went
0.9155 → 0.9147 and multi-hop 0.8106 → 0.8117 (1000, 500, 400, 300 and 200 compared in
docs/memory.md, "Steady recall as the session grows"); it applies only from
``COMMON_MIN_TURNS`` turns, so LoCoMo's conversations are ranked as before."""

COMMON_MIN_TURNS = 2000
"""The default ``recall.common_min_turns``: ``common_limit`` applies only to a session of at
least this many turns. Below it a word's rows are bounded by the session itself and a recall
costs what one at 1k turns does, so every word is kept: a conversation of LoCoMo's size (at
most 689 turns) is ranked as before the limit was lowered, and the limit's cost there (measured
by forcing it, docs/memory.md) is paid only where it buys the bound."""


ANN_MIN_TURNS: int | None = None
"""The default ``recall.ann_min_turns``: off. On this project's 2-core machine the exact scan of
a session's 384-d vectors (one core) stayed cheaper than an HNSW search that keeps
recall@300 (``fts_limit``) at 0.99 at every size measured: 18 ms against 52 ms at 100k turns,
where the HNSW search found only 97% of the exact top 300 (benchmarks/bench_turn_ann.py,
docs/memory.md "The dense path"). Set it to use the index above that many vectors."""


QUANTIZE_MIN_TURNS: int | None = 10_000
"""The default ``recall.quantize_min_turns``: from this many turn vectors a session's exact
scan reads an int8 copy of them (a quarter of the bytes) and rescores each query's best
candidates in float32 (docs/memory.md, "The dense path")."""


class RecallSettings(_Section):
    """How stored turns are ranked: the tag, full-text and dense signals, each scaled by its
    ``*_weight``, fused by ``fusion`` (``score``: min-max scaled scores summed; ``rrf``:
    reciprocal-rank fusion with constant ``rrf_k``); ``neighbor_weight`` gives each turn that
    share of its better neighbour's score (an answer sits next to its question);
    ``length_prior`` multiplies a turn's score by ``(tokens + 2) ** length_prior`` (short
    chit-chat rarely holds a fact); ``date_weight`` multiplies by ``1 + date_weight`` the
    score of a turn stored in the period the message names ("in January 2022") or up to
    ``date_slack_days`` after it (what happened is told soon after). The defaults are the
    values measured best on LoCoMo (docs/eval-locomo.md); the date ones were set before
    measuring and not tuned. ``vector_cache_mb`` bounds the turn vectors kept in memory for
    dense recall and the turns' token counts kept for the length prior, all sessions
    together (the least recently used session's are dropped first, and read back from the
    store when it is asked again). ``tag_limit`` caps the tag
    signal's candidates (the best by tag overlap; ``None``: every turn carrying a tag of the
    message), as ``fts_limit`` caps the full-text and dense ones. ``common_limit`` bounds
    what the full-text and tag signals read: a query word or tag on more than that many of
    the session's turns (a tag's counting those that carry it as a related tag) is left out
    of them (it tells few turns apart, and reading its turns is what grows with the
    conversation; ``None``: no limit), in a session of at least ``common_min_turns`` turns
    (below, a word's rows are bounded by the session, and every word is kept).

    ``ann_min_turns``: a session with at least this many turn vectors is searched through an
    HNSW index (``usearch``, the ``ann`` extra; ``null``, the default: always exact), with
    ``expansion_search`` ``max(ann_expansion, 4 × fts_limit)``; below it, one exact pass
    over the vectors for the message and its parts, cut between ``scan_threads`` threads
    from 32,768 vectors on (a part no thread has started when the recall's own part is done
    is scanned by the recall itself). ``quantize_min_turns``: from this many vectors (and
    below ``ann_min_turns``) that pass reads an int8 copy of them, which the recaller's
    worker keeps, and scores each query's best ``2 × fts_limit`` candidates again in float32
    (``null``: float32 only; rows stored since the copy was extended are scanned in
    float32). ``vector_files``: a file-backed SQLite
    store keeps each large session's vectors and index in files beside it
    (``<database>.vectors/``), so a restart maps them instead of reading every vector back
    (docs/memory.md, "Cost model").
    ``state_files``: such a store also keeps the recently used sessions' recall state (tag
    counts, related-tag counts, inbound vocabulary, turns' token counts and authors) in
    ``<database>.state/``, written when the engine closes, so the first recall after a restart
    reads one file instead of the store (``memory.snapshots``).

    ``relevance_floor``: memory is injected only when the message's best cosine similarity
    with a stored turn it could recall reaches this floor; below it the message gets no memory
    at all (no turns, summaries, paged topics or topic hint). ``null`` or ``false`` turns it
    off; it needs the dense signal (with ``embedder: none`` it is off).
    ``unknown_name_floor`` replaces it for a message that names something no stored turn
    contains (a capitalised word that does not open a sentence, months and weekdays aside:
    ``memory.relevance``); ``null`` or ``false`` turns that off.

    ``decompose``: a message that names people or things is also ranked in parts — one name
    kept at a time when it names several, and every name taken out — and the rankings are
    interleaved, so each part's best evidence gets a share of the budget
    (``memory.decompose``; chosen on LoCoMo's tune split, docs/memory.md). A long message (40
    words or more) is also ranked as its asking sentences (``question_focus``: the questions
    opening or closing it, around a pasted page), whose cosines the relevance floors judge
    beside the message's, and its name parts are made from them.

    ``author_weight``: a message that names the author of turns stored as ``"Name: text"``
    (a transcript's convention) has those turns' scores multiplied by ``1 + author_weight``
    — what a person did is mostly told in their own turns (``memory.authors``; chosen on
    LoCoMo's tune split, docs/memory.md; 0 turns it off). Turns without such a prefix, and
    messages naming no author, are ranked as without it."""

    embedder: Literal["minilm", "none"] = "minilm"
    fusion: Literal["score", "rrf"] = "score"
    rrf_k: Int = Field(20, ge=1)
    tag_weight: Float = Field(0.1, ge=0)
    fts_weight: Float = Field(1.0, ge=0)
    dense_weight: Float = Field(1.2, ge=0)
    neighbor_weight: Float = Field(0.5, ge=0, le=1)
    length_prior: Float = Field(0.3, ge=0, le=2)
    date_weight: Float = Field(0.5, ge=0)
    date_slack_days: Int = Field(14, ge=0)
    related_weight: Float = Field(0.5, ge=0, le=1)
    fts_limit: Int = Field(300, ge=10)
    vector_cache_mb: Float = Field(512, gt=0)
    tag_limit: Int | None = Field(1000, ge=10)
    common_limit: Int | None = Field(COMMON_LIMIT, ge=10)
    common_min_turns: Int = Field(COMMON_MIN_TURNS, ge=0)
    ann_min_turns: Int | None = Field(ANN_MIN_TURNS, ge=1000)
    ann_expansion: Int = Field(1600, ge=16)
    scan_threads: Int = Field(2, ge=1, le=64)
    quantize_min_turns: Int | None = Field(QUANTIZE_MIN_TURNS, ge=1000)
    vector_files: bool = True
    state_files: bool = True
    relevance_floor: Float | None = Field(RELEVANCE_FLOOR, ge=-1, le=1)
    unknown_name_floor: Float | None = Field(UNKNOWN_NAME_FLOOR, ge=-1, le=1)
    decompose: bool = True
    author_weight: Float = Field(1.0, ge=0)

    @field_validator("relevance_floor", "unknown_name_floor", mode="before")
    @classmethod
    def _floor_off(cls, value: object, info: ValidationInfo) -> object:
        if value is True:
            return RELEVANCE_FLOOR if info.field_name == "relevance_floor" else UNKNOWN_NAME_FLOOR
        return None if value is False else value


class PagingSettings(_Section):
    """``mode: tools`` offers memory tools to the model (automatic paging stays on as the
    fallback); ``auto`` pages topics silently. ``budget``: tokens paged-in topics may hold in
    total. ``tiers``: model-name fnmatch patterns for the ``weak`` tier (the topic list and
    ``expand_topic``; contextfold decides eviction) and the ``strong`` one (a budget
    dashboard, ``expand_topic`` / ``collapse_topic`` / ``find_quote``); a model no pattern
    matches is ``default_tier`` (``memory/delegation.py``)."""

    enabled: bool = True
    mode: Literal["auto", "tools"] = "auto"
    budget: Int = Field(4096, ge=0)
    tiers: dict[str, list[str]] = Field(
        default_factory=lambda: {k: list(v) for k, v in DEFAULT_TIERS.items()}
    )
    default_tier: Literal["weak", "strong"] = "strong"

    @field_validator("tiers")
    @classmethod
    def _known_tiers(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        unknown = sorted(set(value) - {"weak", "strong"})
        if unknown:
            raise ValueError(f"unknown tier(s) {', '.join(unknown)}; the tiers are weak, strong")
        return value


class HistorySettings(_Section):
    """``filter_off_topic`` drops live-history turns whose tags miss the inbound tags (off by
    default: it re-cuts the history every turn, which defeats provider prompt caches)."""

    filter_off_topic: bool = False


class MemoryConfig(_Section):
    """``store``: where memory lives — an SQLite file (default
    ``$CONTEXTFOLD_HOME/memory.db``) or a ``postgresql://`` URL shared by many processes;
    ``$CONTEXTFOLD_STORE_URL`` overrides it. ``storage_path`` is its older name."""

    version: Literal["1"] = "1"
    storage_path: str | None = None
    store: str | None = None
    context_window: Int = Field(120_000, ge=512)
    encoding: Literal["cl100k_base", "o200k_base"] = "cl100k_base"
    tagger: TaggerSettings = TaggerSettings()
    tag_rules: list[TagRule] = Field(default_factory=list)
    compaction: CompactionSettings = CompactionSettings()
    assembly: AssemblySettings = AssemblySettings()
    recall: RecallSettings = RecallSettings()
    paging: PagingSettings = PagingSettings()
    history: HistorySettings = HistorySettings()
    llm: LLMSettings | None = None
    # Per-session state kept in memory (tag vocabulary, topic hint and tag summaries, turn
    # vectors, turn keys) for at most this many sessions, least recently used out first; a
    # session that falls out is read back from the store when it is next asked for.
    cached_sessions: Int = Field(1000, ge=1)
    # The engine's token counter remembers the counts of at most ``token_cache`` texts of at
    # most ``token_cache_chars`` characters (0: none); longer texts are counted every time.
    token_cache: Int = Field(16_384, ge=0)
    token_cache_chars: Int = Field(1_024, ge=0)

    @field_validator("version", mode="before")
    @classmethod
    def _supported_version(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # ``version: 1`` unquoted
        if value != "1":
            shown = repr(value) if isinstance(value, str) else "true or false"
            if not isinstance(value, str | bool):
                shown = f"a {type(value).__name__}"
            raise ValueError(
                f"{shown} is not supported: this contextfold reads version "
                '"1" (write version: "1", or leave the key out)'
            )
        return value

    @field_validator("tag_rules", mode="before")
    @classmethod
    def _rule_numbers(cls, value: object) -> object:
        if isinstance(value, list):
            for i, rule in enumerate(value):
                for key in ("priority", "ttl_days"):
                    if isinstance(rule, dict) and isinstance(rule.get(key), bool):
                        raise ValueError(
                            f"tag_rules[{i}].{key}: expected a number, got true or false"
                        )
        return value

    @field_validator("store", "storage_path")
    @classmethod
    def _a_store(cls, value: str | None) -> str | None:
        """An SQLite file or a PostgreSQL URL in the spelling psycopg reads; any other URL is
        an error (never a file named after it)."""
        if value is None:
            return None
        from contextfold.store import configured_location

        try:
            return configured_location(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _one_store(self) -> MemoryConfig:
        if self.store is not None and self.storage_path is not None:
            raise ValueError(
                "store and storage_path are both given (storage_path is store's older name); "
                "give only one of them"
            )
        return self

    @model_validator(mode="after")
    def _llm_when_needed(self) -> MemoryConfig:
        wants = [
            name
            for name, on in (
                ("tagger.type: llm", self.tagger.type == "llm"),
                ("tagger.inbound: llm", self.tagger.inbound == "llm"),
                ("compaction.summarizer: llm", self.compaction.summarizer == "llm"),
            )
            if on
        ]
        if wants and self.llm is None:
            raise ValueError(f"{' and '.join(wants)} need an `llm:` section (provider, model)")
        return self


def _describe(error: ValidationError) -> str:
    lines = []
    for err in error.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {where}: {err['msg'].removeprefix('Value error, ')}")
    return "\n".join(lines)


def parse_config(data: Any, *, source: str = "configuration") -> MemoryConfig:
    """Validate already-loaded YAML data; errors name each bad field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    _server_keys_here(source, data)
    try:
        return MemoryConfig.model_validate(data)
    except ValidationError as exc:
        count = exc.error_count()
        raise ConfigError(
            f"{source}: {count} invalid setting{'s' if count > 1 else ''}:\n{_describe(exc)}"
        ) from None


def _server_keys_here(source: str, data: dict[Any, Any]) -> None:
    """``ConfigError`` when a memory config holds server-config keys (``host``, ``port``,
    ``proxy``, ...): saying which file each kind belongs in, rather than "extra inputs are not
    permitted" for each of them."""
    from contextfold.server.config import ServerConfig

    server = [str(k) for k in data if k in ServerConfig.model_fields]
    if not server:
        return
    memory = [str(k) for k in data if k in MemoryConfig.model_fields]
    if not memory:
        raise ConfigError(
            f"{source}: this looks like a server config ({', '.join(server)}), not a memory "
            f"config: start the server with `contextfold serve -c {source}`; memory settings "
            "go in a separate contextfold.yaml that it names with `memory_config: FILE`"
        )
    raise ConfigError(
        f"{source}: mixes server keys ({', '.join(server)}) and memory keys "
        f"({', '.join(memory)}); they go in two files: a server config (`contextfold serve "
        "-c FILE`) that names the memory config (contextfold.yaml) with `memory_config: FILE`"
    )


def load_config(path: str | Path) -> MemoryConfig:
    """Read and validate ``contextfold.yaml``; a missing file, a YAML syntax error (with its
    line) or an invalid setting raises ``ConfigError``."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"config file {str(file)!r} not found; create one with `contextfold init chat`"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {str(file)!r}: {exc}") from None
    return parse_config(load_yaml(text, str(file)), source=str(file))


def template(kind: str) -> str:
    """The commented starter ``contextfold.yaml`` for ``kind`` (chat, coding or rag)."""
    if kind not in TEMPLATES:
        raise ConfigError(f"unknown template {kind!r}; choose one of {', '.join(TEMPLATES)}")
    return (resources.files("contextfold.memory") / "templates" / f"{kind}.yaml").read_text(
        encoding="utf-8"
    )
