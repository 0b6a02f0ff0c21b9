"""A relative path in a server config is relative to that file's folder (``memory_config``,
``context_api.graph_path``, ``dashboard.corpus``), not to the current directory; and ``config
validate`` checks the memory config a server config names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contextfold.cli import app
from contextfold.server.config import ServerConfig, load_server_config

MEMORY = "recall:\n  embedder: none\n"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def validate(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["config", "validate", *args])
    return result.exit_code, result.stdout, result.stderr


def test_server_config_paths_are_relative_to_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _write(
        tmp_path / "sub" / "s.yaml",
        "memory_config: mem.yaml\n"
        "context_api: {graph_path: data/graph.db}\n"
        "dashboard: {corpus: ../docs.db}\n",
    )
    cfg = load_server_config("sub/s.yaml")
    assert Path(cfg.memory_config or "") == Path("sub/mem.yaml")
    assert Path(cfg.context_api.graph_path or "") == Path("sub/data/graph.db")
    assert Path(cfg.dashboard.corpus or "") == Path("sub/../docs.db")
    cfg = load_server_config(tmp_path / "sub" / "s.yaml")  # an absolute file: absolute paths
    assert cfg.memory_config == str(tmp_path / "sub" / "mem.yaml")


def test_absolute_paths_urls_and_memory_stay_as_they_are(tmp_path: Path) -> None:
    url = "postgresql://app:s3cret@db/graph"
    path = _write(
        tmp_path / "sub" / "s.yaml",
        f"memory_config: {tmp_path / 'm.yaml'}\n"
        f"context_api: {{graph_path: '{url}'}}\n"
        "dashboard: {corpus: ':memory:'}\n",
    )
    cfg = load_server_config(path)
    assert cfg.memory_config == str(tmp_path / "m.yaml")
    assert (cfg.context_api.graph_path, cfg.dashboard.corpus) == (url, ":memory:")


def test_a_config_built_in_code_keeps_its_paths(tmp_path: Path) -> None:
    cfg = ServerConfig(memory_config="m.yaml", context_api={"graph_path": "g.db"})  # type: ignore[arg-type]
    assert (cfg.memory_config, cfg.context_api.graph_path) == ("m.yaml", "g.db")


def test_validate_finds_the_memory_config_beside_the_server_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "sub" / "mem.yaml", MEMORY)
    _write(tmp_path / "sub" / "s2.yaml", "memory_config: mem.yaml\nport: 56011\n")
    code, out, err = validate("sub/s2.yaml")
    assert code == 0, err
    assert "ok: sub/s2.yaml (server config)" in out
    assert str(Path("sub/mem.yaml")) in out


@pytest.mark.parametrize(
    ("memory", "fragment"),
    [
        (None, "not found"),
        ("recall: {embedder: none}\nbogus_key: 1\n", "bogus_key"),
        ("store: 'mysql://app:s3cret@x/y'\n", "unsupported URL scheme 'mysql'"),
    ],
)
@pytest.mark.parametrize("json_out", [False, True])
def test_validate_checks_the_memory_config_a_server_config_names(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    memory: str | None,
    fragment: str,
    json_out: bool,
) -> None:
    monkeypatch.chdir(tmp_path)
    if memory is not None:
        _write(tmp_path / "mem.yaml", memory)
    _write(tmp_path / "s1.yaml", "memory_config: mem.yaml\nport: 56011\n")
    code, out, err = validate("s1.yaml", *(["--json"] if json_out else []))
    assert code == 2, out + err
    if json_out:
        answer = json.loads(out)
        assert answer["ok"] is False and answer["kind"] == "server"
        message = answer["message"]
    else:
        assert out == "" and err.startswith("error: ")
        message = err
    assert "memory_config" in message and "mem.yaml" in message and fragment in message
    assert "s3cret" not in out + err
