"""The memory store's conformance suite (``contextfold.store.conformance.memory_search``),
run here on every backend."""

from contextfold.store.conformance.memory_search import *  # noqa: F403
