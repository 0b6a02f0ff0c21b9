"""The memory store's conformance suite (``contextfold.store.conformance.memory_vocab``),
run here on every backend."""

from contextfold.store.conformance.memory_vocab import *  # noqa: F403
