"""Reading documents from files: ``.txt``, ``.md``, ``.json``, ``.jsonl`` and, with the
``formats`` extra, ``.pdf``, ``.html`` / ``.htm`` and ``.docx``.

Text files are decoded as UTF-8 when they are UTF-8 (a byte-order mark is removed); otherwise
``charset-normalizer`` detects the encoding (cp1252, latin-1, UTF-16, Shift JIS, …), which the
document's ``encoding`` metadata records. A file no encoding fits is not text: ``DocumentError``.

A ``.json`` file holds one document object or a list of them; a ``.jsonl`` file one object per
line. An object's text is its ``text`` (or ``content``, or ``body``) field; ``title``, when
present, is prepended as the first line; every other scalar field becomes metadata. Folders
are walked recursively (sorted, hidden files skipped).

PDF text comes from ``pypdf`` (page by page; a scanned PDF has none), HTML text from
``inscriptis`` (layout-aware: paragraphs, lists and tables stay readable; scripts and styles
go), DOCX text from ``python-docx`` (paragraphs and table rows). Each keeps its title, when the
file has one, as ``title`` metadata. Without the extra these files raise ``DocumentError``
with the ``pip install "contextfold[formats]"`` line.
"""

from __future__ import annotations

import codecs
import importlib
import io
import json
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from contextfold.errors import ConfigError, DocumentError
from contextfold.items import valid_text

__all__ = [
    "SUFFIXES",
    "LoadedDocument",
    "decode_text",
    "iter_files",
    "load_documents",
]

TEXT_SUFFIXES = (".txt", ".md", ".json", ".jsonl")
RICH_SUFFIXES = (".pdf", ".html", ".htm", ".docx")
SUFFIXES = TEXT_SUFFIXES + RICH_SUFFIXES
_WESTERN = "cp1252"
_CHAOS_SLACK = 0.1  # how much less clean than the best guess windows-1252 may read
_EXTRA = 'pip install "contextfold[formats]"'
# UTF-32 first: its little-endian mark starts with UTF-16's.
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
_TEXT_FIELDS = ("text", "content", "body")


@dataclass(frozen=True)
class LoadedDocument:
    """One document read from a file: its text, where it came from, its metadata. Its text
    and string metadata are made ``valid_text`` (a lone surrogate from a JSON ``"\\ud83d"``
    becomes U+FFFD), so storing and embedding it never fails to encode."""

    text: str
    source: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", valid_text(self.text))
        metadata = {
            valid_text(k): valid_text(v) if isinstance(v, str) else v
            for k, v in self.metadata.items()
        }
        object.__setattr__(self, "metadata", metadata)


def iter_files(paths: Sequence[str | Path]) -> list[Path]:
    """The supported files under ``paths`` (files as given, folders walked), de-duplicated."""
    found: dict[Path, None] = {}
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ConfigError(f"{raw}: no such file or folder")
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                hidden = any(part.startswith(".") for part in child.relative_to(path).parts)
                if child.is_file() and child.suffix.lower() in SUFFIXES and not hidden:
                    found[child] = None
        elif path.suffix.lower() in SUFFIXES:
            found[path] = None
        else:
            raise ConfigError(f"{raw}: unsupported file type; supported: {', '.join(SUFFIXES)}")
    return list(found)


def decode_text(data: bytes, name: str = "<bytes>") -> tuple[str, str]:
    """``(text, encoding)`` of a text file's bytes: a byte-order mark decides (and is removed),
    else UTF-8 when the bytes are UTF-8, else the encoding ``charset-normalizer`` finds.

    >>> decode_text("café".encode("cp1252"))[0]
    'café'
    >>> decode_text(codecs.BOM_UTF8 + b"hi")
    ('hi', 'utf-8-sig')
    """
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding), encoding
            except UnicodeDecodeError:
                break  # a mark that lies: let detection decide
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        first_bad = exc.start
    else:
        if "\x00" not in text:  # NULs: UTF-16 without its mark is valid UTF-8 (or binary)
            return text, "utf-8"
        first_bad = text.index("\x00")
    from charset_normalizer import from_bytes

    matches = from_bytes(data)
    best = matches.best()
    if best is None or "\x00" in str(best):
        raise DocumentError(
            f"{name}: not text: it is not UTF-8 (byte {first_bad:,} is invalid) and no "
            "other encoding fits its bytes; convert it to UTF-8 or leave it out"
        )
    # Short Western text reads as cleanly in several code pages (``crème`` in cp1250 is
    # ``crčme``); windows-1252 — the web's legacy default for Western text — wins when it reads
    # the bytes about as cleanly as the best guess.
    western = next(
        (
            m
            for m in matches
            if _WESTERN in m.could_be_from_charset and m.chaos <= best.chaos + _CHAOS_SLACK
        ),
        None,
    )
    chosen = western or best
    return str(chosen), _WESTERN if western is not None else chosen.encoding


