"""Config values are never silently coerced or dropped: ``true`` is not a number, a duplicate
YAML key is an error, ``store`` and ``storage_path`` together are an error, relevance floors
stay in their range, ``version`` is the supported one, and a file of the other kind (a server
config given as a memory config, or the reverse) says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from contextfold.cli import app
from contextfold.config_loading import load_yaml
from contextfold.errors import ConfigError
from contextfold.memory.config import load_config
from contextfold.server.config import load_server_config


def _write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _validate(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["config", "validate", str(path)])
    return result.exit_code, result.stdout + result.stderr


# -- booleans are not numbers --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("port: true\n", "port"),
        ("shutdown_timeout: true\n", "shutdown_timeout"),
        ("proxy: {timeout: true}\n", "proxy.timeout"),
        ("proxy: {memory_deadline_ms: false}\n", "proxy.memory_deadline_ms"),
        ("limits: {max_messages: true}\n", "limits.max_messages"),
        ("proxy: {instances: [{name: a, port: true, upstream: 'http://x'}]}\n", "port"),
    ],
)
def test_a_boolean_server_number_is_an_error_naming_the_key(
    tmp_path: Path, text: str, key: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"true or false") as caught:
        load_server_config(path)
    assert key in str(caught.value)
    code, out = _validate(path)
    assert code == 2 and key in out


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("context_window: true\n", "context_window"),
        ("compaction: {soft_threshold: true}\n", "compaction.soft_threshold"),
        ("tagger: {max_tags: true}\n", "tagger.max_tags"),
        ("recall: {dense_weight: false}\n", "recall.dense_weight"),
        ("assembly: {memory_budget: true}\n", "assembly.memory_budget"),
        ("llm: {provider: openai, model: m, timeout: true}\n", "llm.timeout"),
    ],
)
def test_a_boolean_memory_number_is_an_error_naming_the_key(
    tmp_path: Path, text: str, key: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"true or false") as caught:
        load_config(path)
    assert key in str(caught.value)
    code, out = _validate(path)
    assert code == 2 and key in out


def test_numbers_from_yaml_still_load(tmp_path: Path) -> None:
    server = load_server_config(
        _write(
            tmp_path,
            "port: 8080\nshutdown_timeout: 3\nproxy: {timeout: 30, memory_deadline_ms: 20}\n",
        )
    )
    assert (server.port, server.shutdown_timeout, server.proxy.timeout) == (8080, 3, 30.0)
    memory = load_config(
        _write(tmp_path, "context_window: 4096\ncompaction: {soft_threshold: 0.5}\n", "m.yaml")
    )
    assert (memory.context_window, memory.compaction.soft_threshold) == (4096, 0.5)
    # true/false keep their meaning where a setting takes them
    floors = load_config(_write(tmp_path, "recall: {relevance_floor: true}\n", "f.yaml"))
    assert floors.recall.relevance_floor == 0.41


# -- duplicate keys ------------------------------------------------------------------------------


def test_a_duplicate_server_key_is_an_error_naming_it_and_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "port: 1\nhost: 127.0.0.1\nport: 2\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'port' at line 3 \(first at line 1\)"):
        load_server_config(path)
    code, out = _validate(path)
    assert code == 2 and "duplicate key 'port'" in out


def test_a_duplicate_nested_memory_key_is_an_error_naming_it_and_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "recall:\n  embedder: none\n  embedder: minilm\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'embedder' at line 3"):
        load_config(path)
    code, out = _validate(path)
    assert code == 2 and "duplicate key 'embedder'" in out


def test_a_duplicate_key_in_a_flow_mapping_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "proxy:\n  instances: [{name: a, name: b, port: 9000}]\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'name' at line 2 \(first at line 2\)"):
        load_server_config(path)


def test_a_merge_key_may_still_be_overridden(tmp_path: Path) -> None:
    text = "x: &base {embedder: none, fusion: rrf}\nrecall:\n  <<: *base\n  fusion: score\n"
    data = load_yaml(text, "m.yaml")
    assert data["recall"] == {"embedder": "none", "fusion": "score"}


# -- store and storage_path ----------------------------------------------------------------------


def test_store_and_storage_path_together_are_an_error_naming_both(tmp_path: Path) -> None:
    path = _write(tmp_path, "store: a.db\nstorage_path: b.db\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "store" in str(caught.value) and "storage_path" in str(caught.value)
    assert "only one" in str(caught.value)
    assert load_config(_write(tmp_path, "storage_path: b.db\n", "one.yaml")).storage_path


# -- relevance floors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "floor",
    ["{dense: -5}", "{hybrid: 1.5}", "{bm25: -0.1}", "{bm25: 2}", "{dense_margin: 3}"],
)
def test_a_relevance_floor_out_of_range_is_an_error(tmp_path: Path, floor: str) -> None:
    path = _write(tmp_path, f"context_api: {{relevance_floor: {floor}}}\n")
    with pytest.raises(ConfigError, match=r"context_api\.relevance_floor: .*from"):
        load_server_config(path)


def test_relevance_floors_in_range_load(tmp_path: Path) -> None:
    text = "context_api: {relevance_floor: {dense: -1, hybrid: 1, bm25: 0, dense_margin: 2}}\n"
    cfg = load_server_config(_write(tmp_path, text))
    assert cfg.context_api.relevance_floor == {
        "dense": -1,
        "hybrid": 1,
        "bm25": 0,
        "dense_margin": 2,
    }


# -- version -------------------------------------------------------------------------------------


def test_an_unsupported_version_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"version: '2' is not supported.*\"1\""):
        load_config(_write(tmp_path, 'version: "2"\n'))
    assert load_config(_write(tmp_path, 'version: "1"\n', "v1.yaml")).version == "1"
    assert load_config(_write(tmp_path, "version: 1\n", "v1i.yaml")).version == "1"


# -- the other kind's file -----------------------------------------------------------------------


def test_a_file_mixing_server_and_memory_keys_says_so(tmp_path: Path) -> None:
    path = _write(tmp_path, "host: 0.0.0.0\nport: 8080\nrecall: {embedder: none}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "Extra inputs" not in message
    assert "server keys (host, port)" in message and "memory keys (recall)" in message
    assert "memory_config" in message
    code, out = _validate(path)
    assert code == 2 and "server keys (host, port)" in out


def test_a_server_config_given_as_a_memory_config_says_so(tmp_path: Path) -> None:
    path = _write(tmp_path, "port: 8080\nproxy: {upstream: 'http://x'}\n")
    with pytest.raises(ConfigError, match=r"looks like a server config \(port, proxy\)") as caught:
        load_config(path)
    assert f"contextfold serve -c {path}" in str(caught.value)


def test_a_memory_config_given_as_a_server_config_says_so(tmp_path: Path) -> None:
    path = _write(tmp_path, "recall: {embedder: none}\nstore: m.db\n")
    with pytest.raises(
        ConfigError, match=r"looks like a memory config \(recall, store\)"
    ) as caught:
        load_server_config(path)
    assert "--memory-config" in str(caught.value) and "memory_config" in str(caught.value)
