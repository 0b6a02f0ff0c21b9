"""The transparent LLM proxy: clients change only their ``base_url``; every request gains memory.

Routes (kept out of the OpenAPI schema: they are the providers' own APIs):

- ``POST /v1/chat/completions`` (OpenAI), ``POST /v1/messages`` (Anthropic),
  ``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent`` (Gemini) go
  through memory;
- every other ``/v1/…`` and ``/v1beta/…`` request (``/v1/responses``, ``/v1/models``,
  ``/v1/embeddings`` …) is passed through untouched.

Per memory request: strip the session markers and find the session (``session``) →
parse the messages (``wire``) → ``memory.on_message_inbound(last user message,
history)`` → leave out the history turns compaction has folded into memory → add the memory
block after the stable prefix → forward with aiohttp → send the reply back as it arrives (each
SSE event the moment it is complete), accumulating it and marking it with the session →
``memory.on_turn_complete`` on the writer thread (``writer``), off the response path.

Failing open: if anything in the memory path raises, the original request bytes are forwarded
unmodified, the error is logged and shown in the request's dashboard record. Upstream errors
(4xx, 5xx) come back with their status and body. Malformed JSON or invalid UTF-8 gets a 400 in
the provider's error shape. Credentials (``Authorization``, ``x-api-key``, ``x-goog-api-key``,
``?key=``) are forwarded and never logged.

Memory tools (``paging.mode: tools``): the proxy offers expand_topic / collapse_topic /
find_quote next to the client's tools, runs the model's calls to them itself and asks again
(at most ``proxy.max_tool_continuations`` times), invisible to the client. That loop runs
upstream without streaming; a streaming client then receives the final answer as one
synthesized stream.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from multidict import CIMultiDictProxy
from yarl import URL

from contextfold.items import Message
from contextfold.memory.tools import TOOL_NAMES
from contextfold.server.jobs import JobWorker
from contextfold.server.proxy.commit import commit_exchange
from contextfold.server.proxy.markers import session_marker
from contextfold.server.proxy.record import Plan, build_record
from contextfold.server.proxy.session import (
    SESSION_HEADER,
    Position,
    make_token,
    principal_of,
    resolve,
)
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
from contextfold.server.proxy.wire import WIRES, ParsedRequest, Wire, dumps, reply_message
from contextfold.server.proxy.writer import TurnWriter
from contextfold.server.state import ServerState

if TYPE_CHECKING:
    from contextfold.memory.engine import AssembledContext

__all__ = ["Proxy", "ProxyRouter", "router"]

logger = logging.getLogger("contextfold.server.proxy")

_GEMINI = re.compile(r"(?:tuned)?[mM]odels/[^/:]+:(?:generateContent|streamGenerateContent)")
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "content-encoding",
        SESSION_HEADER,
    }
)


def error_response(fmt: str, status: int, message: str, kind: str) -> Response:
    """An error in the shape of the provider ``fmt`` (all three nest ``error.message``)."""
    body: dict[str, Any]
    if fmt == "anthropic":
        body = {"type": "error", "error": {"type": kind, "message": message}}
    elif fmt == "gemini":
        names = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 502: "UNAVAILABLE"}
        body = {"error": {"code": status, "message": message, "status": names.get(status, kind)}}
    else:
        body = {"error": {"message": message, "type": kind, "code": None}}
    return Response(json.dumps(body), status_code=status, media_type="application/json")


def upstream_url(base: str, path: str, query: str) -> str:
    """``base`` joined with the request ``path`` (a base ending in the path's first segment,
    such as ``…/v1``, does not repeat it) and ``query``."""
    base = base.rstrip("/")
    first = "/" + path.lstrip("/").split("/", 1)[0]
    if urlsplit(base).path.endswith(first):
        path = path[len(first) :]
    return base + path + (f"?{query}" if query else "")


def _forward_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    out = {k: v for k, v in headers if k.lower() not in _HOP}
    out["accept-encoding"] = "identity"
    return out


#: What the upstream client raises for a connection refused, reset or timed out.
UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError)


def _response_headers(response: aiohttp.ClientResponse, token: str | None) -> dict[str, str]:
    out = _merged(response.headers)
    if token:
        out[SESSION_HEADER] = token
    return out


class Proxy:
    """The proxy of one server: its HTTP client, its writer thread and its routes."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.writer = TurnWriter()  # dashboard records, off the response path
        self.jobs = JobWorker(state.memory, threads=state.config.proxy.job_threads)
        # Memory work of requests (resolve, recall, commit): its own threads, so a request
        # past its deadline goes on without waiting for them.
        self._pool = ThreadPoolExecutor(32, thread_name_prefix="contextfold-memory")
        self._clients: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        # Records whose reply tags arrive when the session's derived work is done.
        self._awaiting_tags: dict[str, dict[str, _Awaiting]] = {}
        self._tags_lock = threading.Lock()
        self.jobs.on_done = self._publish_tags

    # -- plumbing --------------------------------------------------------------------------------

    def client(self) -> aiohttp.ClientSession:
        """This event loop's upstream client (aiohttp: per request it costs a third of the CPU
        of httpx's async client, and the proxy's added latency is the bar it is measured by)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1000, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=10.0, sock_read=self.state.config.proxy.timeout
                ),
                # The client's own headers go upstream as they came; add none of ours.
                skip_auto_headers=("User-Agent", "Content-Type"),
                trust_env=False,
            )
            self._clients[loop] = client
        return client

    async def _send(
        self, method: str, url: str, headers: dict[str, str], content: bytes
    ) -> aiohttp.ClientResponse:
        """Send upstream; the response's body is still to be read (``read`` / ``content``)
        and the caller releases it. Raises one of ``UPSTREAM_ERRORS``."""
        return await self.client().request(
            method,
            URL(url, encoded=True),  # forwarded as given: no re-quoting of path or ?key=
            headers=headers,
            data=content,
            allow_redirects=False,
        )

    def start(self) -> None:
        """Start the workers of derived work (resuming what the store has pending) and warm
        the models the request path uses, so the first request does not spend its memory
        deadline loading them."""
        self.jobs.start()
        threading.Thread(target=self._warm, name="contextfold-warm", daemon=True).start()

    def _warm(self) -> None:
        memory = self.state.memory
        try:
            memory.counter.count("warm up")
            if memory.embedder is not None:
                memory.embedder.embed(["warm up"])
        except Exception as exc:  # the first request pays for it instead
            logger.warning("warming memory failed: %s: %s", type(exc).__name__, exc)

    async def aclose(self) -> None:
        """Stop the workers (pending work stays in the store, and the log says how much),
        publish the last records, then close the HTTP client of this loop."""
        pending = await anyio.to_thread.run_sync(self.jobs.stop)
        if pending > 0:
            logger.warning(
                "stopped with %d derive job(s) pending in the store; they resume at the next"
                " start (every exchange is stored)",
                pending,
            )
        await anyio.to_thread.run_sync(self.writer.close, 5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every record is published and the store has no pending job (tests and
        benchmarks); False if ``timeout`` seconds passed first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.writer.drain(max(0.0, deadline - time.monotonic())) and self.jobs.idle_now():
                return self.writer.drain(max(0.0, deadline - time.monotonic()))
            time.sleep(0.01)
        return False

    async def _in_pool(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, partial(fn, *args))

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

    # -- the memory path -------------------------------------------------------------------------

    def _position(self, plan: Plan, wire: Wire, body: dict[str, Any]) -> dict[str, Any]:
        """Strip the markers, parse, and find (and fork, when it must) the branch the request
        continues; returns the body without markers."""
        stripped, tokens = wire.strip(body)
        parsed = wire.parse(stripped)
        plan.parsed = parsed
        store = self.state.memory.store
        position = resolve(
            store, plan.principal, parsed.messages, tokens, plan.header, self.state.secret
        )
        if position.fork is not None:
            parent, seq = position.fork
            branch = store.fork(parent, seq)
            plan.notes.append(f"continues turn {seq} of {parent[:8]} on a new branch")
            position = Position(branch, seq, position.new_from, position.source, expect_last=seq)
        plan.position = position
        plan.session_id = position.session_id
        plan.session_source = position.source
        if position.session_id is None:  # created with this id when the exchange commits
            plan.new_session = uuid.uuid4().hex
        return stripped

    def prepare(self, plan: Plan, wire: Wire, body: dict[str, Any]) -> None:
        """Fill ``plan`` with the body to forward (runs in a worker thread; may raise, and the
        caller then fails open)."""
        forwarded = self._position(plan, wire, body)
        parsed = plan.parsed
        assert parsed is not None
        memory = self.state.memory
        if self.tools_mode and plan.session_id is None:
            plan.session_id = memory.store.create_session(principal=plan.principal)
            plan.position = Position(plan.session_id, 0, 0, plan.session_source, expect_last=0)
        if parsed.query is None:
            plan.notes.append("no user message with text: nothing recalled")
        elif plan.session_id is None:
            plan.notes.append("a new conversation: nothing stored yet to recall")
        else:
            assembled = memory.on_message_inbound(
                parsed.query_text, parsed.messages[: parsed.query], session_id=plan.session_id
            )
            plan.assembled = assembled
            forwarded, dropped_raw = self._drop(plan, wire, forwarded, parsed, assembled)
            plan.hint, plan.dynamic = _split_memory(assembled)
            query_raw = parsed.sources[parsed.query][0]
            query_raw -= sum(1 for d in dropped_raw if d < query_raw)
            forwarded = wire.inject(forwarded, plan.hint, plan.dynamic, query_raw)
        if self.tools_mode:
            forwarded = wire.add_tools(forwarded, memory.tool_definitions(wire.name))
        plan.body = forwarded
        if forwarded is not body:  # unchanged: the client's own bytes go upstream
            plan.content = dumps(forwarded)

    def _drop(
        self,
        plan: Plan,
        wire: Wire,
        body: dict[str, Any],
        parsed: ParsedRequest,
        assembled: AssembledContext,
    ) -> tuple[dict[str, Any], set[int]]:
        """Leave out the raw messages whose every parsed message the history filter removed
        (compacted into memory), keeping tool calls with their results and a user turn
        first."""
        filtered = assembled.history
        if filtered is None or not filtered.removed:
            return body, set()
        removed = {r.index: r for r in filtered.removed}
        by_raw: dict[int, list[int]] = {}
        for i, sources in enumerate(parsed.sources):
            for raw in sources:
                by_raw.setdefault(raw, []).append(i)
        drop = {r for r, idx in by_raw.items() if r >= 0 and all(i in removed for i in idx)}
        if wire.name != "openai":  # Anthropic and Gemini want a user turn first
            count = len(wire.items(body))
            first = next((i for i in range(count) if i not in drop), None)
            while first is not None and wire.raw_role(body, first) != "user":
                before = [d for d in drop if d < first]
                if not before:
                    break
                first = max(before)
                drop.discard(first)
        dropped = sorted(i for r in drop for i in by_raw[r])
        kept = [m for i, m in enumerate(parsed.messages) if i not in set(dropped)]
        if _orphans(kept) - _orphans(parsed.messages):
            plan.notes.append("history filter skipped: it would split a tool call from its result")
            return body, set()
        plan.dropped = dropped
        plan.dropped_notes = [
            f"{removed[i].reason}: {removed[i].preview}" for i in dropped if i in removed
        ]
        return wire.drop(body, drop), drop

    # -- requests --------------------------------------------------------------------------------

    async def handle(self, request: Request, fmt: str) -> Response:
        started = time.perf_counter()
        wire = WIRES[fmt]
        upstream, instance = self.upstream_for(request)
        if upstream is None:
            return error_response(
                fmt,
                503,
                "no upstream is configured for this port: set proxy.upstream or run "
                "`contextfold proxy --upstream URL`",
                "api_error",
            )
        raw = await request.body()
        body, problem = _decode(raw)
        if body is None:
            return error_response(fmt, 400, problem, "invalid_request_error")
        path = request.url.path
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
        plan.wire, plan.original = wire, body
        plan.content = raw
        deadline = self.state.config.proxy.memory_deadline_ms / 1000
        if self.state.memory_error:
            plan.error = f"memory is down, request forwarded unmodified: {self.state.memory_error}"
            plan.wire = None  # nothing is stored either
        else:
            plan = await self._prepared(plan, wire, body, deadline)
        url = upstream_url(upstream, path, request.url.query)
        headers = _forward_headers(request.headers.items())
        plan.overhead_ms = (time.perf_counter() - started) * 1000
        if self.tools_mode and plan.body is not None:
            return await self._tool_loop(plan, url, headers)
        return await self._forward(plan, url, headers)

    async def _prepared(
        self, plan: Plan, wire: Wire, body: dict[str, Any], deadline: float
    ) -> Plan:
        """A copy of ``plan`` filled by the memory path within ``deadline`` seconds, else
        ``plan`` with the reason (the request then goes upstream as the client sent it)."""
        draft = _draft(plan)
        try:
            await asyncio.wait_for(
                asyncio.shield(self._in_pool(self.prepare, draft, wire, body)), deadline
            )
        except TimeoutError:
            plan.error = (
                f"memory skipped, request forwarded unmodified: the memory deadline"
                f" ({deadline * 1000:g} ms) passed"
            )
            logger.info("request %s: %s", plan.id, plan.error)
        except Exception as exc:  # fail open: forward the original bytes
            plan.error = (
                f"memory skipped, request forwarded unmodified: {type(exc).__name__}: {exc}"
            )
            logger.warning("request %s: %s", plan.id, plan.error)
        else:
            return draft
        return plan

    def _token(self, plan: Plan, seq: int | None = None) -> str | None:
        """The token naming the request's turn: ``seq`` (the committed reply), else the turn
        the request continues."""
        sid = plan.session_id or plan.new_session
        if sid is None:
            return None
        at = seq if seq is not None else plan.position.anchor if plan.position else 0
        return make_token(plan.principal, sid, at, self.state.secret)

    async def _commit(
        self, plan: Plan, reply: Reply | None, *, partial: bool = False
    ) -> int | None:
        """Commit the exchange (the new messages and the reply) before the reply's last byte
        goes out; returns the reply's seq (``None`` when nothing was stored). A store that
        fails is logged and recorded: the client still gets its reply."""
        if reply is None or plan.committed is not None or plan.wire is None:
            return None
        message = reply_message(reply.text, reply.calls)
        try:
            sid, seqs = await self._in_pool(commit_exchange, self, plan, message, partial)
        except Exception as exc:
            plan.error = f"exchange not stored: {type(exc).__name__}: {exc}"
            logger.error("request %s: %s", plan.id, plan.error)
            return None
        plan.session_id = sid
        plan.committed = (sid, seqs)
        with self._tags_lock:
            self._awaiting_tags.setdefault(sid, {})[plan.id] = _Awaiting(seqs)
            if len(self._awaiting_tags) > 1000:  # bounded: the oldest go without reply tags
                self._awaiting_tags.pop(next(iter(self._awaiting_tags)))
        self.jobs.notify()
        return seqs[-1] if seqs else None

    def _marker(self, plan: Plan, reply: Reply, seq: int | None) -> str | None:
        """The marker for this reply (naming its committed turn), or ``None`` where one would
        break the client (``markers.session_marker``) or nothing was stored."""
        if seq is None or reply.tool_only or not reply.text.strip():
            return None
        token = self._token(plan, seq)
        if plan.body is None and plan.original is not None:  # forwarded as the client sent it
            return session_marker(
                dataclasses.replace(plan, body=plan.original),
                token,
                enabled=self.state.config.proxy.markers,
            )
        return session_marker(plan, token, enabled=self.state.config.proxy.markers)

    async def _forward(self, plan: Plan, url: str, headers: dict[str, str]) -> Response:
        sent = time.perf_counter()
        try:
            response = await self._send("POST", url, headers, plan.content)
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
                headers=_response_headers(response, self._token(plan, seq)),
            )
        sse = is_sse or "alt=sse" in url.partition("?")[2]
        state = stream_state(plan.format, DEFERRED, sse=sse)
        return StreamingResponse(
            self._relay(plan, response, state, sent),
            status_code=response.status,
            headers=_response_headers(response, self._token(plan)),
        )

    async def _relay(
        self, plan: Plan, response: aiohttp.ClientResponse, stream: StreamState, sent: float
    ) -> AsyncIterator[bytes]:
        """The upstream stream, each SSE event sent the moment it is complete. Where the reply
        is complete (the place of the marker), the exchange is committed before anything
        further is sent. When the upstream breaks off mid-stream, what arrived is stored
        marked partial, and the client's stream is cut too (re-raised: the server closes the
        connection without ending the body), so a client never takes a truncated reply for a
        complete one."""
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
            if response.status < 300:
                await self._commit(plan, state.reply)  # a stream with no marker place
            if rest or tail:
                yield rest or b"".join(tail)
        except UPSTREAM_ERRORS as exc:
            error = f"upstream stream broke off: {type(exc).__name__}"
            logger.warning("request %s: %s", plan.id, error)
            raise
        finally:
            if not done:
                state.collect()  # a stream cut short: keep what arrived, marked partial
                if response.status < 300 and plan.committed is None:
                    try:
                        message = reply_message(state.reply.text, state.reply.calls)
                        if state.reply.text or state.reply.calls:
                            plan.committed = commit_exchange(self, plan, message, True)
                            plan.session_id = plan.committed[0]
                    except Exception as exc:
                        logger.error("request %s: cut reply not stored: %s", plan.id, exc)
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

    def _unreachable(self, plan: Plan, url: str, exc: Exception) -> Response:
        where = urlsplit(url).netloc
        message = f"upstream {where} unreachable: {type(exc).__name__}"
        logger.warning("request %s: %s", plan.id, message)
        self._finish(plan, 502, None, None, message)
        return error_response(plan.format, 502, message, "api_error")

    # -- the in-proxy tool loop ------------------------------------------------------------------

    async def _tool_loop(self, plan: Plan, url: str, headers: dict[str, str]) -> Response:
        assert plan.body is not None and plan.session_id is not None
        body, loop_url = _unstreamed(plan.format, plan.body, url)
        sent = time.perf_counter()
        limit = self.state.config.proxy.max_tool_continuations
        memory, sid = self.state.memory, plan.session_id
        for round_ in range(limit + 1):
            if round_ == limit:  # the last round: the model must answer
                body = _without_memory_tools(body)
            try:
                response = await self._send("POST", loop_url, headers, dumps(body))
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
                    headers=_response_headers(response, self._token(plan)),
                )
            reply = reply_of(plan.format, data)
            calls = [c for c in reply.calls if c.name in TOOL_NAMES]
            if not calls:
                break
            results = []
            for call in calls:
                run = partial(memory.handle_tool_call, call.name, call.input, session_id=sid)
                results.append((call, await anyio.to_thread.run_sync(run)))
                plan.tool_calls.append({"name": call.name, "arguments": call.input})
            body = continuation(plan.format, body, data, results)
        assert isinstance(data, dict)
        seq = await self._commit(plan, reply)
        marker = self._marker(plan, reply, seq)
        marked = mark_json(plan.format, data, marker) if marker else data
        self._finish(plan, response.status, (time.perf_counter() - sent) * 1000, reply)
        headers_out = _response_headers(response, self._token(plan, seq))
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
        follow when the session's derived work is done (``_publish_tags``)."""
        message = reply_message(reply.text, reply.calls) if reply is not None else None
        memory, events = self.state.memory, self.state.events
        committed = plan.committed

        def job() -> None:
            record = build_record(
                plan,
                memory,
                status=status,
                upstream_ms=upstream_ms,
                reply=message,
                error=error,
                extra=extra,
            )
            if committed is None:
                events.publish(record.model_copy(update={"response_tags": ()}))
                return
            with self._tags_lock:
                waiting = self._awaiting_tags.get(committed[0], {}).get(plan.id)
                if waiting is not None and waiting.tags is None:
                    waiting.record = record  # the tags follow when derived
                    events.publish(record)
                    return
            tags = waiting.tags if waiting is not None else ()
            events.publish(record.model_copy(update={"response_tags": tags}))

        self.writer.submit(job)

    def _publish_tags(self, session_id: str) -> None:
        """The session's derived work is done: publish its waiting records with their reply
        tags (a record not built yet takes them when it is)."""
        store = self.state.memory.store
        derived = store.session(session_id).derived_seq
        with self._tags_lock:
            waiting = self._awaiting_tags.get(session_id, {})
            ready = [(k, w) for k, w in waiting.items() if w.seqs[-1] <= derived]
        for key, entry in ready:
            tags: dict[str, float] = {}
            for turn in store.turns(session_id, start=entry.seqs[0], end=entry.seqs[-1]):
                for tag, weight in turn.tags.items():
                    tags[tag] = max(weight, tags.get(tag, 0.0))
            ordered = tuple(sorted(tags, key=lambda t: (-tags[t], t)))
            with self._tags_lock:
                entry.tags = ordered
                record = entry.record
                if record is not None:
                    self._awaiting_tags.get(session_id, {}).pop(key, None)
                else:
                    # The record job comes later and publishes it with these tags.
                    self._awaiting_tags.get(session_id, {}).pop(key, None)
                    self._awaiting_tags.setdefault(session_id, {})[key] = entry
            if record is not None:
                self.state.events.publish(record.model_copy(update={"response_tags": ordered}))
        with self._tags_lock:
            if not self._awaiting_tags.get(session_id, True):
                self._awaiting_tags.pop(session_id, None)

    # -- pass-through ----------------------------------------------------------------------------

    async def passthrough(self, request: Request) -> Response:
        """Any other provider route, forwarded untouched and streamed back as it arrives."""
        fmt = _format_of(request.url.path)
        upstream, _ = self.upstream_for(request)
        if upstream is None:
            return error_response(fmt, 503, "no upstream is configured for this port", "api_error")
        url = upstream_url(upstream, request.url.path, request.url.query)
        headers = _forward_headers(request.headers.items())
        try:
            response = await self._send(request.method, url, headers, await request.body())
        except UPSTREAM_ERRORS as exc:
            message = f"upstream {urlsplit(url).netloc} unreachable: {type(exc).__name__}"
            return error_response(fmt, 502, message, "api_error")

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.content.iter_any():
                    yield chunk
            except UPSTREAM_ERRORS as exc:  # cut the client's stream too (see ``_relay``)
                logger.warning("pass-through stream broke off: %s", type(exc).__name__)
                raise
            finally:
                response.release()

        return StreamingResponse(
            relay(), status_code=response.status, headers=_response_headers(response, None)
        )


