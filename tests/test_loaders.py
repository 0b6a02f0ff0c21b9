"""Reading documents from .txt / .md / .json / .jsonl files and folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contextfold.errors import ConfigError
from contextfold.retrieval.loaders import iter_files, load_documents


def test_text_and_markdown_files_are_one_document_each(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("Plain text.")
    (tmp_path / "b.md").write_text("# Title\n\nBody.")
    docs = [d for f in iter_files([tmp_path]) for d in load_documents(f)]
    assert [(d.source, d.metadata["format"]) for d in docs] == [("a.txt", "txt"), ("b.md", "md")]


def test_jsonl_objects_become_documents_with_metadata(tmp_path: Path) -> None:
    path = tmp_path / "faq.jsonl"
    rows = [
        {"title": "Receipts", "text": "Keep them.", "category": "claims", "nested": {"x": 1}},
        {"content": "Second."},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    first, second = load_documents(path)
    assert first.text == "Receipts\nKeep them."
    assert first.metadata == {"title": "Receipts", "category": "claims", "source": "faq.jsonl"}
    assert second.text == "Second."


def test_json_list_or_single_object(tmp_path: Path) -> None:
    (tmp_path / "one.json").write_text(json.dumps({"body": "Solo."}))
    (tmp_path / "many.json").write_text(json.dumps([{"text": "A"}, "B"]))
    assert [d.text for d in load_documents(tmp_path / "one.json")] == ["Solo."]
    assert [d.text for d in load_documents(tmp_path / "many.json")] == ["A", "B"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.jsonl", '{"text": "ok"}\n{oops\n', r"bad.jsonl:2: invalid JSON"),
        ("bad.json", '[{"text": 1}]', r"no text field"),
        ("bad.json", "[3]", r"expected an object"),
    ],
)
def test_malformed_files_name_the_place(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        list(load_documents(path))


def test_invalid_utf8_is_reported_with_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"caf\xe9")
    with pytest.raises(ConfigError, match="offset 3"):
        list(load_documents(path))


def test_folders_are_walked_sorted_skipping_hidden_and_other_types(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / ".git").mkdir()
    for name in ["z.md", "sub/a.txt", ".git/x.txt", "image.png", ".hidden.txt"]:
        (tmp_path / name).write_text("x")
    assert [
        p.relative_to(tmp_path).as_posix() for p in iter_files([tmp_path, tmp_path / "z.md"])
    ] == [
        "sub/a.txt",
        "z.md",
    ]


def test_missing_and_unsupported_paths_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        iter_files([tmp_path / "nope"])
    (tmp_path / "x.pdf").write_text("x")
    with pytest.raises(ConfigError, match="unsupported file type"):
        iter_files([tmp_path / "x.pdf"])
