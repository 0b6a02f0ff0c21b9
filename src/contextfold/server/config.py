"""``ServerConfig``: the server's own YAML file (``contextfold serve --config server.yaml``),
its keys at the top level; the memory engine's ``contextfold.yaml`` is a separate file
(``memory_config``). ``contextfold config validate`` checks either kind.

Each part of the server owns one section model here: ``proxy`` (upstreams and instances),
``context_api`` (API keys → tenants), ``dashboard`` (token), ``limits`` (bad-input guards).
Unknown keys are errors, as everywhere in the configuration.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from contextfold._envnames import ENV_NAME, check_env_name, looks_like_a_key
from contextfold.config_loading import Float, Int, load_yaml
from contextfold.errors import ConfigError
from contextfold.retrieval.floor import FLOOR_KEYS, RelevanceFloor, default_floor

__all__ = [
    "ID_PATTERN",
    "ContextApiSettings",
    "DashboardSettings",
    "EnvelopeSettings",
    "EventLogSettings",
    "InstanceSettings",
    "LimitSettings",
    "OutputSettings",
    "ProxySettings",
    "ServerConfig",
    "load_server_config",
]


class _Section(BaseModel):
    # Errors never echo the input: a key pasted where a variable name belongs must not be
    # printed back (pydantic takes this setting from the outermost model validated).
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


def _location(value: str | None, info: ValidationInfo) -> str | None:
    """A store (an SQLite file or a PostgreSQL URL) or file named in the config: relative to
    the config file's folder when read from one (``load_server_config``), not to the current
    directory; any URL but PostgreSQL's is an error."""
    if value is None:
        return None
    from contextfold.store import configured_location

    try:
        return configured_location(value, (info.context or {}).get("folder"))
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


#: Characters no upstream URL may hold: they would be sent as they are in the request line.
_URL_BAD_CHARACTER = re.compile(r"[\x00-\x20\x7f]")


def _upstream_url(url: str | None) -> str | None:
    """Check an upstream base URL the way the proxy uses it: request paths are appended to it
    (``forward.upstream_url``) and the result is sent as it is. So it is ``http://`` or
    ``https://``, names a host, has a port from 1 to 65535 if any, holds no space or control
    character, no ``?query`` or ``#fragment`` (the path would land after them) and no
    credentials (``user:password@host``: the proxy would send them with every request and
    show them in every error that names the upstream). Messages never repeat the URL."""
    if url is None:
        return None
    if not url.startswith(("http://", "https://")):
        raise ValueError("the upstream must be an http:// or https:// URL")
    if _URL_BAD_CHARACTER.search(url):
        raise ValueError("the upstream URL holds a space or control character")
    authority = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if "@" in authority:
        raise ValueError(
            "the upstream URL carries credentials (user:password@host), which the proxy "
            "refuses: they would go with every request and appear in its errors. Give the "
            "URL without them; clients send their own credentials (the Authorization, "
            "x-api-key or x-goog-api-key header), which the proxy forwards untouched"
        )
    if "?" in url or "#" in url:
        raise ValueError(
            "the upstream URL has a ?query or #fragment; give a base URL such as "
            "https://api.openai.com or https://api.openai.com/v1 (request paths are appended)"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        if "port" in str(exc).lower():
            raise ValueError("the upstream URL's port is not a number from 1 to 65535") from None
        raise ValueError("the upstream is not a valid URL") from None
    if not parts.hostname:
        raise ValueError("the upstream URL has no host (such as https://api.openai.com)")
    if port == 0:
        raise ValueError("the upstream URL's port is not a number from 1 to 65535")
    return url


class InstanceSettings(_Section):
    """One proxy listener: requests to ``port`` go to ``upstream`` (a base URL such as
    ``https://api.openai.com``, without credentials). Every instance shares the server's one
    engine and store."""

    name: str
    port: Int = Field(ge=1, le=65535)
    upstream: str

    @field_validator("upstream")
    @classmethod
    def _an_upstream(cls, value: str | None) -> str | None:
        return _upstream_url(value)


class OutputSettings(_Section):
    """``proxy.tool_outputs``: tool-output compaction for long agent sessions (see
    ``contextfold.server.proxy.outputs``). ``compact`` (off: requests keep every output);
    ``compact_above`` tokens (``None``: 75% of the model's window from ``WINDOWS``, no
    compaction for other models); ``target``: the share of ``compact_above`` a request is
    brought down to when it crosses into a new size bucket; ``keep_recent``: the newest
    outputs that are never stubbed; ``min_tokens``: smaller outputs are never stubbed."""

    compact: bool = True
    compact_above: Int | None = Field(None, ge=1000)
    target: Float = Field(0.5, gt=0.0, lt=1.0)
    keep_recent: Int = Field(4, ge=0)
    min_tokens: Int = Field(256, ge=1)


class EnvelopeSettings(_Section):
    """Client envelopes (channel headers, message footers, event lines, plugin markers) removed
    from user messages before memory tags and stores them; the request itself goes upstream
    unchanged (``server/proxy/envelope.py``). ``patterns``: more regular expressions by name
    (a built-in name replaces that pattern); ``defaults: false`` drops the built-in ones."""

    enabled: bool = True
    defaults: bool = True
    patterns: dict[str, str] = Field(default_factory=dict)

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, value: dict[str, str]) -> dict[str, str]:
        for name, pattern in value.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {name!r} is not a regular expression: {exc}") from None
        return value


