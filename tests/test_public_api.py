"""The front door: ``contextfold.__all__`` is pinned, every name in it imports, the error tree
has one root, and importing the package does no heavy work."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import contextfold
from contextfold import errors

PUBLIC = [
    "Action",
    "AnthropicClient",
    "AnthropicFormatter",
    "AssembledContext",
    "AsyncRetriever",
    "BM25Index",
    "BudgetError",
    "CachedEmbedder",
    "ChainComposer",
    "CharCounter",
    "Chunk",
    "CompactionReport",
    "ConfigError",
    "ContextComposer",
    "ContextEngine",
    "ContextItem",
    "ContextPipeline",
    "ContextResult",
    "ContextfoldError",
    "Decision",
    "DenseRetriever",
    "Diagnostics",
    "DocumentError",
    "DocumentIndex",
    "EdgeType",
    "Embedder",
    "EmbeddingError",
    "EmbeddingTagger",
    "ExtractiveSummarizer",
    "FormatError",
    "Formatter",
    "FunctionEmbedder",
    "GeminiClient",
    "GeminiFormatter",
    "GenericTextFormatter",
    "GraphContextRequest",
    "GraphContextResponse",
    "GraphRetriever",
    "HybridRetriever",
    "InMemoryContextStore",
    "InMemoryVectorStore",
    "KeywordTagger",
    "KnowledgeEdge",
    "KnowledgeGraph",
    "KnowledgeNode",
    "LLMError",
    "LLMSummarizer",
    "LLMTagger",
    "MarkdownChunker",
    "MemoryConfig",
    "MemoryEngine",
    "MemoryManager",
    "MemoryProvider",
    "MemoryStatus",
    "MemoryStore",
    "Message",
    "MiniLMEmbedder",
    "NodeType",
    "NumpyVectorIndex",
    "OpenAICompatibleClient",
    "OpenAIEmbedder",
    "OpenAIFormatter",
    "OverflowStrategy",
    "PipelineError",
    "PipelineStep",
    "PostProcessor",
    "PromptComposer",
    "QueryBundle",
    "RecursiveChunker",
    "Reranker",
    "Retriever",
    "SearchHit",
    "SectionBudget",
    "SectionUsage",
    "SemanticChunker",
    "SentenceTransformerEmbedder",
    "SourceType",
    "SparseRetriever",
    "StepError",
    "StepRecord",
    "StoreError",
    "TagCanonicalizer",
    "TextBlock",
    "TextChunker",
    "TiktokenCounter",
    "TokenBudget",
    "TokenCounter",
    "TokenizerError",
    "ToolResultBlock",
    "ToolUseBlock",
    "USearchVectorIndex",
    "VectorRetriever",
    "Window",
    "__version__",
    "counter_for_model",
    "default_agent_budget",
    "default_chat_budget",
    "default_embedder",
    "default_rag_budget",
    "filter_history",
    "filter_step",
    "fixed5_budget",
    "graph_budget",
    "graph_context",
    "make_chat_client",
    "pack",
    "postprocessor_step",
    "reranker_step",
    "retriever_step",
    "rrf",
    "trim_history",
]


def test_all_is_pinned_and_sorted() -> None:
    assert contextfold.__all__ == PUBLIC
    assert sorted(PUBLIC) == PUBLIC
    assert len(set(PUBLIC)) == len(PUBLIC)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_imports(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from contextfold import {name}", namespace)
    assert namespace[name] is getattr(contextfold, name)
    if name != "__version__":
        assert getattr(namespace[name], "__module__", "").startswith("contextfold")


def test_version_is_a_string() -> None:
    assert isinstance(contextfold.__version__, str)
    assert contextfold.__version__.count(".") >= 2


@pytest.mark.parametrize(
    ("error", "parent"),
    [
        (errors.ConfigError, errors.ContextfoldError),
        (errors.BudgetError, errors.ConfigError),
        (errors.TokenizerError, errors.ContextfoldError),
        (errors.FormatError, errors.ContextfoldError),
        (errors.PipelineError, errors.ContextfoldError),
        (errors.StepError, errors.PipelineError),
        (errors.EmbeddingError, errors.ContextfoldError),
        (errors.StoreError, errors.ContextfoldError),
        (errors.LLMError, errors.ContextfoldError),
        (errors.DocumentError, errors.ContextfoldError),
    ],
)
def test_error_tree_has_one_root(error: type[Exception], parent: type[Exception]) -> None:
    assert issubclass(error, parent)
    assert error.__name__ in errors.__doc__  # the tree is drawn in the module docstring
    assert getattr(contextfold, error.__name__) is error


def test_config_errors_are_not_value_errors() -> None:
    # pydantic would wrap a ValueError raised in a validator and hide its message.
    assert not issubclass(errors.ConfigError, ValueError)
    assert str(errors.StepError("embed", "boom")) == "step 'embed' failed: boom"


def test_import_does_no_heavy_work() -> None:
    script = textwrap.dedent(
        """
        import sys
        import contextfold
        print(contextfold.tokens.load_encoding.cache_info().currsize)
        print(sorted(m for m in ("tiktoken", "rich", "typer", "numpy") if m in sys.modules))
        contextfold.TiktokenCounter().count("now it loads")
        print(contextfold.tokens.load_encoding.cache_info().currsize)
        """
    )
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", script], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["0", "[]", "1"]
