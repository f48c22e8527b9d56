"""The 422 answer's problems: at most 20 listed, numbers JSON cannot hold made strings."""

from __future__ import annotations

import json
import math

from app.validation_errors import MAX_PROBLEMS, listed_problems
from tests.relay import LiveRelay


def test_problems_beyond_the_limit_are_counted_not_listed() -> None:
    errors = [{"type": "extra_forbidden", "loc": ["body", f"k{n}"], "msg": "x"} for n in range(25)]
    listed = listed_problems(errors)
    assert listed[:MAX_PROBLEMS] == errors[:MAX_PROBLEMS]
    assert listed[MAX_PROBLEMS:] == [
        {"type": "more", "loc": [], "msg": "5 more problems not listed."}
    ]
    assert listed_problems(errors[:MAX_PROBLEMS]) == errors[:MAX_PROBLEMS]


def test_numbers_json_cannot_hold_become_their_names() -> None:
    errors = [{"input": {"a": [math.nan, -math.inf]}, "ctx": {"n": math.inf, "ok": 1.5}}]
    assert listed_problems(errors) == [
        {"input": {"a": ["NaN", "-Infinity"]}, "ctx": {"n": "Infinity", "ok": 1.5}}
    ]


def test_nan_or_infinity_in_a_body_gets_422_and_the_connection_serves_on(
    relay: LiveRelay,
) -> None:
    """Python's JSON parser takes NaN and Infinity; the 422 quoted them and could not be sent
    (a 500, and the connection dropped)."""
    cid = relay.create()["id"]
    headers = {"content-type": "application/json"}
    bodies = [
        ("POST", f"/api/conversations/{cid}/messages", b'{"text": NaN}'),
        ("POST", "/api/conversations", b'{"title": Infinity}'),
        (
            "POST",
            f"/api/conversations/{cid}/messages",
            b'{"text": "a", "attachments": [-Infinity]}',
        ),
    ]
    for method, path, body in bodies:
        answer = relay.http.request(method, path, content=body, headers=headers)
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"][0]["input"] in ("NaN", "Infinity", "-Infinity")
        assert relay.http.get("/healthz").status_code == 200  # on the same connection
    # The window is judged as sent (not a notch), its value not quoted.
    body = b'{"auto_compact_window": -Infinity}'
    answer = relay.http.patch(f"/api/conversations/{cid}", content=body, headers=headers)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"].startswith("auto_compact_window must be one of")
    assert relay.http.get("/healthz").status_code == 200


def test_a_body_of_many_stray_keys_gets_a_short_422(relay: LiveRelay) -> None:
    """120,000 keys the model forbids made a 12 MB answer, built on the event loop."""
    cid = relay.create()["id"]
    body = {"text": "a", **{f"k{n}": 1 for n in range(120_000)}}
    answer = relay.http.post(
        f"/api/conversations/{cid}/messages",
        content=json.dumps(body),
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 422
    detail = answer.json()["detail"]
    assert len(detail) == MAX_PROBLEMS + 1
    assert detail[-1]["msg"] == f"{120_000 - MAX_PROBLEMS} more problems not listed."
    assert len(answer.content) < 10_000
