"""What every command shares: one-line errors with exit codes, reading a file or stdin, and
choosing a token counter.

Errors are converted here, at the CLI edge, and nowhere else: bad input (a missing file, invalid
JSON, an unknown name, a value out of range, a budget that cannot hold the pinned items) exits 2;
any other ``ContextfoldError`` raised while running exits 1. Each prints one line to stderr,
never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn, TypeVar

import typer
from pydantic import ValidationError

from contextfold.errors import ConfigError, ContextfoldError
from contextfold.tokens import TiktokenCounter, counter_for_model

__all__ = [
    "EXIT_INPUT",
    "EXIT_RUNTIME",
    "InputError",
    "cli_errors",
    "counter_from",
    "fail",
    "invalid_fields",
    "one_of",
    "read_text",
]

EXIT_RUNTIME = 1
EXIT_INPUT = 2
ENCODINGS = ("cl100k_base", "o200k_base")

_Choice = TypeVar("_Choice", bound=str)


class InputError(Exception):
    """Bad input found by the CLI itself; becomes one error line and exit code 2."""


def fail(message: str, code: int = EXIT_INPUT) -> NoReturn:
    """Print ``error: message`` to stderr and exit with ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn the errors a command may meet into one stderr line and an exit code."""
    try:
        yield
    except InputError as exc:
        fail(str(exc))
    except ValidationError as exc:  # settings built from options and files
        fail(invalid_fields(exc))
    except ConfigError as exc:  # BudgetError included: the input asks for the impossible
        fail(f"{type(exc).__name__}: {exc}")
    except ContextfoldError as exc:
        fail(f"{type(exc).__name__}: {exc}", EXIT_RUNTIME)


def invalid_fields(exc: ValidationError, names: Mapping[str, str] | None = None) -> str:
    """One line for a pydantic ``ValidationError``: each bad field, by the option that set it
    where ``names`` maps its dotted path to one, and what is wrong with it. Never the value,
    which may be a key."""
    problems = []
    for err in exc.errors():
        field = ".".join(str(part) for part in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        problems.append(f"{(names or {}).get(field, field)}: {message}" if field else message)
    return "; ".join(problems)


def one_of(option: str, value: str, choices: Sequence[_Choice]) -> _Choice:
    """The choice ``value`` names (any case), as ``choices`` spell it; ``InputError`` naming
    ``option`` and every choice otherwise."""
    for choice in choices:
        if choice.lower() == value.lower():
            return choice
    raise InputError(f"{option} must be one of {', '.join(choices)}, got {value!r}")


def read_text(source: str) -> tuple[str, str]:
    """``(display name, text)`` of a UTF-8 file (a byte-order mark dropped), or of stdin when
    ``source`` is ``-``."""
    if source == "-":
        name, data = "<stdin>", typer.get_binary_stream("stdin").read()
    else:
        path = Path(source)
        name = source
        if not path.exists():
            raise InputError(f"{source}: no such file")
        if path.is_dir():
            raise InputError(f"{source}: is a directory, not a file")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InputError(f"{source}: cannot read ({exc.strerror or exc})") from None
    try:  # a byte-order mark (as Notepad saves UTF-8) is not content
        return name, data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not UTF-8 text (invalid byte at offset {exc.start:,})") from None


def counter_from(model: str | None, encoding: str | None) -> TiktokenCounter:
    """The counter for ``--model`` and/or ``--encoding`` (default ``o200k_base``).

    Known models get their exact encoding; Claude and Gemini get ``o200k_base`` with a safety
    margin; ``--encoding`` naming another encoding for them is an input error. A model with no
    known tokenizer is counted with ``--encoding`` (default ``o200k_base``), marked
    estimated, and a note says so on stderr.
    """
    if encoding is not None and encoding not in ENCODINGS:
        raise InputError(f"unknown encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}")
    if model is None:
        return TiktokenCounter(encoding or "o200k_base")
    if not model.strip():
        raise InputError("--model is empty; name a model such as gpt-4o or claude-sonnet-4")
    counter = counter_for_model(model, default_encoding=encoding or "o200k_base")
    known = not counter.estimated or counter.safety_margin > 0  # the model's own encoding
    if encoding is not None and known and counter.encoding_name != encoding:
        raise InputError(
            f"--encoding {encoding} does not apply to {model!r}, which is counted with "
            f"{counter.encoding_name}; drop --encoding (or --model)"
        )
    if not known:  # no tokenizer known for this model
        typer.echo(
            f"note: no tokenizer is known for {model!r}; counting with {counter.encoding_name} "
            "(estimated)",
            err=True,
        )
    return counter
