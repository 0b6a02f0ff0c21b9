"""The memory store's conformance suite (``contextfold.store.conformance.memory_sessions``),
run here on every backend."""

from contextfold.store.conformance.memory_sessions import *  # noqa: F403
