"""``contextfold serve --workers N``: N worker processes serving the same ports on one store.

The supervisor (this process) checks that the store can be shared (a file or a database URL,
not ``:memory:``), runs its migrations and makes the secret once, binds every listener — the
main port and each ``proxy.instances`` port — and starts N workers. Each worker is a fresh
interpreter (``spawn``: it inherits nothing but the config and the listening sockets) that runs
the whole server of one process (``cli.serve.serve_app``): its own app, memory engine, job
threads and connections to the store; the kernel hands each new connection to one of the
workers accepting on the shared socket.

What they share lives in the store, so it does not matter which worker a request reaches: a
conversation's turns and branches, the derived-work jobs (claimed by one worker at a time;
those of a worker that died are claimed again), the dashboard's records (every worker's
dashboard lists and streams them all) and the version numbers that keep each worker's caches
correct when another one writes (``MemoryStorage.session_version``).

Why not uvicorn's own ``workers=``: one process of this server listens on several ports (the
proxy instances) and stops in its own way (dashboard streams end, requests in flight get the
shutdown timeout, jobs go back to the store); the supervisor here does what uvicorn's does
(spawned workers on sockets bound once, a dead worker replaced) around that process.

Signals: SIGTERM or SIGINT (Ctrl-C) to the supervisor stops every worker gracefully (each
gets SIGTERM and stops as a one-process server does); a second one makes them quit at once.
The workers ignore SIGINT themselves (a terminal's Ctrl-C reaches the whole process group):
the supervisor decides. A worker that exits while nobody stops it (``kill -9``, a crash) is
replaced; the supervisor gives up, exit status 1, when workers keep dying within seconds of
their start (a config that cannot work). A supervisor killed with SIGKILL stops no one: each
worker notices within half a second that it is gone and stops as on SIGTERM, so the port and
the store are free again for the next server.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from multiprocessing.process import BaseProcess
from typing import Any

from contextfold.server.config import ServerConfig
from contextfold.server.runner import bindings

__all__ = ["bind", "check_shareable", "supervise"]

log = logging.getLogger(__name__)

#: A worker that dies this soon after its start counts as a failed start.
_EARLY = 5.0
#: Failed starts in a row after which the supervisor gives up.
_FAILED_STARTS = 5
#: How often a worker checks that its supervisor is still there (seconds).
_PARENT_POLL = 0.5


def check_shareable(config: ServerConfig) -> str:
    """Where the workers' memory store lives (its migrations run here, once); ``ConfigError``
    when it is ``:memory:``, which one process alone can see."""
    from contextfold.errors import ConfigError
    from contextfold.memory.config import MemoryConfig, load_config
    from contextfold.store import open_memory_store, store_url
    from contextfold.store.sqlite import home_dir
    from contextfold.tokens import CharCounter

    cfg = load_config(config.memory_config) if config.memory_config else MemoryConfig()
    where = store_url(cfg.store or cfg.storage_path) or home_dir() / "memory.db"
    if str(where) == ":memory:":
        raise ConfigError(
            "--workers needs a store the workers can share: an SQLite file or a postgresql://"
            " URL (storage_path / store in the memory config, or $CONTEXTFOLD_STORE_URL),"
            " not :memory:, which each process would have alone"
        )
    # Migrations once, before the workers race to them (no text is counted: a plain counter).
    open_memory_store(where, counter=CharCounter()).close()
    return str(where)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port), to be shared by the workers."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _worker(
    config: dict[str, Any], sockets: list[socket.socket], log_level: str, supervisor: int
) -> None:
    """One worker process: the server of ``config`` on the supervisor's ``sockets``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor stops us, with SIGTERM
    # Stopped while still starting (nothing is held yet): exit quietly. Once it serves, the
    # server's own handler replaces this one.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    threading.Thread(
        target=_stop_without, args=(supervisor,), name="contextfold-supervisor", daemon=True
    ).start()
    from contextfold.cli.serve import serve_app

    serve_app(
        ServerConfig.model_validate(config),
        log_level,
        sockets=sockets,
        signals=(signal.SIGTERM,),
    )


