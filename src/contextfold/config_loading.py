"""What the memory config (``contextfold.yaml``) and the server config share: reading the YAML
file, and number types that refuse ``true`` and ``false``.

A YAML mapping that gives a key twice is an error naming the key and both lines (PyYAML keeps
the last one silently). A number setting given ``true`` or ``false`` is an error (pydantic
would read them as 1 and 0: ``port: true`` would listen on port 1); integers stay numbers for a
``float`` setting, and a numeric string is still read as before.

>>> load_yaml("a: 1\\nb: {c: 2}\\n", "x.yaml")
{'a': 1, 'b': {'c': 2}}
>>> try:
...     load_yaml("a: 1\\nb: 2\\na: 3\\n", "x.yaml")
... except ConfigError as exc:
...     print(exc)
x.yaml: duplicate key 'a' at line 3 (first at line 1); give each key once
"""

from __future__ import annotations

from typing import Annotated, Any

import yaml
from pydantic import BeforeValidator

from contextfold.errors import ConfigError

__all__ = ["Float", "Int", "UniqueKeyLoader", "load_yaml"]

_MERGE = "tag:yaml.org,2002:merge"


class _DuplicateKey(yaml.MarkedYAMLError):
    def __init__(self, key: object, line: int, first: int) -> None:
        super().__init__()
        self.key, self.line, self.first = key, line, first


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping giving the same key twice (merge keys,
    ``<<: *anchor``, may still be overridden by the mapping's own keys)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise _DuplicateKey(key, key_node.start_mark.line + 1, seen[key] + 1)
                seen[key] = key_node.start_mark.line
            except TypeError:  # not hashable: the base class reports it
                continue
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str, source: str) -> Any:
    """The YAML document in ``text``; a syntax error (with its line and column) or a duplicate
    key (with both lines) raises ``ConfigError`` starting with ``source``."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader
    except _DuplicateKey as exc:
        raise ConfigError(
            f"{source}: duplicate key {exc.key!r} at line {exc.line} (first at line {exc.first}); "
            "give each key once"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}: invalid YAML{where}: {problem}") from None


def _not_a_bool(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("expected a number, got true or false")
    return value


#: An ``int`` setting that refuses ``true`` / ``false`` (pydantic alone reads them as 1 / 0).
Int = Annotated[int, BeforeValidator(_not_a_bool)]
#: A ``float`` setting that refuses ``true`` / ``false``.
Float = Annotated[float, BeforeValidator(_not_a_bool)]
