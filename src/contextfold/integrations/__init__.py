"""Adapters to other frameworks, each an optional extra tested against the real library.

``contextfold.integrations.langchain`` (``pip install "contextfold[langchain]"``): retrievers
over a ``DocumentIndex`` (any contextfold ``Retriever``) and over ``POST /api/context``, a chat
message history backed by ``MemoryEngine`` with a recall step, and ``trim_messages``.
``contextfold.integrations.llamaindex`` (``contextfold[llamaindex]``): a retriever and a
``BaseMemory`` over the same parts. ``contextfold.integrations.plugins`` adapts seed 002's own
plug-in shapes (a bare ``chunk(text)``, dict-returning retrievers and composers). Importing a
framework adapter without its framework installed raises ``ImportError`` naming the extra.
"""
