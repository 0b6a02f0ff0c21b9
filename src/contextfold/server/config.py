"""``ServerConfig``: the ``server:`` section of ``contextfold.yaml`` (or its own file).

Each part of the server owns one section model here: ``proxy`` (upstreams and instances),
``context_api`` (API keys → tenants), ``dashboard`` (token), ``limits`` (bad-input guards).
Unknown keys are errors, as everywhere in the configuration.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ContextApiSettings",
    "DashboardSettings",
    "InstanceSettings",
    "LimitSettings",
    "ProxySettings",
    "ServerConfig",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InstanceSettings(_Section):
    """One proxy listener: requests to ``port`` go to ``upstream`` (a base URL such as
    ``https://api.openai.com``). Every instance shares the server's one engine and store."""

    name: str
    port: int = Field(ge=1, le=65535)
    upstream: str


class ProxySettings(_Section):
    """``upstream``: where the main port's proxy forwards; ``instances``: more listeners."""

    upstream: str | None = None
    instances: list[InstanceSettings] = Field(default_factory=list)
    timeout: float = Field(600.0, gt=0)
    max_tool_continuations: int = Field(5, ge=0, le=20)


class ContextApiSettings(_Section):
    """``api_keys`` maps an environment variable holding an API key to the tenants that key
    may read (keys themselves never appear in a config file)."""

    api_keys: dict[str, list[str]] = Field(default_factory=dict)


class DashboardSettings(_Section):
    """``token_env``: the variable holding the dashboard token; required when the server
    binds to anything but loopback. ``corpus``: the document database the Ask page searches
    (default ``$CONTEXTFOLD_HOME/documents.db``, where ``contextfold ingest`` writes);
    ``examples``: the Ask page's example-question buttons."""

    enabled: bool = True
    token_env: str | None = "CONTEXTFOLD_DASHBOARD_TOKEN"
    corpus: str | None = None
    examples: tuple[str, ...] = (
        "Can I expense Uber rides during business travel?",
        "What is the hotel cap in London?",
        "Can I fly business class to Singapore?",
        "Do I need receipts for meals under 10 euros?",
    )


class LimitSettings(_Section):
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(5757, ge=0, le=65535)
    secret_env: str = "CONTEXTFOLD_SECRET"  # HMAC key of session markers (random if unset)
    memory_config: str | None = None  # a contextfold.yaml for the memory engine
    proxy: ProxySettings = ProxySettings()
    context_api: ContextApiSettings = ContextApiSettings()
    dashboard: DashboardSettings = DashboardSettings()
    limits: LimitSettings = LimitSettings()
