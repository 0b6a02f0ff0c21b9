"""Retrieval test collections as one value type: a corpus, queries and graded judgments.

Two loaders read the public collections described in ``shared/benchmarks/README.md`` exactly
as published, with their traps handled:

- :func:`load_scifact` (BEIR's SciFact test split): the ``abstract`` column is a numpy-style
  list repr with *no commas* between the string literals, which ``ast.literal_eval`` would
  silently glue together; the literals are read one by one with :mod:`tokenize`. Only claims
  with test judgments are kept (BEIR's 300).
- :func:`load_cranfield` (SMART format): the query ``.I`` ids run 001..365 with gaps while
  ``cranqrel`` numbers the queries 1..225 in file order, so queries are keyed by position.
  Relevance codes 1 (complete answer) … 4 (minimal interest) become gains ``5 - code``; the
  undocumented ``-1`` line each query has means not relevant and is dropped.

Query ids are the ones the judgments use; every judged gain is an int > 0.
"""

from __future__ import annotations

import ast
import csv
import io
import re
import tokenize
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contextfold.errors import ConfigError

__all__ = ["DATASETS", "IRDataset", "IRDoc", "load_cranfield", "load_dataset", "load_scifact"]

Gain = Annotated[int, Field(gt=0)]


class IRDoc(BaseModel):
    """One corpus document: its title and body. ``full_text`` is what an index should see.

    >>> IRDoc(title="Wings", text="Lift at low speed.").full_text
    'Wings Lift at low speed.'
    """

    model_config = ConfigDict(frozen=True)
    title: str = ""
    text: str

    @property
    def full_text(self) -> str:
        """Title and body joined by a space (either may be empty)."""
        return f"{self.title} {self.text}".strip()


class IRDataset(BaseModel):
    """A retrieval test collection.

    ``qrels`` maps a query id to ``{doc_id: gain}`` with every gain > 0 (the higher, the more
    relevant); a query without an entry there has no relevant document and is not scored.

    >>> ds = IRDataset(
    ...     name="toy",
    ...     corpus={"d1": IRDoc(title="Cats", text="Cats purr.")},
    ...     queries={"q1": "do cats purr"},
    ...     qrels={"q1": {"d1": 1}},
    ... )
    >>> len(ds.corpus), ds.n_judgments
    (1, 1)
    """

    model_config = ConfigDict(frozen=True)
    name: str
    corpus: dict[str, IRDoc]
    queries: dict[str, str]
    qrels: dict[str, dict[str, Gain]]

    @model_validator(mode="after")
    def _qrels_name_known_queries(self) -> IRDataset:
        unknown = sorted(set(self.qrels) - set(self.queries))
        if unknown:
            raise ConfigError(
                f"dataset {self.name!r}: judgments name {len(unknown)} queries that are not "
                f"in its queries (first: {unknown[:5]})"
            )
        return self

    @property
    def n_judgments(self) -> int:
        """Number of judged relevant (query, document) pairs."""
        return sum(len(judged) for judged in self.qrels.values())


# --------------------------------------------------------------------------- shared helpers


def _need(path: Path, what: str) -> Path:
    if not path.is_file():
        raise ConfigError(
            f"{path} not found: expected {what}; pass the dataset folder described in "
            "shared/benchmarks/README.md"
        )
    return path


def _squash(text: str) -> str:
    """Collapse runs of whitespace (including newlines) into single spaces."""
    return " ".join(text.split())


def _csv_rows(path: Path, columns: set[str]) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = columns - set(reader.fieldnames or ())
        if missing:
            raise ConfigError(
                f"{path}: missing column(s) {sorted(missing)}; the header is {reader.fieldnames}"
            )
        try:
            return list(reader)
        except csv.Error as exc:
            raise ConfigError(f"{path}: unreadable CSV near line {reader.line_num}: {exc}") from exc


# --------------------------------------------------------------------------- SciFact

_ABSTRACT_LAYOUT = {tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER}


