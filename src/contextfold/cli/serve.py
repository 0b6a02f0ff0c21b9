"""``contextfold serve`` and ``contextfold proxy``: run the HTTP server.

``serve`` reads a server config file (``--config``; see docs/proxy.md) and listens on its port
and on every ``proxy.instances`` port, all sharing one memory engine and store. ``proxy`` is the
short form for one upstream: ``contextfold proxy --upstream https://api.openai.com``.
With ``--workers N`` either runs N worker processes on those ports and one shared store
(``contextfold.server.workers``). Both run until Ctrl-C (or SIGTERM). Then open dashboard
streams end at once, requests in flight get up to ``shutdown_timeout`` seconds (default 5) to
finish (each exchange is committed before its reply ends), the derive jobs this process holds
go back to the store, and the process exits 0. A second Ctrl-C while stopping exits at once
(status 130).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from pydantic import ValidationError

from contextfold.cli.common import InputError, cli_errors, invalid_fields, one_of

if TYPE_CHECKING:
    from fastapi import FastAPI

    from contextfold.server.config import ServerConfig
    from contextfold.server.runner import Runner

__all__ = ["LOG_LEVELS", "proxy_command", "serve_app", "serve_command"]

#: uvicorn's log levels, from the most said to the least.
LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "critical")
#: The option that sets each setting a command line can give (for errors naming it).
_OPTIONS = {"host": "--host", "port": "--port", "proxy.upstream": "--upstream"}

ServerConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        metavar="FILE",
        help="Server config (YAML): host, port, proxy upstream and instances, limits.",
    ),
]
MemoryConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--memory-config",
        metavar="FILE",
        help="The memory engine's contextfold.yaml (overrides memory_config in --config).",
    ),
]
HostOption = Annotated[
    str | None, typer.Option("--host", help="Address to bind (default 127.0.0.1).")
]
WorkersOption = Annotated[
    int,
    typer.Option(
        "--workers",
        "-w",
        min=1,
        envvar="CONTEXTFOLD_WORKERS",
        help="Worker processes serving the same ports on one shared store (not :memory:); "
        "a worker that dies is replaced. Default 1: one process.",
    ),
]
LogOption = Annotated[
    str, typer.Option("--log-level", help="uvicorn log level: debug, info, warning, error.")
]
EventLogOption = Annotated[
    bool | None,
    typer.Option(
        "--event-log/--no-event-log",
        help="One line per event on stdout (INGEST, REQUEST, RESPONSE, COMPLETE, COMPACT); "
        "default on (the config's event_log.enabled).",
    ),
]
LogContentOption = Annotated[
    bool,
    typer.Option(
        "--log-content",
        help="Add an excerpt of each query and reply to the event log (default: counts, tags "
        "and times only, no message text).",
    ),
]
CaptureOption = Annotated[
    bool,
    typer.Option(
        "--capture-bodies",
        help="Keep the last 50 request bodies sent upstream (credentials redacted) for the "
        "dashboard's request capture (dashboard.capture).",
    ),
]


# What the ``server`` extra installs (and what its imports pull in).
_SERVER_PACKAGES = ("fastapi", "starlette", "uvicorn", "uvloop", "httptools", "anyio")


def _run(
    config_path: Path | None,
    memory_config: Path | None,
    host: str | None,
    port: int | None,
    upstream: str | None,
    log_level: str,
    workers: int = 1,
    *,
    event_log: bool | None = None,
    log_content: bool = False,
    capture: bool = False,
) -> None:
    log_level = one_of("--log-level", log_level, LOG_LEVELS)
    try:
        from contextfold.server.config import ServerConfig, load_server_config

        importlib.import_module("contextfold.server.runner")  # uvicorn: the extra is there
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in _SERVER_PACKAGES:
            raise
        raise InputError(
            f"the server needs the server extra ({missing} is missing): "
            'pip install "contextfold[server]"'
        ) from None

    config = load_server_config(config_path) if config_path else ServerConfig()
    try:
        config = _with_options(config, host, port, upstream, memory_config)
    except ValidationError as exc:
        raise InputError(invalid_fields(exc, _OPTIONS)) from None
    settings = config.event_log.model_dump()
    if event_log is not None:
        settings["enabled"] = event_log
    elif settings["enabled"] is None:  # the command line's default: on
        settings["enabled"] = True
    if log_content:
        settings["content"] = True
    update: dict[str, object] = {"event_log": settings}
    if capture:
        update["dashboard"] = {**config.dashboard.model_dump(), "capture": True}
    config = ServerConfig.model_validate({**config.model_dump(), **update})
    if workers > 1:
        from contextfold.server.workers import supervise

        for sock in _listen(config):  # a port in use: one error line naming it
            sock.close()
        raise typer.Exit(supervise(config, workers, log_level))
    serve_app(config, log_level)


def _with_options(
    config: ServerConfig,
    host: str | None,
    port: int | None,
    upstream: str | None,
    memory_config: Path | None,
) -> ServerConfig:
    """``config`` with the command line's ``--host``, ``--port``, ``--upstream`` and
    ``--memory-config``; a bad value raises pydantic's ``ValidationError``."""
    update: dict[str, object] = {}
    if host is not None:
        update["host"] = host
    if port is not None:
        update["port"] = port
    if memory_config is not None:
        if not memory_config.is_file():
            raise InputError(f"{memory_config}: no such file")
        update["memory_config"] = str(memory_config)
    if upstream is not None:
        update["proxy"] = {**config.proxy.model_dump(), "upstream": upstream}
    if not update:
        return config
    return type(config).model_validate({**config.model_dump(), **update})


