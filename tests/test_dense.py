"""Vector indexes: exact search equals brute force; usearch recall; updates; persistence."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from contextfold.errors import ConfigError, StoreError
from contextfold.retrieval.dense import NumpyVectorIndex, USearchVectorIndex


def _unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    m = rng.standard_normal((n, dim)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


@pytest.fixture
def data() -> tuple[list[str], np.ndarray]:
    vectors = _unit(np.random.default_rng(7), 500, 16)
    return [f"v{i}" for i in range(500)], vectors


def test_numpy_search_equals_brute_force(data) -> None:
    ids, vectors = data
    index = NumpyVectorIndex(16)
    index.add(ids, vectors)
    query = vectors[3] + 0.1
    expected = np.argsort(-(vectors @ query), kind="stable")[:10]
    got = index.search(query, 10)
    assert [i for i, _ in got] == [ids[r] for r in expected]
    np.testing.assert_allclose([s for _, s in got], (vectors @ query)[expected], rtol=1e-5)


def test_allowed_filters_before_ranking(data) -> None:
    ids, vectors = data
    index = NumpyVectorIndex(16)
    index.add(ids, vectors)
    allowed = {"v10", "v20", "v30"}
    got = index.search(vectors[0], 10, allowed=allowed)
    assert {i for i, _ in got} == allowed
    assert index.search(vectors[0], 10, allowed={"nope"}) == []


def test_adding_an_existing_id_replaces_its_vector() -> None:
    index = NumpyVectorIndex(2)
    index.add(["a", "b"], np.array([[1, 0], [0, 1]], np.float32))
    index.add(["a"], np.array([[0, 1]], np.float32))
    assert len(index) == 2
    np.testing.assert_array_equal(index.vector("a"), [0, 1])


def test_growth_keeps_every_vector(data) -> None:
    ids, vectors = data
    index = NumpyVectorIndex(16)
    for start in range(0, 500, 7):  # many small adds exercise the amortised growth
        index.add(ids[start : start + 7], vectors[start : start + 7])
    assert len(index) == 500
    assert index.search(vectors[499], 1)[0][0] == "v499"


def test_remove_then_search(data) -> None:
    ids, vectors = data
    index = NumpyVectorIndex(16)
    index.add(ids, vectors)
    index.remove(["v5", "absent"])
    assert len(index) == 499
    assert index.search(vectors[5], 1)[0][0] != "v5"
    assert index.search(vectors[6], 1)[0][0] == "v6"


def test_save_and_load_roundtrip(data, tmp_path) -> None:
    ids, vectors = data
    index = NumpyVectorIndex(16)
    index.add(ids, vectors)
    index.save(tmp_path / "vec")
    for mmap in (False, True):
        loaded = NumpyVectorIndex.load(tmp_path / "vec", mmap=mmap)
        assert loaded.search(vectors[42], 5) == index.search(vectors[42], 5)
    with pytest.raises(StoreError):
        NumpyVectorIndex.load(tmp_path / "missing")


def test_shape_errors_name_the_numbers() -> None:
    index = NumpyVectorIndex(4)
    with pytest.raises(ConfigError, match=r"2 vectors of dimension 4.*\(2, 3\)"):
        index.add(["a", "b"], np.zeros((2, 3), np.float32))
    index.add(["a"], np.ones((1, 4), np.float32) / 2)
    with pytest.raises(ConfigError, match="dimension 3"):
        index.search(np.zeros(3, np.float32), 1)
    with pytest.raises(ConfigError):
        NumpyVectorIndex(0)


def test_usearch_recall_at_10_against_exact_search() -> None:
    rng = np.random.default_rng(1)
    vectors = _unit(rng, 3000, 32)
    ids = [str(i) for i in range(3000)]
    exact, approx = NumpyVectorIndex(32), USearchVectorIndex(32)
    exact.add(ids, vectors)
    approx.add(ids, vectors)
    queries = _unit(rng, 50, 32)
    recall = np.mean(
        [
            len({i for i, _ in exact.search(q, 10)} & {i for i, _ in approx.search(q, 10)}) / 10
            for q in queries
        ]
    )
    assert recall >= 0.9


def test_usearch_similarities_are_cosines_and_filters_work(data) -> None:
    ids, vectors = data
    index = USearchVectorIndex(16)
    index.add(ids, vectors)
    top_id, top_score = index.search(vectors[9], 1)[0]
    assert top_id == "v9" and top_score == pytest.approx(1.0, abs=1e-4)
    assert {i for i, _ in index.search(vectors[0], 5, allowed={"v1", "v2"})} == {"v1", "v2"}
    index.remove(["v9"])
    assert index.search(vectors[9], 1)[0][0] != "v9"
    index.add(["v1"], vectors[2:3])  # replace
    assert len(index) == 499


@pytest.mark.parametrize("kind", [NumpyVectorIndex, USearchVectorIndex])
def test_similarities_are_exact_cosines_for_named_ids(kind, data) -> None:
    ids, vectors = data
    index = kind(16)
    index.add(ids, vectors)
    sims = index.similarities(vectors[0], ["v1", "missing", "v0"])
    assert sims[0] == pytest.approx(float(vectors[1] @ vectors[0]), abs=1e-5)
    assert sims[1] is None and sims[2] == pytest.approx(1.0, abs=1e-5)


def test_usearch_then_the_onnx_embedder_in_one_process_does_not_crash() -> None:
    # Regression: loading usearch before onnxruntime segfaulted on the first embedding.
    script = (
        "import numpy as np\n"
        "from contextfold.retrieval.dense import USearchVectorIndex\n"
        "from contextfold.retrieval.embedders import MiniLMEmbedder\n"
        "index = USearchVectorIndex(384)\n"
        "vector = MiniLMEmbedder().embed(['refund policy'])\n"
        "index.add(['a'], vector)\n"
        "print(index.search(vector[0], 1)[0][0])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "a"