# --------------------------------------------------------------------------- helpers


@dataclass
class _Awaiting:
    """A committed exchange whose dashboard record waits for its reply tags."""

    seqs: list[int]
    record: Any = None
    tags: tuple[str, ...] | None = None


def _draft(plan: Plan) -> Plan:
    """A copy of ``plan`` for the memory path to fill in: it becomes the plan only when that
    path finishes within its deadline (a late one writes into a copy nobody reads)."""
    draft = copy.copy(plan)
    draft.notes = list(plan.notes)
    draft.dropped, draft.dropped_notes, draft.tool_calls = [], [], []
    return draft


def _merged(headers: CIMultiDictProxy[str]) -> dict[str, str]:
    """The end-to-end headers, a repeated one's values joined by commas (RFC 9110 §5.3)."""
    out: dict[str, str] = {}
    for key, value in headers.items():
        if key.lower() not in _HOP:
            out[key] = f"{out[key]}, {value}" if key in out else value
    return out


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


def _split_memory(assembled: AssembledContext) -> tuple[str, str]:
    """(the ``<context-topics>`` hint, the rest) of the memory block: the hint changes only at
    compaction and goes with the stable prefix; the rest changes every turn."""
    text = assembled.prepend_text
    hint = next((i.content for i in assembled.items if i.metadata.get("kind") == "hint"), "")
    if hint and text.startswith(hint):
        return hint, text[len(hint) :].lstrip("\n")
    return "", text