def _listen(config: ServerConfig) -> list[socket.socket]:
    """A listening socket on every binding of ``config``, in ``bindings`` order: bound here,
    before the app is built, so a port in use (or an address that is not this machine's) is
    one ``InputError`` naming it rather than uvicorn's error after a start."""
    from contextfold.server.runner import bindings
    from contextfold.server.workers import bind

    sockets: list[socket.socket] = []
    try:
        for host, port in bindings(config):
            try:
                sock = bind(host, port)
            except OSError as exc:
                reason = (exc.strerror or str(exc)).lower()
                raise InputError(f"cannot listen on {_address(host, port)}: {reason}") from None
            sock.set_inheritable(False)  # one process: nothing to share it with
            sockets.append(sock)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _address(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets (as in a URL)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def serve_app(
    config: ServerConfig,
    log_level: str,
    *,
    sockets: list[socket.socket] | None = None,
    signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM),
) -> None:
    """Build the app of ``config`` and serve it until one of ``signals`` (a second one quits
    at once): one worker of ``serve --workers`` on the supervisor's ``sockets`` (stopped by
    its SIGTERM), or without them the whole server of one process. That binds every port
    first (one in use is an ``InputError`` naming it) and says "listening" once it serves."""
    from contextfold.server.app import create_app
    from contextfold.server.runner import Runner, bindings

    worker = sockets is not None
    listeners = sockets if sockets is not None else _listen(config)
    try:
        app = create_app(config)
    except BaseException:
        if not worker:
            for sock in listeners:
                sock.close()
        raise
    app.state.contextfold.freeze_gc = True  # this process is the server's alone
    runner = Runner(app, config, log_level=log_level, sockets=listeners)

    # Memory writes run on a thread beside the event loop; a short GIL switch interval keeps
    # them from holding the loop up for the default 5 ms each time it does I/O.
    sys.setswitchinterval(0.0005)

    stop_began: list[float] = []
    who = f"worker {os.getpid()}: " if worker else ""

    def on_signal(sig: signal.Signals) -> None:
        if runner.stopping:
            _force_exit(sig)
        stop_began.append(time.monotonic())
        _say(f"{who}stopping: {_stopping_line(runner)}")
        runner.stop()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in signals:
            loop.add_signal_handler(sig, on_signal, sig)
        serving = asyncio.ensure_future(runner.serve())
        if not worker:  # the supervisor says it for the workers
            while not (runner.started or serving.done()):
                await asyncio.sleep(0.01)
            if runner.started:
                for (host, _), sock in zip(bindings(config), listeners, strict=True):
                    where = _address(host, sock.getsockname()[1])
                    _say(f"contextfold listening on http://{where}")
        await serving

    with asyncio.Runner(loop_factory=_loop_factory()) as loop_runner:
        loop_runner.run(main())
    left = _written(app) if stop_began else ""
    app.state.contextfold.log.flush(1.0)  # the last event lines
    app.state.contextfold.memory.close()
    if stop_began:
        _say(f"{who}stopped in {time.monotonic() - stop_began[0]:.1f} s; {left}")


def _configured_upstream(path: Path | None) -> bool:
    """Whether the server config at ``path`` names an upstream or proxy instances."""
    if path is None:
        return False
    from contextfold.server.config import load_server_config

    config = load_server_config(path)
    return config.proxy.upstream is not None or bool(config.proxy.instances)


def _stopping_line(runner: Runner) -> str:
    """What the first Ctrl-C (or SIGTERM) says: what the stop waits for, and for how long."""
    open_now = runner.open_connections()
    return (
        f"{open_now} open connection{'' if open_now == 1 else 's'}; requests in flight have "
        f"{runner.shutdown_timeout} s to finish, dashboard streams end now "
        "(Ctrl-C again to quit at once)"
    )


