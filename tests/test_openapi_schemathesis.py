"""Schemathesis over the served OpenAPI spec of the context API: generated requests (valid
and invalid, seeded and derandomized) never get a 5xx, and every response matches the status
codes and schemas the spec documents.

The spec is read from an app built at import (schemathesis needs it to collect the tests);
each operation is then exercised against a fresh app over a fresh store, seeded with a few
nodes so that generated ids sometimes hit real ones.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from contextfold.memory.engine import MemoryEngine
from contextfold.server.app import create_app
from contextfold.server.config import ContextApiSettings, ServerConfig

KEY = "test-key-support"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _app(home: Path) -> FastAPI:
    config = ServerConfig(
        context_api=ContextApiSettings(
            api_keys={"CF_SUPPORT_KEY": ["support", "shared"]},
            graph_path=str(home / "graph.db"),
            hybrid=False,
        )
    )
    with mock.patch.dict(os.environ, {"CF_SUPPORT_KEY": KEY}):
        return create_app(config, memory=MemoryEngine(store=":memory:", embedder=None))


_spec_home = Path(tempfile.mkdtemp(prefix="contextfold-spec-"))
atexit.register(shutil.rmtree, _spec_home, ignore_errors=True)
schema = schemathesis.openapi.from_asgi("/openapi.json", _app(_spec_home)).include(
    path_regex="^/api/"
)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[FastAPI]:
    application = _app(tmp_path)
    with TestClient(application) as client:  # runs the lifespan: the store closes at the end
        for n, node_type in enumerate(["faq", "playbook", "entity"]):
            body = {"tenant_id": "support", "node_type": node_type, "title": f"refund {n}"}
            assert client.post("/api/nodes", json=body, headers=AUTH).status_code == 201
        edge = {"source_id": 1, "target_id": 2}
        assert client.post("/api/edges", json=edge, headers=AUTH).status_code == 201
        yield application


@schema.parametrize()
@settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_context_api_conforms_to_its_openapi_spec(case: schemathesis.Case, app: FastAPI) -> None:
    response = case.call_and_validate(
        headers=AUTH, app=app, excluded_checks=[positive_data_acceptance]
    )
    # In place of positive_data_acceptance: a request the schema allows may be refused only
    # for a rule JSON Schema cannot state (an edge's two ends differ, overlap < chunk_size,
    # an entity's content shape, no lone surrogates), each a model validator's value_error.
    positive = case.meta is not None and case.meta.generation.mode.is_positive
    if positive and response.status_code == 422:
        details = response.json()["error"]["details"]
        assert {d["type"] for d in details} == {"value_error"}, details
