"""The memory store's conformance suite (``contextfold.store.conformance.memory_compaction``),
run here on every backend."""

from contextfold.store.conformance.memory_compaction import *  # noqa: F403
