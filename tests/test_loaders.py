"""Reading documents from .txt / .md / .json / .jsonl files in any encoding, from PDF, HTML
and DOCX files (the ``formats`` extra, on real files each test writes), and from folders."""

from __future__ import annotations

import codecs
import json
import sys
from pathlib import Path

import pytest

from contextfold.errors import ConfigError, DocumentError
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
    with pytest.raises(DocumentError, match=message):
        list(load_documents(path))


FRENCH = "Le café du coin sert une crème brûlée. Notre façade naïve cache un déjà-vu."


@pytest.mark.parametrize(
    ("data", "encoding"),
    [
        (FRENCH.encode("cp1252"), "cp1252"),
        (b"caf\xe9 cr\xe8me", "cp1252"),  # short Western text: not read as cp1250 (crčme)
        (codecs.BOM_UTF8 + FRENCH.encode(), "utf-8-sig"),
        (FRENCH.encode("utf-16"), "utf-16"),  # with its byte-order mark
        (FRENCH.encode("utf-16-le"), "utf_16_le"),  # without one (valid UTF-8, full of NULs)
        ("Привет, это документ о командировках и возмещении расходов.".encode("cp1251"), None),
    ],
)
def test_text_in_any_encoding_is_detected_and_the_bom_removed(
    tmp_path: Path, data: bytes, encoding: str | None
) -> None:
    path = tmp_path / "note.txt"
    path.write_bytes(data)
    (doc,) = load_documents(path)
    if encoding is not None:
        assert doc.metadata["encoding"] == encoding
        assert doc.text in (FRENCH, "café crème")
    else:
        assert doc.text.startswith("Привет, это документ")
    assert not doc.text.startswith("\ufeff")


def test_utf8_bom_json_is_read_and_plain_utf8_carries_no_encoding(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_bytes(codecs.BOM_UTF8 + json.dumps({"text": "Hé"}).encode())
    (tmp_path / "b.md").write_text("# Hé", encoding="utf-8")
    assert [d.text for d in load_documents(tmp_path / "a.json")] == ["Hé"]
    assert "encoding" not in next(load_documents(tmp_path / "b.md")).metadata


def test_binary_bytes_are_not_text(tmp_path: Path) -> None:
    path = tmp_path / "image.txt"
    path.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(DocumentError, match=r"image\.txt: not text: it is not UTF-8 \(byte 128"):
        list(load_documents(path))


def _pdf(path: Path, title: str, pages: list[str]) -> None:
    from reportlab.pdfgen.canvas import Canvas

    canvas = Canvas(str(path))
    canvas.setTitle(title)
    for text in pages:
        canvas.drawString(72, 720, text)
        canvas.showPage()
    canvas.save()


def test_pdf_text_comes_page_by_page_with_its_title(tmp_path: Path) -> None:
    path = tmp_path / "refunds.pdf"
    _pdf(path, "Refund policy", ["Refunds are paid within 14 days.", "Managers approve over $100."])
    (doc,) = load_documents(path)
    assert doc.text == "Refunds are paid within 14 days.\n\nManagers approve over $100."
    assert doc.metadata == {"source": "refunds.pdf", "format": "pdf", "title": "Refund policy"}


def test_docx_paragraphs_and_tables_become_text(tmp_path: Path) -> None:
    import docx

    document = docx.Document()
    document.core_properties.title = "Lodging"
    document.add_heading("Hotel caps", level=1)
    document.add_paragraph("London is capped at EUR 220 per night.")
    table = document.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text, table.rows[0].cells[1].text = "Paris", "EUR 190"
    document.save(str(tmp_path / "lodging.docx"))
    (doc,) = load_documents(tmp_path / "lodging.docx")
    assert doc.text == "Hotel caps\nLondon is capped at EUR 220 per night.\nParis | EUR 190"
    assert doc.metadata["title"] == "Lodging"


def test_html_keeps_the_text_and_drops_scripts_and_styles(tmp_path: Path) -> None:
    (tmp_path / "faq.htm").write_text(
        "<html><head><title>FAQ</title><style>p {color: red}</style></head><body>"
        "<script>track()</script><h1>Receipts</h1><p>Keep <b>every</b> receipt.</p>"
        "<ul><li>taxis</li><li>hotels</li></ul></body></html>",
        encoding="utf-8",
    )
    (doc,) = load_documents(tmp_path / "faq.htm")
    lines = [line.strip() for line in doc.text.splitlines() if line.strip()]
    assert lines == ["Receipts", "Keep every receipt.", "* taxis", "* hotels"]
    assert doc.metadata == {"source": "faq.htm", "format": "html", "title": "FAQ"}


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("broken.pdf", b"%PDF-1.4 not really", r"broken\.pdf: not a readable PDF"),
        ("broken.docx", b"PK not a zip", r"broken\.docx: not a readable DOCX"),
        ("empty.html", b"<html><body> </body></html>", r"empty\.html: no text to index"),
    ],
)
def test_broken_rich_files_name_the_file(
    tmp_path: Path, name: str, data: bytes, message: str
) -> None:
    (tmp_path / name).write_bytes(data)
    with pytest.raises(DocumentError, match=message):
        list(load_documents(tmp_path / name))


@pytest.mark.parametrize(
    ("module", "suffix"), [("pypdf", ".pdf"), ("docx", ".docx"), ("inscriptis", ".html")]
)
def test_a_missing_formats_extra_names_the_install_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, suffix: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # what an uninstalled package looks like
    path = tmp_path / f"doc{suffix}"
    path.write_bytes(b"anything")
    with pytest.raises(DocumentError, match=r"needs the 'formats' extra .*contextfold\[formats\]"):
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
    (tmp_path / "x.png").write_text("x")
    with pytest.raises(ConfigError, match="unsupported file type"):
        iter_files([tmp_path / "x.png"])
