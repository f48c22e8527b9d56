"""A short outage of Redis or PostgreSQL under a running turn: the turn goes on after it.

Two `python -m app serve` nodes on PostgreSQL + Redis (tests/cluster.py, the demo agent)
while the owner streams a long reply. Redis is paused (SIGSTOP: every command times out, as
with a network partition) for longer than the lease (3 s here), then resumed. Before, the
owner's next burst could not number its events and the turn was stopped ("The relay could not
store this turn"), and the heartbeat, waiting on Redis, renewed no lease: the other node took
the conversation over with "The relay restarted while this turn was running". The database
is cut off (its connections ended, new ones refused) for less than the lease (10 s there: the
leases live in it, and past a lease the other node takes over, as docs/deploy.md says).
"""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path
from typing import Any

import redis

from tests import postgres
from tests.cluster import LEASE_SECONDS, Nodes, cluster
from tests.crash import TIMEOUT, RelayProcess, of_kind
from tests.redis import RedisServer
from tests.test_cli_entry import refused

PAUSE = LEASE_SECONDS + 2.0  # seconds Redis answers nothing: past the lease
CUT = 3.0  # seconds the database takes no connection (its lease: 10 s)


def streaming(view: dict[str, Any]) -> bool:
    return any(e["state"] == "streaming" for e in of_kind(view, "agent"))


def test_a_turn_streaming_through_a_redis_pause_ends_whole_on_its_owner(tmp_path: Path) -> None:
    with cluster(tmp_path) as nodes:
        # A slower demo: its 220 pieces take about 11 s, the pause falls inside. A lease of 2 s
        # is shorter than a storage job waiting on Redis (2 s) plus a heartbeat: renewed behind
        # such jobs, it lapsed, and the other node took the turn over (every time, before).
        owner, _other = nodes.start(2, OARLOCK_DEMO_DELAY="0.05", OARLOCK_LEASE_SECONDS="2")
        cid = streaming_story(owner)
        redis = nodes.redis.process
        assert redis is not None
        redis.send_signal(signal.SIGSTOP)
        try:
            time.sleep(PAUSE)
        finally:
            redis.send_signal(signal.SIGCONT)
        assert_whole(nodes, cid)


def test_a_turn_streaming_through_a_database_cut_ends_whole_on_its_owner(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path) as nodes:
        owner, _other = nodes.start(2, OARLOCK_DEMO_DELAY="0.05", OARLOCK_LEASE_SECONDS="10")
        cid = streaming_story(owner)
        name = nodes.database_url.rsplit("/", 1)[1]
        admin = postgres.start().admin
        assert admin is not None
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            time.sleep(CUT)
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        assert_whole(nodes, cid)
        for node in nodes.nodes:  # an outage's lines, not a traceback at every heartbeat
            assert "Traceback" not in node.log.read_text(), node.log


def streaming_story(owner: RelayProcess) -> int:
    """A conversation whose long demo reply streams for a second now."""
    cid = owner.create(provider="demo", title="Through an outage")
    owner.send(cid, "slow story please")
    owner.wait_for(cid, streaming)
    time.sleep(1.0)
    return cid


def assert_whole(nodes: Nodes, cid: int) -> None:
    """Every node shows the reply ended whole, without a line (stopped, taken over)."""
    for node in nodes.nodes:
        view = node.wait_for(
            cid,
            lambda v: v["turn"] == {"state": "idle", "queued": 0} and not streaming(v),
            timeout=TIMEOUT,
        )
        lines = [e["text"] for e in of_kind(view, "line")]
        assert lines == [], lines  # neither "could not store" nor "the relay restarted"
        agent = of_kind(view, "agent")
        assert [e["state"] for e in agent] == ["done"], agent
        assert agent[0]["text"].startswith("You said: “slow story please”")
        assert agent[0]["text"].endswith("word199 word200"), agent[0]["text"][-80:]


def test_a_redis_that_cannot_be_used_at_start_is_one_line(tmp_path: Path) -> None:
    # A self-hoster's review: nothing listening, a wrong password, a database index out of
    # range… each was a 50-90 line traceback.
    url = postgres.start().create_database()
    try:
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            port = closed.getsockname()[1]  # closed again: nothing listens there
        env = {
            "OARLOCK_DATA_DIR": str(tmp_path / "data"),
            "OARLOCK_DATABASE_URL": url,
            "OARLOCK_REDIS_URL": f"redis://127.0.0.1:{port}/0",
            "OARLOCK_TOKEN": "a-token-long-enough-0123456789",
        }
        last = refused(["serve", "--port", "1"], env, tmp_path)
        assert last.startswith("OARLOCK_REDIS_URL cannot be used: Error 111 connecting"), last
        server = RedisServer().start()
        try:
            with redis.Redis.from_url(server.url) as client:
                client.config_set("requirepass", "sekrit-password")
            for given, said in (
                (server.url, "the server needs a password (redis://:password@host:port/0)"),
                (server.url.replace("//", "//:wrong@"), "invalid username-password pair"),
            ):
                last = refused(
                    ["serve", "--port", "1"], env | {"OARLOCK_REDIS_URL": given}, tmp_path
                )
                assert last.startswith("OARLOCK_REDIS_URL cannot be used: ") and said in last, last
        finally:
            server.stop()
    finally:
        postgres.start().drop_database(url)
