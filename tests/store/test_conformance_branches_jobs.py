"""The memory store's conformance suite (``contextfold.store.conformance.memory_branches_jobs``),
run here on every backend."""

from contextfold.store.conformance.memory_branches_jobs import *  # noqa: F403
