"""Honest delivery after a crash: a relay (a real process) is SIGKILLed in the middle of a turn.

With the real Claude Code CLI against tests/fake_anthropic.py: a message the CLI received is
not sent again (its turn is shown cut); a message it never received is delivered again and
answered once. With the demo agent (which keeps no record) the cut turn offers Resend.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.agents.transcript import holds_prompt, prompt_received
from app.handoff import first_message
from app.supervisor import MISSED_AGAIN_LINE, REDELIVERED_LINE, RESTART_LINE, UNKNOWN_LINE
from tests.crash import TIMEOUT, RelayProcess, entry, of_kind
from tests.fake_anthropic import FakeAnthropic, last_user_text
from tests.relay import TOKEN


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[RelayProcess]:
    process = RelayProcess(tmp_path / "data")
    try:
        yield process
    finally:
        process.close()


@pytest.fixture
def cli_pids(home: Path) -> Iterator[list[int]]:
    """Processes the test must reap: CLIs the killed relay left running, held wrappers."""
    pids: list[int] = []
    yield pids
    for pid in pids + session_pids(home):
        kill_pid(pid)


# helpers -----------------------------------------------------------------------------------


def session_pids(home: Path) -> list[int]:
    """The CLI processes of this HOME (the CLI names each in ~/.claude/sessions/<pid>.json)."""
    pids = []
    for path in (home / ".claude" / "sessions").glob("*.json"):
        try:
            pids.append(int(json.loads(path.read_text())["pid"]))
        except (OSError, ValueError, KeyError):
            continue
    return pids


def kill_pid(pid: int) -> None:
    """SIGKILL a process if it still runs, and wait until it is gone (or a zombie)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.02)


def crash(relay: RelayProcess, home: Path, cli_pids: list[int]) -> None:
    """SIGKILL the relay and its CLIs (a crash of the machine's relay, its agents with it)."""
    cli_pids += session_pids(home)
    relay.kill()
    for pid in cli_pids:
        kill_pid(pid)


def transcript_lines(home: Path) -> list[dict[str, Any]]:
    """Every record of every session transcript under HOME."""
    records = []
    for path in (home / ".claude" / "projects").glob("*/*.jsonl"):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records


def wait_until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def prompts_sent(fake: FakeAnthropic, text: str) -> int:
    """How many Messages requests the fake got whose last user text is text (its turn's start)."""
    return sum(1 for body in fake.message_bodies() if last_user_text(body) == text)


def held_cli(tmp_path: Path) -> tuple[Path, Path]:
    """A CLI wrapper that waits while a hold file exists, then runs the bundled CLI.

    It records its pid (the CLI's, after exec) so the test can reap it. Returns the wrapper
    and the hold file.
    """
    from claude_agent_sdk._internal.transport.subprocess_cli import SubprocessCLITransport

    real = SubprocessCLITransport._find_bundled_cli(None)  # type: ignore[arg-type]
    assert real, "the bundled claude CLI is missing"
    hold = tmp_path / "hold"
    pids = tmp_path / "wrapper.pids"
    wrapper = tmp_path / "claude-held"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'echo $$ >> "{pids}"\n'
        f'while [ -e "{hold}" ]; do sleep 0.05; done\n'
        f'exec "{real}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper, hold


def wrapper_pids(tmp_path: Path) -> list[int]:
    path = tmp_path / "wrapper.pids"
    return [int(p) for p in path.read_text().split()] if path.exists() else []


# Claude Code: received, so cut --------------------------------------------------------------


