"""The memory store's conformance suite (``contextfold.store.conformance.memory_tag_stats``),
run here on every backend."""

from contextfold.store.conformance.memory_tag_stats import *  # noqa: F403
