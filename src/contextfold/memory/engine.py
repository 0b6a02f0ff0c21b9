"""``MemoryEngine``: two hooks around an LLM call give a conversation unbounded memory.

``on_message_inbound(message, history)`` runs before the call: it tags the message (closed
set: only stored tags can match; broad and temporal questions are detected), recalls stored
turns and summaries, pages topics in, and returns an ``AssembledContext`` whose
``prepend_text`` fits the memory budget. ``on_turn_complete(messages)`` runs after it: it
stores the new turns raw, tags them, and compacts when the live turns cross a threshold.

>>> from contextfold.store.sqlite.memory import MemoryStore
>>> engine = MemoryEngine(store=MemoryStore(), embedder=None)
>>> _ = engine.on_turn_complete([
...     {"role": "user", "content": "Our Henninger filing deadline is March 3."},
...     {"role": "assistant", "content": "Noted: the Henninger filing is due March 3."},
... ])
>>> "March 3" in engine.on_message_inbound("When is the Henninger filing due?").prepend_text
True
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from contextfold import telemetry
from contextfold._bounded import SessionLRU
from contextfold.errors import ConfigError, FormatError
from contextfold.formats.openai import message_from_dict
from contextfold.items import ContextItem, Message, QueryBundle
from contextfold.memory.assemble import (
    MIN_MEMORY_TOKENS,
    Assembler,
    Held,
    MemoryBlock,
    MemoryBudget,
    Room,
)
from contextfold.memory.authors import OPENING_CHARS
from contextfold.memory.background import Background
from contextfold.memory.canonical import TagCanonicalizer
from contextfold.memory.compactor import CompactionReport, Compactor, Level, TokenMonitor
from contextfold.memory.config import MemoryConfig, load_config
from contextfold.memory.delegation import TIER_TOOLS, Delegation, Tier, tier_of
from contextfold.memory.history import FilteredHistory, filter_history
from contextfold.memory.paging import Pager, PagingResult
from contextfold.memory.recall import Quote, RankedTurn, Recaller
from contextfold.memory.relevance import KnownNames, names_in
from contextfold.memory.rules import TagRules
from contextfold.memory.snapshots import SAVED_SESSIONS, SessionState, StateFiles
from contextfold.memory.summarize import ExtractiveSummarizer, LLMSummarizer, Summarizer
from contextfold.memory.tagging import (
    GROUPS_KEY,
    EmbeddingTagger,
    KeywordTagger,
    LLMTagger,
    Tagger,
    TagResult,
)
from contextfold.memory.tools import run_tool_call, tool_definitions
from contextfold.memory.turn_index import VectorFiles
from contextfold.memory.turn_lengths import line_key
from contextfold.memory.turnkeys import TurnKeys, key_of
from contextfold.memory.vocabulary import SplitReport, Vocabulary
from contextfold.retrieval.base import Embedder
from contextfold.store import open_memory_store, store_url
from contextfold.store.models import WRITE_CHUNK, CostReport, Depth, PendingDerive
from contextfold.store.protocols import MemoryStorage
from contextfold.store.sqlite import home_dir
from contextfold.tokens import TiktokenCounter, TokenCounter

__all__ = ["AssembledContext", "MemoryEngine", "MemoryStatus"]

log = logging.getLogger(__name__)

MessageLike = Message | Mapping[str, Any]


class AssembledContext(BaseModel):
    """What memory adds to one request. ``prepend_text`` is the rendered memory block (put it
    after the stable system prompt); ``items`` are the same pieces as ``ContextItem``s for a
    ``ContextPipeline``; ``budget`` says where the memory budget went; ``history`` is the
    filtered live history when one was given."""

    model_config = ConfigDict(frozen=True)
    session_id: str
    prepend_text: str
    matched_tags: tuple[str, ...]
    related_tags: tuple[str, ...]
    broad: bool
    temporal: bool
    items: tuple[ContextItem, ...]
    budget: MemoryBudget
    recalled: tuple[RankedTurn, ...]
    history: FilteredHistory | None = None
    tagger: str = "keyword"
    expired_tags: tuple[str, ...] = ()  # tags whose TTL ran out: their turns not recalled
    expired_turns: int = 0  # stored turns those tags held back from recall
    #: The session's turns with no vector yet when it was recalled: ranked by full text and
    #: tags only (recall never embeds them; the derived work does).
    unembedded: int = 0
    #: Why no memory was given although turns were ranked: the relevance floors
    #: (``recall.relevance_floor``, ``recall.unknown_name_floor``); ``None`` otherwise.
    withheld: str | None = None
    #: What the request's window left for memory beside the history kept (``room``; below
    #: ``MIN_MEMORY_TOKENS``: no memory); ``None`` when no room was given.
    room_left: int | None = None


class MemoryStatus(BaseModel):
    """A session's memory at a glance. ``level``: the compaction threshold its live tokens
    cross, as shares of what the window leaves them beside the tokens each of its requests
    carries besides its history (``MemoryEngine.note_fixed_tokens``, ``TokenMonitor.level``)."""

    model_config = ConfigDict(frozen=True)
    session_id: str
    turns: int
    live_turns: int
    live_tokens: int
    context_window: int
    level: Level
    compaction_watermark: int
    segments: int
    tags: dict[str, int]
    tag_summaries: int
    stale_tag_summaries: int
    working_set: dict[str, str]


def as_message(value: MessageLike) -> Message:
    """``value`` as a ``Message``: a mapping in contextfold's own shape or OpenAI's (with
    ``tool_calls`` / ``tool_call_id``; see ``message_from_dict``)."""
    if isinstance(value, Message):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"not a chat message: expected a message object, got {type(value).__name__} "
            f"{str(value)[:120]!r}"
        )
    try:
        return message_from_dict(value)
    except FormatError as exc:
        raise ConfigError(f"not a chat message: {exc} (in {str(dict(value))[:120]!r})") from None


def _messages_arg(name: str, value: object) -> None:
    """``ConfigError`` unless ``value`` is a list of messages (one message, a str, None or a
    number is not: they would be iterated as fields or characters, or fail deep inside)."""
    if type(value) is list or type(value) is tuple:  # the common case, checked first
        return
    if isinstance(value, str | bytes | Mapping | Message) or not isinstance(value, Iterable):
        raise ConfigError(
            f"{name} must be a list of chat messages (Message objects or dicts; an empty "
            f"list for none), got {type(value).__name__} {str(value)[:80]!r}"
        )


def _count_arg(name: str, value: object, what: str) -> None:
    """``ConfigError`` unless ``value`` is a whole number >= 0 (a bool is not a number here)."""
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(
            f"{name} must be a whole number of {what} (>= 0), got {type(value).__name__} {value!r}"
        )
    if value < 0:
        raise ConfigError(f"{name} must be a whole number of {what} (>= 0), got {value!r}")


_STRIPES = 256
#: Derived turns read with the new ones when a derive begins: the tagger's context.
_CONTEXT = 3


def _hash_key(message: Message) -> tuple[str, str]:
    return (message.role, message.text())


class MemoryEngine:
    """The conversation memory of one store, for any number of sessions.

    Build it from a ``MemoryConfig`` (or ``config_path`` to a ``contextfold.yaml``) and
    optionally override parts: ``store`` (a store, a path or a ``postgresql://`` URL),
    ``tagger`` (tags stored turns), ``inbound_tagger`` (tags new messages; closed set),
    ``summarizer``, ``embedder`` (``"default"``: offline MiniLM; ``None``: no dense recall),
    ``counter``, ``llm_client``.
    ``session_id`` is the session the hooks use when they are not given one."""

    def __init__(
        self,
        config: MemoryConfig | None = None,
        *,
        config_path: str | Path | None = None,
        store: MemoryStorage | str | Path | None = None,
        session_id: str = "default",
        tagger: Tagger | None = None,
        inbound_tagger: Tagger | None = None,
        summarizer: Summarizer | None = None,
        embedder: Embedder | Literal["default"] | None = "default",
        counter: TokenCounter | None = None,
        llm_client: Any = None,
    ) -> None:
        if config is not None and config_path is not None:
            raise ConfigError("pass either config or config_path, not both")
        self.config = (
            load_config(config_path)
            if config_path is not None
            else config
            if config is not None
            else MemoryConfig()
        )
        cfg = self.config
        self.counter = (
            counter
            if counter is not None
            else TiktokenCounter(
                cfg.encoding, cache_size=cfg.token_cache, cache_text_chars=cfg.token_cache_chars
            )
        )
        if store is not None and not isinstance(store, str | Path):
            self.store = store
        else:
            where = store or store_url(cfg.store or cfg.storage_path) or home_dir() / "memory.db"
            self.store = open_memory_store(where, counter=self.counter)
        self.session_id = session_id
        self.rules = TagRules(cfg.tag_rules)
        self.canonicalizer = TagCanonicalizer(self.store.vocab.aliases())
        # A client built here from the config is closed by close(); one passed in is the
        # caller's to close.
        self._owns_client = llm_client is None
        self.llm_client = llm_client if llm_client is not None else self._make_client()
        if embedder == "default":
            embedder = self._default_embedder()
        self.embedder: Embedder | None = embedder
        keyword = KeywordTagger(
            cfg.tagger.keywords or None,
            max_tags=cfg.tagger.max_tags,
            canonicalizer=self.canonicalizer,
            cache_limit=cfg.tagger.known_tag_cache,
        )
        self.tagger: Tagger = tagger if tagger is not None else self._make_tagger(keyword)
        self.inbound_tagger: Tagger = (
            inbound_tagger if inbound_tagger is not None else self._make_inbound(keyword)
        )
        self.summarizer: Summarizer = summarizer or self._make_summarizer()
        self.vocab = Vocabulary(
            self.store,
            cfg.tagger,
            self.canonicalizer,
            self.rules,
            llm=self.llm_client if cfg.llm is not None else None,
            model=cfg.llm.model if cfg.llm is not None else None,
            on_usage=self._log_usage("splitting"),
            sessions=cfg.cached_sessions,
        )
        self.last_splits: list[SplitReport] = []
        self.compactor = Compactor(
            self.store,
            self.summarizer,
            TokenMonitor(
                cfg.context_window,
                soft=cfg.compaction.soft_threshold,
                hard=cfg.compaction.hard_threshold,
            ),
            protected_recent=cfg.compaction.protected_recent_turns,
            rules=self.rules,
            summary_ratio=cfg.compaction.summary_ratio,
            tag_summary_tokens=cfg.compaction.tag_summary_tokens,
            max_segment_tokens=cfg.compaction.max_segment_tokens,
            max_concurrent=cfg.compaction.max_concurrent_summaries,
        )
        self.recaller = Recaller(
            self.store,
            embedder=self.embedder,
            k=cfg.recall.rrf_k,
            fts_limit=cfg.recall.fts_limit,
            related_weight=cfg.recall.related_weight,
            weights={
                "tags": cfg.recall.tag_weight,
                "fts": cfg.recall.fts_weight,
                "dense": cfg.recall.dense_weight,
            },
            neighbor_weight=cfg.recall.neighbor_weight,
            fusion=cfg.recall.fusion,
            length_prior=cfg.recall.length_prior,
            date_weight=cfg.recall.date_weight,
            date_slack_days=cfg.recall.date_slack_days,
            vector_cache_bytes=int(cfg.recall.vector_cache_mb * 2**20),
            tag_limit=cfg.recall.tag_limit,
            common_limit=cfg.recall.common_limit,
            common_min_turns=cfg.recall.common_min_turns,
            ann_min_turns=cfg.recall.ann_min_turns,
            ann_expansion=cfg.recall.ann_expansion,
            scan_threads=cfg.recall.scan_threads,
            quantize_min_turns=cfg.recall.quantize_min_turns,
            vector_dir=self._vector_dir(),
            decompose=cfg.recall.decompose,
            author_weight=cfg.recall.author_weight,
        )
        self.pager = Pager(self.store, budget=cfg.paging.budget)
        self.delegation = Delegation(
            self.store, self.pager, self.counter, sessions=cfg.cached_sessions
        )
        self.assembler = Assembler(
            self.store, self.counter, self.rules, cfg.assembly, sessions=cfg.cached_sessions
        )
        self.recaller.cached_sessions = cfg.cached_sessions
        # Per-session state, for the ``cached_sessions`` most recently used sessions: each is
        # read back from the store when it is asked for again.
        # The vocabulary is kept with the session's generation it was read at
        # (``MemoryStorage.session_version``): another process's tags make it stale.
        self._vocab: SessionLRU[tuple[int, dict[str, int]]] = SessionLRU(cfg.cached_sessions)
        # The tokens each request of a session carries besides its history
        # (``note_fixed_tokens``), counted with its live turns when compaction is judged.
        self._fixed: SessionLRU[int] = SessionLRU(cfg.cached_sessions)
        self._turn_keys = TurnKeys(self.store, sessions=cfg.cached_sessions)
        self._known_names = KnownNames(self.store, sessions=cfg.cached_sessions)
        # One lock per session (striped: a bounded set shared by hash), so a session only ever
        # waits on itself; ``_derive_locks`` keep one session's derived work in order without
        # holding up its requests.
        self._locks = [threading.RLock() for _ in range(_STRIPES)]
        self._derive_locks = [threading.Lock() for _ in range(_STRIPES)]
        # Compactions run under their own lock, so new turns are tagged while one runs.
        self._compact_locks = [threading.Lock() for _ in range(_STRIPES)]
        # Compactions ``on_turn_complete`` trips, with ``compaction.run: background``.
        self.background = Background(self.store, self.derive)
        self._vocab_lock = threading.Lock()
        self._usage = threading.local()
        self.compactor.on_compacted = self._rewarm
        folder = self._beside_store(".state") if cfg.recall.state_files else None
        self._states = StateFiles(folder) if folder is not None else None

    def __repr__(self) -> str:
        return f"MemoryEngine(store={self.store.path!r}, session={self.session_id!r})"

    # -- construction helpers -------------------------------------------------------------------

    def _make_client(self) -> Any:
        llm = self.config.llm
        if llm is None:
            return None
        from contextfold.llm.factory import make_chat_client

        return make_chat_client(
            llm.provider, base_url=llm.base_url, api_key_env=llm.api_key_env, timeout=llm.timeout
        )

    def _default_embedder(self) -> Embedder | None:
        if self.config.recall.embedder == "none":
            return None
        from contextfold.retrieval.embedders import default_embedder

        return default_embedder()

    def _log_usage(self, kind: str) -> Any:
        llm = self.config.llm

        def record(model: str, usage: Any) -> None:
            cost = 0.0
            if llm is not None:
                cost = (
                    usage.prompt_tokens * llm.prompt_price_per_million
                    + usage.completion_tokens * llm.completion_price_per_million
                ) / 1e6
            # Attributed to the session whose work made the call (``derive`` sets it).
            sid = getattr(self._usage, "session_id", None) or self.session_id
            self.store.costs.log_cost(
                sid, kind, model, usage.prompt_tokens, usage.completion_tokens, cost
            )

        return record

    def _make_tagger(self, keyword: KeywordTagger) -> Tagger:
        cfg = self.config
        if cfg.tagger.type == "llm" and cfg.llm is not None:
            return LLMTagger(
                self.llm_client,
                cfg.llm.model,
                fallback=keyword,
                max_tags=cfg.tagger.max_tags,
                lookback_words=cfg.tagger.lookback_words,
                on_usage=self._log_usage("tagging"),
            )
        return keyword

    def _make_inbound(self, keyword: KeywordTagger) -> Tagger:
        cfg = self.config
        if cfg.tagger.inbound == "llm" and cfg.llm is not None:
            return LLMTagger(
                self.llm_client,
                cfg.llm.model,
                fallback=keyword,
                max_tags=cfg.tagger.max_tags,
                on_usage=self._log_usage("tagging"),
            )
        if self.config.tagger.inbound == "embedding":
            if self.embedder is None:
                raise ConfigError("tagger.inbound: embedding needs an embedder (recall.embedder)")
            return EmbeddingTagger(self.embedder, threshold=self.config.tagger.embedding_threshold)
        return keyword

    def _make_summarizer(self) -> Summarizer:
        cfg = self.config
        extractive = ExtractiveSummarizer(
            self.counter,
            ratio=cfg.compaction.summary_ratio,
            cache_bytes=int(cfg.compaction.summary_cache_mb * 2**20),
        )
        if cfg.compaction.summarizer == "llm" and cfg.llm is not None:
            return LLMSummarizer(
                self.llm_client,
                cfg.llm.model,
                counter=self.counter,
                context_window=cfg.llm.context_window,
                fallback=extractive,
                on_usage=self._log_usage("summary"),
            )
        return extractive

    # -- sessions -------------------------------------------------------------------------------

    def lock(self, session_id: str | None = None) -> threading.RLock:
        """The lock that keeps one session's reads and writes in order (sessions never wait
        on each other, bar the rare two that share a stripe)."""
        return self._locks[hash(self._sid(session_id)) % _STRIPES]

    def _sid(self, session_id: str | None) -> str:
        """``session_id``, or the engine's default session for ``None``; ``ConfigError`` for
        an empty one or one that is no string (it wrote to the default session, so two
        users whose ids came out empty shared one memory)."""
        if session_id is None:
            return self.session_id
        if not isinstance(session_id, str) or not session_id.strip():
            raise ConfigError(
                f"session_id must be a non-empty string (None for the default session "
                f"{self.session_id!r}), got {session_id!r}"
            )
        return session_id

    def _session(self, session_id: str | None) -> str:
        sid = self._sid(session_id)
        # Cached: known to exist, unless another process has deleted it since.
        if sid not in self._vocab or self.store.session_version(sid) is None:
            with self.lock(sid):
                try:
                    self.store.session(sid)
                except ConfigError:
                    # Created meanwhile by another thread or process: as good.
                    with contextlib.suppress(ConfigError):
                        self.store.create_session(sid)
                self._counts(sid)
        return sid

    def _counts(self, sid: str) -> dict[str, int]:
        """The session's tag counts (its vocabulary), read from the store when not cached; read
        under the session's lock, as the counts are updated (``_tag_pending``)."""
        version = self.store.session_version(sid)
        generation = version[1] if version is not None else 0
        cached = self._vocab.peek(sid)
        if cached is not None and cached[0] == generation:
            self._vocab.touch(sid)  # a use: the state files keep the most recently used
            return cached[1]
        if cached is None and version is not None and self._states is not None:
            restored = self._restore(sid, version)
            if restored is not None:
                return restored
        with self.lock(sid):
            # Read after the generation: a write between the two leaves the counts newer than
            # their key, and the next look reads them again.
            counts = self.store.tag_counts(sid)
            if cached is not None:
                # The tags known already keep their order, the new ones follow: the tagger
                # extends its index of a vocabulary that grew by appending, instead of
                # rebuilding it for every tag (its results do not depend on the order).
                counts = {**{t: counts[t] for t in cached[1] if t in counts}, **counts}
            self._vocab.put(sid, (generation, counts))
            return counts

    def _restore(self, sid: str, version: tuple[int, int]) -> dict[str, int] | None:
        """A new engine's first look at a session: take what an earlier one saved at close
        (``memory.snapshots``) — the turns' token counts and authors if the session is the same
        incarnation, the tag counts, related-tag counts and inbound vocabulary if it is still
        at the same generation; the tag counts, or ``None`` (read from the store)."""
        assert self._states is not None
        state = self._states.load(sid)
        if state is None or state.born != version[0]:
            return None
        if state.check_seq and self.store.turn_hash(sid, state.check_seq) != state.check_hash:
            return None  # another database at the same path, numbering its sessions alike
        self.recaller.adopt(sid, *state.turns())
        if state.generation != version[1] or state.counts is None:
            return None
        with self.lock(sid):
            if self._vocab.peek(sid) is not None:
                return None  # read meanwhile
            counts = state.counts
            self._vocab.put(sid, (state.generation, counts))
            self.vocab.adopt(sid, state.generation, counts, state.related, state.inbound)
            tagger = self.inbound_tagger
            if (
                isinstance(tagger, KeywordTagger)
                and state.inbound is not None
                and state.groups is not None
            ):
                tagger.adopt_groups(state.inbound, state.groups, state.groups_key)
            if state.topics is not None:
                self.assembler.adopt_topics(sid, state.born, state.topics_watermark, state.topics)
            return counts

    def _save_states(self) -> None:
        """At close: save the recall state of the ``SAVED_SESSIONS`` most recently used
        sessions (``memory.snapshots``). A file that cannot be written is skipped."""
        if self._states is None:
            return
        try:
            self._save_each_state()
        except Exception as exc:  # never keeps close() from closing the rest
            log.warning("could not save the sessions' recall state: %s", exc)

    def _save_each_state(self) -> None:
        assert self._states is not None
        for sid in list(self._vocab)[-SAVED_SESSIONS:]:
            self._save_state(sid)
        self._states.trim()

    def _save_state(self, sid: str) -> None:
        """Save one session's recall state (``memory.snapshots``) as this process keeps it,
        the turns' token counts up to the turns stored (``lengths_to_save``);
        nothing when it keeps none (a file that cannot be written is skipped)."""
        assert self._states is not None
        version = self.store.session_version(sid)
        cached = self._vocab.peek(sid)
        if version is None or cached is None:
            return
        born, generation = version
        check = self.store.last_seq(sid)
        state = SessionState(
            sid, born, generation, check_seq=check, check_hash=self.store.turn_hash(sid, check)
        )
        if cached[0] == generation:
            state.counts = cached[1]
            state.related, state.inbound = self.vocab.kept(sid, generation)
            if isinstance(self.inbound_tagger, KeywordTagger) and state.inbound is not None:
                state.groups = self.inbound_tagger.groups(state.inbound)
                state.groups_key = GROUPS_KEY
            topics = self.assembler.kept_topics(sid)
            if topics is not None and topics[0] == born:
                state.topics_watermark, state.topics = topics[1], topics[2]
        lengths, authors = self.recaller.kept_state(sid)
        state.keep_turns(self.recaller.lengths_to_save(sid) or lengths, authors)
        if state.counts is None and state.lengths is None and state.authors is None:
            return
        with contextlib.suppress(OSError):
            self._states.save(state)

    def _rewarm(self, sid: str) -> None:
        """After a compaction (inline, or on the background thread, its writes all done): read
        again what it changed and the next recall of the session reads — its tag counts and
        inbound vocabulary with the related-tag counts (all kept per generation, which the
        compaction drew anew; the derives' own writes carry them forward instead,
        ``Vocabulary.advance``) and the compacted topics' counts — so that recall does
        not. Another write in between only makes the recall read them again itself; a session
        deleted meanwhile has nothing to read. Then the session's state is saved
        (``memory.snapshots``), for a process that is killed before it closes."""
        try:
            with self.lock(sid):
                self.vocab.inbound_vocabulary(sid, self._counts(sid))
            self.assembler.rewarm(sid)
            if self._states is not None:
                # Saved now, not only at close: a process killed later (kill -9, a crash)
                # still leaves its turns' counts, authors and line costs to the next one.
                self._save_state(sid)
        except ConfigError:
            return  # the session was deleted meanwhile: nothing to read
        except Exception as exc:  # the compaction is done: the next recall reads them itself
            log.warning("could not read session %r again after its compaction: %s", sid, exc)

    def vocabulary(self, session_id: str | None = None) -> dict[str, int]:
        """The session's tags with their turn counts."""
        with self.lock(session_id):
            return dict(self._counts(self._session(session_id)))

    # -- writing --------------------------------------------------------------------------------

    def _new_messages(self, sid: str, messages: Sequence[Message], new_only: bool) -> list[Message]:
        """The messages after the last stored turns (matched by role and text, as a block of up
        to 8); all of them when none matches (only new turns given, or a re-cut history) or
        when ``new_only``. One message alike is no match inside the messages, only at their
        start (a history trimmed at the front) or when it is the session's only turn: only new
        turns may say what the last stored turn said (an assistant's "OK" again), and taking
        that for a resend lost the turns before it. ``messages`` hold no system message."""
        if new_only or not messages:
            return list(messages)
        last = self.store.last_seq(sid)
        if last == 0:
            return list(messages)
        rows = self.store.turn_rows(sid, list(range(max(1, last - 7), last + 1)))
        stored = [(rows[s].role, rows[s].text) for s in sorted(rows)]
        keys = [_hash_key(m) for m in messages]
        for size in range(min(len(stored), len(keys)), 0, -1):
            block = stored[-size:]
            whole = size == last  # every stored turn
            for start in range(len(keys) - size, -1, -1):
                if keys[start : start + size] == block and (size > 1 or start == 0 or whole):
                    return list(messages[start + size :])
        return list(messages)

    def store_turns(
        self,
        sid: str,
        messages: Sequence[Message],
        *,
        timestamps: Sequence[datetime] | None = None,
        partial: Sequence[bool] | None = None,
    ) -> list[int]:
        """Store ``messages`` raw (no tagging, no model) and queue their derived work: the
        turns are durable when this returns. ``derive`` (or a worker) tags them later."""
        with self.lock(sid):
            return self._store_turns(
                self._session(sid), messages, timestamps=timestamps, partial=partial
            )

    def _store_turns(
        self,
        sid: str,
        messages: Sequence[Message],
        *,
        timestamps: Sequence[datetime] | None = None,
        partial: Sequence[bool] | None = None,
    ) -> list[int]:
        """``store_turns`` for a session known to exist: the turns and their derive job in
        one write (one round trip on a database server)."""
        if not messages:
            return []
        return self.store.commit_exchange(sid, messages, timestamps=timestamps, partial=partial)

    def derive(self, session_id: str | None = None) -> CompactionReport | None:
        """Do a session's derived work: tag (and embed) its turns not derived yet, in order,
        then compact when the live turns cross a threshold, then rebuild any tag summary a
        compaction left missing or stale (so a crash between the two is repaired by the next
        run). Only the short writes hold the session's lock: a slow tagger or summarizer never
        holds up the session's requests."""
        return self._derive(self._session(session_id))

    def _derive(self, sid: str, *, compact: bool = True) -> CompactionReport | None:
        """``derive`` for a session known to exist. ``compact=False``: tag and embed only, and
        hand a compaction the thresholds call for to the background (``Background``: kept in
        the store as the session's job first)."""
        with self._derive_locks[hash(sid) % _STRIPES]:
            pending = self.store.begin_derive(sid, context=_CONTEXT)
            upto = self._derive_begun(sid, pending)
        return self._compact_derived(sid, pending, upto, compact=compact)

    def _derive_begun(self, sid: str, pending: PendingDerive) -> int:
        """Tag and embed the turns of the derive ``pending`` began (``begin_derive``: this run
        covers every turn stored so far, its job dropped; a turn stored from here on queues a
        new job), under the session's derive lock; the ``derived_seq`` it leaves."""
        self._usage.session_id = sid
        try:
            record = pending.record
            upto, current = self._tag_pending(
                sid,
                record.derived_seq,
                pending.turns,
                record.generation,
                written=self._keep_written(sid, record.born, pending.turns, record.derived_seq),
            )
            cached = self._vocab.peek(sid)
            if current is not None and cached is not None and cached[0] == current:
                # The counts as this derive's own write left them, at the generation it
                # drew (another process's write since is seen by the next derive): no store
                # read to check them.
                with self.vocab.pinned(sid, current):
                    self.last_splits = self.vocab.evolve(sid, cached[1], upto)
            else:
                self.last_splits = self.vocab.evolve(sid, self._counts(sid), upto)
            if self.recaller.embedder is not None:
                self.recaller.ensure_vectors(sid)
            return upto
        finally:
            self._usage.session_id = None

    def _keep_written(
        self, sid: str, born: int, turns: Sequence[tuple[int, str, str, str]], done: int
    ) -> Callable[[Sequence[int]], None]:
        """Each turn after ``done`` counted as a line of the memory block, as the assembler
        would (``TurnLengths.lines``), and what keeps a chunk's costs once its tags are
        written, with its turns' authors (``note_authors``: a session derived but never
        recalled has them at its first recall, and after a restart; no store read). Called
        under the session's lock: a ``delete_session`` comes before, and the write fails, or
        after, and its ``forget`` drops them."""
        counter = self.assembler.counter
        costs = {seq: counter.count(text + "\n") for seq, _, text, _ in turns if seq > done}
        key = line_key(counter)
        # Each turn's opening, and the seq before it (``note_authors``: every turn after it)
        # (cut at a NUL as SQLite's ``substr`` is: a recall reads them from the store)
        openings = {
            seq: text[:OPENING_CHARS].split("\0", 1)[0] for seq, _, text, _ in turns if seq > done
        }
        before = dict(zip(openings, [done, *openings], strict=False))

        def written(seqs: Sequence[int]) -> None:
            kept = [(seq, costs[seq]) for seq in seqs if seq in costs]
            self.recaller.note_lines(sid, born, key, kept)
            if kept:
                rows = [(seq, openings[seq]) for seq, _ in kept]
                self.recaller.note_authors(sid, born, before[rows[0][0]], rows)

        return written

    def _compact_derived(
        self, sid: str, pending: PendingDerive, upto: int, *, compact: bool
    ) -> CompactionReport | None:
        """After a derive (outside its lock: the turns stored meanwhile are tagged while a
        compaction runs, under its own lock): compact when the thresholds call for it, here
        or (``compact=False``) as the session's background job."""
        live, fixed = pending.live_tokens, self.fixed_tokens(sid)
        if not compact:
            if self.compactor.monitor.level(live, fixed) != "none":
                self.background.submit(sid)
            return None
        self._usage.session_id = sid
        try:
            with self._compact_locks[hash(sid) % _STRIPES]:
                report = self.compactor.maybe_compact(sid, upto=upto, live_tokens=live, fixed=fixed)
                # (A compaction another process ran meanwhile rebuilds its own summaries.)
                if report is None and pending.record.compaction_watermark > 0:
                    self.compactor.rebuild_tag_summaries(sid)
                return report
        finally:
            self._usage.session_id = None

    def _store_and_begin(
        self, sid: str, turns: list[Message], when: list[datetime] | None
    ) -> PendingDerive:
        """Store ``turns`` and begin the session's derive in one store call (the last
        ``WRITE_CHUNK`` of them: a longer history's first turns are committed before, a chunk
        per transaction). A session cached here is taken to exist (no read to check it): one
        that another process deleted meanwhile is created again, as ``_session`` does."""
        if sid not in self._vocab:
            self._session(sid)
        head = max(0, len(turns) - WRITE_CHUNK)
        if head:
            self._store_turns(sid, turns[:head], timestamps=when[:head] if when else None)
            turns, when = turns[head:], when[head:] if when else None
        try:
            return self.store.begin_derive(sid, context=_CONTEXT, append=turns, timestamps=when)
        except ConfigError:
            if self.store.session_version(sid) is not None:
                raise
            self._vocab.pop(sid)
            self._session(sid)
            return self.store.begin_derive(sid, context=_CONTEXT, append=turns, timestamps=when)

    def _tag_pending(
        self,
        sid: str,
        done: int,
        turns: Sequence[tuple[int, str, str, str]],
        generation: int,
        *,
        written: Callable[[Sequence[int]], None] | None = None,
    ) -> tuple[int, int | None]:
        """Tag the turns after ``done`` (the session's ``derived_seq``) among ``turns`` (as
        ``begin_derive`` read them at ``generation``, with the derived turns before them as
        context; tags computed outside the lock; the tags, the new ``derived_seq`` and the
        vocabulary counts written together); the ``derived_seq`` it leaves, and the
        generation its last write drew when the cached counts were carried to it (``None``
        when they were not: they are read again when next used). ``written`` is called with
        each chunk's seqs once its write is done, under the session's lock."""
        rows = {seq: (role, text) for seq, role, text, _ in turns}
        last = max(rows, default=0)
        if last <= done:
            return done, None
        previous = [rows[seq][1] for seq in sorted(rows) if seq <= done]
        with self.lock(sid):
            # The tagger's vocabulary is a hint (tags converge on words already in use): the
            # counts cached here serve, even a generation behind another process's writes;
            # the counts themselves are checked against the store below, where they change.
            cached = self._vocab.peek(sid)
            vocab = dict(cached[1] if cached is not None else self._counts(sid))
        tagged: dict[int, tuple[dict[str, float], Sequence[str]]] = {}
        for seq in range(done + 1, last + 1):
            row = rows.get(seq)
            if row is None:
                continue
            role, text = row
            if role == "system":
                tagged[seq] = ({}, ())
                continue
            with self.vocab.pinned(sid, generation):
                result = self.vocab.resolve_result(
                    sid,
                    self.tagger.tag(text, vocabulary=list(vocab), context=previous[-_CONTEXT:]),
                )
            tagged[seq] = (
                {tag: 1.0 if i == 0 else 0.9 for i, tag in enumerate(result.tags)},
                result.related_tags,
            )
            for tag in result.tags:
                vocab[tag] = vocab.get(tag, 0) + 1
            previous.append(text)
        # Written a chunk of turns per transaction (the tags and ``derived_seq`` together), so
        # the tags of a long history do not keep other sessions' writes waiting.
        seqs = sorted(tagged)
        chunks = [seqs[i : i + WRITE_CHUNK] for i in range(0, len(seqs), WRITE_CHUNK)] or [[]]
        current: int | None = None
        for n, chunk in enumerate(chunks):
            with self.lock(sid):
                # The generations are read under the write's lock: no other writer comes in
                # between, so counts cached at ``before`` plus this chunk's are the counts at
                # ``after``.
                before, after = self.store.write_derived(
                    sid,
                    {seq: tagged[seq] for seq in chunk},
                    last if n == len(chunks) - 1 else chunk[-1],
                )
                if written is not None:
                    written(chunk)
                cached = self._vocab.peek(sid)
                # Counts cached at another generation are stale already: they are read from
                # the store when next used.
                current = None
                if cached is not None and cached[0] == before:
                    counts = cached[1]
                    for seq in chunk:
                        for tag in tagged[seq][0]:
                            counts[tag] = counts.get(tag, 0) + 1
                    self._vocab.put(sid, (after, counts))
                    current = after
                self.vocab.advance(
                    sid,
                    before,
                    after,
                    (t for seq in chunk for t in set(tagged[seq][1]) - set(tagged[seq][0])),
                )
        return last, current

    def on_turn_complete(
        self,
        messages: Sequence[MessageLike],
        *,
        session_id: str | None = None,
        timestamps: Sequence[datetime] | None = None,
        new_only: bool = False,
    ) -> CompactionReport | None:
        """Store the turns of ``messages`` not stored yet (system messages are not turns),
        tag and embed them, and compact if the live turns cross a threshold: inside this
        call, which returns the report (``compaction.run: inline``, the default), or on the
        engine's background thread, as a store-kept job (``compaction.run: background``; the
        call returns ``None`` and ``flush`` waits for it). ``timestamps`` (one per message)
        default to now.

        ``messages`` may be the whole history or only the new turns: the stored tail is found
        in it and what follows is new, so sending the same history twice stores nothing
        twice. That also means new turns that repeat the stored tail exactly (the same
        exchange again) are taken for a resend; pass ``new_only=True`` when ``messages`` are
        only new turns, and every one of them is stored.

        The turns are committed raw first; the tagging and compaction run here, after the
        commit (``derive``), so a tagger that fails leaves them stored and queued for the
        next ``derive``."""
        _messages_arg("messages", messages)
        if timestamps is not None:
            if isinstance(timestamps, str | bytes) or not isinstance(timestamps, Sequence):
                raise ConfigError(
                    f"timestamps must be a list of datetimes (one per message) or None, got "
                    f"{type(timestamps).__name__} {timestamps!r}"
                )
            for n, stamp in enumerate(timestamps):
                if not isinstance(stamp, datetime):
                    raise ConfigError(
                        f"timestamps must be datetimes (one per message), got "
                        f"{type(stamp).__name__} {stamp!r} at timestamps[{n}]"
                    )
        parsed = [as_message(m) for m in messages]
        if timestamps is not None and len(timestamps) != len(parsed):
            raise ConfigError(
                f"{len(parsed)} messages need as many timestamps, got {len(timestamps)}"
            )
        sid = self._sid(session_id)
        # The derive lock, then the session's (the order ``_tag_pending`` takes them): the new
        # turns are stored and their derive begun in one store call.
        with self._derive_locks[hash(sid) % _STRIPES]:
            with self.lock(sid):
                stamps = dict(zip(map(id, parsed), timestamps, strict=True)) if timestamps else None
                turns = self._new_messages(sid, [m for m in parsed if m.role != "system"], new_only)
                when = [stamps[id(m)] for m in turns] if stamps else None
                pending = self._store_and_begin(sid, turns, when)
            upto = self._derive_begun(sid, pending)
        return self._compact_derived(
            sid, pending, upto, compact=self.config.compaction.run == "inline"
        )

    def ingest_history(
        self,
        messages: Sequence[MessageLike],
        *,
        session_id: str | None = None,
        timestamps: Sequence[datetime] | None = None,
        new_only: bool = False,
    ) -> CompactionReport | None:
        """Bootstrap a session from an existing conversation (same as ``on_turn_complete``)."""
        return self.on_turn_complete(
            messages, session_id=session_id, timestamps=timestamps, new_only=new_only
        )

    def compact(self, *, session_id: str | None = None) -> CompactionReport | None:
        """Compact now, whatever the thresholds say (``None`` when nothing is compactable)."""
        sid = self._session(session_id)
        with self._compact_locks[hash(sid) % _STRIPES]:
            return self.compactor.compact(sid, level="hard")

    def note_fixed_tokens(self, tokens: int, *, session_id: str | None = None) -> None:
        """Note the tokens each request of the session carries besides its history — the
        system prompt, the tools, the memory block and the reply's reserve, as its latest
        request had them (the proxy notes them for every request). Compaction's thresholds
        are then shares of what the window leaves the history beside these (the soft one:
        70 % of ``context_window − tokens``, never less than 70 % of a tenth of the window;
        ``TokenMonitor.level``), so it starts early enough that the history sent fits the
        window beside them, and no earlier. Kept in this process, for the ``cached_sessions``
        most recently noted sessions; a session with none noted is judged against the whole
        window.

        >>> from contextfold.store.sqlite.memory import MemoryStore
        >>> engine = MemoryEngine(store=MemoryStore(), embedder=None)
        >>> engine.note_fixed_tokens(5_000, session_id="chat")
        >>> engine.fixed_tokens("chat"), engine.fixed_tokens("another")
        (5000, 0)
        """
        _count_arg("tokens", tokens, "tokens")
        self._fixed.put(self._sid(session_id), tokens)

    def fixed_tokens(self, session_id: str | None = None) -> int:
        """The tokens noted for the session by ``note_fixed_tokens`` (0 when none are)."""
        return self._fixed.peek(self._sid(session_id)) or 0

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the derived work ``on_turn_complete`` left to the background (the
        compactions it tripped, with ``compaction.run: background``), at most ``timeout``
        seconds; whether it all finished."""
        return self.background.flush(timeout)

    # -- reading --------------------------------------------------------------------------------

    def tag_message(self, message: str, *, session_id: str | None = None) -> TagResult:
        """The inbound tags of ``message``: only tags the session already has."""
        with self.lock(session_id):
            sid = self._session(session_id)
            vocab = self._counts(sid)
            known = self.vocab.inbound_vocabulary(sid, vocab)
            outer, self._usage.session_id = getattr(self._usage, "session_id", None), sid
            try:  # an LLM inbound tagger's cost goes to this session
                raw = self.inbound_tagger.tag(message, vocabulary=known)
            finally:
                self._usage.session_id = outer
            return self.vocab.inbound(sid, raw, vocab)

    def prefetch(self, message: str) -> None:
        """Start the work of a recall for ``message`` that does not need the session (its
        query embedding), so it runs while the caller does other work; ``on_message_inbound``
        collects it."""
        self.recaller.prefetch(message)

    def on_message_inbound(
        self,
        message: str | MessageLike,
        conversation_history: Sequence[MessageLike] = (),
        *,
        session_id: str | None = None,
        budget: int | None = None,
        protected: int = 0,
        model: str | None = None,
        room: Room | None = None,
    ) -> AssembledContext:
        """Memory for ``message`` within ``budget`` tokens (default: assembly.memory_budget),
        and within what ``room`` leaves of the model's window beside the history the filter
        keeps (``Room``: no memory below ``MIN_MEMORY_TOKENS``; ``room_left`` says what it
        left).
        Turns already in ``conversation_history`` are not recalled again (by content, runs of
        whitespace aside: ``TurnKeys.seqs_held``), nor turns that are mostly older versions
        of it (``assemble.Held``). ``model`` (the model the request goes to) picks the
        memory tools' tier in ``paging.mode: tools`` (``tier``). The history filter keeps the
        last ``protected`` messages
        of the history whatever it decides (beside ``compaction.protected_recent_turns``): a
        caller that sends the message being answered inside the history, with a tool loop
        after it, keeps them all."""
        # Cheap checks (this is the hot path): a wrong type fails here, naming the argument.
        if not isinstance(message, str | Message | Mapping):
            raise ConfigError(
                f"message must be a str or a chat message (Message or dict), got "
                f"{type(message).__name__} {str(message)[:80]!r}"
            )
        _messages_arg("conversation_history", conversation_history)
        if budget is not None:
            _count_arg("budget", budget, "tokens")
        _count_arg("protected", protected, "messages")
        if model is not None and not isinstance(model, str):
            raise ConfigError(
                f"model must be a model name (str) or None, got {type(model).__name__} {model!r}"
            )
        if room is not None:
            if not isinstance(room, Room):
                raise ConfigError(f"room must be a Room or None, got {type(room).__name__}")
            if len(room.history) != len(conversation_history):
                raise ConfigError(
                    f"room.history needs one count per message of conversation_history"
                    f" ({len(conversation_history)}), got {len(room.history)}"
                )
        try:
            return self._inbound(
                message, conversation_history, session_id, budget, protected, model, room
            )
        finally:
            # The worker's reads the recall asked for start once it is answered, not beside it.
            self.recaller.start_reads()

    def _inbound(
        self,
        message: str | MessageLike,
        conversation_history: Sequence[MessageLike],
        session_id: str | None,
        budget: int | None,
        protected: int,
        model: str | None,
        room: Room | None = None,
    ) -> AssembledContext:
        started = telemetry.now()
        text = message if isinstance(message, str) else as_message(message).text()
        history = [as_message(m) for m in conversation_history]
        with self.lock(session_id):
            sid = self._session(session_id)
            tags, expired, held_back = self.vocab.hold_back(
                sid, self.tag_message(text, session_id=sid), self._counts(sid)
            )
            filtered = self._filter(sid, history, tags, protected) if history else None
            # Turns the model will see in its (filtered) history are not recalled again; the
            # ones the filter drops (compacted, off-topic) stay candidates.
            kept_inputs = self._kept_inputs(filtered)
            kept = [history[i] for i in kept_inputs]
            exclude = self._turn_keys.seqs_held(sid, kept) if kept else set()
            exclude |= held_back  # the turns of expired tags
            # A history that holds every stored turn leaves memory nothing to add: no turn to
            # recall, and the hint and summaries would only restate what the request holds.
            holds_all = self._holds_everything(sid, exclude)
            limit = budget if budget is not None else self.config.assembly.memory_budget
            # What the window leaves beside the history kept: memory never pushes the request
            # past it, and where it leaves less than the minimum memory adds nothing (nothing
            # is ranked either).
            left = None if room is None else room.left(kept_inputs)
            no_room = left is not None and left < MIN_MEMORY_TOKENS
            if left is not None:
                limit = min(limit, max(left, 0))
            ranked = (
                []
                if holds_all or no_room
                else self.recaller.rank(
                    sid,
                    text,
                    tags=tags.tags,
                    related=tags.related_tags,
                    exclude=exclude,
                    tag_counts=self._counts(sid),
                    related_counts=self.vocab.related_counts(sid),
                    defer_reads=True,
                )
            )
            # Turns after ``embedded`` have no vector yet: the floor cannot judge them, and a
            # recall that found one by its text or tags is not withheld.
            unembedded = self.recaller.pending_vectors(sid)
            embedded = self.store.last_seq(sid) - unembedded if unembedded else None
            withheld = self._below_floor(sid, text, ranked)
            if embedded is not None and any(r.seq > embedded and r.ranks for r in ranked):
                withheld = None
            below = withheld is not None
            paging = self.config.paging
            # Automatic paging in both modes: in ``tools`` it is the fallback for a model that
            # does not manage its memory.
            pages = paging.enabled and not below and not no_room
            if pages and not holds_all:
                self.pager.touch(sid, list(tags.tags))
            paged = self.pager.loaded(sid) if pages else []
            tier = self.tier(model) if paging.enabled and paging.mode == "tools" else None
            if below or no_room or (holds_all and not paged):
                # Nothing stored is close enough to the message, the window has no room for
                # memory, or the history holds it all: no memory at all. (Topics the model
                # paged in itself still come, where there is room.)
                ranked = []
                block = MemoryBlock(text="", items=[], budget=MemoryBudget(budget=limit))
            else:
                block = self.assembler.assemble(
                    sid,
                    ranked,
                    tags=tags,
                    paged=paged,
                    budget=limit,
                    tools=tier or False,
                    held=Held(m.text() for m in kept) if kept else None,
                    lines=self.recaller.session_lines(sid, self.store.session_version(sid)),
                    dashboard=(
                        (lambda topics: self.delegation.dashboard(sid, topics))
                        if tier == "strong"
                        else None
                    ),
                )
        result = AssembledContext(
            session_id=sid,
            prepend_text=block.text,
            matched_tags=tags.tags,
            related_tags=tags.related_tags,
            broad=tags.broad,
            temporal=tags.temporal,
            items=tuple(block.items),
            budget=block.budget,
            recalled=tuple(ranked),
            history=filtered,
            tagger=tags.source,
            expired_tags=expired,
            expired_turns=len(held_back),
            unembedded=unembedded,
            withheld=withheld,
            room_left=left,
        )
        telemetry.record_recall(result, started)
        return result

    def _below_floor(self, sid: str, text: str, ranked: Sequence[RankedTurn]) -> str | None:
        """Why the relevance floor withholds memory (``memory.relevance``), else ``None``: it
        is on, the dense signal scored the candidates, and the best cosine similarity among
        them is under ``recall.relevance_floor`` — or under ``recall.unknown_name_floor`` when
        the message names something no stored turn contains. A recall that ranked nothing (the
        history holds every turn), or whose candidates have no vector yet (the derived work
        has not embedded them), is not judged."""
        recall = self.config.recall
        floor, strict = recall.relevance_floor, recall.unknown_name_floor
        if (floor is None and strict is None) or self.recaller.embedder is None or not ranked:
            return None
        scored = [r.similarity for r in ranked if r.similarity is not None]
        if not scored:
            return None
        best = max(scored)
        if floor is not None and best < floor:
            return (
                f"the best cosine similarity with a stored turn, {best:.2f}, is under"
                f" recall.relevance_floor {floor:g}"
            )
        if strict is None or best >= strict:
            return None
        # Only a message the first floor passes, and the stricter one would not, looks up names.
        unknown = self._known_names.unknown(sid, names_in(self.recaller.judged_text(text)))
        if not unknown:
            return None
        return (
            f"the message names {', '.join(sorted(unknown)[:3])}, which no stored turn"
            f" contains, and its best cosine similarity, {best:.2f}, is under"
            f" recall.unknown_name_floor {strict:g}"
        )

    def _holds_everything(self, sid: str, exclude: set[int]) -> bool:
        """Whether the history the caller sends holds every stored turn of the session: then
        no turn can be recalled, and ranking (the full-text search and the query's embedding)
        is skipped — its result would be empty — and no hint or summary is added either: they
        are made of turns the request holds. Topics paged in are not ranked turns and are
        loaded either way."""
        return len(exclude) >= self.store.last_seq(sid)

    @staticmethod
    def _kept_inputs(filtered: FilteredHistory | None) -> list[int]:
        if filtered is None:
            return []
        return [i for indices in filtered.kept_indices for i in indices]

    def _filter(
        self, sid: str, history: list[Message], tags: TagResult, protected: int = 0
    ) -> FilteredHistory:
        watermark = self.store.session(sid).compaction_watermark
        compacted_keys = set(self._turn_keys.keys(sid)[: max(watermark - 1, 0)])
        compacted = 0
        for message in history:
            if message.role == "system" or key_of(message) in compacted_keys:
                compacted += 1
                continue
            break
        keep = None
        if self.config.history.filter_off_topic and tags.tags:
            wanted = set(tags.tags) | set(tags.related_tags)

            def keep(_: int, m: Message) -> bool:
                result = self.tagger.tag(m.text(), vocabulary=list(self._counts(sid)))
                return bool(wanted & set(result.tags))

        return filter_history(
            history,
            protected_recent=max(self.config.compaction.protected_recent_turns, protected),
            compacted=compacted,
            keep=keep,
            broad=tags.broad or tags.temporal,
        )

    def context_items(self, query: QueryBundle) -> list[ContextItem]:
        """``MemoryProvider``: lets ``ContextPipeline.with_memory(engine)`` pack memory."""
        return list(self.on_message_inbound(query.query_str).items)

    # -- paging and tools -----------------------------------------------------------------------

    def expand_topic(
        self, tag: str, depth: Depth = "full", *, session_id: str | None = None
    ) -> PagingResult:
        with self.lock(session_id):
            sid = self._session(session_id)
            return self.pager.expand(sid, self.canonicalizer.canonical(tag), depth)

    def collapse_topic(
        self, tag: str, depth: Depth = "summary", *, session_id: str | None = None
    ) -> PagingResult:
        with self.lock(session_id):
            sid = self._session(session_id)
            return self.pager.collapse(sid, self.canonicalizer.canonical(tag), depth)

    def find_quote(
        self, query: str, *, limit: int = 5, session_id: str | None = None
    ) -> list[Quote]:
        with self.lock(session_id):
            return self.recaller.find_quote(self._session(session_id), query, limit=limit)

    def tier(self, model: str | None) -> Tier:
        """The delegation tier of ``model`` (``paging.tiers``; ``memory/delegation.py``)."""
        paging = self.config.paging
        return tier_of(model, paging.tiers, paging.default_tier)

    def tool_definitions(
        self, format: str = "openai", *, model: str | None = None
    ) -> list[dict[str, Any]]:
        """JSON tool definitions for ``format``: the ones ``model``'s tier is offered
        (expand_topic; with collapse_topic and find_quote for a strong model)."""
        return tool_definitions(format, TIER_TOOLS[self.tier(model)])

    def handle_tool_call(
        self, name: str, arguments: Mapping[str, Any], *, session_id: str | None = None
    ) -> str:
        """Run a memory tool call from a model; returns the tool result text (JSON). A bad
        call returns an error text for the model instead of raising."""
        return run_tool_call(self, name, arguments, session_id=session_id)

    # -- reports --------------------------------------------------------------------------------

    def status(self, *, session_id: str | None = None) -> MemoryStatus:
        with self.lock(session_id):
            sid = self._session(session_id)
            session = self.store.session(sid)
            last = self.store.last_seq(sid)
            live_tokens = self.store.active_tokens(sid)
            summaries = self.store.paging.tag_summaries(sid)
            return MemoryStatus(
                session_id=sid,
                turns=last,
                live_turns=last - max(session.compaction_watermark, 1) + 1 if last else 0,
                live_tokens=live_tokens,
                context_window=self.config.context_window,
                level=self.compactor.monitor.level(live_tokens, self.fixed_tokens(sid)),
                compaction_watermark=session.compaction_watermark,
                segments=len(self.store.segments(sid, full_text=False)),
                tags=dict(sorted(self._counts(sid).items(), key=lambda kv: (-kv[1], kv[0]))),
                tag_summaries=len(summaries),
                stale_tag_summaries=sum(s.stale for s in summaries.values()),
                working_set={t: e.depth for t, e in self.store.paging.working_set(sid).items()},
            )

    def cost_report(
        self, *, session_id: str | None = None, all_sessions: bool = False
    ) -> CostReport:
        return self.store.costs.cost_report(None if all_sessions else self._sid(session_id))

    def add_alias(self, alias: str, canonical: str, *, session_id: str | None = None) -> None:
        """Register ``alias`` → ``canonical`` (stored; used by every later tagging and lookup)
        in every session, or only in ``session_id``."""
        with self._vocab_lock:
            self.vocab.add_alias(alias, canonical, session_id=session_id)

    def remove_alias(self, alias: str, *, session_id: str | None = None) -> bool:
        """Remove a store-wide (or ``session_id``-scoped) alias; whether there was one."""
        with self._vocab_lock:
            return self.vocab.remove_alias(alias, session_id=session_id)

    def _vector_dir(self) -> Path | None:
        """Where the recaller keeps large sessions' vectors and indexes: beside a file-backed
        SQLite store (``recall.vector_files``); ``None`` for an in-memory or PostgreSQL one."""
        if not self.config.recall.vector_files or self.embedder is None:
            return None
        return self._vector_folder()

    def _vector_folder(self) -> Path | None:
        """The folder beside a file-backed SQLite store where vector files live (written by
        any engine on the store that has an embedder); ``None`` for other stores."""
        return self._beside_store(".vectors")

    def _beside_store(self, suffix: str) -> Path | None:
        """``<database><suffix>`` beside a file-backed SQLite store; ``None`` for others."""
        path = getattr(self.store, "path", None)
        if not isinstance(path, str) or path == ":memory:" or not Path(path).is_file():
            return None  # in memory, or a PostgreSQL URL
        return Path(f"{path}{suffix}")

    def delete_session(self, session_id: str | None = None) -> bool:
        """Delete a session with everything derived from it: its rows in the store
        (``MemoryStorage.delete_session``), its cached vectors and, beside a SQLite store, its
        vector files, now rather than when an engine next closes; whether it existed. The CLI,
        the LangChain and LlamaIndex adapters and the LoCoMo runner delete through here."""
        sid = self._sid(session_id)
        with self.lock(sid):
            existed = self.store.delete_session(sid)
            self.recaller.forget(sid)
            folder = self._vector_folder()
            if folder is not None and folder.is_dir():
                # Every model's files, also those an engine with another (or no) embedder
                # wrote, found by name: no other session's file is read, nothing is asked of
                # the store per file.
                VectorFiles(folder).discard_session(sid)
            if self._states is not None:
                self._states.discard(sid)
        return existed

    def close(self) -> None:
        """Finish the background work (``flush``), write the vector files, then close the
        client and the store."""
        self.background.close()
        self._save_states()
        self.recaller.close()
        if self._owns_client and self.llm_client is not None:
            self.llm_client.close()
            self.llm_client = None
        self.store.close()

    def __enter__(self) -> MemoryEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
