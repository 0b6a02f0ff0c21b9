#!/usr/bin/env python3
"""Write docs/cli.md from the real ``--help`` output of every ``contextfold`` command.

    .venv/bin/python scripts/gen_cli_docs.py           # rewrite docs/cli.md
    .venv/bin/python scripts/gen_cli_docs.py --check   # exit 1 if docs/cli.md is stale

The help is rendered at a fixed width without colour, so the file is the same on every machine.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Fix the rendering before typer (and rich) read the environment at import.
for _name in ("FORCE_COLOR", "PY_COLORS", "GITHUB_ACTIONS"):
    os.environ.pop(_name, None)
os.environ.update(
    {
        "TERMINAL_WIDTH": "100",
        "COLUMNS": "100",
        "NO_COLOR": "1",
        "_TYPER_FORCE_DISABLE_TERMINAL": "1",
    }
)

from typer.testing import CliRunner  # noqa: E402

from contextfold.cli import app  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"

INTRO = """\
# CLI reference

Generated from the commands' own `--help` by `scripts/gen_cli_docs.py`; do not edit by hand.
After changing a command, run `.venv/bin/python scripts/gen_cli_docs.py` (the test suite fails
while this file is stale).

Exit codes: `0` success; `2` bad input (a missing or unreadable file, invalid JSON, a field of
the wrong type, an unknown budget / format / encoding / mode / dataset, a budget that cannot
hold the pinned instructions and query, searching a corpus that was never ingested, a port out
of range or already in use, an unknown option); `1` any other contextfold error at run time
(e.g. an LLM endpoint that fails after its retries). A model with no known tokenizer is not an
error: it is counted with `--encoding` (default `o200k_base`), marked estimated, and a note on
stderr says so.
Every error is one line on stderr that starts with `error:`, never a traceback (option-parsing
errors are reported by typer with the command's usage line).
"""


def _help(args: list[str]) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], prog_name="contextfold")
    if result.exit_code != 0:
        raise SystemExit(f"contextfold {' '.join(args)} --help exited {result.exit_code}")
    lines = [line.rstrip() for line in result.stdout.splitlines()]
    return "\n".join(lines).strip("\n")


def render() -> str:
    parts = [INTRO, "## `contextfold`\n\n```text\n" + _help([]) + "\n```\n"]
    for command in app.registered_commands:
        name = command.name or ""
        parts.append(f"## `contextfold {name}`\n\n```text\n" + _help([name]) + "\n```\n")
    for group in app.registered_groups:
        name = group.name or ""
        parts.append(f"## `contextfold {name}`\n\n```text\n" + _help([name]) + "\n```\n")
        assert group.typer_instance is not None
        for command in group.typer_instance.registered_commands:
            sub = [name, command.name or ""]
            parts.append(f"## `contextfold {' '.join(sub)}`\n\n```text\n" + _help(sub) + "\n```\n")
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not DOC.is_file() or DOC.read_text(encoding="utf-8") != text:
            print(f"{DOC} is stale; run: .venv/bin/python scripts/gen_cli_docs.py", file=sys.stderr)
            return 1
        print(f"{DOC} is up to date")
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
