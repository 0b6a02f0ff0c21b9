"""Retrieval evaluation: the dataset loaders and their traps, the metrics against hand-computed
values and trec_eval, and the runner on a toy collection."""

from __future__ import annotations

import csv
import json
import math
import os
import random
from pathlib import Path
from typing import Any

import pytest

from contextfold.errors import ConfigError
from contextfold.eval.datasets import (
    IRDataset,
    IRDoc,
    load_cranfield,
    load_dataset,
    load_scifact,
)
from contextfold.eval.metrics import mean_over_queries, ndcg_at_k, recall_at_k
from contextfold.eval.retrieval import RetrievalReport, evaluate_retrieval

ROOT = Path(__file__).resolve().parent.parent
# the same place tests/test_benchmarks_smoke.py reads the shared data from (benchmarks/_common.py)
DATA = Path(
    os.environ.get("CONTEXTFOLD_BENCH_DATA") or ROOT.parent / "shared" / "benchmarks" / "data"
)

# --------------------------------------------------------------------------- fixtures


def write_scifact(
    root: Path,
    abstracts: dict[str, str],
    claims: list[tuple[str, str]],
    qrels: list[tuple[str, str, int]],
) -> Path:
    (root / "csv").mkdir(parents=True)
    (root / "qrels").mkdir()
    with (root / "csv/corpus_train.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["doc_id", "title", "abstract", "structured"])
        for doc_id, abstract in abstracts.items():
            writer.writerow([doc_id, f"Title {doc_id}", abstract, "False"])
    with (root / "csv/claims_validation.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "claim", "evidence_doc_id"])
        writer.writerows([qid, claim, ""] for qid, claim in claims)
    lines = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t{s}" for q, d, s in qrels)]
    (root / "qrels/test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


CRAN_DOCS = """\
.I 1
.T
wing in a
slipstream .
.A
brenckman,m.
.B
j. ae. scs. 25, 1958, 324.
.W
wing in a slipstream .
  lift increase due to slipstream .
.I 2
.T
shear flow .
.A
ting,l.
.B
.W
shear flow past a plate .
.A
stray author line after the abstract started .
.W
more abstract .
"""

CRAN_QUERIES = """\
.I 001
.W
similarity laws for
aeroelastic models .
.I 004
.W
heat conduction in slabs .
.I 365
.W
shear flow past plates .
"""


def write_cranfield(root: Path, qrels: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cran.all.1400").write_text(CRAN_DOCS, encoding="utf-8")
    (root / "cran.qry").write_text(CRAN_QUERIES, encoding="utf-8")
    (root / "cranqrel").write_text(qrels, encoding="utf-8")
    return root


# --------------------------------------------------------------------------- SciFact loader


def test_scifact_abstract_literals_are_read_one_by_one(tmp_path: Path) -> None:
    # numpy-style repr: no commas between literals, both quote styles, an escaped quote, an
    # apostrophe inside a double-quoted literal and an escaped newline
    abstract = "['First (n = 17).'\n 'It\\'s escaped.'\n \"Don't glue us.\"\n 'Tail.   \\n']"
    root = write_scifact(tmp_path, {"10": abstract}, [("1", "claim")], [("1", "10", 1)])
    doc = load_scifact(root).corpus["10"]
    assert doc.text == "First (n = 17). It's escaped. Don't glue us. Tail."
    assert doc.title == "Title 10"


def test_scifact_keeps_judged_claims_once_with_their_first_text(tmp_path: Path) -> None:
    claims = [("1", "first"), ("1", "first"), ("3", "unjudged"), ("5", "fifth")]
    root = write_scifact(
        tmp_path, {"10": "['a']", "11": "['b']"}, claims, [("1", "10", 1), ("5", "11", 1)]
    )
    ds = load_scifact(root)
    assert ds.queries == {"1": "first", "5": "fifth"}
    assert ds.qrels == {"1": {"10": 1}, "5": {"11": 1}}


def test_scifact_drops_zero_score_judgments(tmp_path: Path) -> None:
    qrels = [("1", "10", 1), ("1", "11", 0), ("2", "11", 0)]
    root = write_scifact(tmp_path, {"10": "['a']", "11": "['b']"}, [("1", "x"), ("2", "y")], qrels)
    ds = load_scifact(root)
    assert ds.qrels == {"1": {"10": 1}}
    assert list(ds.queries) == ["1"]


@pytest.mark.parametrize("abstract", ["['a' + 'b']", "['unterminated", "[b'bytes']"])
def test_scifact_malformed_abstract_is_a_config_error(tmp_path: Path, abstract: str) -> None:
    root = write_scifact(tmp_path, {"10": abstract}, [("1", "x")], [("1", "10", 1)])
    with pytest.raises(ConfigError, match="doc 10"):
        load_scifact(root)


def test_scifact_judgments_for_unknown_claims_are_a_config_error(tmp_path: Path) -> None:
    root = write_scifact(tmp_path, {"10": "['a']"}, [("1", "x")], [("1", "10", 1), ("9", "10", 1)])
    with pytest.raises(ConfigError, match=r"judges 1 queries .*\['9'\]"):
        load_scifact(root)


# --------------------------------------------------------------------------- Cranfield loader


def test_cranfield_gapped_query_ids_are_mapped_by_position(tmp_path: Path) -> None:
    ds = load_cranfield(write_cranfield(tmp_path, "1 1 2\n2 1 3\n3 2 1\n"))
    assert ds.queries == {
        "1": "similarity laws for aeroelastic models .",
        "2": "heat conduction in slabs .",
        "3": "shear flow past plates .",
    }
    assert ds.qrels["3"] == {"2": 4}  # the third query (.I 365) is cranqrel's query 3


def test_cranfield_minus_one_lines_are_dropped(tmp_path: Path) -> None:
    ds = load_cranfield(write_cranfield(tmp_path, "1 1 2 \n1 2 -1\n2 2 -1\n"))
    assert ds.qrels == {"1": {"1": 3}}
    assert ds.n_judgments == 1


@pytest.mark.parametrize(("code", "gain"), [(1, 4), (2, 3), (3, 2), (4, 1)])
def test_cranfield_gain_is_five_minus_code(tmp_path: Path, code: int, gain: int) -> None:
    ds = load_cranfield(write_cranfield(tmp_path, f"1 2 {code}\n"))
    assert ds.qrels == {"1": {"2": gain}}


def test_cranfield_document_fields_and_stray_tags_inside_the_abstract(tmp_path: Path) -> None:
    corpus = load_cranfield(write_cranfield(tmp_path, "1 1 1\n")).corpus
    assert corpus["1"] == IRDoc(
        title="wing in a slipstream .",
        text="wing in a slipstream . lift increase due to slipstream .",
    )
    assert corpus["1"].full_text.startswith("wing in a slipstream . wing in a slipstream .")
    # record 240 of the real file has '.A'/'.B' lines inside its abstract, 576/578 a second .W
    assert corpus["2"].text == (
        "shear flow past a plate . stray author line after the abstract started . more abstract ."
    )


def test_cranfield_query_number_beyond_the_queries_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"query number 4 is outside 1\.\.3"):
        load_cranfield(write_cranfield(tmp_path, "4 1 2\n"))


# --------------------------------------------------------------------------- load_dataset


@pytest.mark.parametrize(
    ("name", "present", "missing"),
    [
        ("scifact", [], "csv/corpus_train.csv"),
        ("cranfield", ["cran.all.1400"], "cran.qry"),
    ],
)
def test_missing_file_is_a_config_error_naming_it(
    tmp_path: Path, name: str, present: list[str], missing: str
) -> None:
    for file in present:
        (tmp_path / file).write_text(".I 1\n.W\ntext\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"{tmp_path / missing} not found: expected"):
        load_dataset(name, tmp_path)


def test_load_dataset_rejects_unknown_names_and_non_folders(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown dataset 'msmarco'; choose one of scifact"):
        load_dataset("msmarco", tmp_path)
    with pytest.raises(ConfigError, match="is not a folder"):
        load_dataset("cranfield", tmp_path / "nowhere")


def test_dataset_rejects_non_positive_gains_and_unknown_judged_queries() -> None:
    corpus = {"d": IRDoc(text="x")}
    with pytest.raises(ValueError, match="greater than 0"):  # pydantic's ValidationError
        IRDataset(name="t", corpus=corpus, queries={"q": "x"}, qrels={"q": {"d": 0}})
    with pytest.raises(ConfigError, match="judgments name 1 queries"):
        IRDataset(name="t", corpus=corpus, queries={}, qrels={"q": {"d": 1}})


# --------------------------------------------------------------------------- metrics


def test_ndcg_of_a_perfect_ranking_is_one() -> None:
    assert ndcg_at_k(["a", "b", "c", "x"], {"a": 3, "b": 2, "c": 1}) == 1.0


def test_ndcg_and_recall_are_zero_when_nothing_relevant_is_retrieved() -> None:
    assert ndcg_at_k(["x", "y"], {"a": 1}) == 0.0
    assert recall_at_k(["x", "y"], {"a": 1}) == 0.0
    assert ndcg_at_k([], {"a": 1}) == 0.0


def test_ndcg_graded_example_by_hand() -> None:
    # ranks 1..4 = c(1) x(0) a(3) b(2); linear gain, discount log2(rank + 1)
    dcg = 1 / math.log2(2) + 0 / math.log2(3) + 3 / math.log2(4) + 2 / math.log2(5)
    # ideal order a(3) b(2) c(1): 3/1 + 2/log2(3) + 1/2
    idcg = 3 / math.log2(2) + 2 / math.log2(3) + 1 / math.log2(4)
    got = ndcg_at_k(["c", "x", "a", "b"], {"a": 3, "b": 2, "c": 1})
    assert got == pytest.approx(dcg / idcg)
    assert got == pytest.approx(0.70589, abs=1e-5)  # 3.36135 / 4.76186


def test_ndcg_cuts_both_the_ranking_and_the_ideal_at_k() -> None:
    qrels = {"a": 1, "b": 1, "c": 1}
    assert ndcg_at_k(["a"], qrels, k=1) == 1.0  # ideal@1 holds one document too
    # 'a' at rank 3 is beyond k=2: nothing found in the cut
    assert ndcg_at_k(["x", "y", "a"], qrels, k=2) == 0.0


def test_recall_by_hand_and_grade_zero_is_not_relevant() -> None:
    qrels = {"a": 2, "b": 1, "c": 1, "z": 0}
    assert recall_at_k(["a", "x", "b", "c"], qrels, k=3) == pytest.approx(2 / 3)  # a, b of a b c


def test_repeated_ids_earn_their_gain_once() -> None:
    assert recall_at_k(["a", "a"], {"a": 1, "b": 1}) == 0.5
    assert ndcg_at_k(["a", "a", "b"], {"a": 1, "b": 1}) == 1.0  # the repeat does not push b


def test_queries_without_relevant_documents_are_left_out_of_the_mean() -> None:
    runs = {"q1": ["a"], "q2": ["x"], "q3": ["a"]}
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"a": 0}, "q4": {"c": 1}}
    assert ndcg_at_k(runs["q3"], qrels["q3"]) is None
    # q1 = 1, q2 = 0, q4 missing from the runs = 0, q3 left out: 1 / 3
    assert mean_over_queries(ndcg_at_k, runs, qrels, 10) == pytest.approx(1 / 3)
    with pytest.raises(ConfigError, match="none of the 1 judged queries"):
        mean_over_queries(recall_at_k, runs, {"q3": {"a": 0}}, 10)


def test_metrics_match_trec_eval_on_random_rankings() -> None:
    pytrec_eval = pytest.importorskip("pytrec_eval")
    rng = random.Random(7)
    docs = [f"d{i}" for i in range(60)]
    qrels: dict[str, dict[str, int]] = {}
    runs: dict[str, list[str]] = {}
    for q in range(40):
        qrels[f"q{q}"] = {d: rng.randint(1, 3) for d in rng.sample(docs, rng.randint(1, 15))}
        runs[f"q{q}"] = rng.sample(docs, rng.randint(0, 50))
    # trec_eval ranks by score: give strictly decreasing scores in our order
    scored = {q: {d: float(len(r) - i) for i, d in enumerate(r)} for q, r in runs.items()}
    measures = {"ndcg_cut.5", "ndcg_cut.10", "recall.10", "recall.30"}
    reference = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(scored)
    for qid, ranked in runs.items():
        if not ranked:
            continue  # trec_eval skips queries absent from the run
        ref = reference[qid]
        for k in (5, 10):
            assert ndcg_at_k(ranked, qrels[qid], k) == pytest.approx(
                ref[f"ndcg_cut_{k}"], abs=1e-12
            )
        for k in (10, 30):
            assert recall_at_k(ranked, qrels[qid], k) == pytest.approx(
                ref[f"recall_{k}"], abs=1e-12
            )


# --------------------------------------------------------------------------- runner


@pytest.fixture
def toy() -> IRDataset:
    corpus = {f"d{i}": IRDoc(title=f"t{i}", text=f"text {i}") for i in range(6)}
    qrels = {"q1": {"d0": 2, "d1": 1}, "q2": {"d2": 1}, "q3": {"d3": 3, "d4": 3, "d5": 1}}
    queries = {"q1": "one", "q2": "two", "q3": "three", "q4": "no judgments"}
    return IRDataset(name="toy", corpus=corpus, queries=queries, qrels=qrels)


def test_oracle_scores_one_and_reversed_scores_less(toy: IRDataset) -> None:
    by_text = {text: qid for qid, text in toy.queries.items()}

    def oracle(query: str, k: int) -> list[str]:
        judged = toy.qrels[by_text[query]]
        return sorted(judged, key=lambda d: -judged[d])[:k]

    def reversed_oracle(query: str, k: int) -> list[str]:
        return [
            *(d for d in toy.corpus if d not in toy.qrels[by_text[query]]),
            *oracle(query, k)[::-1],
        ]

    report = evaluate_retrieval(
        toy, {"oracle": oracle, "reversed": reversed_oracle}, progress=False
    )
    best, worst = report.modes
    assert (best.mode, best.ndcg, best.recall, best.n_queries) == ("oracle", 1.0, 1.0, 3)
    assert worst.ndcg < 1.0 and worst.recall == 1.0
    assert report.n_queries == 3 and report.n_unjudged_queries == 1  # q4 is not run


def test_searchers_are_asked_for_the_larger_cut_off(toy: IRDataset) -> None:
    asked: list[int] = []

    def searcher(query: str, k: int) -> list[str]:
        asked.append(k)
        return list(toy.corpus)

    evaluate_retrieval(toy, {"all": searcher}, k_ndcg=3, k_recall=5, progress=False)
    assert asked == [5, 5, 5]


def test_report_renders_markdown_and_json(toy: IRDataset) -> None:
    report = evaluate_retrieval(toy, {"bm25": lambda q, k: ["d0", "d2", "d3"]}, progress=False)
    lines = report.to_markdown().splitlines()
    assert lines[2] == "| mode | nDCG@10 | recall@100 | median ms | p95 ms |"
    assert lines[4].startswith(f"| bm25 | {report.modes[0].ndcg:.4f} | ")
    data = json.loads(report.to_json())
    assert RetrievalReport.model_validate(data) == report
    assert "ndcg_per_query" not in json.loads(report.to_json(per_query=False))["modes"][0]


def test_progress_goes_to_stderr_only_when_asked(
    toy: IRDataset, capsys: pytest.CaptureFixture[str]
) -> None:
    evaluate_retrieval(toy, {"m": lambda q, k: []}, progress=False)
    assert capsys.readouterr() == ("", "")
    evaluate_retrieval(toy, {"m": lambda q, k: []}, progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "toy · m" in err and "3/3" in err


def test_non_string_ids_are_a_config_error(toy: IRDataset) -> None:
    def row_numbers(query: str, k: int) -> list[Any]:
        return [0, 1]

    with pytest.raises(ConfigError, match="searcher 'ints' returned 2 non-string ids"):
        evaluate_retrieval(toy, {"ints": row_numbers}, progress=False)


# --------------------------------------------------------------------------- the real data

needs_data = pytest.mark.skipif(
    not DATA.is_dir(),
    reason=f"shared benchmark data not found at {DATA}; set CONTEXTFOLD_BENCH_DATA",
)


@needs_data
def test_real_scifact_counts() -> None:
    ds = load_scifact(DATA / "scifact")
    assert (len(ds.corpus), len(ds.queries), ds.n_judgments) == (5183, 300, 339)
    # 4983's abstract: the third literal starts a new sentence instead of being glued on
    assert ". To assess effects of prematurity" in ds.corpus["4983"].text


@needs_data
def test_real_cranfield_counts() -> None:
    ds = load_cranfield(DATA / "cranfield")
    assert (len(ds.corpus), len(ds.queries), len(ds.qrels)) == (1400, 225, 225)
    gains = [g for judged in ds.qrels.values() for g in judged.values()]
    assert {g: gains.count(g) for g in (4, 3, 2, 1)} == {4: 128, 3: 387, 2: 734, 1: 363}


@needs_data
def test_real_scifact_train_split_is_disjoint_from_test() -> None:
    train = load_dataset("scifact", DATA / "scifact", split="train")
    test = load_scifact(DATA / "scifact")
    assert (len(train.queries), train.n_judgments) == (809, 919)
    assert not set(train.queries) & set(test.queries)
    with pytest.raises(ConfigError, match="only scifact"):
        load_dataset("cranfield", DATA / "cranfield", split="train")
