"""Every GET route only reads (docs/security.md, "a malicious page in the same browser").

The session cookie is SameSite=Lax: another site's page gets it sent on a top-level GET
navigation (a link clicked). So a GET that changed something would be a change any site could
make with a link. Each GET route of the app is asked with real ids (a conversation with a
turn, an image, a pin, a handoff) and the database's rows and the data directory's files are
the same after as before. A GET route added later is asked too; one whose path it cannot fill,
or that answers other than 200, fails it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import inspect, text

from tests.images import png
from tests.relay import LiveRelay
from tests.test_backups_relay import wait_backups
from tests.test_changes import change, repo

# Query strings the routes need to answer more than a 422; paths not listed get none.
QUERIES = {
    "/api/search": "?q=hello",
    "/api/conversations/{conversation_id}/export": "?format=md",
    "/api/conversations/{conversation_id}/changes/diff": "?path=a.txt",
    "/api/conversations/{conversation_id}/files": "?q=no",
    "/login": "?next=/",
}
SKIPPED = {"/openapi.json", "/docs"}  # FastAPI's own, off unless docs are turned on


def rows(relay: LiveRelay) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, in a stable order."""
    engine = relay.app.state.engine
    with engine.connect() as connection:
        return {
            table: sorted(
                (tuple(row) for row in connection.execute(text(f'SELECT * FROM "{table}"'))),
                key=repr,
            )
            for table in inspect(engine).get_table_names()
        }


def files(data_dir: Path) -> dict[str, tuple[int, int]]:
    """The data directory's files (the database's own files aside): size and mtime each."""
    found = {}
    for path in sorted(data_dir.rglob("*")):
        if path.is_file() and not path.name.startswith("oarlock.db"):
            stat = path.stat()
            found[str(path.relative_to(data_dir))] = (stat.st_size, stat.st_mtime_ns)
    return found


def get_paths(relay: LiveRelay) -> list[str]:
    """The app's GET routes' paths (FastAPI's included routers walked)."""

    def walk(routes: list[Any]) -> list[Any]:
        found = []
        for route in routes:
            inner = getattr(route, "original_router", None)
            found += walk(inner.routes) if inner is not None else [route]
        return found

    return [r.path for r in walk(relay.app.routes) if "GET" in (getattr(r, "methods", None) or ())]


def conversation(relay: LiveRelay, cwd: Path, text: str) -> tuple[int, int]:
    """A conversation with a turn, a pin and an image waiting: its id and the image's."""
    cid = relay.create(cwd=str(cwd), title="Only read")["id"]
    assert relay.send(cid, text).status_code == 202
    view = relay.wait_idle(cid)
    user = next(e for e in view["timeline"] if e["kind"] == "user")
    pinned = relay.http.put(f"/api/conversations/{cid}/pins/{user['id']}")
    assert pinned.status_code == 200, pinned.text
    return cid, relay.attach(cid, png())


def test_no_get_route_changes_anything(relay: LiveRelay) -> None:
    cwd = repo(relay.settings.roots[0] / "work" / "reads")
    change(cwd)  # the Changes view and its diffs have something to show
    old, old_image = conversation(relay, cwd, "hello there")
    handoff = {"done": "Read.", "next": "Read more.", "files": ["a.txt"]}
    saved = relay.http.put(f"/api/conversations/{old}/handoff", json=handoff)
    assert saved.status_code == 200, saved.text
    compacted = relay.send(old, "/compact")  # old: archived, with a backup and a carry record
    assert compacted.status_code == 201, compacted.text
    backups = wait_backups(relay, old, 1)  # (written off the request's path)
    new, new_image = conversation(relay, cwd, "and again")
    before = rows(relay), files(relay.settings.data_dir)
    answers: dict[str, int] = {}
    for cid, image in ((old, old_image), (new, new_image)):
        ids = {"conversation_id": cid, "attachment_id": image, "name": backups[0]["name"]}
        for path in get_paths(relay):
            if path in SKIPPED:
                continue
            url = path.format(**ids) + QUERIES.get(path, "")
            answers[url] = relay.http.get(url, follow_redirects=False).status_code
    assert (rows(relay), files(relay.settings.data_dir)) == before, answers
    # Asked for real: every one answered 200 but the archived one's preview and backups of the
    # new one (it has none).
    refused = {url: status for url, status in answers.items() if status != 200}
    assert refused == {
        f"/api/conversations/{old}/compact": 409,
        f"/api/conversations/{new}/backups/{backups[0]['name']}": 404,
        f"/api/conversations/{new}/backups/{backups[0]['name']}/rendered": 404,
    }, refused
