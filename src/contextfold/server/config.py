"""``ServerConfig``: the ``server:`` section of ``contextfold.yaml`` (or its own file).

Each part of the server owns one section model here: ``proxy`` (upstreams and instances),
``context_api`` (API keys → tenants), ``dashboard`` (token), ``limits`` (bad-input guards).
Unknown keys are errors, as everywhere in the configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from contextfold.errors import ConfigError

__all__ = [
    "ContextApiSettings",
    "DashboardSettings",
    "InstanceSettings",
    "LimitSettings",
    "ProxySettings",
    "ServerConfig",
    "load_server_config",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InstanceSettings(_Section):
    """One proxy listener: requests to ``port`` go to ``upstream`` (a base URL such as
    ``https://api.openai.com``). Every instance shares the server's one engine and store."""

    name: str
    port: int = Field(ge=1, le=65535)
    upstream: str = Field(pattern=r"^https?://")


class ProxySettings(_Section):
    """``upstream``: where the main port's proxy forwards; ``instances``: more listeners."""

    upstream: str | None = Field(None, pattern=r"^https?://")
    instances: list[InstanceSettings] = Field(default_factory=list)
    timeout: float = Field(600.0, gt=0)
    max_tool_continuations: int = Field(5, ge=0, le=20)


class ContextApiSettings(_Section):
    """``api_keys`` maps an environment variable holding an API key to the tenants that key
    may read (keys themselves never appear in a config file)."""

    api_keys: dict[str, list[str]] = Field(default_factory=dict)


class DashboardSettings(_Section):
    """``token_env``: the variable holding the dashboard token; required when the server
    binds to anything but loopback."""

    enabled: bool = True
    token_env: str | None = "CONTEXTFOLD_DASHBOARD_TOKEN"


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
    level). Any problem raises ``ConfigError`` naming the file and the bad fields."""
    file = Path(path)
    try:
        data: Any = yaml.safe_load(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"server config {str(file)!r} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read server config {str(file)!r}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{file}: invalid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return ServerConfig.model_validate(data)
    except ValidationError as exc:
        lines = [
            f"  {'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
            for err in exc.errors()
        ]
        raise ConfigError(f"{file}: invalid server config:\n" + "\n".join(lines)) from None