def _stop_without(supervisor: int) -> None:
    """SIGTERM to this worker once process ``supervisor`` is no longer its parent (killed with
    SIGKILL, or crashed: it stops no one then). Without it the workers would serve the port
    and the store for ever, and a new server could not bind; with it each stops as on the
    supervisor's SIGTERM, finishing the requests in flight. Polled (every half second) so
    it works wherever ``getppid`` does."""
    while os.getppid() == supervisor:
        time.sleep(_PARENT_POLL)
    log.warning("the supervisor (pid %d) is gone: this worker stops", supervisor)
    os.kill(os.getpid(), signal.SIGTERM)


class _Supervisor:
    def __init__(self, config: ServerConfig, workers: int, log_level: str) -> None:
        self.config = config
        self.count = workers
        self.log_level = log_level
        self.sockets: list[socket.socket] = []
        self.workers: list[BaseProcess] = []
        self.started: dict[int, float] = {}
        self.stopping = 0  # signals received
        self.wake = threading.Event()
        self.context = multiprocessing.get_context("spawn")

    def say(self, line: str) -> None:
        print(f"contextfold: {line}", file=sys.stderr, flush=True)

    def spawn(self) -> BaseProcess:
        process = self.context.Process(
            target=_worker,
            args=(self.config.model_dump(mode="json"), self.sockets, self.log_level, os.getpid()),
            name="contextfold-worker",
            daemon=False,
        )
        process.start()
        self.started[id(process)] = time.monotonic()
        return process

    def on_signal(self, signum: int, _frame: object) -> None:
        self.stopping += 1
        self.wake.set()

    def run(self) -> int:
        for host, port in bindings(self.config):
            self.sockets.append(bind(host, port))
        for sock in self.sockets:
            host, port = sock.getsockname()[:2]
            self.say(f"listening on http://{host}:{port} ({self.count} workers)")
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.on_signal)
        self.workers = [self.spawn() for _ in range(self.count)]
        failed = 0
        try:
            while not self.stopping:
                self.wake.wait(0.2)
                for i, process in enumerate(self.workers):
                    if process.is_alive() or self.stopping:
                        continue
                    process.join()
                    early = time.monotonic() - self.started.pop(id(process), 0.0) < _EARLY
                    failed = failed + 1 if early else 0
                    self.say(
                        f"worker {process.pid} exited (status {process.exitcode}); "
                        + (
                            "giving up: workers keep dying as they start"
                            if failed >= _FAILED_STARTS
                            else "starting another (the jobs it held are claimed again)"
                        )
                    )
                    if failed >= _FAILED_STARTS:
                        self.stop()
                        return 1
                    self.workers[i] = self.spawn()
            return self.stop()
        finally:
            for sock in self.sockets:
                sock.close()

    def stop(self) -> int:
        """SIGTERM to every worker, and wait for them (another signal: SIGTERM again, which
        makes them quit at once; past the shutdown timeout and a margin: SIGKILL)."""
        self.say(f"stopping {sum(p.is_alive() for p in self.workers)} worker(s)")
        signalled = self.stopping
        for process in self.workers:
            if process.is_alive() and process.pid is not None:
                process.terminate()
        deadline = time.monotonic() + self.config.shutdown_timeout + 15
        while any(p.is_alive() for p in self.workers) and time.monotonic() < deadline:
            if self.stopping > signalled:  # asked again: quit at once
                signalled = self.stopping
                for process in self.workers:
                    if process.is_alive():
                        process.terminate()
            time.sleep(0.05)
        for process in self.workers:
            if process.is_alive():
                process.kill()
            process.join(5)
        codes = [p.exitcode for p in self.workers]
        self.say(f"stopped; worker exit statuses {codes}")
        return 0


def supervise(config: ServerConfig, workers: int, log_level: str = "info") -> int:
    """Run ``workers`` worker processes of ``config`` until SIGTERM or SIGINT (see the module
    docstring); the exit status."""
    check_shareable(config)
    # The secret that signs session markers: made once here, so the workers do not race to
    # create it (each then reads it).
    import os

    from contextfold.server.state import load_secret
    from contextfold.store.sqlite import home_dir

    if not os.environ.get(config.secret_env):
        home = home_dir()
        home.mkdir(parents=True, exist_ok=True)
        load_secret(home / "secret")
    return _Supervisor(config, workers, log_level).run()
