"""The memory store's conformance suite (``contextfold.store.conformance.memory_derive``),
run here on every backend."""

from contextfold.store.conformance.memory_derive import *  # noqa: F403
