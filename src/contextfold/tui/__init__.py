"""The interactive chat (``contextfold chat``): ``ChatSession`` (the turns through memory and
the model, no UI) and ``ChatApp`` (its Textual screen, in ``contextfold.tui.app``; needs the
``tui`` extra: ``pip install "contextfold[tui]"``)."""

from contextfold.tui.session import ChatSession, ChatTurn

__all__ = ["ChatSession", "ChatTurn"]
