"""Shared by the framework adapters: the frameworks' messages to and from contextfold's."""

from __future__ import annotations

from contextfold.items import ContextItem

__all__ = ["item_metadata", "require"]


def require(module: str, extra: str) -> None:
    """Import ``module`` or fail with the pip command that installs it."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"this adapter needs {module.split('.')[0]}, which is not installed; "
            f'pip install "contextfold[{extra}]"'
        ) from exc


def item_metadata(item: ContextItem) -> dict[str, object]:
    """A retrieved item's metadata for a framework document: the item's own metadata with its
    id, score, source and section (``score`` wins over a metadata key of that name)."""
    meta: dict[str, object] = dict(item.metadata)
    meta.update(id=item.id, score=item.score, source_type=item.source.value)
    if item.section is not None:
        meta["section"] = item.section
    return meta
