"""``EventLog``: the server's terminal log, one line per event, as it happens.

``contextfold serve`` and ``contextfold proxy`` write it to stdout (their other messages go to
stderr), so an operator watching the terminal sees what memory does to every request (each
event is one line; the two long ones are wrapped here)::

    [INGEST] 43 turns from the client's history (session=a1b2c3d4e5f6)
    [T44] REQUEST anthropic claude-haiku stream=True tags=[css, design] msgs=52 dropped=25
          mem=312t vc=8.9ms session=a1b2c3d4e5f6
    [T44] RESPONSE status=200 stream=True llm=3028ms total=3117ms chars=117
    [T44] COMPLETE 1204ms tags=[css, web-development, html] (session=a1b2c3d4e5f6)
    [COMPACT] 24 turns into 6 segments, freed 9,412 tokens (18,020 -> 8,608, ratio 2.1x)
          in 88ms (session=a1b2c3d4e5f6)

Lines carry counts, tags, times and ids, never message text: an excerpt of the query (and of
the reply, on ``COMPLETE``) is added only with ``content`` (``--log-content``). ``enabled``
off (``--no-event-log``, or ``event_log.enabled: false``) writes nothing.

Writing never holds anything up: the proxy's writer and job threads queue a line and go on,
and a thread of the log writes the lines out. A stdout nobody reads (a pipe left full) or a
closed one loses lines, never a request or a job: past ``backlog`` queued lines the new ones
are dropped and counted, and the count is written once stdout takes lines again.

>>> import io
>>> out = io.StringIO()
>>> log = EventLog(stream=out)
>>> log.ingest("a1b2c3d4e5f6a7b8", 3)
>>> log.flush()
True
>>> out.getvalue()
"[INGEST] 3 turns from the client's history (session=a1b2c3d4e5f6)\\n"
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from contextfold.memory.compactor import CompactionReport

__all__ = ["EventLog"]

#: The characters of the query (or reply) a line quotes with ``content`` on.
EXCERPT = 80


def _tags(tags: Sequence[str]) -> str:
    return "[" + ", ".join(tags) + "]"


def _excerpt(text: str, limit: int = EXCERPT) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _turn(turn: int | None) -> str:
    return f"[T{turn}]" if turn is not None else "[T?]"


def _sid(session_id: str | None) -> str:
    return (session_id or "new")[:12]


class EventLog:
    """One line per event on ``stream`` (default: the process's stdout at write time)."""

    def __init__(
        self,
        *,
        enabled: bool = True,
        content: bool = False,
        stream: TextIO | None = None,
        backlog: int = 10_000,
    ) -> None:
        self.enabled = enabled
        self.content = content
        self.stream = stream
        self.dropped = 0  # lines lost to a full backlog (stdout not read)
        self._queue: queue.Queue[str] = queue.Queue(maxsize=backlog)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        """Queue one line for the log's thread (started on the first line)."""
        if not self.enabled:
            return
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            with self._lock:
                self.dropped += 1
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="contextfold-event-log", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            line = self._queue.get()
            try:
                with self._lock:
                    dropped, self.dropped = self.dropped, 0
                out = self.stream if self.stream is not None else sys.stdout
                if dropped:
                    out.write(f"[LOG] {dropped} event lines dropped: stdout was not read\n")
                out.write(line + "\n")
                out.flush()  # a terminal or a pipe sees it now
            except (OSError, ValueError):  # stdout closed or gone: the line is lost
                pass
            finally:
                self._queue.task_done()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the queued lines are written (at most ``timeout`` seconds)."""
        done = threading.Event()

        def wait() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        return done.wait(timeout)

    def ingest(self, session_id: str, turns: int) -> None:
        """A new conversation brought ``turns`` earlier turns of its history: stored now,
        tagged by the session's derive job (its ``COMPLETE`` line)."""
        self.write(f"[INGEST] {turns} turns from the client's history (session={_sid(session_id)})")

    def request(
        self,
        turn: int | None,
        *,
        label: str,
        model: str | None,
        stream: bool,
        tags: Sequence[str],
        messages: int,
        dropped: int,
        memory_tokens: int,
        overhead_ms: float,
        session_id: str | None,
        query: str = "",
        error: str | None = None,
    ) -> None:
        """A request on its way upstream: its inbound tags, the messages it carried and how
        many memory left out, the memory tokens added and the time spent before forwarding."""
        line = (
            f"{_turn(turn)} REQUEST {label}{f' {model}' if model else ''} stream={stream}"
            f" tags={_tags(tags)} msgs={messages} dropped={dropped} mem={memory_tokens}t"
            f" vc={overhead_ms:.1f}ms session={_sid(session_id)}"
        )
        if error:
            line += " fail-open"
        if self.content and query:
            line += f" | {_excerpt(query)}"
        self.write(line)

    def response(
        self,
        turn: int | None,
        *,
        status: int,
        stream: bool,
        upstream_ms: float | None,
        total_ms: float,
        chars: int,
    ) -> None:
        """The upstream's reply has ended (``llm``: the upstream's time, ``total``: since the
        request arrived)."""
        llm = "–" if upstream_ms is None else f"{upstream_ms:.0f}ms"
        self.write(
            f"{_turn(turn)} RESPONSE status={status} stream={stream} llm={llm}"
            f" total={total_ms:.0f}ms chars={chars}"
        )

    def complete(
        self,
        turn: int | None,
        *,
        elapsed_ms: float,
        tags: Sequence[str],
        session_id: str,
        reply: str = "",
    ) -> None:
        """The exchange has been tagged (``elapsed``: since the request arrived)."""
        line = (
            f"{_turn(turn)} COMPLETE {elapsed_ms:.0f}ms tags={_tags(tags)}"
            f" (session={_sid(session_id)})"
        )
        if self.content and reply:
            line += f" | {_excerpt(reply)}"
        self.write(line)

    def compact(self, report: CompactionReport) -> None:
        """A compaction: the turns and segments, the tokens freed and the ratio of the
        compacted turns' tokens to their summaries'."""
        ratio = report.tokens_compacted / report.summary_tokens if report.summary_tokens else 0.0
        self.write(
            f"[COMPACT] {report.turns_compacted} turns into {report.segments_compacted}"
            f" segments, freed {report.tokens_freed:,} tokens ({report.tokens_compacted:,} ->"
            f" {report.summary_tokens:,}, ratio {ratio:.1f}x) in {report.duration_ms:.0f}ms"
            f" (session={_sid(report.session_id)})"
        )