def test_message_the_cli_received_is_shown_cut_not_sent_again(
    relay: RelayProcess, fake: FakeAnthropic, home: Path, cli_pids: list[int]
) -> None:
    fake.long_word_delay = 0.2  # the reply streams for a minute: the kill lands mid-turn
    relay.start()
    cid = relay.create(provider="claude", title="Cut")
    relay.send(cid, "first")
    relay.wait_idle(cid)
    second = relay.send(cid, "second [[LONG:300]]")
    relay.wait_for(cid, lambda v: any(e["state"] == "streaming" for e in of_kind(v, "agent")))
    assert prompts_sent(fake, "second [[LONG:300]]") == 1  # the CLI got it and asked the API
    view = relay.get(cid)
    prompt_id = entry(view, second["id"])["data"]["prompt_uuid"]
    # The CLI writes its transcript in batches; a kill of the relay's whole process group
    # would take it down too: wait for the record, then kill both.
    wait_until(
        lambda: any(r.get("uuid") == prompt_id for r in transcript_lines(home)),
        "the transcript never recorded the prompt",
    )
    crash(relay, home, cli_pids)
    relay.start()
    view = relay.wait_idle(cid)
    lines = of_kind(view, "line")
    assert [(e["text"], e["data"]) for e in lines] == [
        (
            RESTART_LINE,
            {"level": "warning", "type": "cut", "entry_id": second["id"], "received": True},
        )
    ]
    cut = entry(view, second["id"])
    assert cut["state"] == "sent"
    assert cut["data"]["cut"] == "received"
    assert prompts_sent(fake, "second [[LONG:300]]") == 1  # not delivered again
    # Resend stays possible (the reply was cut), once.
    fake.long_word_delay = 0.001
    assert (
        relay.client.post(f"/api/conversations/{cid}/messages/{cut['id']}/resend").status_code
        == 202
    )
    relay.wait_idle(cid)
    assert prompts_sent(fake, "second [[LONG:300]]") == 2


def test_a_reply_streaming_when_the_relay_is_killed_keeps_its_text_to_the_last_second(
    relay: RelayProcess, fake: FakeAnthropic, home: Path, cli_pids: list[int]
) -> None:
    # A review found no text after a kill -9: it came less than a second after the reply began,
    # before its first checkpoint. Past that, what was stored stays, cut (README, After a crash).
    fake.long_word_delay = 0.1
    relay.start()
    cid = relay.create(provider="claude", title="Killed while streaming")
    relay.send(cid, "tell me [[LONG:300]]")
    relay.wait_for(cid, lambda v: any(e["state"] == "streaming" for e in of_kind(v, "agent")))
    time.sleep(4)
    (shown,) = of_kind(relay.get(cid), "agent")
    crash(relay, home, cli_pids)
    relay.start()
    (kept,) = of_kind(relay.wait_idle(cid), "agent")
    assert kept["state"] == "interrupted"
    # (Both are the reply's beginning; a checkpoint between the look and the kill keeps more.)
    text, seen = kept["text"], shown["text"]
    assert text and (seen.startswith(text) or text.startswith(seen)), (kept, shown)
    # A word each 0.1 s: what was shown at the kill (about 40 words), but for about its last
    # second (15 words: the last second's 10 and the time the kill took).
    assert len(kept["text"].split()) >= len(shown["text"].split()) - 15, (kept, shown)


def test_a_message_whose_reply_was_stored_is_not_sent_again_before_the_transcript_says_so(
    relay: RelayProcess, fake: FakeAnthropic, home: Path, cli_pids: list[int], tmp_path: Path
) -> None:
    """Killed before the CLI wrote its transcript's batch (it dies with the relay): the relay's
    own record of the turn (the agent's text, a tool call) says the CLI got the prompt.

    Found by a hostile review: the message was delivered again, the tool it asked for ran
    twice, and the timeline said the agent had never received it.
    """
    relay.start()
    cid = relay.create(provider="claude", title="Write", permission_mode="acceptEdits")
    relay.send(cid, "first")
    relay.wait_idle(cid)
    text = f"[[WRITE:{tmp_path / 'f.txt'}|hello]]"
    message = relay.send(cid, text)
    relay.wait_for(cid, lambda v: bool(of_kind(v, "activity")))  # the Write call is stored
    crash(relay, home, cli_pids)
    relay.start()
    view = relay.wait_idle(cid)
    assert prompts_sent(fake, text) == 1  # not delivered again
    [cut_line] = of_kind(view, "line")
    assert (cut_line["text"], cut_line["data"]["received"]) == (RESTART_LINE, True)
    assert entry(view, message["id"])["data"]["cut"] == "received"
    assert not [e for e in of_kind(view, "line") if e["text"] == REDELIVERED_LINE]


# Claude Code: never received, so delivered again ----------------------------------------------


