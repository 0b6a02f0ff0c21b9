"""Client envelopes: what a chat gateway wraps around a user's words, removed before memory
reads them.

Gateways that bridge a chat app to a model (OpenClaw and its Telegram, WhatsApp, Discord…
channels) send each user message inside an envelope: a channel header naming the sender and
time, a message-id footer, system event lines ("System: [...] Node connected"), plugin
markers. Tagged as they are, every turn gets the tags ``telegram`` and ``message-id``, and the
stored turns repeat the same header thousands of times. ``Envelope`` removes them from the
user messages memory reads — the parsed copy, after parsing — so they are neither tagged nor
stored; the request goes upstream as the client sent it (the body is never edited), and the
request's record notes what was removed.

Patterns are regular expressions (multi-line mode: ``^``/``$`` match at each line) by name;
``proxy.envelope.patterns`` adds to (or, under the same name, replaces) ``DEFAULT_PATTERNS``,
``proxy.envelope.defaults: false`` drops the built-in ones and ``enabled: false`` turns it off.
A message that would be left with no text keeps its text whole.

>>> env = Envelope(DEFAULT_PATTERNS)
>>> env.strip_text("[Telegram Ada (@ada) id:42 +2m 2026-01-05 10:00 UTC] Book the table\\n"
...                "[message_id: 881]")
('Book the table', ['channel-header', 'message-footer'])
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING

from contextfold._bounded import BoundedMemo, text_size
from contextfold.errors import ConfigError
from contextfold.items import Message, TextBlock

if TYPE_CHECKING:
    from contextfold.server.config import EnvelopeSettings

__all__ = ["DEFAULT_PATTERNS", "Envelope", "envelope_of", "strip_envelope"]

_CHANNELS = (
    "Telegram|WhatsApp|Discord|Slack|Signal|iMessage|Matrix|Messenger|Teams|Line|WebChat|SMS"
)

#: The built-in envelope patterns, by name.
DEFAULT_PATTERNS: dict[str, str] = {
    # "[Telegram Ada (@ada) id:42 +2m 2026-01-05 10:00 UTC] " at the start of a line.
    "channel-header": rf"^\[(?:{_CHANNELS})\b[^\]\n]*\][ \t]*",
    # "[message_id: 881]" (or "[msg_id: …]") alone on a line.
    "message-footer": r"^[ \t]*\[(?:message_id|msg_id|message-id)\s*:\s*[^\]\n]+\][ \t]*$",
    # "System: [2026-01-05 10:00:00] Node connected" — a gateway's event line.
    "event-line": r"^System:[ \t]*\[[^\]\n]*\][^\n]*$",
    # "[[reply_to_current]]", "[[audio_as_voice]]", "<!-- plugin:… -->" markers.
    "plugin-marker": r"\[\[[a-z_]+(?::[^\]\n]*)?\]\]|<!--\s*(?:plugin|openclaw)[:\s][^>]*-->",
}

_BLANK_RUNS = re.compile(r"\n{3,}")


class Envelope:
    """Removes the envelope ``patterns`` (name → regex) from user messages' text."""

    def __init__(self, patterns: Mapping[str, str]) -> None:
        # A chat resends its whole history every request: each text is stripped once (16 MB
        # at most per pattern set; ``_compiled`` keeps up to 32 sets, most servers one).
        self._stripped: BoundedMemo[str, tuple[str, tuple[str, ...]]] = BoundedMemo(
            entries=20_000, max_bytes=16 << 20
        )
        self.patterns: dict[str, re.Pattern[str]] = {}
        for name, pattern in patterns.items():
            try:
                self.patterns[name] = re.compile(pattern, re.MULTILINE)
            except re.error as exc:
                raise ConfigError(
                    f"proxy.envelope.patterns.{name}: not a regular expression: {exc}"
                ) from None

    def strip_text(self, text: str) -> tuple[str, list[str]]:
        """``text`` without its envelope, and the names of the patterns that matched (the
        text unchanged, and ``[]``, when nothing matched or nothing would be left);
        remembered for the texts seen lately."""
        out, hits = self._stripped.get(
            text, lambda: self._strip(text), size=lambda found: 2 * text_size(text)
        )
        return out, list(hits)

    def _strip(self, text: str) -> tuple[str, tuple[str, ...]]:
        hits: list[str] = []
        out = text
        for name, pattern in self.patterns.items():
            out, count = pattern.subn("", out)
            if count:
                hits.append(name)
        if not hits:
            return text, ()
        out = _BLANK_RUNS.sub("\n\n", out).strip()
        if not out:
            return text, ()
        return out, tuple(hits)

    def strip_messages(self, messages: list[Message]) -> dict[str, int]:
        """Strip the user messages of ``messages`` in place; how many of them each pattern
        matched."""
        counts: dict[str, int] = {}
        for i, message in enumerate(messages):
            if message.role != "user":
                continue
            blocks = []
            changed = False
            for block in message.content:
                if isinstance(block, TextBlock):
                    text, hits = self.strip_text(block.text)
                    if hits:
                        changed = True
                        for name in hits:
                            counts[name] = counts.get(name, 0) + 1
                        block = TextBlock(text=text)
                blocks.append(block)
            if changed:
                messages[i] = message.model_copy(update={"content": tuple(blocks)})
        return counts


@lru_cache(maxsize=32)
def _compiled(patterns: tuple[tuple[str, str], ...]) -> Envelope:
    return Envelope(dict(patterns))


def envelope_of(settings: EnvelopeSettings) -> Envelope | None:
    """The ``Envelope`` of ``proxy.envelope`` (``None`` when it is off or has no pattern)."""
    if not settings.enabled:
        return None
    patterns = {**(DEFAULT_PATTERNS if settings.defaults else {}), **settings.patterns}
    return _compiled(tuple(patterns.items())) if patterns else None


def strip_envelope(settings: EnvelopeSettings, messages: list[Message]) -> str | None:
    """Strip ``messages`` (a parsed request's, in place) per ``settings``; the note for the
    request's record, or ``None`` when nothing was removed."""
    envelope = envelope_of(settings)
    if envelope is None:
        return None
    counts = envelope.strip_messages(messages)
    if not counts:
        return None
    listed = ", ".join(f"{name} ×{n}" for name, n in counts.items())
    return f"envelope removed before tagging and storing: {listed}"
