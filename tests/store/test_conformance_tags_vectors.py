"""The memory store's conformance suite (``contextfold.store.conformance.memory_tags_vectors``),
run here on every backend."""

from contextfold.store.conformance.memory_tags_vectors import *  # noqa: F403
