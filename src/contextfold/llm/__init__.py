"""LLM access over httpx, no vendor SDK: chat clients for OpenAI-compatible endpoints (OpenAI,
Ollama, vLLM, LM Studio), Anthropic and Gemini behind one ``ChatClient`` protocol, a factory
from a provider name, the retrying JSON transport they share, and token usage and cost
accounting.

Importing this package loads no model and opens no connection.
"""

from __future__ import annotations

from contextfold.llm.anthropic import AnthropicClient
from contextfold.llm.base import (
    ChatClient,
    ChatResult,
    ModelPrice,
    Usage,
    UsageTracker,
    cost_usd,
)
from contextfold.llm.factory import PROVIDERS, Provider, make_chat_client
from contextfold.llm.gemini import GeminiClient
from contextfold.llm.http import AsyncJsonHttpClient, JsonHttpClient, RetryPolicy
from contextfold.llm.openai_compat import OpenAICompatibleClient

__all__ = [
    "PROVIDERS",
    "AnthropicClient",
    "AsyncJsonHttpClient",
    "ChatClient",
    "ChatResult",
    "GeminiClient",
    "JsonHttpClient",
    "ModelPrice",
    "OpenAICompatibleClient",
    "Provider",
    "RetryPolicy",
    "Usage",
    "UsageTracker",
    "cost_usd",
    "make_chat_client",
]