def _abstract_sentences(abstract: str, doc_id: str) -> list[str]:
    """The string literals of a numpy-style list repr (``['a'\\n 'b']``), one by one.

    Any quote style and escape Python accepts is decoded, and commas are allowed (a Python
    list repr reads the same); anything else is an error rather than text silently glued
    into a sentence.
    """
    sentences: list[str] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(abstract.strip()).readline):
            if tok.type == tokenize.STRING:
                value = ast.literal_eval(tok.string)
                if not isinstance(value, str):
                    raise ConfigError(
                        f"doc {doc_id}: abstract holds a non-text literal {tok.string[:40]!r}"
                    )
                sentences.append(value)
            elif tok.type not in _ABSTRACT_LAYOUT and tok.string not in ("[", "]", ","):
                raise ConfigError(
                    f"doc {doc_id}: abstract is not a list of string literals "
                    f"(unexpected {tok.string!r} at line {tok.start[0]}, column {tok.start[1]})"
                )
    except (tokenize.TokenError, SyntaxError, ValueError) as exc:
        raise ConfigError(
            f"doc {doc_id}: abstract is not a list of string literals: {exc}"
        ) from exc
    return sentences


def _beir_qrels(path: Path) -> dict[str, dict[str, int]]:
    """A BEIR qrels TSV (``query-id corpus-id score`` header); scores <= 0 are dropped."""
    qrels: dict[str, dict[str, int]] = {}
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0].split() != ["query-id", "corpus-id", "score"]:
        raise ConfigError(f"{path}: expected the header 'query-id corpus-id score'")
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        parts = line.split("\t")
        try:
            qid, doc_id, score = parts[0].strip(), parts[1].strip(), int(parts[2])
        except (IndexError, ValueError) as exc:
            raise ConfigError(
                f"{path}:{number}: expected 'query-id<TAB>corpus-id<TAB>int', got {line!r}"
            ) from exc
        if score > 0:
            judged = qrels.setdefault(qid, {})
            judged[doc_id] = max(score, judged.get(doc_id, 0))
    return qrels


def load_scifact(path: str | Path, *, split: str = "test") -> IRDataset:
    """BEIR's SciFact test split (or, with ``split="train"``, the train split's claims and
    qrels — for tuning without touching the test queries) from the folder holding ``csv/``
    and ``qrels/``.

    Corpus: ``csv/corpus_train.csv`` (5,183 abstracts; body = sentences joined by a space).
    Queries: the claims of ``csv/claims_validation.csv`` (de-duplicated by id) that have
    judgments in ``qrels/test.tsv`` (300 queries, 339 pairs).
    """
    root = Path(path)
    if split not in ("test", "train"):
        raise ConfigError(f"SciFact has a 'test' and a 'train' split, not {split!r}")
    claims_file = "claims_validation.csv" if split == "test" else "claims_train.csv"
    corpus_rows = _csv_rows(
        _need(
            root / "csv/corpus_train.csv", "SciFact's corpus CSV (doc_id,title,abstract,structured)"
        ),
        {"doc_id", "title", "abstract"},
    )
    claim_rows = _csv_rows(
        _need(root / f"csv/{claims_file}", f"SciFact's {split} claims CSV (columns id, claim)"),
        {"id", "claim"},
    )
    qrels_file = root / f"qrels/{split}.tsv"
    qrels = _beir_qrels(_need(qrels_file, f"BEIR's SciFact {split} qrels TSV"))

    corpus: dict[str, IRDoc] = {}
    for row in corpus_rows:
        doc_id = row["doc_id"].strip()
        sentences = (s.strip() for s in _abstract_sentences(row["abstract"], doc_id))
        corpus[doc_id] = IRDoc(
            title=_squash(row["title"]), text=" ".join(s for s in sentences if s)
        )
    claims: dict[str, str] = {}
    for row in claim_rows:
        claims.setdefault(row["id"].strip(), _squash(row["claim"]))
    unjudged = sorted(set(qrels) - set(claims))
    if unjudged:
        raise ConfigError(
            f"{qrels_file} judges {len(unjudged)} queries that "
            f"csv/{claims_file} does not hold (first: {unjudged[:5]})"
        )
    queries = {qid: text for qid, text in claims.items() if qid in qrels}
    return IRDataset(name="scifact", corpus=corpus, queries=queries, qrels=qrels)


# --------------------------------------------------------------------------- Cranfield

_SMART_TAG = re.compile(r"^\.(?:I\s+(\S+)|([TABW]))\s*$")