def _orphans(messages: list[Message]) -> set[str]:
    calls = {i for m in messages for i in m.tool_use_ids}
    results = {i for m in messages for i in m.tool_result_ids}
    return calls ^ results


def _format_of(path: str) -> str:
    if path.startswith("/v1beta/"):
        return "gemini"
    return "anthropic" if path.startswith("/v1/messages") else "openai"


def _unstreamed(fmt: str, body: dict[str, Any], url: str) -> tuple[dict[str, Any], str]:
    """The request asked without streaming (the tool loop reads whole replies)."""
    if fmt == "gemini":
        base, _, query = url.partition("?")
        query = "&".join(p for p in query.split("&") if p and p != "alt=sse")
        base = base.replace(":streamGenerateContent", ":generateContent")
        return body, base + (f"?{query}" if query else "")
    out = {k: v for k, v in body.items() if k != "stream_options"}
    if "stream" in out:
        out["stream"] = False
    return out, url


def _without_memory_tools(body: dict[str, Any]) -> dict[str, Any]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return body
    kept = []
    for tool in tools:
        if not isinstance(tool, dict):
            kept.append(tool)
            continue
        declarations = tool.get("functionDeclarations")
        if isinstance(declarations, list):
            rest = [d for d in declarations if d.get("name") not in TOOL_NAMES]
            if rest:
                kept.append({**tool, "functionDeclarations": rest})
            continue
        if Wire._tool_name(tool) not in TOOL_NAMES:
            kept.append(tool)
    out = {k: v for k, v in body.items() if k != "tools"}
    if kept:
        out["tools"] = kept
    return out