@pytest.mark.parametrize("first_turn", [True, False], ids=["resumed-session", "new-session"])
def test_message_the_cli_never_received_is_delivered_again_once(
    relay: RelayProcess,
    fake: FakeAnthropic,
    home: Path,
    cli_pids: list[int],
    tmp_path: Path,
    first_turn: bool,
) -> None:
    wrapper, hold = held_cli(tmp_path)
    relay.start(OARLOCK_CLAUDE_CLI=str(wrapper))
    cid = relay.create(provider="claude", title="Held")
    if first_turn:  # a session exists: the relay checks its transcript by id
        relay.send(cid, "first")
        relay.wait_idle(cid)
        relay.kill(signal.SIGTERM)  # a clean stop closes the CLI: the next message starts one
        relay.start(OARLOCK_CLAUDE_CLI=str(wrapper))
    hold.touch()  # the next CLI waits before it starts: it never reads the prompt
    message = relay.send(cid, "held back")
    relay.wait_for(cid, lambda v: entry(v, message["id"])["state"] == "sent")
    wait_until(lambda: len(wrapper_pids(tmp_path)) == 1 + first_turn, "the CLI never spawned")
    relay.kill()
    for pid in wrapper_pids(tmp_path):
        kill_pid(pid)
    assert prompts_sent(fake, "held back") == 0
    hold.unlink()

    relay.start(OARLOCK_CLAUDE_CLI=str(wrapper))
    view = relay.wait_idle(cid)
    cli_pids += session_pids(home)
    assert prompts_sent(fake, "held back") == 1
    again = entry(view, message["id"])
    assert again["state"] == "sent"
    assert again["data"]["redelivered"] is True
    redelivered = [e for e in of_kind(view, "line") if e["text"] == REDELIVERED_LINE]
    assert [e["data"] for e in redelivered] == [
        {"level": "warning", "type": "redelivered", "entry_id": message["id"]}
    ]
    replies = [e["text"] for e in of_kind(view, "agent")]
    assert replies.count("You said: held back") == 1
    # in order: the line, then the message, then its one reply
    order = [e["id"] for e in view["timeline"]]
    reply = next(e for e in of_kind(view, "agent") if e["text"] == "You said: held back")
    assert order.index(redelivered[0]["id"]) < order.index(message["id"]) < order.index(reply["id"])
    assert not [e for e in of_kind(view, "line") if e["text"] in (RESTART_LINE, UNKNOWN_LINE)]


def test_restart_waits_for_a_cli_left_running_before_it_decides(
    relay: RelayProcess,
    fake: FakeAnthropic,
    home: Path,
    cli_pids: list[int],
    tmp_path: Path,
) -> None:
    """Only the relay is killed: A's CLI goes on with its turn, in the cwd B's new session has.

    While it runs, nothing says whether B's CLI (held, then killed) wrote B's prompt: the
    restarted relay waits for it to exit, then delivers B again instead of offering Resend.
    """
    fake.long_word_delay = 0.15  # A's reply takes about 9 s, past the relay's restart
    wrapper, hold = held_cli(tmp_path)
    cli = {"OARLOCK_CLAUDE_CLI": str(wrapper)}
    relay.start(**cli)
    a = relay.create(provider="claude", title="A")
    b = relay.create(provider="claude", title="B")
    busy = relay.send(a, "busy [[LONG:60]]")
    relay.wait_for(a, lambda v: any(e["state"] == "streaming" for e in of_kind(v, "agent")))
    hold.touch()
    held = relay.send(b, "held back")
    relay.wait_for(b, lambda v: entry(v, held["id"])["state"] == "sent")
    wait_until(lambda: len(wrapper_pids(tmp_path)) == 2, "B's CLI never spawned")
    orphans = session_pids(home)
    assert len(orphans) == 1  # A's CLI; B's is still held
    cli_pids += orphans
    relay.kill()
    kill_pid(wrapper_pids(tmp_path)[1])  # B's held CLI never starts
    hold.unlink()

    relay.start(**cli)
    view_b = relay.wait_idle(b)
    assert prompts_sent(fake, "held back") == 1
    assert [e["text"] for e in of_kind(view_b, "line")] == [REDELIVERED_LINE]
    assert [e["text"] for e in of_kind(view_b, "agent")] == ["You said: held back"]
    view_a = relay.wait_idle(a)
    assert [(e["text"], e["data"]["received"]) for e in of_kind(view_a, "line")] == [
        (RESTART_LINE, True)
    ]
    assert entry(view_a, busy["id"])["data"]["cut"] == "received"
    assert prompts_sent(fake, "busy [[LONG:60]]") == 1


