"""``contextfold ingest`` / ``search`` / ``ask`` on the demo policy corpus, through typer's
``CliRunner``; ``ask --llm`` against the fake OpenAI-compatible server."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from contextfold.cli import app

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ROOT / "examples" / "policies"
SECTIONS = ("instructions", "goal", "memory", "retrieval", "tool_outputs")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("corpus") / "docs.db"
    result = invoke("ingest", str(POLICIES), "--db", str(db))
    assert result.exit_code == 0, result.output
    return db


def test_ingest_reports_what_it_stored_and_is_idempotent(corpus: Path) -> None:
    again = invoke("ingest", str(POLICIES), "--db", str(corpus))
    assert again.exit_code == 0, again.output
    match = re.search(r"ingested (\d+) new document\(s\).*skipped (\d+)", again.stdout)
    assert match is not None and match.group(1) == "0"
    assert int(match.group(2)) == 7 + 12  # seven policy files, twelve FAQ lines


def _mixed_folder(root: Path) -> Path:
    """Three files in walk order: UTF-8, binary bytes (no encoding fits), cp1252 French."""
    folder = root / "mixed"
    folder.mkdir()
    (folder / "a_refunds.txt").write_text("Refunds are paid within 14 days.", encoding="utf-8")
    (folder / "b_scan.txt").write_bytes(bytes(range(256)) * 8)
    (folder / "c_cafe.txt").write_bytes("Le café rembourse la crème brûlée.".encode("cp1252"))
    return folder


def test_ingest_skips_an_unreadable_file_and_says_why_at_the_end(tmp_path: Path) -> None:
    db = tmp_path / "docs.db"
    result = invoke("ingest", str(_mixed_folder(tmp_path)), "--db", str(db), "--no-embed")
    assert result.exit_code == 0, result.output
    assert "ingested 2 new document(s)" in result.stdout
    assert result.stderr.splitlines()[-2:] == [
        "skipped 1 of 3 file(s) that could not be read:",
        f"  {tmp_path / 'mixed' / 'b_scan.txt'}: not text: it is not UTF-8 (byte 128 is "
        "invalid) and no other encoding fits its bytes; convert it to UTF-8 or leave it out",
    ]
    found = invoke("search", "crème brûlée", "--db", str(db), "--mode", "bm25", "--json")
    assert "Le café rembourse la crème brûlée." in found.stdout  # decoded as cp1252


def test_ingest_on_error_fail_stops_and_says_what_is_already_stored(tmp_path: Path) -> None:
    db = tmp_path / "docs.db"
    folder = _mixed_folder(tmp_path)
    result = invoke("ingest", str(folder), "--db", str(db), "--no-embed", "--on-error", "fail")
    assert result.exit_code == 1
    assert "Traceback" not in result.output and "ConfigError" not in result.output
    error = result.stderr.strip()
    assert error.startswith(f"error: DocumentError: {folder / 'b_scan.txt'}: not text")
    assert "Stopped at file 2 of 3: the 1 file(s) before it are stored (1 new document(s))" in error
    assert "--on-error skip" in error
    found = invoke("search", "refunds", "--db", str(db), "--mode", "bm25", "--json")
    assert [h["metadata"]["source"] for h in json.loads(found.stdout)] == ["a_refunds.txt"]


def test_ingest_reads_pdf_html_and_docx(tmp_path: Path) -> None:
    import docx
    from reportlab.pdfgen.canvas import Canvas

    folder = tmp_path / "rich"
    folder.mkdir()
    canvas = Canvas(str(folder / "per_diem.pdf"))
    canvas.drawString(72, 720, "The per diem in Lisbon is EUR 61.")
    canvas.save()
    (folder / "visa.html").write_text("<p>Visa fees are reimbursed in full.</p>")
    document = docx.Document()
    document.add_paragraph("Laptops are replaced every four years.")
    document.save(str(folder / "equipment.docx"))
    db = tmp_path / "docs.db"
    result = invoke("ingest", str(folder), "--db", str(db), "--no-embed")
    assert result.exit_code == 0, result.output
    assert "ingested 3 new document(s)" in result.stdout
    for query, source in [("per diem Lisbon", "per_diem.pdf"), ("visa fees", "visa.html")]:
        found = invoke("search", query, "--db", str(db), "--mode", "bm25", "-k", "1", "--json")
        assert json.loads(found.stdout)[0]["metadata"]["source"] == source


def test_search_modes_find_the_hotel_cap(corpus: Path) -> None:
    for mode in ("bm25", "dense", "hybrid"):
        result = invoke(
            "search",
            "hotel cap in London",
            "--mode",
            mode,
            "-k",
            "3",
            "--db",
            str(corpus),
            "--json",
        )
        assert result.exit_code == 0, result.output
        hits = json.loads(result.stdout)
        assert len(hits) == 3
        assert any("220" in h["text"] and "London" in h["text"] for h in hits), mode
        assert all(h["match_source"] in {"bm25", "vector", "hybrid"} for h in hits)


def test_search_table_output(corpus: Path) -> None:
    result = invoke("search", "Uber ride-hailing", "--db", str(corpus), "-k", "2")
    assert result.exit_code == 0, result.output
    assert "hybrid search: Uber ride-hailing" in result.stdout
    assert "ground_transport_policy.txt" in result.stdout


def test_ask_without_an_llm_says_so_and_shows_the_best_passage(corpus: Path) -> None:
    result = invoke("ask", "Can I expense Uber rides during business travel?", "--db", str(corpus))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("no LLM configured, so no answer (add --llm BASE_URL --model")
    assert lines[2].startswith("[Source 1] ")  # the best hit, then its passage
    assert "public transport is impractical" in lines[3]
    assert re.fullmatch(
        r"context: [\d,]+ of 3,247 tokens, 5 of 8 sources in it \(1 cut, 3 dropped\); "
        r"more: --show context,budget,sources",
        lines[-1],
    )
    assert len(lines) <= 12  # the passage and two lines: no prompt, no tables unless asked
    assert "Context budget" not in result.stdout and "## Question" not in result.stdout


@pytest.mark.parametrize("show", [["budget,context,sources"], ["sources", "context", "budget"]])
def test_ask_show_prints_context_budget_and_sources(corpus: Path, show: list[str]) -> None:
    args = [arg for value in show for arg in ("--show", value)]
    result = invoke(
        "ask",
        "Can I expense Uber rides during business travel?",
        "--db",
        str(corpus),
        "--memory",
        "Employee works from the Berlin office.",
        "--tool-output",
        "trip_lookup -> TR-2291 approved",
        *args,
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    for section in SECTIONS:
        assert re.search(rf"│ {section}\s+│", out), section
    assert re.search(r"│ retrieval\s+│\s+550 │\s+\d+ │ ⚠ TRUNCATED", out)  # 8 chunks > 550 tokens
    assert "Source 1: " in out  # the packed context
    assert out.index("## Question") < out.index("Context budget") < out.index("Sources")
    assert out.rstrip().endswith("┘")  # no hint: everything was shown


def test_ask_names_cut_and_dropped_chunks_by_file_and_position(corpus: Path) -> None:
    result = invoke("ask", "Can I expense Uber rides?", "--db", str(corpus), "--show", "budget")
    assert result.exit_code == 0, result.output
    cuts = [
        line for line in result.stdout.splitlines() if re.match(r"  (dropped|truncated) ", line)
    ]
    assert cuts
    for line in cuts:
        assert re.search(
            r"retrieval\s+\[Source \d\] \S+\.(txt|md|jsonl)( \".*\")? chunk \d+ ", line
        )
        assert not re.search(r"[0-9a-f]{16}", line), line  # not the chunk's hash


def test_ask_with_an_llm_prints_the_answer_first(corpus: Path, fake_llm) -> None:
    fake_llm.reply = "Yes, standard-tier rides are reimbursable [Source 1]."
    result = invoke(
        "ask",
        "Can I expense Uber rides?",
        "--db",
        str(corpus),
        "--llm",
        fake_llm.base_url,
        "--model",
        "test-model",
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Yes, standard-tier rides are reimbursable [Source 1].\n")
    assert "no LLM configured" not in result.stdout
    request = fake_llm.requests[-1]
    assert request.body["model"] == "test-model"
    assert request.body["messages"][0]["role"] == "system"
    assert any("Source 1:" in str(m["content"]) for m in request.body["messages"])


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["search", "x", "--mode", "fuzzy"], "unknown mode"),
        (["search", "x", "-k", "0"], "-k must be a positive"),
        (["search", "  "], "empty"),
        (["ask", ""], "empty"),
        (["ask", " \n "], "empty"),
        (["ask", "x", "--budget", "huge"], "--budget must be fixed5 or rag"),
        (["ask", "x", "--llm", "http://127.0.0.1:9"], "--llm and --model go together"),
        (["ask", "x", "--show", "budget,prompt"], "--show takes context, budget, sources or all"),
        (["ingest", "/definitely/not/here"], "no such file"),
        (["ingest", "README.md", "--overlap", "300"], "--overlap < --chunk-size"),
        (["ingest", "README.md", "--on-error", "ignore"], "--on-error must be skip or fail"),
    ],
)
def test_bad_input_is_one_clear_error(corpus: Path, args: list[str], fragment: str) -> None:
    result = invoke(*args, "--db", str(corpus))
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output


def test_search_without_a_corpus_says_how_to_make_one(tmp_path: Path) -> None:
    result = invoke("search", "x", "--db", str(tmp_path / "none.db"))
    assert result.exit_code == 2
    assert "run `contextfold ingest" in result.output


def test_eval_retrieval_reports_every_mode_and_writes_json(tmp_path: Path) -> None:
    from test_eval_retrieval import write_cranfield

    data = write_cranfield(tmp_path / "cran", "1 2 1\n2 1 3\n3 2 2\n")
    out = tmp_path / "report.json"
    result = invoke(
        "eval",
        "retrieval",
        "--dataset",
        "cranfield",
        "--data",
        str(data),
        "--modes",
        "bm25,hybrid",
        "--no-progress",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"\| bm25 \| [01]\.\d{4} \|", result.stdout)
    report = json.loads(out.read_text())
    assert [m["mode"] for m in report["modes"]] == ["bm25", "hybrid"]
    assert report["settings"]["split"] == "test"
    # "shear flow past plates" -> document 2 is the only one about shear flow
    bm25 = report["modes"][0]
    assert bm25["ndcg"] > 0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--dataset", "msmarco"], "unknown dataset"),
        (["--dataset", "cranfield", "--modes", "bm25,fuzzy"], "--modes takes"),
        (["--dataset", "cranfield", "--split", "train"], "only scifact"),
    ],
)
def test_eval_bad_input(tmp_path: Path, args: list[str], fragment: str) -> None:
    from test_eval_retrieval import write_cranfield

    data = write_cranfield(tmp_path / "cran", "1 2 1\n")
    result = invoke("eval", "retrieval", *args, "--data", str(data), "--no-progress")
    assert result.exit_code == 2, result.output
    assert fragment in result.output
