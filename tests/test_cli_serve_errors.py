"""Bad values for ``contextfold serve`` / ``proxy`` and their server config: each is one
``error:`` line on stderr naming the flag or field, exit status 2, never a traceback and never
a server that starts only to fail on every request. A port already in use is such an error
too, and "listening" is said only once the server answers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contextfold.errors import ConfigError
from contextfold.server.config import load_server_config
from proxy_support import free_port

pytestmark = pytest.mark.integration

#: Upstream URLs that cannot work, and what the error says about each.
BAD_UPSTREAMS = {
    "http://127.0.0.1:notaport": "port",
    "http://127.0.0.1:0": "port",
    "http://127.0.0.1:99999": "port",
    "http://": "no host",
    "http://:8080": "no host",
    "http:///v1": "no host",
    "ftp://example.com": "http:// or https://",
    "example.com": "http:// or https://",
    "http://api example.com": "space or control character",
    "http://api.example.com/v1?key=x": "query",
    "http://api.example.com/v1#part": "query",
    "http://[::1": "not a valid URL",
    "http://user:secret@127.0.0.1:1": "credentials",
}

GOOD_UPSTREAMS = [
    "https://api.openai.com",
    "http://127.0.0.1:8080/v1",
    "http://[::1]:8080",
    "https://generativelanguage.googleapis.com/v1beta/",
]


def cli(*args: str, home: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``contextfold ARGS`` as a process (stdin closed), with ``home`` as CONTEXTFOLD_HOME."""
    env = {**os.environ, "CONTEXTFOLD_HOME": str(home)}
    env.pop("CONTEXTFOLD_PORT", None)
    env.pop("CONTEXTFOLD_STORE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "contextfold", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The single ``error:`` line a failed command wrote, after checking it was the only one
    and the exit status was 2."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "listening" not in done.stderr
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port some other socket is listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


# --------------------------------------------------------------------------- upstream URLs


@pytest.mark.parametrize(("url", "says"), BAD_UPSTREAMS.items())
def test_a_bad_upstream_in_a_server_config_is_an_error_naming_the_field(
    url: str, says: str, tmp_path: Path
) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(f"proxy:\n  upstream: {url!r}\n")
    with pytest.raises(ConfigError) as caught:
        load_server_config(path)
    message = str(caught.value)
    assert "proxy.upstream:" in message and says in message, message
    assert url not in message and "secret" not in message  # the URL is never repeated

    path.write_text(f"proxy:\n  instances:\n    - {{name: x, port: 5758, upstream: {url!r}}}\n")
    with pytest.raises(ConfigError) as caught:
        load_server_config(path)
    assert "proxy.instances.0.upstream:" in str(caught.value) and says in str(caught.value)


@pytest.mark.parametrize("url", GOOD_UPSTREAMS)
def test_a_good_upstream_is_kept_as_written(url: str, tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(f"proxy:\n  upstream: {url!r}\n")
    assert load_server_config(path).proxy.upstream == url


def test_config_validate_refuses_a_bad_upstream(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(
        'proxy:\n  upstream: "http://127.0.0.1:notaport"\n'
        '  instances:\n    - {name: x, port: 18795, upstream: "http://"}\n'
    )
    done = cli("config", "validate", str(path), home=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr
    assert "proxy.upstream:" in done.stderr and "proxy.instances.0.upstream:" in done.stderr


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:notaport", "port"),
        ("http://", "no host"),
        ("http://user:pw@127.0.0.1:1", "credentials"),
        ("ftp://127.0.0.1", "http:// or https://"),
    ],
)
def test_proxy_refuses_a_bad_upstream_flag_before_it_starts(
    url: str, says: str, tmp_path: Path
) -> None:
    done = cli("proxy", "--upstream", url, "--port", str(free_port()), home=tmp_path)
    line = one_error_line(done)
    assert line.startswith("error: --upstream: ") and says in line, line
    assert ":pw@" not in line


# --------------------------------------------------------------------------- flag values


@pytest.mark.parametrize(
    ("port", "says"),
    [("99999", "less than or equal to 65535"), ("-1", "greater than or equal to 0")],
)
@pytest.mark.parametrize("command", ["serve", "proxy"])
def test_a_port_out_of_range_is_one_error_line(
    command: str, port: str, says: str, tmp_path: Path
) -> None:
    args = ["--upstream", "http://127.0.0.1:9"] if command == "proxy" else []
    line = one_error_line(cli(command, *args, "--port", port, home=tmp_path))
    assert line == f"error: --port: Input should be {says}", line


@pytest.mark.parametrize("command", ["serve", "proxy"])
def test_an_unknown_log_level_is_one_error_line(command: str, tmp_path: Path) -> None:
    args = ["--upstream", "http://127.0.0.1:9"] if command == "proxy" else []
    done = cli(command, *args, "--log-level", "LOUD", "--port", str(free_port()), home=tmp_path)
    line = one_error_line(done)
    assert line.startswith(
        "error: --log-level must be one of trace, debug, info, warning, error"
    ), line
    assert "'LOUD'" in line


def test_a_bad_port_in_the_environment_names_the_flag(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "contextfold", "serve"],
        env={**os.environ, "CONTEXTFOLD_HOME": str(tmp_path), "CONTEXTFOLD_PORT": "70000"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = one_error_line(done)
    assert line.startswith("error: --port: "), line


# --------------------------------------------------------------------------- listening


def test_a_busy_port_is_one_error_line_naming_it(busy_port: int, tmp_path: Path) -> None:
    line = one_error_line(cli("serve", "--port", str(busy_port), home=tmp_path))
    assert line == f"error: cannot listen on 127.0.0.1:{busy_port}: address already in use"


def test_a_busy_instance_port_is_named(busy_port: int, tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(
        f"port: {free_port()}\nproxy:\n  instances:\n"
        f"    - {{name: x, port: {busy_port}, upstream: 'http://127.0.0.1:9'}}\n"
    )
    line = one_error_line(cli("serve", "--config", str(config), home=tmp_path))
    assert f"127.0.0.1:{busy_port}: address already in use" in line, line


def test_a_busy_port_with_workers_is_one_error_line(busy_port: int, tmp_path: Path) -> None:
    done = cli("serve", "--workers", "2", "--port", str(busy_port), home=tmp_path)
    line = one_error_line(done)
    assert line == f"error: cannot listen on 127.0.0.1:{busy_port}: address already in use"


def test_listening_is_said_once_the_server_answers(tmp_path: Path) -> None:
    memory = tmp_path / "contextfold.yaml"
    memory.write_text(f"storage_path: {tmp_path / 'memory.db'}\nrecall:\n  embedder: none\n")
    port = free_port()
    command = [sys.executable, "-m", "contextfold", "proxy", "--upstream", "http://127.0.0.1:9"]
    command += ["--port", str(port), "--memory-config", str(memory)]
    env = {**os.environ, "CONTEXTFOLD_HOME": str(tmp_path)}
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 60
        line = process.stderr.readline()
        while "listening" not in line:
            assert line and time.monotonic() < deadline, "no listening line"
            line = process.stderr.readline()
        assert line.strip() == f"contextfold listening on http://127.0.0.1:{port}"
        # No retry: once it says so, it answers.
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
    finally:
        process.terminate()
        process.communicate(timeout=30)
    assert process.returncode == 0


def test_a_stop_still_stops_when_stderr_is_gone(tmp_path: Path) -> None:
    """``contextfold serve 2>&1 | head -2``, then Ctrl-C: the reader of stderr is gone when
    the stop wants to say so. The stop goes on (it hung: the message raised BrokenPipeError)."""
    memory = tmp_path / "contextfold.yaml"
    memory.write_text(f"storage_path: {tmp_path / 'memory.db'}\nrecall:\n  embedder: none\n")
    port = free_port()
    command = [sys.executable, "-m", "contextfold", "serve", "--port", str(port)]
    command += ["--memory-config", str(memory)]
    env = {**os.environ, "CONTEXTFOLD_HOME": str(tmp_path)}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 60
        while "listening" not in process.stderr.readline():
            assert time.monotonic() < deadline and process.poll() is None, "no listening line"
        process.stderr.close()  # the reader went away
        process.terminate()
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