@pytest.mark.parametrize("compacted", [False, True])
def test_a_message_missed_twice_offers_resend_instead_of_a_third_delivery(
    relay: RelayProcess,
    fake: FakeAnthropic,
    home: Path,
    cli_pids: list[int],
    tmp_path: Path,
    compacted: bool,
) -> None:
    wrapper, hold = held_cli(tmp_path)
    cli = {"OARLOCK_CLAUDE_CLI": str(wrapper)}
    relay.start(**cli)
    cid = relay.create(provider="claude", title="Held twice")
    summary = None
    if compacted:  # the message is the first of a compacted conversation: it carries a summary
        relay.send(cid, "remember the kestrel plan")
        relay.wait_idle(cid)
        answer = relay.client.post(f"/api/conversations/{cid}/messages", json={"text": "/compact"})
        cid = answer.json()["compacted_into"]["id"]
        summary = relay.get(cid)["pending_summary"]
        assert "kestrel" in summary
    spawned_before = len(wrapper_pids(tmp_path))
    hold.touch()
    message = relay.send(cid, "held back")
    for spawned, condition in enumerate(
        [
            lambda e: e["state"] == "sent",
            lambda e: e["state"] == "sent" and e["data"].get("redelivered") is True,
        ],
        start=1,
    ):
        relay.wait_for(cid, lambda v, condition=condition: condition(entry(v, message["id"])))
        wait_until(
            lambda n=spawned: len(wrapper_pids(tmp_path)) == spawned_before + n,
            "the CLI never spawned",
        )
        relay.kill()
        for pid in wrapper_pids(tmp_path):
            kill_pid(pid)
        if spawned == 1:
            relay.start(**cli)  # delivered again, and held again
    hold.unlink()

    relay.start(**cli)
    view = relay.wait_idle(cid)
    assert prompts_sent(fake, "held back") == 0
    assert [(e["text"], e["data"]) for e in of_kind(view, "line")] == [
        (
            REDELIVERED_LINE,
            {"level": "warning", "type": "redelivered", "entry_id": message["id"]},
        ),
        (
            MISSED_AGAIN_LINE,
            {
                "level": "warning",
                "type": "cut",
                "entry_id": message["id"],
                "received": False,
                "resend": True,
            },
        ),
    ]
    assert entry(view, message["id"])["data"]["cut"] == "missed"
    # Never received: its carry-over waits for the conversation's next message (found by a
    # review: a Resend went without it, and the old conversation's context was lost).
    assert view["pending_summary"] == summary
    url = f"/api/conversations/{cid}/messages/{message['id']}/resend"
    assert relay.client.post(url).status_code == 202
    view = relay.wait_idle(cid)
    cli_pids += session_pids(home)
    sent = [last_user_text(b) for b in fake.message_bodies()]
    assert [text for text in sent if text.endswith("held back")] == [
        first_message(summary, "held back") if summary else "held back"
    ]
    assert [e["text"] for e in of_kind(view, "agent")] == [f"You said: {sent[-1]}"]


# The demo agent keeps no record: Resend ------------------------------------------------------