class ProxySettings(_Section):
    """``upstream``: where the main port's proxy forwards; ``instances``: more listeners.
    ``markers``: append the session marker to assistant replies — an opt-in for clients that
    can send no header (off, the default: no reply carries one; a conversation is found again
    by the history the client resends, and by the ``x-contextfold-session`` header)."""

    upstream: str | None = None
    instances: list[InstanceSettings] = Field(default_factory=list)
    timeout: Float = Field(600.0, gt=0)
    max_tool_continuations: Int = Field(5, ge=0, le=20)
    # The request path's budget for memory (resolve, recall, inject): past it the request is
    # forwarded without memory and its record says why.
    memory_deadline_ms: Float = Field(50.0, gt=0)
    # A request that may not fit the model's window as the client sent it (its body is at
    # least 2 bytes per token of the memory's ``context_window``) waits this long for its
    # memory work instead: forwarded unmodified, it would overflow the window.
    fit_deadline_ms: Float = Field(2000.0, gt=0)
    # The tokens of the window kept for the reply of a request that names no maximum of its
    # own (``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``,
    # ``maxOutputTokens``): what the proxy forwards stays under ``context_window`` less this.
    reply_reserve_tokens: Int = Field(4096, ge=0, le=1_000_000)
    # Background threads deriving tags, vectors and summaries from committed turns.
    job_threads: Int = Field(1, ge=1, le=16)
    markers: bool = False
    # What a new conversation may recall: only its own (``conversation``), or, continuing as a
    # new branch, the latest conversation of the same credential (``principal``: a coding
    # agent's sessions share one memory).
    recall_scope: Literal["conversation", "principal"] = "conversation"
    tool_outputs: OutputSettings = Field(default_factory=OutputSettings)
    envelope: EnvelopeSettings = Field(default_factory=EnvelopeSettings)

    @field_validator("upstream")
    @classmethod
    def _an_upstream(cls, value: str | None) -> str | None:
        return _upstream_url(value)


#: Tenant (and document) ids: letters, digits and ``. _ : @ -``, starting with a letter or digit.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"


#: The range of each relevance floor (``retrieval/floor.py``): BM25 a share of the most the
#: query's words could score, dense and hybrid a cosine (-1: off), the margin a cosine distance.
_FLOOR_RANGES: dict[str, tuple[float, float, str]] = {
    "bm25": (0.0, 1.0, "a share of the best possible BM25 score, from 0 to 1"),
    "dense": (-1.0, 1.0, "a cosine similarity, from -1 (off) to 1"),
    "hybrid": (-1.0, 1.0, "a cosine similarity, from -1 (off) to 1"),
    "dense_margin": (0.0, 2.0, "a cosine distance below the best hit, from 0 to 2"),
}


