"""A JSON input file saved with a UTF-8 byte-order mark (as Notepad writes it) reads as the
same file without one, as ``ingest`` already reads documents: the mark is not content."""

from __future__ import annotations

import codecs
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTEXTFOLD_HOME": str(home)}
    env.pop("CONTEXTFOLD_STORE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "contextfold", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize("bom", [False, True], ids=["plain", "bom"])
def test_json_inputs_read_the_same_with_a_byte_order_mark(tmp_path: Path, bom: bool) -> None:
    mark = codecs.BOM_UTF8 if bom else b""
    request = tmp_path / "request.json"
    request.write_bytes(mark + json.dumps({"query": "Can I expense a taxi?"}).encode())
    conversation = tmp_path / "conversation.json"
    messages = [{"role": "user", "content": "We picked quartz for the kitchen."},
                {"role": "assistant", "content": "Quartz it is."}]  # fmt: skip
    conversation.write_bytes(mark + json.dumps(messages).encode())

    built = run("build", "-i", str(request), "--json", home=tmp_path / "home")
    assert built.returncode == 0, built.stderr
    assert "Can I expense a taxi?" in built.stdout
    stored = run("memory", "compact", "-i", str(conversation), home=tmp_path / "home")
    assert stored.returncode == 0, stored.stderr
    assert "stored 2 new turn(s)" in stored.stdout
    counted = run("tokens", str(request), home=tmp_path / "home")
    assert counted.returncode == 0, counted.stderr
    plain = tmp_path / "plain.json"
    plain.write_bytes(request.read_bytes().removeprefix(codecs.BOM_UTF8))
    assert run("tokens", str(plain), home=tmp_path / "home").stdout == counted.stdout.replace(
        str(request), str(plain)
    )
