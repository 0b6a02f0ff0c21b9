"""contextfold — a context engine for LLM applications.

Decides what a model sees: instructions, the query, conversation memory, retrieved knowledge
and tool outputs, packed under an exact token budget, formatted for OpenAI, Anthropic, Gemini
or plain text, with every decision explained.

>>> from contextfold import ContextPipeline, fixed5_budget
>>> result = (ContextPipeline().with_budget(fixed5_budget())
...           .add_system_prompt("Answer from the policy.").build("Can I expense Uber?"))
>>> result.diagnostics.used_tokens <= result.diagnostics.available
True
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from contextfold.budget import (
    OverflowStrategy,
    SectionBudget,
    TokenBudget,
    default_agent_budget,
    default_chat_budget,
    default_rag_budget,
    fixed5_budget,
    graph_budget,
)
from contextfold.conversation import MemoryManager, trim_history
from contextfold.errors import (
    BudgetError,
    ConfigError,
    ContextfoldError,
    DocumentError,
    EmbeddingError,
    FormatError,
    LLMError,
    PipelineError,
    StepError,
    StoreError,
    TokenizerError,
)
from contextfold.formats import (
    AnthropicFormatter,
    Formatter,
    GeminiFormatter,
    GenericTextFormatter,
    OpenAIFormatter,
)
from contextfold.items import (
    ContextItem,
    Message,
    QueryBundle,
    SourceType,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from contextfold.pipeline import (
    ContextPipeline,
    PipelineStep,
    filter_step,
    postprocessor_step,
    reranker_step,
    retriever_step,
)
from contextfold.protocols import AsyncRetriever, MemoryProvider, PostProcessor, Reranker, Retriever
from contextfold.result import ContextResult, Diagnostics, StepRecord
from contextfold.tokens import CharCounter, TiktokenCounter, TokenCounter, counter_for_model
from contextfold.window import Action, Decision, SectionUsage, Window, pack

# Retrieval pulls in numpy, bm25s and onnxruntime: its names load on first access (PEP 562),
# so ``import contextfold`` stays light.
_LAZY = {
    "AnthropicClient": "contextfold.llm",
    "AssembledContext": "contextfold.memory",
    "BM25Index": "contextfold.retrieval.sparse",
    "CachedEmbedder": "contextfold.retrieval.embedders",
    "ChainComposer": "contextfold.retrieval.engine",
    "Chunk": "contextfold.retrieval.base",
    "CompactionReport": "contextfold.memory",
    "ContextComposer": "contextfold.retrieval.engine",
    "ContextEngine": "contextfold.retrieval.engine",
    "DenseRetriever": "contextfold.retrieval.retrievers",
    "DocumentIndex": "contextfold.retrieval.index",
    "EdgeType": "contextfold.retrieval.graph",
    "Embedder": "contextfold.retrieval.base",
    "EmbeddingTagger": "contextfold.memory",
    "ExtractiveSummarizer": "contextfold.memory",
    "FunctionEmbedder": "contextfold.retrieval.embedders",
    "GeminiClient": "contextfold.llm",
    "GraphContextRequest": "contextfold.retrieval.graph",
    "GraphContextResponse": "contextfold.retrieval.graph",
    "GraphRetriever": "contextfold.retrieval.seed_retrievers",
    "HybridRetriever": "contextfold.retrieval.retrievers",
    "InMemoryContextStore": "contextfold.retrieval.retrievers",
    "InMemoryVectorStore": "contextfold.retrieval.retrievers",
    "KeywordTagger": "contextfold.memory",
    "KnowledgeEdge": "contextfold.retrieval.graph",
    "KnowledgeGraph": "contextfold.retrieval.graph",
    "KnowledgeNode": "contextfold.retrieval.graph",
    "LLMSummarizer": "contextfold.memory",
    "LLMTagger": "contextfold.memory",
    "MarkdownChunker": "contextfold.retrieval.chunking",
    "MemoryConfig": "contextfold.memory",
    "MemoryEngine": "contextfold.memory",
    "MemoryStatus": "contextfold.memory",
    "MemoryStore": "contextfold.store.sqlite.memory",
    "MiniLMEmbedder": "contextfold.retrieval.embedders",
    "NodeType": "contextfold.retrieval.graph",
    "NumpyVectorIndex": "contextfold.retrieval.dense",
    "OpenAICompatibleClient": "contextfold.llm",
    "OpenAIEmbedder": "contextfold.retrieval.embedders",
    "PromptComposer": "contextfold.retrieval.engine",
    "RecursiveChunker": "contextfold.retrieval.chunking",
    "SearchHit": "contextfold.retrieval.base",
    "SemanticChunker": "contextfold.retrieval.chunking",
    "SentenceTransformerEmbedder": "contextfold.retrieval.embedders",
    "SparseRetriever": "contextfold.retrieval.retrievers",
    "TagCanonicalizer": "contextfold.memory",
    "TextChunker": "contextfold.retrieval.chunking",
    "USearchVectorIndex": "contextfold.retrieval.dense",
    "VectorRetriever": "contextfold.retrieval.seed_retrievers",
    "default_embedder": "contextfold.retrieval.embedders",
    "filter_history": "contextfold.memory",
    "graph_context": "contextfold.retrieval.graph",
    "make_chat_client": "contextfold.llm.factory",
    "rrf": "contextfold.retrieval.fusion",
}

if TYPE_CHECKING:
    from contextfold.llm import (
        AnthropicClient,
        GeminiClient,
        OpenAICompatibleClient,
    )
    from contextfold.llm.factory import (
        make_chat_client,
    )
    from contextfold.memory import (
        AssembledContext,
        CompactionReport,
        EmbeddingTagger,
        ExtractiveSummarizer,
        KeywordTagger,
        LLMSummarizer,
        LLMTagger,
        MemoryConfig,
        MemoryEngine,
        MemoryStatus,
        TagCanonicalizer,
        filter_history,
    )
    from contextfold.retrieval.base import (
        Chunk,
        Embedder,
        SearchHit,
    )
    from contextfold.retrieval.chunking import (
        MarkdownChunker,
        RecursiveChunker,
        SemanticChunker,
        TextChunker,
    )
    from contextfold.retrieval.dense import (
        NumpyVectorIndex,
        USearchVectorIndex,
    )
    from contextfold.retrieval.embedders import (
        CachedEmbedder,
        FunctionEmbedder,
        MiniLMEmbedder,
        OpenAIEmbedder,
        SentenceTransformerEmbedder,
        default_embedder,
    )
    from contextfold.retrieval.engine import (
        ChainComposer,
        ContextComposer,
        ContextEngine,
        PromptComposer,
    )
    from contextfold.retrieval.fusion import (
        rrf,
    )
    from contextfold.retrieval.graph import (
        EdgeType,
        GraphContextRequest,
        GraphContextResponse,
        KnowledgeEdge,
        KnowledgeGraph,
        KnowledgeNode,
        NodeType,
        graph_context,
    )
    from contextfold.retrieval.index import (
        DocumentIndex,
    )
    from contextfold.retrieval.retrievers import (
        DenseRetriever,
        HybridRetriever,
        InMemoryContextStore,
        InMemoryVectorStore,
        SparseRetriever,
    )
    from contextfold.retrieval.seed_retrievers import (
        GraphRetriever,
        VectorRetriever,
    )
    from contextfold.retrieval.sparse import (
        BM25Index,
    )
    from contextfold.store.sqlite.memory import (
        MemoryStore,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'contextfold' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


try:
    __version__ = version("contextfold")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"

__all__ = [
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