class ContextApiSettings(_Section):
    """The knowledge-graph API (``/api/context``, ``/api/nodes``, ``/api/edges``,
    ``/api/documents``).

    ``api_keys`` maps the *name* of an environment variable holding an API key to the tenants
    that key owns (reads and writes); keys themselves never appear in a config file. With no
    keys the API is open to every caller while the server binds to loopback, and answers 401
    to everyone when it binds anywhere else. ``graph_path``: the SQLite file of nodes, edges and
    documents, or a ``postgresql://`` URL to share them among servers (default: the memory
    store's database when memory is on PostgreSQL, else ``<home>/graph.db``). ``hybrid``:
    rank entry points with the memory engine's embedder as well as BM25 (when the engine has
    one). ``relevance_floor``: entry
    points must clear the calibrated relevance floor (``true``, the default), none (``false``),
    or the floors given per mode (``{bm25: 0.1, dense: 0.3, hybrid: 0.35}``, and
    ``dense_margin``; keys left out keep their default); see docs/retrieval.md.

    >>> ContextApiSettings(api_keys={"SUPPORT_KEY": ["support", "shared"]}).api_keys
    {'SUPPORT_KEY': ['support', 'shared']}
    """

    api_keys: dict[str, list[str]] = Field(default_factory=dict)
    graph_path: str | None = None
    hybrid: bool = True
    relevance_floor: bool | dict[str, Float] = True

    @field_validator("graph_path")
    @classmethod
    def _a_store(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _location(value, info)

    @field_validator("relevance_floor")
    @classmethod
    def _floor_modes(cls, value: bool | dict[str, float]) -> bool | dict[str, float]:
        unknown = sorted(set(value) - set(FLOOR_KEYS)) if isinstance(value, dict) else []
        if unknown:
            raise ValueError(
                "relevance_floor modes are bm25, dense and hybrid (and dense_margin); "
                f"got {unknown}"
            )
        if isinstance(value, dict):
            for key, number in value.items():
                low, high, what = _FLOOR_RANGES[key]
                if not low <= number <= high:
                    raise ValueError(f"{key} is {what}; got {number:g}")
            try:
                RelevanceFloor(**{**default_floor(None).as_dict(), **value})
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("api_keys")
    @classmethod
    def _names_not_keys(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, tenants in value.items():
            if looks_like_a_key(name):
                raise ValueError(
                    "api_keys maps environment variable names to tenants, and one of its names "
                    "looks like an API key itself (the value is not shown). Put the key in an "
                    "environment variable and name that variable here: keys never belong in a "
                    "config file"
                )
            if not ENV_NAME.fullmatch(name):
                raise ValueError(
                    "api_keys maps environment variable names to tenants, and one of its names "
                    "is not a variable name (letters, digits and _ only). Put the key itself "
                    "in an environment variable and name that variable here: keys never "
                    "belong in a config file"
                )
            if not tenants:
                raise ValueError(f"api_keys.{name}: list at least one tenant id")
            for tenant in tenants:
                if not re.match(ID_PATTERN, tenant):
                    raise ValueError(
                        f"api_keys.{name}: tenant id {tenant!r} is not 1-128 letters, digits "
                        "and . _ : @ - starting with a letter or digit"
                    )
        return value


class DashboardSettings(_Section):
    """``token_env``: the variable holding the dashboard token; required when the server
    binds to anything but loopback. ``corpus``: the document database the Ask page searches
    (default ``$CONTEXTFOLD_HOME/documents.db``, where ``contextfold ingest`` writes);
    ``examples``: the Ask page's example-question buttons. ``capture``: keep the raw bodies
    sent upstream (the last ``capture_keep``, credentials redacted) for the dashboard's
    request capture; off by default (bodies hold the conversations)."""

    enabled: bool = True
    token_env: str | None = "CONTEXTFOLD_DASHBOARD_TOKEN"
    corpus: str | None = None
    capture: bool = False
    capture_keep: Int = Field(50, ge=1, le=1000)
    examples: tuple[str, ...] = (
        "Can I expense Uber rides during business travel?",
        "What is the hotel cap in London?",
        "Can I fly business class to Singapore?",
        "Do I need receipts for meals under 10 euros?",
    )
    #: The tool whose output fills an Ask chat turn's tool-outputs section (``find_quote``:
    #: the memory's exact earlier lines for the question; ``None``: no tool).
    chat_tool: Literal["find_quote"] | None = "find_quote"

    @field_validator("corpus")
    @classmethod
    def _a_store(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _location(value, info)

    @field_validator("token_env")
    @classmethod
    def _a_name_not_a_token(cls, value: str | None) -> str | None:
        return None if value is None else check_env_name(value)


class EventLogSettings(_Section):
    """The terminal event log (``contextfold.server.event_log``): one line per event on
    stdout. ``enabled``: unset, ``contextfold serve`` and ``proxy`` write it and an app built
    in code (``create_app``) does not. ``content``: add an excerpt of the query and the reply
    (off: counts, tags and times only)."""

    enabled: bool | None = None
    content: bool = False


class LimitSettings(_Section):
    """Bad-input guards. Every route: a request body larger than ``max_body_bytes`` is
    answered 413 before it is read into memory (declared ``Content-Length`` or counted as a
    chunked body streams in). The proxy's memory routes (chat completions, messages,
    generateContent) also refuse, in the provider's error shape and before anything goes
    upstream, a body with more than ``max_messages`` messages (413), a message (or system
    prompt) larger than ``max_message_bytes`` of text (413), and JSON nested deeper than
    ``max_json_depth`` (400); the ``/api`` routes refuse a body nested deeper than
    ``max_json_depth`` too, at most 200 levels there (what a response can return)."""

    max_body_bytes: Int = Field(8 * 1024 * 1024, ge=1024)
    max_messages: Int = Field(10_000, ge=1)
    max_message_bytes: Int = Field(2 * 1024 * 1024, ge=1024)
    max_json_depth: Int = Field(100, ge=8, le=900)


class ServerConfig(_Section):
    """``shutdown_timeout``: on Ctrl-C or SIGTERM, how many seconds requests in flight may
    take to finish before they are cut off (the dashboard's event streams end at once)."""

    host: str = "127.0.0.1"
    port: Int = Field(5757, ge=0, le=65535)
    shutdown_timeout: Int = Field(5, ge=0)
    secret_env: str = "CONTEXTFOLD_SECRET"  # HMAC key of session markers (random if unset)
    memory_config: str | None = None  # a contextfold.yaml for the memory engine
    proxy: ProxySettings = ProxySettings()
    context_api: ContextApiSettings = ContextApiSettings()
    dashboard: DashboardSettings = DashboardSettings()
    event_log: EventLogSettings = EventLogSettings()
    limits: LimitSettings = LimitSettings()

    @field_validator("secret_env")
    @classmethod
    def _a_name_not_a_secret(cls, value: str) -> str:
        return check_env_name(value)

    @field_validator("memory_config")
    @classmethod
    def _beside_the_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        folder = (info.context or {}).get("folder")
        if value is None or folder is None or not value.strip():
            return value
        return str(Path(folder) / value)  # an absolute path stays as it is

    @model_validator(mode="after")
    def _distinct_ports(self) -> ServerConfig:
        ports = [self.port, *(i.port for i in self.proxy.instances)]
        names = [i.name for i in self.proxy.instances]
        taken = sorted({p for p in ports if p and ports.count(p) > 1})
        if taken:
            raise ValueError(f"port {taken[0]} is used twice (server port and proxy.instances)")
        if len(set(names)) != len(names):
            raise ValueError("proxy.instances: every instance needs its own name")
        return self


def load_server_config(path: str | Path) -> ServerConfig:
    """Read and validate a server config file (YAML; the ``ServerConfig`` fields at the top
    level). Any problem raises ``ConfigError`` naming the file and the bad fields. A relative
    path in it (``memory_config``, ``context_api.graph_path``, ``dashboard.corpus``) is
    relative to the file's folder, whatever the current directory."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"server config {str(file)!r} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read server config {str(file)!r}: {exc}") from None
    data: Any = load_yaml(text, str(file))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: expected a mapping at the top level, got {type(data).__name__}")
    _memory_keys_here(file, data)
    if list(data) == ["server"]:
        raise ConfigError(
            f"{file}: a server config has its keys at the top level (host, port, proxy, "
            "context_api, dashboard, limits, ...), not under 'server:'; remove that line and "
            "unindent the rest"
        )
    try:
        return ServerConfig.model_validate(data, context={"folder": file.parent})
    except ValidationError as exc:
        lines = [
            f"  {'.'.join(str(p) for p in err['loc']) or '(top level)'}: "
            + err["msg"].removeprefix("Value error, ")
            for err in exc.errors()
        ]
        raise ConfigError(f"{file}: invalid server config:\n" + "\n".join(lines)) from None


def _memory_keys_here(file: Path, data: dict[Any, Any]) -> None:
    """``ConfigError`` when a server config holds memory-config keys (``recall``, ``store``,
    ...): saying which file each kind belongs in, rather than "extra inputs are not permitted"
    for each of them."""
    from contextfold.memory.config import MemoryConfig

    memory = [str(k) for k in data if k in MemoryConfig.model_fields]
    if not memory:
        return
    server = [str(k) for k in data if k in ServerConfig.model_fields]
    keys = f"({', '.join(memory)})"
    if len(memory) > len(server):
        raise ConfigError(
            f"{file}: this looks like a memory config {keys}, not a server config: pass it "
            f"as `contextfold serve --memory-config {file}`, or name it in a server config with "
            "`memory_config: FILE`"
        )
    raise ConfigError(
        f"{file}: a server config with memory keys {keys}: they go in a separate memory "
        "config (contextfold.yaml) that the server config names with `memory_config: FILE`"
    )
