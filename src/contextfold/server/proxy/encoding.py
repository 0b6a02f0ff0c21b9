"""Request bodies sent compressed (``Content-Encoding``).

Codex CLI sends its ``/v1/responses`` bodies compressed with zstd (``Content-Encoding: zstd``);
other clients may use gzip or deflate. The proxy decodes the body before it reads it and
forwards the decoded bytes (``Content-Encoding`` is not forwarded: ``forward``'s hop-by-hop
set), on the memory routes and the pass-through alike. Several codings (``gzip, zstd``) are
undone in reverse order; ``identity`` is no coding.

A decoded body may be no larger than ``limits.max_body_bytes`` (a 413: a few kilobytes of
zstd must not expand into gigabytes), a coding the proxy cannot undo is a 415, and a body that
does not decode is a 400, each before anything is sent upstream. zstd needs the
``zstandard`` package (in the ``server`` extra); without it a zstd body is a 415 saying so.

>>> import gzip
>>> decode_body(gzip.compress(b'{"input": "hi"}'), "gzip", 1024)
b'{"input": "hi"}'
>>> try:
...     decode_body(b"abc", "br", 1024)
... except BodyError as exc:
...     print(exc.status, exc.message)
415 request body has Content-Encoding 'br'; this proxy decodes gzip, deflate and zstd
"""

from __future__ import annotations

import io
import zlib

__all__ = ["BodyError", "decode_body"]


class BodyError(Exception):
    """A body the proxy cannot decode: the status to answer and what is wrong."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def decode_body(raw: bytes, header: str | None, limit: int) -> bytes:
    """``raw`` with the codings of the ``Content-Encoding`` ``header`` undone (at most
    ``limit`` bytes decoded); raises ``BodyError``."""
    codings = [c.strip().lower() for c in (header or "").split(",") if c.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        if coding in ("gzip", "x-gzip", "deflate"):
            raw = _zlib(raw, coding, limit)
        elif coding == "zstd":
            raw = _zstd(raw, limit)
        else:
            raise BodyError(
                415,
                f"request body has Content-Encoding {coding!r}; this proxy decodes gzip,"
                " deflate and zstd",
            )
    return raw


def _too_large(coding: str, limit: int) -> BodyError:
    return BodyError(
        413,
        f"request body decoded from {coding} is larger than {limit:,} bytes"
        " (limits.max_body_bytes)",
    )


def _zlib(raw: bytes, coding: str, limit: int) -> bytes:
    # gzip: a gzip header; deflate: a zlib stream, or (as some clients send it) a raw one.
    tries = [16 + zlib.MAX_WBITS] if coding != "deflate" else [zlib.MAX_WBITS, -zlib.MAX_WBITS]
    for n, wbits in enumerate(tries):
        decoder = zlib.decompressobj(wbits)
        try:
            out = decoder.decompress(raw, limit + 1)
        except zlib.error as exc:
            if n + 1 < len(tries):
                continue
            raise BodyError(400, f"request body is not valid {coding}: {exc}") from exc
        if len(out) > limit or decoder.unconsumed_tail:
            raise _too_large(coding, limit)
        if not decoder.eof:
            raise BodyError(400, f"request body is not valid {coding}: it ends too early")
        return out
    raise AssertionError("unreachable")  # pragma: no cover


def _zstd(raw: bytes, limit: int) -> bytes:
    try:
        import zstandard
    except ImportError as exc:
        raise BodyError(
            415,
            "request body has Content-Encoding 'zstd'; install the zstandard package"
            " (pip install 'contextfold[server]') for the proxy to decode it",
        ) from exc
    try:
        # Read in bounded pieces: a small body may expand without bound.
        chunks: list[bytes] = []
        size = 0
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)) as reader:
            while size <= limit and (piece := reader.read(64 * 1024)):
                chunks.append(piece)
                size += len(piece)
        out = b"".join(chunks)
        if len(out) <= limit and raw:
            # The reader stops quietly where a body was cut short: decode the first frame
            # again, which is now known to be small, to see that it ends.
            check = zstandard.ZstdDecompressor().decompressobj()
            check.decompress(raw)
            if not check.eof:
                raise BodyError(400, "request body is not valid zstd: it ends too early")
    except zstandard.ZstdError as exc:
        raise BodyError(400, f"request body is not valid zstd: {exc}") from exc
    if len(out) > limit:
        raise _too_large("zstd", limit)
    return out