def _from_object(obj: Any, source: str, where: str) -> LoadedDocument:
    if isinstance(obj, str):
        return LoadedDocument(obj, source, {"source": source})
    if not isinstance(obj, dict):
        raise DocumentError(
            f"{where}: expected an object with a 'text' field, got {type(obj).__name__}"
        )
    text_field = next((f for f in _TEXT_FIELDS if isinstance(obj.get(f), str)), None)
    if text_field is None:
        raise DocumentError(f"{where}: no text field (one of {', '.join(_TEXT_FIELDS)})")
    text = obj[text_field]
    title = obj.get("title")
    if isinstance(title, str) and title.strip() and not text.startswith(title):
        text = f"{title}\n{text}"
    metadata = {
        k: v for k, v in obj.items() if k != text_field and isinstance(v, str | int | float | bool)
    }
    metadata.setdefault("source", source)
    return LoadedDocument(text, source, metadata)


def load_documents(path: Path) -> Iterator[LoadedDocument]:
    """The documents in one file. A file that cannot be read (no encoding fits, malformed
    JSON, a broken PDF or DOCX, the ``formats`` extra missing) raises ``DocumentError`` naming
    the file and the place."""
    source = path.name
    suffix = path.suffix.lower()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DocumentError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if suffix in RICH_SUFFIXES:
        yield from _rich_document(path, data, suffix)
        return
    raw, encoding = decode_text(data, str(path))
    if suffix in (".txt", ".md"):
        if raw.strip():
            metadata = {"source": source, "format": suffix[1:]}
            if encoding != "utf-8":
                metadata["encoding"] = encoding
            yield LoadedDocument(raw, source, metadata)
        return
    if suffix == ".jsonl":
        for number, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DocumentError(f"{path}:{number}: invalid JSON ({exc.msg})") from None
            yield _from_object(obj, source, f"{path}:{number}")
        return
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    for n, obj in enumerate(parsed if isinstance(parsed, list) else [parsed]):
        yield _from_object(obj, source, f"{path}[{n}]")


def _extra(module: str, path: Path, kind: str) -> ModuleType:
    """``module``, or a ``DocumentError`` naming the extra that brings it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DocumentError(
            f"{path}: reading {kind} files needs the 'formats' extra ({module} is not "
            f"installed): {_EXTRA}"
        ) from None


def _rich_document(path: Path, data: bytes, suffix: str) -> Iterator[LoadedDocument]:
    if suffix == ".pdf":
        text, title = _pdf_text(path, data)
    elif suffix == ".docx":
        text, title = _docx_text(path, data)
    else:
        text, title = _html_text(path, data)
    if not text.strip():
        hint = " (a scanned PDF has no text layer: OCR it first)" if suffix == ".pdf" else ""
        raise DocumentError(f"{path}: no text to index{hint}")
    kind = "html" if suffix == ".htm" else suffix[1:]
    metadata: dict[str, Any] = {"source": path.name, "format": kind}
    if title:
        metadata["title"] = title
    yield LoadedDocument(text, path.name, metadata)


def _pdf_text(path: Path, data: bytes) -> tuple[str, str | None]:
    pypdf = _extra("pypdf", path, "PDF")
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise DocumentError(f"{path}: the PDF is encrypted; decrypt it first")
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
        info = reader.metadata
        title = info.title if info is not None else None
    except pypdf.errors.PyPdfError as exc:
        raise DocumentError(f"{path}: not a readable PDF ({exc})") from None
    return "\n\n".join(p for p in pages if p), (title or "").strip() or None


def _docx_text(path: Path, data: bytes) -> tuple[str, str | None]:
    docx = _extra("docx", path, "DOCX")

    try:
        document = docx.Document(io.BytesIO(data))
    except (zipfile.BadZipFile, KeyError, ValueError, docx.opc.exceptions.PackageNotFoundError):
        raise DocumentError(f"{path}: not a readable DOCX file (not a Word document?)") from None
    lines = [p.text for p in document.paragraphs]
    for table in document.tables:
        for row in table.rows:
            lines.append(" | ".join(cell.text.strip() for cell in row.cells))
    text = "\n".join(line for line in lines if line.strip())
    return text, (document.core_properties.title or "").strip() or None


def _html_text(path: Path, data: bytes) -> tuple[str, str | None]:
    inscriptis = _extra("inscriptis", path, "HTML")
    lxml_html = _extra("lxml.html", path, "HTML")  # inscriptis's own parser
    markup, _ = decode_text(data, str(path))
    if not markup.strip():
        return "", None
    try:
        tree = lxml_html.document_fromstring(markup)
    except (ValueError, lxml_html.etree.ParserError) as exc:
        raise DocumentError(f"{path}: not readable HTML ({exc})") from None
    title = (tree.findtext(".//title") or "").strip() or None
    text = inscriptis.Inscriptis(tree).get_text()
    lines = [line.rstrip() for line in text.splitlines()]
    return "\n".join(lines).strip(), title
