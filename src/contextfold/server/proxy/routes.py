"""The transparent LLM proxy: clients change only their ``base_url``; every request gains memory.

Routes (kept out of the OpenAPI schema: they are the providers' own APIs):

- ``POST /v1/chat/completions`` (OpenAI), ``POST /v1/responses`` (OpenAI Responses API:
  ``responses``), ``POST /v1/messages`` (Anthropic),
  ``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent`` (Gemini; the
  same under ``/v1/models/…``, the stable API version) go through memory, and so do Azure
  OpenAI's ``/openai/deployments/{name}/chat/completions`` (the deployment is the model when
  the body names none), ``/openai/v1/chat/completions`` and ``/openai/v1/responses``;
- every other ``/v1/…``, ``/v1beta/…`` and ``/openai/…`` request (``/v1/models``,
  ``/v1/embeddings``, ``GET /v1/responses/{id}`` …) is passed through untouched, counted per
  route (``PassThroughCounts``: the dashboard's stats and one log line per new route).

Per memory request, each step in its module: the caller's principal and the turn its history
continues (``session``) → memory for it under ``proxy.memory_deadline_ms`` (or
``proxy.fit_deadline_ms`` for a request that may not fit the window as sent; ``recall``:
position, recall, history, inject, the whole counted against the model's window: ``fit``,
and a request over it all the same logged and noted) → the upstream call (``forward``) →
the reply relayed as it arrives (``stream``), the exchange committed where the reply is
complete and before its end reaches the client (``commit``), the marker put there when one
fits (``markers``) → the dashboard record (``record``), its reply tags once the session's
derive job (``contextfold.server.jobs``) has tagged them.

Failing open: if anything in the memory path raises or runs past its deadline, the original
request bytes are forwarded unmodified (and the exchange is still stored), the reason is logged
and shown in the request's dashboard record (an exception's text cut to 200 characters: it may
quote the client's values). Upstream errors (4xx, 5xx) come back with their status and body.
Malformed JSON or invalid UTF-8 gets a 400 in the provider's error shape, and so does a path
that would leave the upstream's prefix (``forward.forward_path``); a body past one of the
limits (``limits``) gets a 413 or 400 before anything is sent upstream. Credentials
(``Authorization``, ``x-api-key``, ``x-goog-api-key``, ``?key=``) are forwarded and never
logged; nothing of a body is logged.

Memory tools (``paging.mode: tools``): the proxy offers expand_topic / collapse_topic /
find_quote next to the client's tools, runs the model's calls to them itself and asks again
(at most ``proxy.max_tool_continuations`` times), invisible to the client. Each round is
counted against the model's window like the request (``fit.tool_round``: the results cut to
what it leaves; a round over it all the same logged and noted). That loop runs upstream
without streaming; a streaming client then receives the final answer as one
synthesized stream. A model's bad call comes back to it as a tool error; an engine error in
the loop fails open: the client's request goes upstream unmodified, and its answer comes back.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from contextfold import telemetry
from contextfold._bounded import clip
from contextfold.memory.tools import TOOL_NAMES
from contextfold.server.events import RequestRecord
from contextfold.server.jobs import Foreground, JobWorker
from contextfold.server.proxy import fit, limits, outputs, recall, responses
from contextfold.server.proxy.commit import commit_exchange, replay_exchange
from contextfold.server.proxy.encoding import BodyError, decode_body
from contextfold.server.proxy.forward import (
    CONNECT_TIMEOUT,
    UPSTREAM_ERRORS,
    StreamCut,
    Upstream,
    error_response,
    forward_headers,
    forward_path,
    request_error,
    response_headers,
    upstream_host,
    upstream_url,
)
from contextfold.server.proxy.markers import session_marker
from contextfold.server.proxy.record import Plan, ReplyTags, build_record
from contextfold.server.proxy.session import (
    SESSION_HEADER,
    make_token,
    principal_of,
)
from contextfold.server.proxy.spool import ExchangeSpool, Spooled, SpoolReplayer, store_key
from contextfold.server.proxy.stream import (
    DEFERRED,
    MARKER_SLOT,
    Reply,
    SseSplitter,
    StreamState,
    continuation,
    mark_json,
    reply_of,
    stream_state,
    synthesize,
)
from contextfold.server.proxy.tools import unstreamed, without_memory_tools
from contextfold.server.proxy.turns import TurnNumbers, user_turns
from contextfold.server.proxy.wire import WIRES, Wire, dumps, reply_message
from contextfold.server.proxy.writer import TurnWriter
from contextfold.server.state import ServerState
from contextfold.store.sqlite import home_dir

if TYPE_CHECKING:
    from contextfold.items import Message
    from contextfold.memory.compactor import CompactionReport

__all__ = ["Proxy", "ProxyRouter", "format_of", "router"]

logger = logging.getLogger("contextfold.server.proxy")
_T = TypeVar("_T")

_GEMINI = re.compile(r"(?:tuned)?[mM]odels/[^/:]+:(?:generateContent|streamGenerateContent)")
# Azure OpenAI: a deployment's chat completions, and the v1 API's.
_AZURE_CHAT = re.compile(r"deployments/[^/]+/chat/completions|v1/chat/completions")
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
#: The longest a background job waits for the requests in flight to finish their memory work.
QUIET_WAIT = 0.05
#: A request body of this many bytes per token of the model's window or more may not fit it
#: unmodified (English text and code run 3-4 bytes a token, JSON adds more): its memory work
#: is waited for up to ``proxy.fit_deadline_ms`` instead of the memory deadline.
FIT_BYTES_PER_TOKEN = 2


class Proxy:
    """The proxy of one server: its HTTP client, its writer thread and its routes."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.writer = TurnWriter()  # dashboard records, off the response path
        self.jobs = JobWorker(state.memory, threads=state.config.proxy.job_threads)
        # Stored turns get their vectors from the jobs: a recall ranks by the vectors stored
        # (the newest turns are found by their text and tags meanwhile) and never waits on
        # an embedding backlog (``Recaller`` never embeds stored turns).
        # Memory work of requests (resolve, recall, commit): its own threads, so a request
        # past its deadline goes on without waiting for them.
        self._pool = ThreadPoolExecutor(32, thread_name_prefix="contextfold-memory")
        self.upstream = Upstream(state.config.proxy.timeout)
        self.tags = ReplyTags(state.memory.store, state.events)
        self.turns = TurnNumbers(state.memory.store)
        self.tags.on_tagged = self._log_complete
        self.jobs.on_compacted = self._compacted
        # Responses API ids -> stored turns, kept in the store (every worker process sees them)
        self.chains = responses.ResponseChains(store=state.memory.store)
        self.jobs.on_done = self.tags.derived
        # Jobs another process ran: their reply tags are looked for on a timer.
        self.jobs.on_tick = self.tags.sweep
        self.foreground = Foreground()
        # Background work yields to requests in a burst, for at most 50 ms a job (a batch of
        # records), so under steady load it still advances.
        self.jobs.gate = self.writer.gate = partial(self.foreground.wait_quiet, QUIET_WAIT)
        # Exchanges the store could not take, on local disk until it can (``spool``).
        self.spool: SpoolReplayer | None = None
        key = store_key(str(getattr(state.memory.store, "path", "") or ""))
        if key is not None and state.memory_error is None:
            try:
                spool = ExchangeSpool(home_dir() / "spool.db", key)
            except OSError as exc:  # a home that cannot be made (a read-only root)
                logger.warning(
                    "running without a spool: an exchange the store cannot take is not kept"
                    " to store later (%s)",
                    exc,
                )
            else:
                self.spool = SpoolReplayer(spool, self._replay)

    # -- plumbing --------------------------------------------------------------------------------

    def start(self) -> None:
        """Warm the models the request path uses (the server answers once they are loaded, so
        the first request does not spend its memory deadline loading them), then start the
        workers of derived work (resuming what the store has pending)."""
        self._warm()
        if self.state.freeze_gc:
            freeze_loaded()
        self.jobs.start()
        if self.spool is not None:
            self.spool.start()

    def _warm(self) -> None:
        memory = self.state.memory
        try:
            memory.counter.count("warm up")
            if memory.embedder is not None:
                memory.embedder.embed(["warm up"])
        except Exception as exc:  # the first request pays for it instead
            logger.warning("warming memory failed: %s: %s", type(exc).__name__, exc)

    async def aclose(self) -> None:
        """Close the HTTP client of this loop (the servers have stopped: nothing goes upstream
        any more), stop the workers (pending work stays in the store, and the log says how
        much), then publish the last records."""
        await self.upstream.aclose()
        if self.spool is not None:
            spooled = await anyio.to_thread.run_sync(self.spool.stop)
            if spooled:
                logger.warning(
                    "stopped with %d exchange(s) spooled in %s (the store did not take them);"
                    " the next start stores them",
                    spooled,
                    self.spool.spool.path,
                )
        pending = await anyio.to_thread.run_sync(self.jobs.stop)
        if pending > 0:
            logger.warning(
                "stopped with %d derive job(s) pending in the store; they resume at the next"
                " start (every exchange is stored)",
                pending,
            )
        await anyio.to_thread.run_sync(self.writer.close, 5.0)
        await anyio.to_thread.run_sync(self.state.events.detach)  # before the store closes
        self._pool.shutdown(wait=False, cancel_futures=True)

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every record is published and the store has no pending job (tests and
        benchmarks); False if ``timeout`` seconds passed first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.writer.drain(max(0.0, deadline - time.monotonic())) and self.jobs.idle_now():
                drained = self.writer.drain(max(0.0, deadline - time.monotonic()))
                return self.state.events.flush() and drained
            time.sleep(0.01)
        return False

    def _body(self, request: Request, raw: bytes) -> bytes:
        """The request body decoded from its ``Content-Encoding`` (``encoding``: Codex CLI
        sends zstd); the decoded bytes are what is read and forwarded."""
        coding = request.headers.get("content-encoding")
        if not coding:
            return raw
        return decode_body(raw, coding, self.state.config.limits.max_body_bytes)

    async def _in_pool(self, fn: Callable[..., _T], *args: Any) -> _T:
        with self.foreground:
            return await asyncio.get_running_loop().run_in_executor(self._pool, partial(fn, *args))

    async def _target(
        self, request: Request, fmt: str
    ) -> Response | tuple[str, str | None, str, bytes]:
        """(upstream base URL, instance name, path to forward, decoded body) of a request, or
        the provider-shaped error that answers it: no upstream for its port, a path that must
        not be forwarded, a body that cannot be decoded."""
        upstream, instance = self.upstream_for(request)
        if upstream is None:
            return error_response(
                fmt,
                503,
                "no upstream is configured for this port: set proxy.upstream or run "
                "`contextfold proxy --upstream URL`",
                "api_error",
            )
        try:
            path = forward_path(request.scope.get("raw_path") or b"", request.url.path)
        except ValueError as exc:
            return request_error(fmt, 400, f"{exc}; not forwarded")
        try:
            raw = self._body(request, await request.body())
        except BodyError as exc:
            return request_error(fmt, exc.status, exc.message)
        return upstream, instance, path, raw

    def upstream_for(self, request: Request) -> tuple[str | None, str | None]:
        """(upstream base URL, instance name) for the port the request came in on."""
        server = request.scope.get("server")
        port = server[1] if server else None
        for instance in self.state.config.proxy.instances:
            if instance.port == port:
                return instance.upstream, instance.name
        return self.state.config.proxy.upstream, None

    @property
    def tools_mode(self) -> bool:
        paging = self.state.memory.config.paging
        return paging.enabled and paging.mode == "tools"

    def prepare(self, plan: Plan, wire: Wire, body: dict[str, Any]) -> None:
        """The memory path for one request (``recall.prepare``; the Responses API:
        ``responses.prepare``)."""
        if wire.name == responses.FORMAT:
            responses.prepare(self.state, self.chains, plan, body)
            return
        recall.prepare(self.state, plan, wire, body, tools=self.tools_mode)

    # -- requests --------------------------------------------------------------------------------

    async def handle(self, request: Request, fmt: str) -> Response:
        with self.foreground:  # until the request goes upstream
            prepared = await self._prepare_request(request, fmt)
        if isinstance(prepared, Response):
            return prepared
        plan, url, headers, raw = prepared
        self._log_request(plan)
        # The Responses API has no in-proxy memory tool loop (``responses``).
        memory_tools = self.tools_mode and plan.format != responses.FORMAT
        restore = plan.compaction is not None and outputs.restores(plan.format)
        if (memory_tools or restore) and plan.body is not None:
            return await self._tool_loop(plan, url, headers, raw)
        return await self._forward(plan, url, headers)

    async def _prepare_request(
        self, request: Request, fmt: str
    ) -> Response | tuple[Plan, str, dict[str, str], bytes]:
        """Everything before the request goes upstream: read, check, locate, recall, inject,
        compact; an error response, or (the plan, the upstream URL, the headers to send, the
        body as the client sent it, decoded)."""
        started = time.perf_counter()
        wire = responses.WIRE if fmt == responses.FORMAT else WIRES[fmt]
        target = await self._target(request, fmt)
        if isinstance(target, Response):
            return target
        upstream, instance, path, raw = target
        body, problem = _decode(raw)
        if body is None:
            return request_error(fmt, 400, problem)
        broken = limits.check(body, wire.key, self.state.config.limits)
        if broken is not None:
            return request_error(fmt, *broken)
        plan = Plan(
            id=uuid.uuid4().hex,
            format=fmt,
            path=path,
            model=wire.model(body, path),
            stream=wire.is_stream(body, path),
            instance=instance,
            started=started,
        )
        plan.header = request.headers.get(SESSION_HEADER)
        plan.principal = principal_of(request.headers, request.query_params, self.state.secret)
        if fmt == responses.FORMAT:  # ``previous_response_id``: the turn that response stored
            plan.header = self.chains.token(plan.principal, body, self.state.secret) or plan.header
        plan.wire, plan.original = wire, body
        plan.content = raw
        deadline = self.state.config.proxy.memory_deadline_ms / 1000
        if self.state.memory_error:
            plan.error = f"memory is down, request forwarded unmodified: {self.state.memory_error}"
            plan.wire = None  # nothing is stored either
        else:
            plan = await self._prepared(plan, wire, body, deadline)
        model = plan.model if plan.model is not None else body.get("model")
        model = model if isinstance(model, str) else None
        cap = self._outputs_cap(fmt, body)
        if outputs.limit_for(fmt, self.state.config.proxy.tool_outputs, model, cap) is not None:
            try:
                await self._in_pool(self._compact_outputs, plan, body)
            except Exception as exc:  # fail open: the request goes without compaction
                plan.notes.append(f"tool outputs not compacted: {type(exc).__name__}: {exc}")
                logger.warning("request %s: %s", plan.id, plan.notes[-1])
        if (over := fit.overflow(plan)) is not None:  # never forwarded over it without a trace
            plan.notes.append(over)
            logger.warning("request %s: %s", plan.id, over)
        url = upstream_url(upstream, path, request.url.query)
        headers = forward_headers(request.headers.items())
        plan.overhead_ms = (time.perf_counter() - started) * 1000
        return plan, url, headers, raw

    def _outputs_cap(self, fmt: str, body: dict[str, Any]) -> int:
        """What the window leaves the client's messages (``outputs.limit_for``'s ``cap``):
        ``context_window`` less the reply's reserve and the memory budget — from the config
        and the request's own maximum alone, so the limit (and which outputs are stubbed)
        does not move between a session's requests with their memory work."""
        memory = self.state.memory.config
        window = memory.context_window
        default = self.state.config.proxy.reply_reserve_tokens
        reserve = fit.reply_reserve(fmt, body, default, window)
        return window - reserve - memory.assembly.memory_budget

    def _compact_outputs(self, plan: Plan, body: dict[str, Any]) -> None:
        """Stub the request's oldest tool outputs when it is over its limit (``outputs``),
        sized by the client's messages as they go upstream (the history filter applied,
        memory not: memory that varies from turn to turn never moves a bucket); the restore
        tool goes with the stubs."""
        forwarded = plan.body if plan.body is not None else body
        sized = plan.bare if plan.bare is not None and plan.body is not None else body
        settings = self.state.config.proxy.tool_outputs
        out, done = outputs.compact(
            plan.format,
            forwarded,
            settings,
            plan.model,
            sent=sized,
            cap=self._outputs_cap(plan.format, body),
        )
        if done is None:
            return
        if outputs.restores(plan.format):
            out = WIRES[plan.format].add_tools(out, outputs.restore_definitions(plan.format))
        plan.body, plan.content, plan.compaction = out, dumps(out), done
        plan.notes.append(done.note())

    async def _prepared(
        self, plan: Plan, wire: Wire, body: dict[str, Any], deadline: float
    ) -> Plan:
        """A copy of ``plan`` filled by the memory path within ``deadline`` seconds (within
        ``proxy.fit_deadline_ms`` for a request that may not fit the model's window as sent,
        its wait for a memory thread included: ``_fit_deadline``), else ``plan`` with the
        reason (the request then goes upstream as the client sent it)."""
        draft = recall.draft(plan)
        work = asyncio.ensure_future(self._in_pool(self.prepare, draft, wire, body))
        # A failure after the wait gave up is read here (no "exception never retrieved").
        work.add_done_callback(lambda done: done.cancelled() or done.exception())
        waited = time.perf_counter()
        limit = deadline
        try:
            try:
                await asyncio.wait_for(asyncio.shield(work), deadline)
            except TimeoutError:
                # Forwarded as the client sent it, a request that may not fit the model's
                # window would overflow (a provider refuses it): its memory work (what makes it
                # fit) is waited for, queued behind other requests' work too.
                limit = self._fit_deadline(plan)
                if work.done() or limit <= deadline:
                    raise
                await asyncio.wait_for(asyncio.shield(work), limit - deadline)
                draft.notes.append(
                    f"memory took {(time.perf_counter() - waited) * 1000:.0f} ms, past the"
                    f" {deadline * 1000:g} ms deadline: waited for, as the request"
                    f" ({len(plan.content):,} bytes) may not fit the model's window unmodified"
                )
        except TimeoutError as exc:
            if work.done() and not work.cancelled() and work.exception() is exc:
                reason = f"TimeoutError: {clip(str(exc))}"  # raised by the work itself
            else:
                which = "memory" if limit <= deadline else "window-fit"
                reason = f"the {which} deadline ({limit * 1000:g} ms) passed"
            plan.error = f"memory skipped, request forwarded unmodified: {reason}"
            logger.warning("request %s: %s", plan.id, plan.error)
        except Exception as exc:  # fail open: forward the original bytes
            plan.error = (
                f"memory skipped, request forwarded unmodified: {type(exc).__name__}: "
                f"{clip(str(exc))}"
            )
            logger.warning("request %s: %s", plan.id, plan.error)
        else:
            return draft
        return plan

    def _fit_deadline(self, plan: Plan) -> float:
        """How long (s) memory is waited for in all: ``proxy.fit_deadline_ms`` for a request
        that may not fit the model's window as the client sent it (its body holds at least
        ``FIT_BYTES_PER_TOKEN`` bytes per token of ``context_window``: a body with fewer is
        unlikely to overflow it; base64 images and files count as bytes, so a request
        carrying them may wait although it would fit), else the memory deadline."""
        proxy = self.state.config.proxy
        window = self.state.memory.config.context_window
        if len(plan.content) >= FIT_BYTES_PER_TOKEN * window:
            return proxy.fit_deadline_ms / 1000
        return proxy.memory_deadline_ms / 1000

    def _token(self, plan: Plan, seq: int | None = None) -> str | None:
        """The token naming the request's turn: ``seq`` (the committed reply), else the turn
        the request continues."""
        sid = plan.session_id or plan.new_session
        if sid is None:
            return None
        at = seq if seq is not None else plan.position.anchor if plan.position else 0
        return make_token(plan.principal, sid, at, self.state.secret)

    async def _commit(self, plan: Plan, reply: Reply | None) -> int | None:
        """``_store`` on a memory thread: the exchange committed before the reply's last byte
        goes out."""
        return await self._in_pool(self._store, plan, reply)

    def _store(self, plan: Plan, reply: Reply | None, partial: bool = False) -> int | None:
        """Commit the exchange (the new messages and ``reply``) once; returns the reply's seq
        (``None`` when nothing was stored: no reply, memory down, already stored). A store
        that fails is logged and recorded: the client still gets its reply."""
        if reply is None or plan.committed is not None or plan.spooled or plan.wire is None:
            return None
        partial = partial or bool(getattr(reply, "partial", False))  # a Responses reply
        if partial and not (reply.text or reply.calls):
            return None  # cut before anything arrived: nothing to keep
        message = reply_message(reply.text, reply.calls)
        try:
            sid, seqs = commit_exchange(self, plan, message, partial)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {clip(str(exc))}"
            plan.spooled = self._spooled(plan, reply, message, partial)
            if plan.spooled:
                plan.error = f"exchange spooled, stored once the store takes it: {reason}"
                logger.warning("request %s: %s", plan.id, plan.error)
            else:
                plan.error = f"exchange not stored: {reason}"
                logger.error("request %s: %s", plan.id, plan.error)
            return None
        plan.session_id = sid
        plan.committed = (sid, seqs)
        fit.note(self.state, plan, sid)  # (a fork at the commit: its new branch's)
        if plan.format == responses.FORMAT:
            self.chains.committed(plan, reply, sid, seqs)
        self.tags.expect(sid, plan.id, seqs)
        self.jobs.notify()
        return seqs[-1] if seqs else None

    def _spooled(self, plan: Plan, reply: Reply, message: Message, partial: bool) -> bool:
        """Keep an exchange the store did not take in the spool (durably, before the reply's
        last byte goes out); whether it is kept."""
        if self.spool is None or plan.original is None:
            return False
        try:
            self.spool.spool.add(
                format=plan.format,
                principal=plan.principal,
                header=plan.header,
                body=plan.original,
                reply=message,
                partial=partial,
                exchange_time=plan.exchange_time,
                new_session=plan.new_session,
                response_id=getattr(reply, "response_id", None),
            )
        except Exception as exc:
            logger.error("request %s: the exchange spool failed too: %s", plan.id, exc)
            return False
        self.spool.wake()
        return True

    def spooled(self) -> tuple[int, int]:
        """How many exchanges wait in the spool for the store, and how many it gave up (their
        replay kept failing with an error that was not an outage); (0, 0) without a spool."""
        if self.spool is None:
            return 0, 0
        try:
            return self.spool.spool.pending(), self.spool.spool.pending(given_up=True)
        except sqlite3.Error as exc:
            logger.warning("cannot read the exchange spool: %s", exc)
            return 0, 0

    def _replay(self, spooled: Spooled) -> None:
        """Store one spooled exchange (``SpoolReplayer``): as its request would have been."""
        if replay_exchange(self, spooled) is not None:
            self.jobs.notify()

    def _marker(self, plan: Plan, reply: Reply, seq: int | None) -> str | None:
        """The marker for this reply (naming its committed turn), or ``None`` where one would
        break the client (``markers.session_marker``) or nothing was stored."""
        if seq is None or reply.has_calls or not reply.text.strip():
            return None
        if plan.format == responses.FORMAT:
            return None  # Responses continue by content, the header and response ids
        token = self._token(plan, seq)
        return session_marker(plan, token, enabled=self.state.config.proxy.markers)

    async def _forward(self, plan: Plan, url: str, headers: dict[str, str]) -> Response:
        sent = time.perf_counter()
        try:
            response = await self.upstream.send("POST", url, headers, plan.content)
        except UPSTREAM_ERRORS as exc:
            return self._unreachable(plan, url, exc)
        is_sse = response.headers.get("content-type", "").startswith("text/event-stream")
        if response.status >= 400 or not plan.stream or not (is_sse or plan.format == "gemini"):
            try:
                content = await response.read()
            except UPSTREAM_ERRORS as exc:
                return self._unreachable(plan, url, exc)
            finally:
                response.release()
            upstream_ms = (time.perf_counter() - sent) * 1000
            reply: Reply | None = None
            seq: int | None = None
            if response.status < 300:
                try:
                    data = json.loads(content)
                except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                    data = None
                if isinstance(data, dict):
                    reply = reply_of(plan.format, data)
                    seq = await self._commit(plan, reply)
                    marker = self._marker(plan, reply, seq)
                    if marker:
                        content = dumps(mark_json(plan.format, data, marker))
            self._finish(plan, response.status, upstream_ms, reply)
            return Response(
                content,
                status_code=response.status,
                headers=response_headers(response, self._token(plan, seq)),
            )
        sse = is_sse or "alt=sse" in url.partition("?")[2]
        state = stream_state(
            plan.format, DEFERRED, sse=sse, may_mark=self.state.config.proxy.markers
        )
        return StreamingResponse(
            self._relay(plan, response, state, sent),
            status_code=response.status,
            headers=response_headers(response, self._token(plan)),
        )

    async def _relay(
        self, plan: Plan, response: aiohttp.ClientResponse, stream: StreamState, sent: float
    ) -> AsyncIterator[bytes]:
        """The upstream stream, each SSE event sent the moment it is complete. Where the reply
        is complete (the place of the marker), the exchange is committed before anything
        further is sent. When the upstream breaks off mid-stream, what arrived is stored
        marked partial, and the client's stream is cut too (re-raised: the server closes the
        connection without ending the body), so a client never takes a truncated reply for a
        complete one. A stream that ends cleanly but reported an error event, or never sent
        its final event, is relayed as it came and stored marked partial too."""
        self.writer.opened()
        state = stream
        splitter = SseSplitter()
        first: float | None = None
        error: str | None = None
        done = False
        sse = getattr(state, "sse", True)
        try:
            async for chunk in response.content.iter_any():
                if first is None:
                    first = (time.perf_counter() - sent) * 1000
                if not sse:
                    state.feed_raw(chunk)
                    yield chunk
                    continue
                out = [piece for event in splitter.feed(chunk) for piece in state.feed(event)]
                if MARKER_SLOT in out:
                    out = await self._fill_slot(plan, state, out)
                if out:
                    yield b"".join(out)
            rest = splitter.rest()
            tail = state.finish()
            if MARKER_SLOT in tail:
                tail = await self._fill_slot(plan, state, tail)
            done = True
            if not state.ended and state.error is None:
                state.error = "upstream stream ended before its final event"
            if response.status < 300:
                # A stream with no marker place; one that reported an error or ended before
                # its final event is kept marked partial, never as a whole reply.
                await self._in_pool(self._store, plan, state.reply, state.error is not None)
            if rest or tail:  # a held event first, then bytes after the last whole event
                yield b"".join(tail) + rest
        except UPSTREAM_ERRORS as exc:
            error = f"upstream stream broke off: {type(exc).__name__}"
            logger.warning("request %s: %s", plan.id, error)
            raise StreamCut(error) from exc
        finally:
            if not done:
                state.collect()  # a stream cut short: keep what arrived, marked partial
                if response.status < 300:  # in this thread: the request may be cancelled
                    self._store(plan, state.reply, partial=True)
            upstream_ms = (time.perf_counter() - sent) * 1000
            extra = {"first_byte_ms": round(first, 3)} if first is not None else {}
            self._finish(
                plan, response.status, upstream_ms, state.reply, error or state.error, extra
            )
            self.writer.closed()
            response.release()

    async def _fill_slot(self, plan: Plan, state: StreamState, out: list[bytes]) -> list[bytes]:
        """Commit the now complete reply, then put its marker event (or nothing) where the
        stream keeps its place."""
        state.collect()
        seq = await self._commit(plan, state.reply)
        marker = self._marker(plan, state.reply, seq)
        event = state.render_marker(marker) if marker else b""
        return [event if piece is MARKER_SLOT else piece for piece in out if piece or event]

    def _failure(self, url: str, exc: Exception) -> tuple[int, str]:
        """The status and message for an upstream that could not be reached (502), or that
        was reached but did not connect or answer in time (504, naming the limit)."""
        host = upstream_host(url)
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return 504, f"upstream {host} timed out: no connection within {CONNECT_TIMEOUT:g} s"
        if isinstance(exc, TimeoutError):  # the read: nothing came for ``proxy.timeout``
            return 504, (
                f"upstream {host} timed out: nothing received for "
                f"{self.upstream.read_timeout:g} s (proxy.timeout)"
            )
        return 502, f"upstream {host} unreachable: {type(exc).__name__}"

    def _unreachable(self, plan: Plan, url: str, exc: Exception) -> Response:
        status, message = self._failure(url, exc)
        logger.warning("request %s: %s", plan.id, message)
        self._finish(plan, status, None, None, message)
        return error_response(plan.format, status, message, "api_error")

    # -- the in-proxy tool loop ------------------------------------------------------------------

    async def _tool_loop(
        self, plan: Plan, url: str, headers: dict[str, str], raw: bytes
    ) -> Response:
        """The in-proxy tool loop; an engine error in it fails open (``_rounds``)."""
        try:
            return await self._rounds(plan, url, headers)
        except _EngineError as failed:
            exc = failed.__cause__ or failed
            plan.error = (
                f"memory tools failed, request forwarded unmodified: {type(exc).__name__}: "
                f"{clip(str(exc))}"
            )
            logger.warning("request %s: %s", plan.id, plan.error)
            plan.body, plan.content, plan.tool_calls = None, raw, []
            return await self._forward(plan, url, headers)

    async def _rounds(self, plan: Plan, url: str, headers: dict[str, str]) -> Response:
        assert plan.body is not None
        body, loop_url = unstreamed(plan.format, plan.body, url)
        sent = time.perf_counter()
        limit = self.state.config.proxy.max_tool_continuations
        memory, sid = self.state.memory, plan.session_id
        names = (TOOL_NAMES if self.tools_mode and sid is not None else ()) + (
            (outputs.RESTORE_TOOL,) if plan.compaction is not None else ()
        )
        over: str | None = None  # the first follow-up round over the window, noted once
        for round_ in range(limit + 1):
            if round_ == limit:  # the last round: the model must answer
                body = without_memory_tools(body)
            try:
                response = await self.upstream.send("POST", loop_url, headers, dumps(body))
                try:
                    content = await response.read()
                finally:
                    response.release()
            except UPSTREAM_ERRORS as exc:
                return self._unreachable(plan, url, exc)
            try:
                data = json.loads(content) if response.status < 300 else None
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                data = None
            if not isinstance(data, dict):
                self._finish(plan, response.status, (time.perf_counter() - sent) * 1000, None)
                return Response(
                    content,
                    status_code=response.status,
                    headers=response_headers(response, self._token(plan)),
                )
            reply = reply_of(plan.format, data)
            calls = [c for c in reply.calls if c.name in names]
            if not calls:
                break
            try:
                results = []
                for call in calls:
                    if call.name == outputs.RESTORE_TOOL and plan.compaction is not None:
                        results.append((call, plan.compaction.answer(call.input)))
                    else:
                        run = partial(
                            memory.handle_tool_call, call.name, call.input, session_id=sid
                        )
                        results.append((call, await anyio.to_thread.run_sync(run)))
                    plan.tool_calls.append({"name": call.name, "arguments": _clipped(call.input)})
                # Counted like the request, the results cut to what the window leaves them.
                asked = reply_message(reply.text, calls)
                results = fit.tool_round(plan, memory.counter, asked, results)
                body = continuation(plan.format, body, data, results)
                if not over and (over := fit.overflow(plan, round_=round_ + 1)) is not None:
                    plan.notes.append(over)
                    logger.warning("request %s: %s", plan.id, over)
            except Exception as exc:  # fail open (``_tool_loop``)
                raise _EngineError from exc
        assert isinstance(data, dict)
        seq = await self._commit(plan, reply)
        marker = self._marker(plan, reply, seq)
        marked = mark_json(plan.format, data, marker) if marker else data
        self._finish(plan, response.status, (time.perf_counter() - sent) * 1000, reply)
        headers_out = response_headers(response, self._token(plan, seq))
        if plan.stream:
            include_usage = bool((plan.body.get("stream_options") or {}).get("include_usage"))
            sse = plan.format != "gemini" or "alt=sse" in url.partition("?")[2]
            content = synthesize(plan.format, marked, include_usage=include_usage, sse=sse)
            headers_out["content-type"] = "text/event-stream" if sse else "application/json"
            return Response(content, status_code=response.status, headers=headers_out)
        headers_out["content-type"] = "application/json"
        return Response(dumps(marked), status_code=response.status, headers=headers_out)

    # -- after the reply -------------------------------------------------------------------------

    def _finish(
        self,
        plan: Plan,
        status: int,
        upstream_ms: float | None,
        reply: Reply | None,
        error: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Queue the dashboard record of a finished request (writer thread); its reply tags
        follow when the session's derived work is done (``ReplyTags``)."""
        span = telemetry.start_proxy_span(plan.started)
        message = reply_message(reply.text, reply.calls) if reply is not None else None
        memory, events = self.state.memory, self.state.events
        committed = plan.committed
        total_ms = (time.perf_counter() - plan.started) * 1000 if plan.started else 0.0
        chars = len(reply.text) if reply is not None else 0

        def job() -> None:
            if committed is not None:  # counted up to the stored reply (forks, fail-open too)
                try:
                    plan.turn = self.turns.upto(committed[0], committed[1][-1])
                except Exception as exc:
                    logger.warning("request %s: turn not counted: %s", plan.id, exc)
            self.state.log.response(
                plan.turn,
                status=status,
                stream=plan.stream,
                upstream_ms=upstream_ms,
                total_ms=total_ms,
                chars=chars,
            )
            record = build_record(
                plan,
                memory,
                status=status,
                upstream_ms=upstream_ms,
                reply=message,
                error=error,
                extra=extra,
            )
            telemetry.end_proxy_span(span, record)
            if committed is None:
                events.publish(record.model_copy(update={"response_tags": ()}))
            else:
                self.tags.publish(committed[0], record)

        self.writer.submit(job)

    # -- the terminal log and the dashboard's extras ------------------------------------------

    def _log_request(self, plan: Plan) -> None:
        """On the writer thread, before the request's record: count its turn in the store
        (``TurnNumbers``), keep its body when capture is on, write its ``INGEST`` and
        ``REQUEST`` lines."""
        content = plan.content

        def job() -> None:
            try:
                plan.turn = self.turns.of(plan)
            except Exception as exc:  # the store is down: the record counts the request's
                logger.warning("request %s: turn not counted: %s", plan.id, exc)
            position, parsed = plan.position, plan.parsed
            messages = parsed.messages if parsed is not None else []
            sid = plan.session_id or plan.new_session
            if plan.ingested_seqs is None and (
                position is not None and position.session_id is None and position.fork is None
            ):  # stored with the exchange (``recall.ingest`` counted those it stored itself)
                plan.ingested = max(0, user_turns(messages[position.new_from :]) - 1)
            if plan.ingested:
                self.state.log.ingest(sid or "", plan.ingested)
            self.state.captures.add(
                plan.id,
                sid or "",
                plan.format,
                plan.path,
                content,
                model=plan.model,
                turn=plan.turn,
                memory=plan.body is not None,
            )
            assembled = plan.assembled
            query = next((m.text() for m in reversed(messages) if m.role == "user"), "")
            memory_text = "\n".join(t for t in (plan.hint, plan.dynamic) if t)
            self.state.log.request(
                plan.turn,
                label=plan.instance or plan.format,
                model=plan.model,
                stream=plan.stream,
                tags=assembled.matched_tags if assembled is not None else (),
                messages=len(messages),
                dropped=len(plan.dropped_notes),
                memory_tokens=self.state.memory.counter.count(memory_text) if memory_text else 0,
                overhead_ms=plan.overhead_ms,
                session_id=sid,
                query=query,
                error=plan.error,
            )

        self.writer.submit(_quiet(job))

    def _log_complete(self, record: RequestRecord, elapsed_ms: float) -> None:
        reply = record.messages[-1].text if record.messages else ""
        self.state.log.complete(
            record.turn,
            elapsed_ms=elapsed_ms,
            tags=record.response_tags or (),
            session_id=record.session_id,
            reply=reply if record.messages and record.messages[-1].role == "assistant" else "",
        )

    def _compacted(self, report: CompactionReport) -> None:
        """A job compacted a session: the ``COMPACT`` line and a dashboard event."""
        self.state.log.compact(report)
        self.state.events.publish(compaction_record(report))

    # -- pass-through ----------------------------------------------------------------------------

    async def passthrough(self, request: Request) -> Response:
        """Any other provider route, forwarded untouched and streamed back as it arrives."""
        fmt = format_of(request.url.path)
        target = await self._target(request, fmt)
        if isinstance(target, Response):
            return target
        upstream, _, path, content = target
        if self.state.passed.count(request.method, path):
            logger.info(
                "passed through without memory: %s (counted in the dashboard's stats)",
                self.state.passed.label(request.method, path),
            )
        url = upstream_url(upstream, path, request.url.query)
        headers = forward_headers(request.headers.items())
        try:
            response = await self.upstream.send(request.method, url, headers, content)
        except UPSTREAM_ERRORS as exc:
            status, message = self._failure(url, exc)
            return error_response(fmt, status, message, "api_error")

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.content.iter_any():
                    yield chunk
            except UPSTREAM_ERRORS as exc:  # cut the client's stream too (see ``_relay``)
                logger.warning("pass-through stream broke off: %s", type(exc).__name__)
                raise StreamCut(f"pass-through stream broke off: {type(exc).__name__}") from exc
            finally:
                response.release()

        return StreamingResponse(
            relay(), status_code=response.status, headers=response_headers(response, None)
        )


# --------------------------------------------------------------------------- helpers


def _quiet(job: Callable[[], None]) -> Callable[[], None]:
    """``job`` for the writer, which retries a job that raises: a log line is written once."""

    def run() -> None:
        try:
            job()
        except Exception as exc:
            logger.warning("event log: %s: %s", type(exc).__name__, clip(str(exc)))

    return run


def compaction_record(report: CompactionReport) -> RequestRecord:
    """The dashboard's record of a compaction (kind ``compaction``; the report in ``extra``)."""
    return RequestRecord(
        id=f"compaction-{uuid.uuid4().hex}",
        session_id=report.session_id,
        kind="compaction",
        format="compaction",
        status=200,
        response_tags=report.tag_summaries_rebuilt,
        overhead_ms=round(report.duration_ms, 3),
        extra={
            "turns_compacted": report.turns_compacted,
            "segments_compacted": report.segments_compacted,
            "tokens_compacted": report.tokens_compacted,
            "summary_tokens": report.summary_tokens,
            "tokens_freed": report.tokens_freed,
            "level": report.level,
            "watermark": [report.watermark_before, report.watermark_after],
        },
    )


class _EngineError(Exception):
    """The memory engine failed inside the tool loop (the cause is the engine's error)."""


def _clipped(arguments: dict[str, Any]) -> dict[str, Any]:
    """A tool call's arguments for the record: long strings cut (the model wrote them, and a
    record is kept in memory)."""
    return {k: clip(v) if isinstance(v, str) else v for k, v in list(arguments.items())[:20]}


def _decode(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"request body is not valid UTF-8 (invalid byte at offset {exc.start:,})"
    if not text.strip():
        return None, "request body is empty; expected a JSON object"
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, (
            f"request body is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        )
    except RecursionError:
        return None, "request body is JSON nested too deeply to read; send it less deeply nested"
    if not isinstance(body, dict):
        return None, f"request body is a JSON {type(body).__name__}; expected an object"
    return body, ""


def format_of(path: str) -> str:
    """The provider format of a proxy route: ``gemini``, ``anthropic`` or ``openai``."""
    if path.startswith("/v1beta/") or _GEMINI.search(path):
        return "gemini"
    return "anthropic" if path.startswith("/v1/messages") else "openai"


def freeze_loaded() -> None:
    """Move every object alive now (modules, models, encodings, caches: they stay for the
    process's life) out of the garbage collector's generations, so a full collection scans
    only what requests made since. Measured with 20 clients: full collections of 80-320 ms,
    each stalling every request in flight (the proxy's slowest 1%), became 35-50 ms on the
    same loaded machine. Done before the server answers, so its own full collection delays
    no request."""
    gc.collect()
    gc.freeze()


def warm_routes(app: FastAPI) -> None:
    """Match a request path against every route once, at start-up: FastAPI builds an included
    router's routes on the first request that reaches them (measured: 100-500 ms, paid by
    the first client otherwise). The path matches nothing, so nothing runs."""
    scope = {"type": "http", "method": "GET", "path": "/.contextfold-warm-up", "root_path": ""}
    for route in app.router.routes:
        route.matches({**scope, "headers": []})


class ProxyRouter(APIRouter):
    """The proxy's routes, with the ``Proxy`` behind them (``.proxy``)."""

    proxy: Proxy


def router(state: ServerState) -> ProxyRouter:
    """The proxy routes for ``state``; its lifespan starts the job workers and, at shutdown,
    hands their jobs back to the store."""
    proxy = Proxy(state)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        warm_routes(app)
        proxy.start()
        yield
        await proxy.aclose()

    routes = ProxyRouter(lifespan=lifespan)
    routes.proxy = proxy

    @routes.post("/v1/chat/completions", include_in_schema=False)
    async def openai_chat(request: Request) -> Response:
        return await proxy.handle(request, "openai")

    @routes.post("/v1/responses", include_in_schema=False)
    async def openai_responses(request: Request) -> Response:
        return await proxy.handle(request, responses.FORMAT)

    @routes.post("/v1/messages", include_in_schema=False)
    async def anthropic_messages(request: Request) -> Response:
        return await proxy.handle(request, "anthropic")

    @routes.api_route("/v1beta/{rest:path}", methods=_METHODS, include_in_schema=False)
    @routes.api_route("/v1/{rest:path}", methods=_METHODS, include_in_schema=False)
    async def other(request: Request, rest: str) -> Response:
        if request.method == "POST" and _GEMINI.fullmatch(rest):
            return await proxy.handle(request, "gemini")
        return await proxy.passthrough(request)

    @routes.api_route("/openai/{rest:path}", methods=_METHODS, include_in_schema=False)
    async def azure(request: Request, rest: str) -> Response:
        if request.method == "POST":
            if _AZURE_CHAT.fullmatch(rest):
                return await proxy.handle(request, "openai")
            if rest == "v1/responses":
                return await proxy.handle(request, responses.FORMAT)
        return await proxy.passthrough(request)

    return routes
