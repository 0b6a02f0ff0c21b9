"""Tool-call arguments: unknown ones refused by name, and the SDK's validation errors turned into
one short line per bad argument that says what the argument takes.

The SDK validates a call against the tool's argument model (its typed parameters, ``strict``
where a JSON string or boolean must not pass for a number) and reports a failure as pydantic's
full report under ``Error executing tool <name>``; docs/mcp.md keeps that prefix for unexpected
failures. ``explain`` writes the short form from the tool's input schema:

>>> schema = {"properties": {"k": {"type": "integer", "minimum": 1, "maximum": 50}}}
>>> takes(schema["properties"]["k"], schema)
'an integer from 1 to 50'
>>> unknown_arguments("find_quote", {"query": "x", "extra": 1}, {"properties": {"query": {}}})
"find_quote: unknown argument 'extra'; it takes query"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

__all__ = ["explain", "takes", "unknown_arguments"]

_JSON_TYPES = {
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


def unknown_arguments(tool: str, arguments: Mapping[str, Any], schema: Mapping[str, Any]) -> str:
    """The error for the arguments of a call that ``tool``'s input schema does not name, or
    ``""`` when it names them all."""
    known = list(schema.get("properties", {}))
    unknown = [name for name in arguments if name not in known]
    if not unknown:
        return ""
    names = ", ".join(repr(name) for name in unknown)
    accepted = f"it takes {', '.join(known)}" if known else "it takes no arguments"
    return f"{tool}: unknown argument{'s' if len(unknown) > 1 else ''} {names}; {accepted}"


def explain(tool: str, error: ValidationError, schema: Mapping[str, Any]) -> str:
    """One line per bad argument: its name (``history.0.role`` inside a list), what was wrong
    (the value's JSON type for a wrong type, never the value itself) and, for a top-level
    argument, what it takes."""
    properties = schema.get("properties", {})
    lines = []
    for err in error.errors(include_url=False):
        loc = [str(part) for part in err["loc"]]
        name = ".".join(loc) or "(arguments)"
        if err["type"] == "missing":
            line = f"{tool}: argument {name!r} is missing"
        else:
            line = f"{tool}: argument {name!r}: {err['msg']}"
            if err["type"].endswith(("_type", "_parsing")):
                line += f", got {_JSON_TYPES.get(type(err.get('input')), 'something else')}"
        if len(loc) == 1 and loc[0] in properties:
            line += f"; it takes {takes(properties[loc[0]], schema)}"
        lines.append(line)
    return "\n".join(lines)


def takes(prop: Mapping[str, Any], schema: Mapping[str, Any]) -> str:
    """What a JSON-schema property accepts, in words."""
    if "$ref" in prop:
        prop = schema.get("$defs", {}).get(str(prop["$ref"]).rsplit("/", 1)[-1], {})
    if "anyOf" in prop:
        options = [p for p in prop["anyOf"] if p.get("type") != "null"]
        words = " or ".join(takes(p, schema) for p in options)
        return words + (", or null" if len(options) < len(prop["anyOf"]) else "")
    if "enum" in prop:
        return "one of " + ", ".join(repr(v) for v in prop["enum"])
    kind = prop.get("type")
    if kind == "integer" or kind == "number":
        noun = "an integer" if kind == "integer" else "a number"
        low, high = prop.get("minimum"), prop.get("maximum")
        if low is not None and high is not None:
            return f"{noun} from {low} to {high}"
        if low is not None:
            return f"{noun} of at least {low}"
        return f"{noun} of at most {high}" if high is not None else noun
    if kind == "string":
        low, high = prop.get("minLength"), prop.get("maxLength")
        if low is not None and high is not None:
            return f"a string of {low} to {high} characters"
        return "a string"
    if kind == "boolean":
        return "true or false"
    if kind == "array":
        items = prop.get("items", {})
        if "$ref" in items:
            fields = schema.get("$defs", {}).get(str(items["$ref"]).rsplit("/", 1)[-1], {})
            keys = ", ".join(fields.get("properties", {}))
            return f"a list of objects {{{keys}}}" if keys else "a list of objects"
        inner = items.get("type")
        return f"a list of {inner}s" if inner in ("string", "integer", "number") else "a list"
    if kind == "object":
        return "an object"
    return "a value of its schema"