def test_demo_cut_turn_offers_resend_and_resend_answers(relay: RelayProcess) -> None:
    relay.start(OARLOCK_DEMO_DELAY="20")  # its first word 20 s after the turn began: none stored
    cid = relay.create(provider="demo", title="Demo")
    message = relay.send(cid, "please be slow")
    relay.wait_for(cid, lambda v: entry(v, message["id"])["state"] == "sent")
    relay.kill()

    relay.start(OARLOCK_DEMO_DELAY="0.005")
    view = relay.wait_idle(cid)
    [cut_line] = of_kind(view, "line")
    assert cut_line["text"] == UNKNOWN_LINE
    assert cut_line["data"] == {
        "level": "warning",
        "type": "cut",
        "entry_id": message["id"],
        "received": None,
        "resend": True,
    }
    assert entry(view, message["id"])["data"]["cut"] == "unknown"
    url = f"/api/conversations/{cid}/messages/{message['id']}/resend"

    # Origin-checked like every POST made with the cookie
    foreign = relay.client.post(url, headers={"Origin": "http://evil.example"})
    assert foreign.status_code == 403, foreign.text
    login = relay.client.get(f"/?token={TOKEN}", follow_redirects=False)  # a session cookie
    session_cookie = login.headers["set-cookie"].split(";")[0]
    relay.client.cookies.clear()
    cookie = relay.client.post(url, headers={"Authorization": "", "Cookie": session_cookie})
    assert cookie.status_code == 403, cookie.text  # the cookie without an Origin
    assert relay.get(cid)["turn"] == {"state": "idle", "queued": 0}

    response = relay.client.post(url)
    assert response.status_code == 202, response.text
    resent = response.json()
    assert (resent["kind"], resent["state"], resent["text"]) == ("user", "queued", "please be slow")
    assert resent["data"] == {"resent_from": message["id"]}
    view = relay.wait_idle(cid)
    assert entry(view, message["id"])["data"]["resent"] is True
    assert entry(view, cut_line["id"])["data"]["resent"] is True
    done = [e for e in of_kind(view, "agent") if e["state"] == "done"]
    assert [e["text"].split("”")[0] for e in done] == ["You said: “please be slow"]

    again = relay.client.post(url)
    assert again.status_code == 409
    assert again.json() == {"detail": "This message was already resent."}
    not_cut = relay.client.post(f"/api/conversations/{cid}/messages/{resent['id']}/resend")
    assert not_cut.status_code == 409
    missing = relay.client.post(f"/api/conversations/{cid}/messages/{cut_line['id']}/resend")
    assert missing.status_code == 404
    assert len(of_kind(relay.get(cid), "user")) == 2  # nothing stored by the refusals


def test_a_resent_first_message_of_a_compacted_conversation_carries_its_summary(
    relay: RelayProcess,
) -> None:
    # Found by a review: the cut message had taken the carry-over with it, and its Resend
    # went without: the old conversation's context never reached the agent.
    relay.start(OARLOCK_DEMO_DELAY="0.005")
    old = relay.create(provider="demo", title="Before")
    relay.send(old, "remember the kestrel plan")
    relay.wait_idle(old)
    compacted = relay.client.post(f"/api/conversations/{old}/messages", json={"text": "/compact"})
    assert compacted.status_code == 201, compacted.text
    cid = compacted.json()["compacted_into"]["id"]
    summary = relay.get(cid)["pending_summary"]
    assert "kestrel" in summary
    relay.kill()
    relay.start(OARLOCK_DEMO_DELAY="20")  # its first word 20 s after the turn began: none stored
    message = relay.send(cid, "please be slow")
    relay.wait_for(cid, lambda v: entry(v, message["id"])["state"] == "sent")
    assert relay.get(cid)["pending_summary"] is None  # it went out with the message
    relay.kill()

    relay.start(OARLOCK_DEMO_DELAY="0.005")
    view = relay.wait_idle(cid)
    assert [e["text"] for e in of_kind(view, "line")] == [UNKNOWN_LINE]
    assert view["pending_summary"] is None  # maybe it arrived: the user decides (Resend)
    url = f"/api/conversations/{cid}/messages/{message['id']}/resend"
    resent = relay.client.post(url).json()
    view = relay.wait_idle(cid)
    assert entry(view, resent["id"])["data"]["summary"] == summary  # it went with this one
    assert "summary" not in entry(view, message["id"])["data"]  # and only once
    assert view["pending_summary"] is None
    [reply] = [e for e in of_kind(view, "agent") if e["state"] == "done"]
    assert reply["text"].startswith("You said: “[Carry-over")


def test_a_cut_turn_whose_reply_was_stored_is_received_whatever_the_agent_recorded(
    relay: RelayProcess,
) -> None:
    """The demo keeps no record, but its streamed text was stored: it got the message."""
    relay.start(OARLOCK_DEMO_DELAY="0.2")  # "slow" streams 200 words: the kill lands mid-turn
    cid = relay.create(provider="demo", title="Demo")
    relay.send(cid, "please be slow")
    relay.wait_for(cid, lambda v: any(e["state"] == "streaming" for e in of_kind(v, "agent")))
    relay.kill()
    relay.start(OARLOCK_DEMO_DELAY="0.005")
    view = relay.wait_idle(cid)
    [cut_line] = of_kind(view, "line")
    assert (cut_line["text"], cut_line["data"]["received"]) == (RESTART_LINE, True)
    assert "resend" not in cut_line["data"]
    assert [e["state"] for e in of_kind(view, "agent")] == ["interrupted"]


