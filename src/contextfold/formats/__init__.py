"""Provider formats: render a packed window as an OpenAI, Anthropic, Gemini or text payload, and
parse provider payloads back into messages."""

from contextfold.formats.anthropic import AnthropicFormatter, parse_anthropic_messages
from contextfold.formats.base import BaseFormatter, Formatter, Layout, layout_items, render_part
from contextfold.formats.gemini import GeminiFormatter, parse_gemini_contents
from contextfold.formats.openai import OpenAIFormatter, parse_openai_messages
from contextfold.formats.text import GenericTextFormatter

__all__ = [
    "AnthropicFormatter",
    "BaseFormatter",
    "Formatter",
    "GeminiFormatter",
    "GenericTextFormatter",
    "Layout",
    "OpenAIFormatter",
    "formatter_for",
    "layout_items",
    "parse_anthropic_messages",
    "parse_gemini_contents",
    "parse_openai_messages",
    "render_part",
]

_BY_NAME: dict[str, type[BaseFormatter]] = {
    f.name: f for f in (OpenAIFormatter, AnthropicFormatter, GeminiFormatter, GenericTextFormatter)
}


def formatter_for(name: str, **options: bool) -> BaseFormatter:
    """The formatter for ``"openai"``, ``"anthropic"``, ``"gemini"`` or ``"text"``."""
    from contextfold.errors import ConfigError

    try:
        return _BY_NAME[name](**options)
    except KeyError:
        raise ConfigError(f"unknown format {name!r}; choose one of {sorted(_BY_NAME)}") from None
