"""``contextfold init --from virtual-context.yaml``: convert seed 001's configuration file.

A ``virtual-context.yaml`` holds in one file what contextfold splits in two: the memory
engine's settings (``contextfold.yaml``) and the server's (``server.yaml``: its ``proxy``
instances). ``convert`` maps each key it knows and lists every key it could not carry over, with
the reason — nothing is dropped silently:

==========================================  ===============================================
``virtual-context.yaml``                    contextfold
==========================================  ===============================================
``context_window``                          ``context_window``
``storage.sqlite.path`` / ``storage_root``  ``storage_path`` (``<storage_root>/store.db``)
``tag_generator.type``                      ``tagger.type`` (``llm`` / ``keyword``);
                                            ``embedding``: ``tagger.inbound: embedding``
``tag_generator.provider`` / ``model``      ``llm`` (the provider's ``base_url`` and type
                                            from ``providers``)
``tag_generator.max_tags``                  ``tagger.max_tags`` (at most 20)
``…keyword_fallback.tag_keywords``          ``tagger.keywords``
``tag_generator.tag_splitting``             ``tagger.splitting``
``tag_rules``                               ``tag_rules`` (same keys)
``compaction`` / ``assembly``               the same keys of ``compaction`` / ``assembly``
``proxy.instances`` (``label``)             ``server.yaml``: the first instance is the main
                                            port, the others ``proxy.instances`` (``name``)
==========================================  ===============================================

>>> memory, server, notes = convert({"context_window": 32000, "proxy": {"instances": [
...     {"port": 5757, "upstream": "https://api.openai.com", "label": "openai"}]}})
>>> memory["context_window"], server["port"], server["proxy"]["upstream"]
(32000, 5757, 'https://api.openai.com')
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

__all__ = ["convert"]

_PROVIDER_TYPES = {"generic_openai": "openai", "openai": "openai", "anthropic": "anthropic"}
_COMPACTION = ("soft_threshold", "hard_threshold", "protected_recent_turns")
_COMPACTION_MORE = ("max_concurrent_summaries",)
_ASSEMBLY = ("context_hint_enabled", "context_hint_max_tokens")
_SPLITTING = ("enabled", "frequency_threshold", "frequency_pct_threshold", "max_splits_per_turn")


def _section(data: dict[str, Any], key: str, notes: list[str]) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        notes.append(f"{key}: expected a mapping, got {type(value).__name__}; not converted")
        return {}
    return value


def _copy(
    source: dict[str, Any], keys: tuple[str, ...], where: str, notes: list[str]
) -> dict[str, Any]:
    out = {k: source[k] for k in keys if k in source}
    for key in source:
        if key not in keys:
            notes.append(f"{where}.{key}: no contextfold equivalent; not converted")
    return out


def _llm(tagger: dict[str, Any], providers: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    name = str(tagger.get("provider") or "ollama")
    model = tagger.get("model")
    provider = providers.get(name) or {}
    kind = str(provider.get("type", name))
    if name == "ollama" or kind == "ollama":
        llm: dict[str, Any] = {"provider": "ollama"}
    elif kind in _PROVIDER_TYPES:
        llm = {"provider": _PROVIDER_TYPES[kind]}
    elif kind == "gemini":
        llm = {"provider": "gemini"}
    else:
        notes.append(f"providers.{name}.type: {kind!r} is not a provider contextfold knows")
        llm = {"provider": "openai"}
    llm["model"] = str(model or "")
    if provider.get("base_url"):
        llm["base_url"] = provider["base_url"]
    for key in ("api_key_env",):
        if provider.get(key):
            llm[key] = provider[key]
    for key in provider:
        if key not in ("type", "base_url", "api_key_env", "model"):
            notes.append(f"providers.{name}.{key}: no contextfold equivalent; not converted")
    if not model:
        notes.append("tag_generator.model: missing; fill in llm.model")
    return llm


def _tagger(
    data: dict[str, Any], notes: list[str], splitting_keys: tuple[str, ...]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    source = _section(data, "tag_generator", notes)
    providers = _section(data, "providers", notes)
    tagger: dict[str, Any] = {}
    llm = None
    kind = source.get("type", "keyword")
    if kind == "llm":
        tagger["type"] = "llm"
        llm = _llm(source, providers, notes)
    elif kind == "embedding":
        tagger["inbound"] = "embedding"
    elif kind != "keyword":
        notes.append(f"tag_generator.type: {kind!r} is not llm, keyword or embedding")
    if "max_tags" in source:
        tagger["max_tags"] = min(int(source["max_tags"]), 20)
    fallback = source.get("keyword_fallback") or {}
    keywords = fallback.get("tag_keywords") if isinstance(fallback, dict) else None
    if keywords:
        tagger["keywords"] = {str(t): [str(w) for w in ws] for t, ws in keywords.items()}
    splitting = source.get("tag_splitting")
    if isinstance(splitting, dict):
        tagger["splitting"] = _copy(splitting, splitting_keys, "tag_generator.tag_splitting", notes)
    known = {"type", "provider", "model", "max_tags", "keyword_fallback", "tag_splitting"}
    for key in source:
        if key not in known:
            notes.append(f"tag_generator.{key}: no contextfold equivalent; not converted")
    return tagger, llm


def _storage(data: dict[str, Any], notes: list[str]) -> str | None:
    storage = _section(data, "storage", notes)
    backend = storage.get("backend", "sqlite")
    if backend != "sqlite":
        notes.append(
            f"storage.backend: {backend!r} is not converted (contextfold stores in SQLite)"
        )
    sqlite = storage.get("sqlite") or {}
    if isinstance(sqlite, dict) and sqlite.get("path"):
        return str(sqlite["path"])
    root = data.get("storage_root")
    return str(PurePosixPath(str(root)) / "store.db") if root else None


def _server(data: dict[str, Any], notes: list[str]) -> dict[str, Any] | None:
    proxy = _section(data, "proxy", notes)
    instances = proxy.get("instances") or []
    if not instances:
        return None
    converted = []
    for n, instance in enumerate(instances):
        if not isinstance(instance, dict):
            notes.append(f"proxy.instances[{n}]: expected a mapping; not converted")
            continue
        name = instance.get("label") or instance.get("name") or f"instance-{n + 1}"
        converted.append(
            {"name": str(name), "port": instance.get("port"), "upstream": instance.get("upstream")}
        )
        for key in instance:
            if key not in ("label", "name", "port", "upstream"):
                notes.append(f"proxy.instances[{n}].{key}: no contextfold equivalent")
    for key in proxy:
        if key != "instances":
            notes.append(f"proxy.{key}: no contextfold equivalent; not converted")
    if not converted:
        return None
    main, rest = converted[0], converted[1:]
    notes.append(
        f"proxy.instances: {main['name']!r} (port {main['port']}) is the server's main port"
        " (it serves the dashboard too); the others are proxy.instances"
    )
    return {"port": main["port"], "proxy": {"upstream": main["upstream"], "instances": rest}}


def convert(
    data: dict[str, Any], *, splitting_keys: tuple[str, ...] = _SPLITTING
) -> tuple[dict[str, Any], dict[str, Any] | None, list[str]]:
    """(the ``contextfold.yaml`` mapping, the ``server.yaml`` mapping or ``None`` without
    proxy instances, notes on what was not carried over) for a ``virtual-context.yaml``."""
    notes: list[str] = []
    memory: dict[str, Any] = {}
    if "context_window" in data:
        memory["context_window"] = int(data["context_window"])
    path = _storage(data, notes)
    if path:
        memory["storage_path"] = path
    tagger, llm = _tagger(data, notes, splitting_keys)
    if tagger:
        memory["tagger"] = tagger
    if llm is not None:
        memory["llm"] = llm
    rules = data.get("tag_rules")
    if isinstance(rules, list) and rules:
        memory["tag_rules"] = [dict(rule) for rule in rules if isinstance(rule, dict)]
    compaction = _copy(
        _section(data, "compaction", notes), _COMPACTION + _COMPACTION_MORE, "compaction", notes
    )
    if compaction:
        memory["compaction"] = compaction
    assembly = _copy(_section(data, "assembly", notes), _ASSEMBLY, "assembly", notes)
    if assembly:
        memory["assembly"] = assembly
    handled = {
        "version",
        "context_window",
        "storage_root",
        "storage",
        "tag_generator",
        "providers",
        "tag_rules",
        "compaction",
        "assembly",
        "proxy",
    }
    for key in data:
        if key not in handled:
            notes.append(f"{key}: no contextfold equivalent; not converted")
    return memory, _server(data, notes), notes
