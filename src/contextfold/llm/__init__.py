"""LLM access over httpx, no vendor SDK: an OpenAI-compatible client (OpenAI, Ollama, vLLM,
LM Studio), the retrying JSON transport it is built on, and token-usage accounting.

Importing this package loads no model and opens no connection.
"""

from __future__ import annotations

from contextfold.llm.http import AsyncJsonHttpClient, JsonHttpClient, RetryPolicy
from contextfold.llm.openai_compat import ChatResult, OpenAICompatibleClient, Usage, UsageTracker

__all__ = [
    "AsyncJsonHttpClient",
    "ChatResult",
    "JsonHttpClient",
    "OpenAICompatibleClient",
    "RetryPolicy",
    "Usage",
    "UsageTracker",
]
