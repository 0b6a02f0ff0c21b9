"""The memory store's conformance properties (``contextfold.store.conformance.memory_properties``),
run here on every backend."""

from contextfold.store.conformance.memory_properties import *  # noqa: F403
