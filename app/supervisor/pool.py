"""The agent pool: processes started on demand, fitted to the memory budget, reaped when idle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from app import archive, store
from app.agent_memory import Live, fits, starting_size, to_stop, tree_rss
from app.agents.base import (
    Agent,
    AgentSpec,
    Exits,
    PermissionDecision,
    PermissionRequest,
    SwitchesMode,
    SwitchesModel,
)
from app.limits import give_back_memory
from app.models import Conversation
from app.providers import CLAUDE_CLI_PROVIDERS, agent_env, load_provider, provider_loaded
from app.questions import EXPIRED_AGENT, EXPIRED_SHUTDOWN
from app.supervisor.base import SupervisorState
from app.supervisor.runner import Runner, TurnState, Watched, failure_reason
from app.tools import relay_tools
from app.trust import (
    UntrustedSettings,
    new_settings,
    project_settings,
    trusted_by_claude,
    unlisted,
)
from app.views import effective_window
from app.window import ENV_VAR, restart_line
from app.workspace import usable_cwd

log = logging.getLogger(__name__)

STOPPED_BY_USER = "Stopped by the user."  # what the agent is told of a question Stop denied
SHUTDOWN_WORK_LINE = "The relay stopped; the agent's background work ended with it."
ARCHIVED_WORK_LINE = "The conversation was archived; the agent's background work ended with it."


REFRESH_SECONDS = 3.0  # the longest the 🧠 modal waits for the agent's own report
SETTINGS_WATCH = 1.0  # seconds between looks at a live Claude Code agent's project settings


class NoRoom(Exception):
    """A warm-up not started: the agents running or starting fill the memory budget."""


class ModelRefused(Exception):
    """The live agent would not take the model chosen (a name Claude Code does not know...)."""

    def __init__(self, model: str | None, reason: str) -> None:
        super().__init__(f"Claude Code did not take the model “{model}”: {reason}")
        self.model = model


class Pool(SupervisorState):
    """The agent processes (mixed into Supervisor)."""

    async def _warmed(self, runner: Runner) -> None:
        """Wait for a warm-up under way (started or failed), so that a close closes its agent.

        Without it, a runner dropped while its warm-up starts the agent gets that agent after,
        with nothing left to stop it.
        """
        warming = runner.warming
        if warming is not None and not warming.done() and warming is not asyncio.current_task():
            await asyncio.wait({warming})  # never raises its error, never cancels it

    async def _ensure_agent(self, runner: Runner, *, warm_up: bool = False) -> Agent:
        """The runner's live agent, started if need be (NoRoom: a warm-up the budget refuses)."""
        warming = runner.warming
        if warming is not None and warming is not asyncio.current_task():
            # A warm-up under way: its agent serves this turn (if it fails, this one starts).
            await asyncio.wait({warming})  # never raises its error, never cancels it
        if runner.agent is not None:
            await self._look_again(runner)  # UntrustedSettings: stopped, the line says why
            return runner.agent
        conversation = await self._conversation(runner.conversation_id)
        # Checked again at each start (WorkspaceError: the turn's error line says why): the
        # roots may have changed, the directory gone, a symlink on its way pointed elsewhere.
        cwd = await asyncio.to_thread(usable_cwd, conversation.cwd, self.settings.roots)
        if conversation.provider in CLAUDE_CLI_PROVIDERS:  # UntrustedSettings: the line says why
            await self._check_trust(runner, conversation, cwd)
        if not provider_loaded(conversation.provider):  # its first agent: its SDK's import
            await asyncio.to_thread(load_provider, conversation.provider)
        spec = self._agent_spec(conversation, runner)
        agent = self.agent_factory(conversation.provider, spec, self.settings)
        runner.starting = True
        self.publish_agent(runner.conversation_id)
        try:
            # Room first, sized as the largest live agent, so that the peak stays in budget.
            # A message's agent starts whatever the rest hold (their turns are never stopped);
            # a warm-up only when the budget holds it, with every agent starting meanwhile.
            room = await self._fit_budget(exclude=runner.conversation_id, incoming=True)
            if warm_up and not room:
                raise NoRoom(runner.conversation_id)
            await agent.start()
        except BaseException:
            runner.starting = False
            self.publish_agent(runner.conversation_id)
            raise
        runner.agent, runner.starting = agent, False
        runner.agent_mode, runner.agent_model = spec.permission_mode, spec.model
        runner.mode_echoes.clear()
        runner.last_used = time.monotonic()  # its idle time starts now, not at the request
        self.publish_agent(runner.conversation_id)
        await self._fit_budget(exclude=runner.conversation_id)  # now with its real size
        if conversation.applied_window != conversation.auto_compact_window:
            await self.storage.write(self._applied, conversation)
        if runner.changed_while_starting:  # a mode or model chosen after the read above
            runner.changed_while_starting = False
            await self.apply_mode_here(runner.conversation_id)
            await self.apply_model_here(runner.conversation_id)
        return agent

    async def _check_trust(self, runner: Runner, conversation: Conversation, cwd: Path) -> None:
        """Refuse to start an agent with project files nobody trusted for its folder (they
        appeared since: UntrustedSettings); a conversation from before they were recorded
        (migration 0015) records what it finds, as the question was asked at its creation.
        What was trusted is watched while the agent lives (_look_again, _watch_settings).
        cwd: the folder resolved now, as the agent will see it (its parents are the ones
        Claude Code looks in, should a folder on the stored path have become a symlink)."""
        trusted = conversation.trusted_settings
        if trusted is None:
            trusted = await asyncio.to_thread(project_settings, cwd)
            await self.storage.write(self._trusted, conversation.id or 0, trusted)
        env = agent_env(conversation.provider, self.settings, None)
        new = await asyncio.to_thread(new_settings, trusted, cwd, env)
        if new:
            raise UntrustedSettings(new)
        runner.watched = Watched(cwd, trusted, env)

    async def _untrusted_now(self, runner: Runner) -> list[str]:
        """The files a live agent's folder has that nobody trusted (none when not watched)."""
        watched = runner.watched
        if watched is None or runner.agent is None:
            return []
        found = await asyncio.to_thread(unlisted, watched.trusted, watched.cwd)
        if found and await asyncio.to_thread(trusted_by_claude, watched.env, watched.cwd):
            # Claude Code's own record trusts the folder: not read again at every look.
            runner.watched = replace(watched, trusted=[*watched.trusted, *found])
            return []
        return found

    async def _stop_untrusted(self, runner: Runner) -> list[str]:
        """Stop a live agent whose folder got project files nobody trusted; those files (none:
        it goes on). Claude Code reads its settings files again when they change."""
        new = await self._untrusted_now(runner)
        if not new or runner.watched is None:
            return []
        log.warning(
            "conversation %s: untrusted Claude Code settings appeared (%s): its agent is stopped",
            runner.conversation_id,
            ", ".join(new),
        )
        runner.watched = None
        runner.stopped_untrusted = runner.state != TurnState.IDLE  # (_end_turn clears it)
        await self._close_agent(runner)
        return new

    async def _look_again(self, runner: Runner) -> None:
        """Before a turn: files that appeared since the live agent started stop it
        (UntrustedSettings: the turn's line says so)."""
        if new := await self._stop_untrusted(runner):
            raise UntrustedSettings(new)

    async def _watch_settings(self) -> None:
        """Every second, stop each live Claude Code agent whose folder got project settings
        nobody trusted (a running turn with it), with a line whose button trusts them."""
        while True:
            await asyncio.sleep(SETTINGS_WATCH)
            for runner in list(self.runners.values()):
                try:
                    if new := await self._stop_untrusted(runner):
                        text = str(UntrustedSettings(new, stopped=True))
                        await self._error_line_soon(runner, text, {"trust": new, "again": False})
                except Exception:  # the next pass looks again
                    log.exception("watching the settings of %s failed", runner.conversation_id)

    def _trusted(self, conversation_id: int, files: list[str]) -> None:
        with self.session() as session:
            store.trust_settings(session=session, conversation_id=conversation_id, files=files)
            session.commit()

    async def _apply_mode(self, runner: Runner, mode: str, *, turn_begins: bool) -> None:
        """Give the live agent the conversation's permission mode, if it runs with another.

        Switched in place when the agent can (Claude Code: from its next tool call, even in
        the middle of a turn); else the agent is closed, to resume with the new mode: at
        once when idle, at the next turn's start when one runs (turn_begins). One switch at a
        time per conversation: a second, asked while the first waits for the agent, compares
        with what the first has set.
        """
        async with runner.switching:
            agent = runner.agent
            if agent is None or runner.agent_mode == mode:
                return
            if isinstance(agent, SwitchesMode):
                runner.mode_echoes.append(mode)  # before the request: its echo may come first
                try:
                    switched = await agent.switch_mode(mode)
                except BaseException:
                    runner.mode_echoes.pop()
                    raise
                if switched:
                    runner.agent_mode = mode
                    return
                runner.mode_echoes.pop()  # not switched: no echo comes
            idle = runner.state == TurnState.IDLE and not runner.starting
            # (background work: a restart would kill it; applied at a turn after it)
            if (turn_begins or idle) and not agent.background_work():
                await self._close_agent(runner)

    async def _apply_model(self, runner: Runner, model: str | None) -> None:
        """Give the live agent the conversation's chosen model (ModelRefused: it would not)."""
        async with runner.switching:
            agent = runner.agent
            if not isinstance(agent, SwitchesModel) or runner.agent_model == model:
                return
            try:
                await agent.switch_model(model)
            except Exception as error:  # a name Claude Code does not know, the API unreachable
                raise ModelRefused(model, failure_reason(error)) from error
            runner.agent_model = model

    async def apply_mode(self, conversation: Conversation) -> None:
        """A conversation's permission mode changed: its live agent follows (_apply_mode), on
        the node that runs it (told at once: a running turn's next tool call has the mode)."""
        cid = conversation.id or 0
        if self.cluster is not None and not self.cluster.holds(cid):
            self.cluster.send("mode", cid)
            return
        await self.apply_mode_here(cid)

    async def apply_mode_here(self, conversation_id: int) -> None:
        """This node's live agent of the conversation takes its permission mode, as stored when
        its turn to switch comes (the last choice wins, in whatever order they were told)."""
        runner = self.runners.get(conversation_id)
        if runner is None or not _live(runner):
            return
        conversation = await self._conversation(conversation_id)
        try:
            await self._apply_mode(runner, conversation.permission_mode, turn_begins=False)
        except Exception:  # the CLI did not answer: stored, it is applied as the next turn begins
            log.warning("conversation %s: mode not switched now", conversation_id, exc_info=True)
            runner.agent_mode = None  # unknown: the next turn's start switches it

    async def apply_model(self, conversation: Conversation) -> None:
        """A conversation's chosen model changed: its live agent uses it from its next request,
        on the node that runs it (ModelRefused here: the choice is put back)."""
        cid = conversation.id or 0
        if self.cluster is not None and not self.cluster.holds(cid):
            self.cluster.send("model", cid)
            return
        await self.apply_model_here(cid, said=False)

    async def apply_model_here(self, conversation_id: int, *, said: bool = True) -> None:
        """This node's live agent of the conversation takes its chosen model, as stored now.

        Refused, the choice goes back to the model the agent runs with; said: a line in the
        timeline says so (no one who asked is waiting for an answer).
        """
        runner = self.runners.get(conversation_id)
        if runner is None or not _live(runner):
            return
        conversation = await self._conversation(conversation_id)
        try:
            await self._apply_model(runner, conversation.chosen_model)
        except ModelRefused as refused:
            await self.storage.write(self._model_back, runner, refused, said)
            if not said:
                raise

    async def _model_for_turn(self, runner: Runner, model: str | None) -> None:
        """The chosen model, as a turn begins; refused, the turn goes on with the agent's."""
        try:
            await self._apply_model(runner, model)
        except ModelRefused as refused:
            await self.storage.write(self._model_back, runner, refused, True)

    def _model_back(self, runner: Runner, refused: ModelRefused, said: bool) -> None:
        """Put a refused model choice back to the one the agent runs with."""
        with self.session() as session:
            conversation = store.lock_conversation(
                session=session, conversation_id=runner.conversation_id
            )
            if conversation is None or conversation.chosen_model != refused.model:
                return  # chosen again since
            store.update_conversation(
                session=session, conversation=conversation, chosen_model=runner.agent_model
            )
            self.publish_conversation(conversation)
            if said:
                self._line(session, conversation, str(refused), level="warning")

    def _applied(self, conversation: Conversation) -> None:
        with self.session() as session:
            session.add(conversation)
            store.update_conversation(
                session=session,
                conversation=conversation,
                applied_window=conversation.auto_compact_window,
            )

    def _agent_spec(self, conversation: Conversation, runner: Runner | None) -> AgentSpec:
        """What the conversation's agent starts with; without a runner it asks nothing."""

        async def ask(request: PermissionRequest) -> PermissionDecision:
            if runner is None:
                return PermissionDecision(False, "No turn is running.")
            return await self._ask(runner, request, conversation.cwd)  # (the agent's cwd)

        return AgentSpec(
            conversation_id=conversation.id or 0,
            cwd=Path(conversation.cwd),
            session_id=conversation.session_id,
            permission_mode=conversation.permission_mode,
            model=conversation.chosen_model,
            auto_compact_window=conversation.auto_compact_window,
            env=agent_env(conversation.provider, self.settings, conversation.auto_compact_window),
            ask_permission=ask,
            on_own_turn=None if runner is None else partial(self._own_turn_began, runner),
            context_tokens=conversation.context_tokens,
            tools=relay_tools(
                save_handoff=lambda arguments: self._tool_save_handoff(
                    conversation.id or 0, arguments
                ),
                search_archive=lambda arguments: self._tool_archive(
                    archive.search_archive, conversation.id or 0, arguments
                ),
                read_archive=lambda arguments: self._tool_archive(
                    archive.read_archive, conversation.id or 0, arguments
                ),
            ),
        )

    async def _apply_window(self, runner: Runner) -> None:
        """Restart the agent once when its conversation's window setting changed."""
        conversation = runner.turn_conversation or await self._conversation(runner.conversation_id)
        if conversation.session_id is None:
            return
        old, new = conversation.applied_window, conversation.auto_compact_window
        if old == new:
            return
        if runner.agent is not None and runner.agent.background_work():
            return  # a restart would kill it: applies once the background work has ended
        # Claude Code reads the window only at start: resume the same session with the new one.
        await self._close_agent(runner)

        def restarted() -> None:
            with self.session() as session:
                session.add(conversation)
                self._line(session, conversation, restart_line(old, new), data={"type": "restart"})
                store.update_conversation(
                    session=session, conversation=conversation, applied_window=new
                )

        await self.storage.write(restarted)

    def background_work(self, conversation_id: int) -> bool:
        """True while the conversation's live agent runs background work."""
        runner = self.runners.get(conversation_id)
        return bool(runner and runner.agent is not None and runner.agent.background_work())

    async def agent_context(self, conversation_id: int) -> tuple[dict[str, Any] | None, bool]:
        """What the 🧠 modal shows of the agent: its context report and its background work.

        On a node that does not run the conversation, its owner's answer (cluster/node.py).
        """
        if self.cluster is not None and not self.cluster.holds(conversation_id):
            return await self.cluster.ask_context(conversation_id)
        return await self.refresh_context(conversation_id), self.background_work(conversation_id)

    async def refresh_context(self, conversation_id: int) -> dict[str, Any] | None:
        """The agent's latest context report, asked again when its agent is live and idle."""
        runner = self.runners.get(conversation_id)
        if runner is None:
            return None
        if runner.agent is not None and runner.state == TurnState.IDLE:
            # The modal waits for this: a slow agent gets the last report instead.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REFRESH_SECONDS):
                    await self._report_context(runner, runner.agent)
        return runner.context_report

    async def _report_context(self, runner: Runner, agent: Agent) -> None:
        """Ask the agent what window it really uses; warn when it disagrees with ours."""
        try:
            report = await asyncio.wait_for(agent.context_usage(), timeout=15)
        except Exception as error:  # noqa: BLE001 - the report is informative only
            log.info("no context report for conversation %s: %s", runner.conversation_id, error)
            return
        if not report:
            return
        runner.context_report = report
        try:
            conversation = await self._conversation(runner.conversation_id)
        except LookupError:
            return
        resolved = effective_window(conversation, os.environ.get(ENV_VAR))
        reported = report.get("maxTokens")
        if resolved is not None and reported is not None and reported != resolved.window:
            log.warning(
                "conversation %s: agent window %s (%s), relay expected %s (%s)",
                runner.conversation_id,
                reported,
                report.get("autocompactSource"),
                resolved.window,
                resolved.source,
            )

    async def _interrupt_agent(self, runner: Runner) -> None:
        for entry_id, future in list(runner.questions.items()):
            if not future.done():
                future.set_result(PermissionDecision(False, STOPPED_BY_USER))
            runner.questions.pop(entry_id, None)
        if runner.agent is not None:
            await runner.agent.interrupt()

    async def _close_agent(self, runner: Runner, *, publish: bool = True) -> None:
        agent, runner.agent = runner.agent, None
        if agent is not None:
            try:
                await asyncio.wait_for(agent.close(), timeout=10)
            except Exception:  # the process is gone from the runner either way
                log.warning(
                    "conversation %s: stopping its agent failed",
                    runner.conversation_id,
                    exc_info=True,
                )
            if publish:  # not for a deleted conversation: its event would make its stream again
                self.publish_agent(runner.conversation_id)
        if runner.questions and publish:
            await self._drop_questions(runner)

    async def _drop_questions(self, runner: Runner) -> None:
        """The questions nobody can act on once the agent is gone (a background subagent's,
        which its turn's end left open): denied, and expired for every tab."""
        asked = [*runner.questions]
        for entry_id in asked:
            future = runner.questions.pop(entry_id)
            if not future.done():
                future.set_result(PermissionDecision(False, "The agent was stopped."))
        runner.lasting.clear()
        try:
            why = EXPIRED_SHUTDOWN if self._closing else EXPIRED_AGENT
            await self.storage.write(self._expire_questions, runner.conversation_id, asked, why)
        except Exception:  # a restart expires them
            log.exception("conversation %s: could not expire its questions", runner.conversation_id)

    async def _stop_with_work(self, runner: Runner, text: str) -> None:
        """Stop the agent now, background work and all; when it had some, a line says so."""
        agent = runner.agent
        working = agent is not None and agent.background_work()
        runner.retiring = True
        try:
            await self._close_agent(runner)
        finally:
            runner.retiring = False
        if working:
            try:
                await self.storage.write(self._write_line, runner, text, "warning")
            except Exception:  # the agent is stopped all the same
                log.exception("conversation %s: could not store %r", runner.conversation_id, text)

    def _stoppable(self, runner: Runner) -> bool:
        """An idle agent: no turn, no start, no open question, no background work."""
        agent = runner.agent
        return (
            agent is not None
            and runner.state == TurnState.IDLE
            and not (runner.task is not None and not runner.task.done())
            and not runner.starting
            and not runner.questions
            and not agent.background_work()
        )

    async def _fit_budget(self, *, exclude: int | None = None, incoming: bool = False) -> bool:
        """Stop the least recently used idle agents until the live ones fit the budget, with
        the agents being started (and one more, incoming); whether they fit then."""
        runners = self.runners.copy()  # storage threads add runners
        live = [
            Live(cid, tree_rss(getattr(r.agent, "pid", None)), r.last_used, self._stoppable(r))
            for cid, r in runners.items()
            if r.agent is not None and cid != exclude
        ]
        starting = sum(r.starting and r.agent is None for c, r in runners.items() if c != exclude)
        estimate = starting_size((agent.rss for agent in live), starting + incoming)
        for conversation_id in to_stop(live, self.agent_budget, estimate):
            runner = self.runners.get(conversation_id)
            if runner is not None and self._stoppable(runner):  # still, after the awaits
                log.info("agent memory budget: stopping the agent of %s", conversation_id)
                await self._close_agent(runner)
        return fits(live, self.agent_budget, estimate)

    async def _reap_idle(self) -> None:
        """Stop agent processes of conversations idle for longer than the idle timeout."""
        timeout = self.settings.agent_idle_timeout
        while True:
            await asyncio.sleep(max(0.5, min(timeout / 4, 5)))
            now = time.monotonic()
            for runner in list(self.runners.copy().values()):
                idle = runner.state == TurnState.IDLE and not (
                    runner.task and not runner.task.done()
                )
                expired = runner.archived or now - runner.last_used > timeout
                # Never one running background work (a shell it started), as for the budget,
                # unless its conversation is archived: then nothing of it may go on.
                stoppable = self._stoppable(runner) or (
                    runner.archived and idle and not runner.starting and not runner.questions
                )
                if runner.agent is not None and expired and stoppable:
                    log.info("stopping idle agent of conversation %s", runner.conversation_id)
                    if runner.archived:  # (its background work, if any, ends: said so)
                        await self._stop_with_work(runner, ARCHIVED_WORK_LINE)
                    else:
                        await self._close_agent(runner)
                elif runner.agent is not None and idle and not runner.starting and gone(runner):
                    # Killed or crashed between turns: asleep, as the header then says (it
                    # said ready, and a keystroke warmed nothing); the next message resumes.
                    log.info("the agent of conversation %s exited", runner.conversation_id)
                    await self._close_agent(runner)
            try:
                await self._fit_budget()  # agents grow during their turns
            except Exception:
                log.exception("fitting the agents' memory budget failed")
            try:
                await self.storage.write(self.release_idle, time.monotonic() - timeout)
            except Exception:  # memory is released on the next pass
                log.exception("releasing idle conversations failed")

    async def _close_if_gone(self, runner: Runner) -> None:
        """A turn ended by its agent's crash: the agent goes (asleep), the next turn resumes."""
        if runner.agent is not None and gone(runner):
            await self._close_agent(runner)

    def release_idle(self, before: float) -> list[int]:
        """Forget what idle and archived conversations hold in memory; which ones were released.

        A runner goes when its conversation is archived or unused since `before` and it
        holds nothing live (agent, turn, question, report); the hub's numbering and replay
        go when no runner and no tab needs them, after their last seq is stored.
        """
        released = []
        for conversation_id, runner in self.runners.copy().items():
            busy = (
                runner.agent is not None
                or runner.state != TurnState.IDLE
                or (runner.task is not None and not runner.task.done())
                or (runner.reporting is not None and not runner.reporting.done())
                or (runner.warming is not None and not runner.warming.done())
                or runner.starting
                or runner.questions
                or runner.streaming
            )
            if not busy and (runner.archived or runner.last_used < before):
                del self.runners[conversation_id]
                released.append(conversation_id)
        # An archived conversation's numbering goes with its runner, however recent.
        idle = self.hub.idle(before, also=released)
        seqs = {cid: seq for cid, seq in idle.items() if cid not in self.runners}
        if seqs:
            with self.session() as session:  # stored first: numbering resumes after them
                store.raise_last_seqs(session=session, seqs=seqs)
            for conversation_id in seqs:
                self.hub.release(conversation_id)
        if released or seqs:
            give_back_memory()  # else what was released stays in the process's RSS
        return released


def gone(runner: Runner) -> bool:
    """Whether the runner's agent runs in a process that has exited."""
    agent = runner.agent
    return isinstance(agent, Exits) and not agent.is_alive()


def _live(runner: Runner) -> bool:
    """Whether the runner has an agent to switch; one starting is told once it has started."""
    if runner.agent is None and runner.starting:
        runner.changed_while_starting = True
    return runner.agent is not None