def _written(app: FastAPI) -> str:
    """What the stop left: every exchange is stored as its reply ends; derived work may be
    pending in the store."""
    try:
        pending = app.state.contextfold.memory.store.jobs.pending_jobs()
    except Exception as exc:  # a store that is down or closed: say so, do not fail the stop
        return f"every exchange is stored; derive jobs unknown ({type(exc).__name__})"
    if pending:
        return f"every exchange is stored; {pending} derive job(s) wait in the store"
    return "every exchange is stored and derived"


def _force_exit(sig: signal.Signals) -> NoReturn:
    """A second Ctrl-C (or SIGTERM) while stopping: exit now, without waiting for requests in
    flight or the pending memory writes (SQLite keeps what it has committed)."""
    _say(
        f"forced stop ({sig.name} while stopping): exiting now; requests in flight are cut off "
        "(their exchanges are not stored); derived work stays in the store"
    )
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(128 + sig)


def _say(line: str) -> None:
    """``line`` on stderr; when nothing reads it any more (``serve 2>&1 | head``, the reader
    gone), the rest of the run writes to nowhere instead of failing: a stop whose message
    raised would never stop."""
    try:
        typer.echo(line, err=True)
    except (OSError, ValueError):  # BrokenPipeError, or a stream closed under us
        sys.stderr = Path(os.devnull).open("w", encoding="utf-8")  # noqa: SIM115 - kept


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (the ``server`` extra brings it; it moves
    bytes between the client, the proxy and the upstream with less overhead than asyncio's
    own), else asyncio's default."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - the server extra installs it
        return None
    return uvloop.new_event_loop


def serve_command(
    config: ServerConfigOption = None,
    memory_config: MemoryConfigOption = None,
    host: HostOption = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            "-p",
            envvar="CONTEXTFOLD_PORT",
            help="Main port (default: $CONTEXTFOLD_PORT, else --config's port, else 5757).",
        ),
    ] = None,
    log_level: LogOption = "info",
    workers: WorkersOption = 1,
    event_log: EventLogOption = None,
    log_content: LogContentOption = False,
    capture_bodies: CaptureOption = False,
) -> None:
    """Run the server: the LLM proxy, POST /api/context and the dashboard.

    Listens on the config's port and on each proxy instance's port; all of them share one
    memory engine and store. With --workers N, N processes serve those ports, all on one store
    (an SQLite file or a postgresql:// URL). Ctrl-C stops it: requests in flight get up to
    shutdown_timeout seconds (default 5); every exchange is already stored, and derived work
    left pending stays in the store for the next start; a second Ctrl-C quits at once."""
    with cli_errors():
        _run(
            config,
            memory_config,
            host,
            port,
            None,
            log_level,
            workers,
            event_log=event_log,
            log_content=log_content,
            capture=capture_bodies,
        )


def proxy_command(
    upstream: Annotated[
        str | None,
        typer.Option(
            "--upstream",
            "-u",
            metavar="URL",
            help="The provider API to forward to, e.g. https://api.openai.com. Without it, "
            "--config's proxy.upstream and proxy.instances are started.",
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            "-p",
            envvar="CONTEXTFOLD_PORT",
            help="Port to listen on ($CONTEXTFOLD_PORT; default: --config's port, else 5757).",
        ),
    ] = None,
    config: ServerConfigOption = None,
    memory_config: MemoryConfigOption = None,
    host: HostOption = None,
    log_level: LogOption = "info",
    workers: WorkersOption = 1,
    event_log: EventLogOption = None,
    log_content: LogContentOption = False,
    capture_bodies: CaptureOption = False,
) -> None:
    """Run the transparent LLM proxy in front of one upstream, or the configured instances.

    With --upstream: one listener forwarding there. Without it: the upstream and the proxy
    instances of --config (each instance's port forwards to its own upstream; all share one
    memory). Point a client's base_url at http://127.0.0.1:PORT (OpenAI SDK: .../v1); every request
    gains conversation memory. Ctrl-C stops it: requests in flight get up to shutdown_timeout
    seconds (default 5); every exchange is already stored, and derived work left pending stays
    in the store for the next start; a second Ctrl-C quits at once."""
    with cli_errors():
        if upstream is None and not _configured_upstream(config):
            raise InputError(
                "no upstream: pass --upstream URL, or --config FILE with proxy.upstream or "
                "proxy.instances (`contextfold init --from virtual-context.yaml` writes one)"
            )
        _run(
            config,
            memory_config,
            host,
            port,
            upstream,
            log_level,
            workers,
            event_log=event_log,
            log_content=log_content,
            capture=capture_bodies,
        )