def _smart_records(path: Path) -> list[tuple[str, dict[str, str]]]:
    """``(id, {field: text})`` per ``.I`` record of a SMART file, whitespace squashed.

    Three Cranfield records carry stray ``.A``/``.B``/``.W`` lines inside their abstract
    (240, 576, 578); once ``.W`` has started, such lines are dropped and the text after them
    stays in the abstract, which is where it belongs.
    """
    records: list[tuple[str, dict[str, list[str]]]] = []
    field = ""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        tag = _SMART_TAG.match(line)
        if tag and tag.group(1) is not None:
            records.append((tag.group(1), {}))
            field = ""
        elif not records:
            if line.strip():
                raise ConfigError(f"{path}:{number}: expected a '.I <id>' line, got {line!r}")
        elif tag and field != "W":
            field = tag.group(2)
            records[-1][1].setdefault(field, [])
        elif not tag and field:
            records[-1][1][field].append(line)
    return [
        (rid, {f: _squash(" ".join(lines)) for f, lines in fields.items()})
        for rid, fields in records
    ]


def _cranfield_qrels(path: Path, n_queries: int) -> dict[str, dict[str, int]]:
    """``cranqrel`` lines ``query doc code``: gain ``5 - code`` for codes 1..4, ``-1`` dropped."""
    qrels: dict[str, dict[str, int]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            query, doc, code = (int(part) for part in line.split())
        except ValueError as exc:
            raise ConfigError(
                f"{path}:{number}: expected 'query doc code' integers, got {line!r}"
            ) from exc
        if not 1 <= query <= n_queries:
            raise ConfigError(
                f"{path}:{number}: query number {query} is outside 1..{n_queries} "
                "(cranqrel numbers the queries of cran.qry by position)"
            )
        if code in (-1, 5):  # -1: undocumented, not relevant; 5: "of no interest"
            continue
        if not 1 <= code <= 4:
            raise ConfigError(f"{path}:{number}: relevance code {code} is not one of -1, 1..5")
        judged = qrels.setdefault(str(query), {})
        judged[str(doc)] = max(5 - code, judged.get(str(doc), 0))
    return qrels


def load_cranfield(path: str | Path) -> IRDataset:
    """The Cranfield 1400 collection from the folder holding ``cran.all.1400``, ``cran.qry``
    and ``cranqrel``.

    Documents keep their ``.I`` number as id, ``.T`` as title and ``.W`` as body. Queries are
    numbered ``"1"``..``"225"`` by position in ``cran.qry``, as ``cranqrel`` numbers them.
    """
    root = Path(path)
    docs = _smart_records(
        _need(root / "cran.all.1400", "Cranfield's documents (SMART .I .T .A .B .W)")
    )
    topics = _smart_records(_need(root / "cran.qry", "Cranfield's queries (SMART .I .W)"))
    qrels = _cranfield_qrels(
        _need(root / "cranqrel", "Cranfield's judgments ('query doc code')"), len(topics)
    )
    corpus = {
        str(int(doc_id)) if doc_id.isdigit() else doc_id: IRDoc(
            title=f.get("T", ""), text=f.get("W", "")
        )
        for doc_id, f in docs
    }
    queries = {str(position): f.get("W", "") for position, (_, f) in enumerate(topics, start=1)}
    return IRDataset(name="cranfield", corpus=corpus, queries=queries, qrels=qrels)


# --------------------------------------------------------------------------- by name

DATASETS = {"scifact": load_scifact, "cranfield": load_cranfield}
"""The loaders :func:`load_dataset` dispatches to, by name."""


def load_dataset(name: str, path: str | Path, *, split: str = "test") -> IRDataset:
    """Load the collection ``name`` (``"scifact"`` or ``"cranfield"``) from its folder;
    ``split="train"`` exists for SciFact only."""
    loader = DATASETS.get(name.lower())
    if loader is None:
        raise ConfigError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if not Path(path).is_dir():
        raise ConfigError(
            f"{path} is not a folder: expected the {name} dataset folder described in "
            "shared/benchmarks/README.md"
        )
    if split != "test":
        if name.lower() != "scifact":
            raise ConfigError(f"only scifact has a {split!r} split; {name} has one query set")
        return load_scifact(path, split=split)
    return loader(path)
