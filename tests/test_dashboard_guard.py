"""Who may open the dashboard: loopback only without a token, the token otherwise, and nobody
when the server listens beyond loopback with no token configured."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from contextfold.server.dashboard_guard import DashboardGuard, host_of, is_loopback
from dashboard_support import TOKEN, make_app

ENV = "CONTEXTFOLD_DASHBOARD_TOKEN"
ROUTES = ("/dashboard", "/dashboard/ask", "/dashboard/api/records", "/dashboard/api/export")


def error_message(response: httpx.Response) -> str:
    """The message of the server's one error shape, ``{"error": {"type", "message"}}``."""
    return str(response.json()["error"]["message"])


def client(app: FastAPI, *, peer: str = "127.0.0.1", host: str = "127.0.0.1:5757") -> TestClient:
    return TestClient(app, base_url=f"http://{host}", client=(peer, 50000))


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("example.com", False),
        ("127.0.0.1.nip.io", False),
        ("", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("header", "host"),
    [("127.0.0.1:5757", "127.0.0.1"), ("localhost", "localhost"), ("[::1]:80", "::1")],
)
def test_host_of(header: str, host: str) -> None:
    assert host_of(header) == host


def test_loopback_without_a_token_is_open_to_loopback_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    c = client(make_app())
    for route in ROUTES:
        assert c.get(route).status_code == 200, route
    assert client(make_app(), host="localhost:5757").get("/dashboard").status_code == 200


def test_loopback_without_a_token_refuses_other_clients_and_foreign_host_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    remote = client(make_app(), peer="10.0.0.7").get("/dashboard/api/records")
    assert remote.status_code == 403 and "loopback clients only" in error_message(remote)
    rebound = client(make_app(), host="attacker.example:5757").get("/dashboard/api/records")
    assert rebound.status_code == 403 and "not a loopback name" in error_message(rebound)
    static = client(make_app(), peer="10.0.0.7").get("/dashboard/static/common.js")
    assert static.status_code == 403


def test_beyond_loopback_without_a_token_the_dashboard_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    c = client(make_app(host="0.0.0.0"))
    for route in (*ROUTES, "/dashboard/static/common.js"):
        response = c.get(route)
        assert response.status_code == 403, route
        detail = response.json()["error"]["message"]
        assert "listens on 0.0.0.0" in detail and ENV in detail
    assert c.get("/healthz").status_code == 200  # the rest of the server still serves


@pytest.mark.parametrize("bound", ["0.0.0.0", "127.0.0.1"])
def test_a_configured_token_is_required_as_bearer_or_query(
    monkeypatch: pytest.MonkeyPatch, bound: str
) -> None:
    monkeypatch.setenv(ENV, TOKEN)
    c = client(make_app(host=bound), peer="192.168.1.9", host="dash.example:5757")
    missing = c.get("/dashboard/api/records")
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert "Authorization: Bearer" in missing.json()["error"]["message"]
    wrong = c.get("/dashboard/api/records", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["message"] == "wrong dashboard token"
    assert c.get("/dashboard/api/records", params={"token": "nope"}).status_code == 401
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for route in ROUTES:
        assert c.get(route, headers=bearer).status_code == 200, route
        assert c.get(route, params={"token": TOKEN}).status_code == 200, route
    assert c.get("/dashboard/static/common.js").status_code == 200  # no data: no token needed


def test_a_short_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "short")
    response = client(make_app(host="0.0.0.0")).get(
        "/dashboard/api/records", headers={"Authorization": "Bearer short"}
    )
    assert response.status_code == 403
    assert "shorter than 16" in response.json()["error"]["message"]


def test_the_token_is_read_from_the_configured_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_DASH_TOKEN", TOKEN)
    monkeypatch.delenv(ENV, raising=False)
    app = make_app(host="0.0.0.0", token_env="MY_DASH_TOKEN")
    c = client(app, peer="192.168.1.9", host="dash.example:5757")
    assert c.get("/dashboard/api/records", params={"token": TOKEN}).status_code == 200
    no_env = DashboardGuard(bound_host="0.0.0.0", token=None, token_env=None).refusal
    assert no_env is not None and "dashboard.token_env" in no_env
