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

from importlib.metadata import PackageNotFoundError, version

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
    FormatError,
    PipelineError,
    StepError,
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

try:
    __version__ = version("contextfold")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"

__all__ = [
    "Action",
    "AnthropicFormatter",
    "AsyncRetriever",
    "BudgetError",
    "CharCounter",
    "ConfigError",
    "ContextItem",
    "ContextPipeline",
    "ContextResult",
    "ContextfoldError",
    "Decision",
    "Diagnostics",
    "FormatError",
    "Formatter",
    "GeminiFormatter",
    "GenericTextFormatter",
    "MemoryManager",
    "MemoryProvider",
    "Message",
    "OpenAIFormatter",
    "OverflowStrategy",
    "PipelineError",
    "PipelineStep",
    "PostProcessor",
    "QueryBundle",
    "Reranker",
    "Retriever",
    "SectionBudget",
    "SectionUsage",
    "SourceType",
    "StepError",
    "StepRecord",
    "TextBlock",
    "TiktokenCounter",
    "TokenBudget",
    "TokenCounter",
    "TokenizerError",
    "ToolResultBlock",
    "ToolUseBlock",
    "Window",
    "__version__",
    "counter_for_model",
    "default_agent_budget",
    "default_chat_budget",
    "default_rag_budget",
    "filter_step",
    "fixed5_budget",
    "graph_budget",
    "pack",
    "postprocessor_step",
    "reranker_step",
    "retriever_step",
    "trim_history",
]
