"""schemathesis over the relay's own OpenAPI schema: no 5xx, every error a JSON 4xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings

from app.routes import api
from tests.relay import TOKEN, LiveRelay, make_settings

EXAMPLES = 40  # per operation


def _operations() -> list[str]:
    """Every API operation as "METHOD path" (the schema does not depend on settings)."""
    app = FastAPI()
    app.include_router(api.router)
    schema = schemathesis.openapi.from_dict(app.openapi())
    return [f"{r.ok().method.upper()} {r.ok().path}" for r in schema.get_all_operations()]


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRelay]:
    data: Path = tmp_path_factory.mktemp("fuzz") / "data"
    live = LiveRelay(make_settings(data)).start()
    first = live.create(title="one")
    live.create(title="two")
    live.send(first["id"], "hello")
    live.wait_idle(first["id"])
    try:
        yield live
    finally:
        live.stop()


@pytest.mark.parametrize("operation", _operations())
def test_operation_answers_json_without_server_errors(relay: LiveRelay, operation: str) -> None:
    method, path = operation.split(" ", 1)
    target = schemathesis.openapi.from_dict(relay.app.openapi())[path][method]
    problems: list[str] = []

    @given(case=target.as_strategy())
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    def fuzz(case: Any) -> None:
        parameters = case.path_parameters or {}
        if isinstance(parameters.get("conversation_id"), int) and parameters["conversation_id"] % 2:
            parameters["conversation_id"] = 1  # half the cases reach a real conversation
        response = case.call(
            base_url=relay.base,
            headers={"Authorization": f"Bearer {TOKEN}", "Origin": relay.base},
        )
        kind = response.headers.get("content-type") or [""]  # a list of values
        kind = kind[0] if isinstance(kind, list) else kind
        if response.status_code >= 500 or not kind.startswith("application/json"):
            problems.append(f"{case.method} {case.formatted_path}: {response.status_code} {kind}")

    fuzz()
    assert problems == []