def test_resend_in_an_archived_conversation_is_refused(relay: RelayProcess) -> None:
    relay.start(OARLOCK_DEMO_DELAY="0.2")
    cid = relay.create(provider="demo", title="Archived")
    message = relay.send(cid, "please be slow")
    relay.wait_for(cid, lambda v: any(e["state"] == "streaming" for e in of_kind(v, "agent")))
    relay.kill()
    relay.start(OARLOCK_DEMO_DELAY="0.005")
    relay.wait_idle(cid)
    response = relay.client.post(f"/api/conversations/{cid}/messages", json={"text": "/compact"})
    assert response.status_code == 201, response.text
    refused = relay.client.post(f"/api/conversations/{cid}/messages/{message['id']}/resend")
    assert refused.status_code == 409
    assert refused.json() == {
        "detail": "This conversation is archived; it can be read, not written."
    }
    assert len(of_kind(relay.get(cid), "user")) == 1


# The transcript reading, on files -------------------------------------------------------------


def write_transcript(config: Path, session_id: str, records: list[dict[str, Any]]) -> Path:
    path = config / "projects" / "-work" / f"{session_id}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_transcript_holds_only_a_user_record_with_that_uuid(tmp_path: Path) -> None:
    path = write_transcript(
        tmp_path,
        "s1",
        [
            {"type": "user", "uuid": "u-1", "message": {"content": "hi"}},
            {"type": "assistant", "uuid": "u-2", "parentUuid": "u-3"},
        ],
    )
    path.write_text(path.read_text() + '{"type": "user", "uuid": "u-3"')  # a torn last line
    assert holds_prompt(path, "u-1")
    assert not holds_prompt(path, "u-2")  # not a user record
    assert not holds_prompt(path, "u-3")  # only named, or torn
    assert not holds_prompt(path, "u-4")


def test_prompt_received_answers_true_false_or_cannot_know(tmp_path: Path) -> None:
    config = tmp_path / "config"
    env = {"CLAUDE_CONFIG_DIR": str(config)}
    cwd = Path("/work")
    write_transcript(config, "s1", [{"type": "user", "uuid": "u-1"}])
    now = time.time()
    assert prompt_received(env, cwd, "s1", "u-1", now) is True
    assert prompt_received(env, cwd, "s1", "u-2", now) is False
    assert prompt_received(env, cwd, "other", "u-1", now) is False  # another session's record
    assert prompt_received(env, cwd, None, "u-1", now) is True  # a new session: searched
    assert prompt_received(env, cwd, None, "u-1", now + 3600) is False  # files older than the send
    sessions = config / "sessions"
    sessions.mkdir()
    # A CLI of the session still runs (this test's own pid): it may yet record the prompt.
    (sessions / "1.json").write_text(json.dumps({"pid": os.getpid(), "sessionId": "s1"}))
    assert prompt_received(env, cwd, "s1", "u-2", now) is None
    assert prompt_received(env, cwd, "s2", "u-2", now) is False
    (sessions / "1.json").write_text(json.dumps({"pid": os.getpid(), "cwd": "/work"}))
    assert prompt_received(env, cwd, None, "u-2", now) is None
    child = subprocess.Popen(["sleep", "60"])  # a CLI this relay runs itself: not left over
    try:
        (sessions / "1.json").write_text(json.dumps({"pid": child.pid, "sessionId": "s1"}))
        assert prompt_received(env, cwd, "s1", "u-2", now) is False
    finally:
        child.kill()
        child.wait()
    dead = 2**22 + 12345  # above pid_max's default: no such process
    (sessions / "1.json").write_text(json.dumps({"pid": dead, "sessionId": "s1"}))
    assert prompt_received(env, cwd, "s1", "u-2", now) is False
    home_env = {"HOME": str(tmp_path / "home")}  # without CLAUDE_CONFIG_DIR: $HOME/.claude
    write_transcript(tmp_path / "home" / ".claude", "s9", [{"type": "user", "uuid": "u-9"}])
    assert prompt_received(home_env, cwd, "s9", "u-9", now) is True