class ProxyRouter(APIRouter):
    """The proxy's routes, with the ``Proxy`` behind them (``.proxy``)."""

    proxy: Proxy


def router(state: ServerState) -> ProxyRouter:
    """The proxy routes for ``state``; its lifespan writes pending turns at shutdown."""
    proxy = Proxy(state)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        proxy.start()
        yield
        await proxy.aclose()

    routes = ProxyRouter(lifespan=lifespan)
    routes.proxy = proxy

    @routes.post("/v1/chat/completions", include_in_schema=False)
    async def openai_chat(request: Request) -> Response:
        return await proxy.handle(request, "openai")

    @routes.post("/v1/messages", include_in_schema=False)
    async def anthropic_messages(request: Request) -> Response:
        return await proxy.handle(request, "anthropic")

    @routes.api_route("/v1beta/{rest:path}", methods=_METHODS, include_in_schema=False)
    async def gemini(request: Request, rest: str) -> Response:
        if request.method == "POST" and _GEMINI.fullmatch(rest):
            return await proxy.handle(request, "gemini")
        return await proxy.passthrough(request)

    @routes.api_route("/v1/{rest:path}", methods=_METHODS, include_in_schema=False)
    async def openai_other(request: Request, rest: str) -> Response:
        return await proxy.passthrough(request)

    return routes
