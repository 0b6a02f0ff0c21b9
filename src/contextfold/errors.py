"""Every exception contextfold raises, under one root.

Catch ``ContextfoldError`` to handle anything the library raises on purpose::

    ContextfoldError
    ├── ConfigError            invalid configuration or arguments
    │   └── BudgetError        a budget that cannot hold what it must (numbers in the message)
    ├── TokenizerError         an encoding file is missing, corrupt or unknown
    ├── FormatError            a payload that is not valid for the named provider format
    ├── EmbeddingError         an embedding model is missing or corrupt, or returned bad vectors
    ├── StoreError             the SQLite store cannot be opened, migrated or written
    ├── DocumentError          a document file cannot be read: no text encoding fits it, a
    │                          malformed JSON / PDF / DOCX file, or a format extra missing
    ├── LLMError               an LLM or embeddings endpoint failed (after retries); carries
    │                          the HTTP status and the endpoint's own message
    └── PipelineError          a pipeline cannot run as configured
        └── StepError          a pipeline step raised (``on_error="raise"``); ``__cause__`` is
                               the original exception

``ConfigError`` is deliberately not a ``ValueError``: pydantic would wrap a ``ValueError``
raised in a validator into its own ``ValidationError`` and hide the message's numbers.

Messages say what happened, with the numbers, and what to do next.
"""

from __future__ import annotations

__all__ = [
    "BudgetError",
    "ConfigError",
    "ContextfoldError",
    "DocumentError",
    "EmbeddingError",
    "FormatError",
    "LLMError",
    "PipelineError",
    "StepError",
    "StoreError",
    "TokenizerError",
]


class ContextfoldError(Exception):
    """Root of every error contextfold raises on purpose."""


class ConfigError(ContextfoldError):
    """Invalid configuration or arguments."""


class BudgetError(ConfigError):
    """A token budget is invalid, or cannot hold the items that must never be dropped."""


class TokenizerError(ContextfoldError):
    """A token encoding could not be loaded (missing, corrupt or unknown)."""


class FormatError(ContextfoldError, ValueError):
    """A provider payload does not have the shape its format requires."""


class EmbeddingError(ContextfoldError):
    """An embedding model could not be loaded (missing, hash mismatch) or misbehaved."""


class StoreError(ContextfoldError):
    """The store cannot be opened, migrated or written."""


class DocumentError(ContextfoldError):
    """A document file cannot be read; the message names the file and what to do."""


class LLMError(ContextfoldError):
    """An LLM or embeddings endpoint failed; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PipelineError(ContextfoldError):
    """A pipeline cannot run as configured (e.g. an async step inside ``build()``)."""


class StepError(PipelineError):
    """A pipeline step raised while ``on_error="raise"``; the original is ``__cause__``."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"step {step!r} failed: {message}")
        self.step = step
