"""The command line: `oarlock serve` (the default) and `oarlock migrate`."""

from __future__ import annotations

import asyncio
import errno
import faulthandler
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import click
import uvicorn
from pydantic import ValidationError

from app.config import Settings, place_error
from app.limits import protocol_options
from app.logs import RedactTokens, uvicorn_log_config
from app.security import is_loopback, token_error

if TYPE_CHECKING:
    from fastapi import FastAPI

    from app.migrate import Upgraded


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn options every way of serving the relay uses (CLI, tests, benchmarks).

    Forwarded headers only from trusted proxies, redacted logs, the timed protocol and limits.
    """
    trusted = settings.trusted_proxies
    return {
        # uvicorn would otherwise believe X-Forwarded-For from 127.0.0.1: any local process.
        "proxy_headers": bool(trusted),
        "forwarded_allow_ips": ",".join(trusted),
        "log_config": uvicorn_log_config(),
        # A line per request only when asked for (OARLOCK_LOG_LEVEL=debug): quiet by default.
        "access_log": settings.log_level.lower() in ("debug", "trace"),
        **protocol_options(settings),
    }


def _settings(**options: Any) -> Settings:
    """Settings from the environment, with the options given on the command line on top; a
    value that cannot be used ends the command with a line naming it (not a traceback)."""
    try:
        return Settings(**{name: value for name, value in options.items() if value is not None})
    except ValidationError as error:
        given = [name for name, value in options.items() if value is not None]
        sys.exit("\n".join(setting_problems(error, given)))


def setting_problems(error: ValidationError, given: Collection[str] = ()) -> list[str]:
    """A line per refused setting: its variable (or option), why, and the value when not a
    secret (a token, or a database URL with its password)."""
    lines = []
    for problem in error.errors():
        name = str(problem["loc"][0]) if problem["loc"] else ""
        where = f"--{name.replace('_', '-')}" if name in given else f"OARLOCK_{name.upper()}"
        if not name:  # a check of several settings together (model_validator)
            where = "The configuration"
        why = problem["msg"].removeprefix("Value error, ").rstrip(".")
        value = problem.get("input")
        secret = any(word in name for word in ("token", "url", "password", "secret"))
        hidden = secret or isinstance(value, dict) or str(value) in why
        lines.append(f"{where}: {why}" + ("." if hidden else f" (it is {value!r})."))
    return lines


def open_data(settings: Settings, *, alone: bool = False) -> Upgraded:
    """The data directory made (private) and the database migrated, or a line saying why not.

    alone: the relay that serves: the data directory (and a SQLite file) locked for this
    process first, before its start-up touches the database (app/single.py).
    """
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    from app.db import display_url, ensure_private_dir, sqlite_file
    from app.migrate import upgrade
    from app.single import single_error

    where = settings.resolved_data_dir
    if where.exists() and not where.is_dir():
        sys.exit(f"The data directory {where} cannot be used: it is not a directory.")
    try:
        ensure_private_dir(where)
        problem = single_error(where, sqlite_file(settings.db_url)) if alone else None
    except OSError as error:
        sys.exit(f"The data directory {where} cannot be used: {error.strerror or error}.")
    if problem is not None:
        sys.exit(problem)
    try:
        return upgrade(settings.db_url)
    except CommandError as error:  # a revision this code does not have: a newer oarlock's
        sys.exit(
            f"The database {display_url(settings.db_url)} was migrated by a newer oarlock "
            f"({error}): run that version, or restore a copy of the data taken before."
        )
    except (SQLAlchemyError, ImportError) as error:
        reason = str(getattr(error, "orig", None) or error).strip().splitlines() or ["?"]
        try:
            database = f"The database {display_url(settings.db_url)}"
        except SQLAlchemyError:  # not a URL at all
            database = "OARLOCK_DATABASE_URL"
        sys.exit(f"{database} cannot be used: {reason[0]}")


@click.group(invoke_without_command=True)
@click.version_option(package_name="oarlock")
@click.pass_context
def main(context: click.Context) -> None:
    """oarlock: a web relay for coding agents.

    Without a command, `oarlock` serves, as `oarlock serve` does (settings: OARLOCK_*
    variables, README.md "Configuration").
    """
    if context.invoked_subcommand is None:
        context.invoke(serve)


QUIET_AT_DEBUG = ("markdown_it",)  # libraries kept at INFO under OARLOCK_LOG_LEVEL=debug
LATE_CHECK = 0.02  # seconds between looks for connections accepted while the stop began


@main.command()
@click.option("--host", default=None, help="Address to listen on [OARLOCK_HOST, 127.0.0.1].")
@click.option("--port", type=int, default=None, help="Port [OARLOCK_PORT, 8000].")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Data [OARLOCK_DATA_DIR, ./data].",
)
def serve(host: str | None, port: int | None, data_dir: Path | None) -> None:
    """Migrate the database and run the relay."""
    from app.cluster import setting_error
    from app.main import create_app

    settings = _settings(host=host, port=port, data_dir=data_dir)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactTokens())
    if settings.log_level != "debug":  # Alembic's set-up lines at every start: noise
        logging.getLogger("alembic").setLevel(logging.WARNING)
    for chatty in QUIET_AT_DEBUG:  # a line per Markdown rule per message: noise, not debugging
        logging.getLogger(chatty).setLevel(max(logging.INFO, logging.getLogger().level))
    if settings.no_auth and not is_loopback(settings.host):
        sys.exit(
            f"Refusing to listen on {settings.host} without a token: agents run shell commands.\n"
            "Unset OARLOCK_NO_AUTH (a token is generated for you) or listen on 127.0.0.1."
        )
    problem = setting_error(settings) or token_error(settings.token) or place_error(settings)
    problem = problem or provider_error(settings) or host_error(settings)
    if settings.redis_url and problem is None:  # before the database is made or migrated
        from app.cluster.alive import redis_error

        problem = redis_error(settings.redis_url, settings.node_id, settings.token)
    if problem is not None:
        sys.exit(problem)
    logging.getLogger(__name__).info("%s.", open_data(settings, alone=True).said())
    if settings.redis_url:  # (migrated: its table exists) the live nodes on another Redis?
        from app.cluster.same_redis import start_error

        name = settings.node_id or ""
        problem = start_error(settings.db_url, settings.redis_url, name, settings.lease_seconds)
    if problem is None:
        problem = port_error(settings)  # (after the lock: its line says more)
    if problem is not None:
        sys.exit(problem)
    app = app_or_exit(settings, create_app)
    shown_host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    url = f"http://{shown_host}:{settings.port}/"
    token = app.state.token
    lines = ["", "  oarlock is running. Open this URL in your browser:"]
    if token and sys.stdout.isatty():
        # Encoded: a token from `openssl rand -base64` holds + and / (a + read back as a space).
        lines.append(f"    {url}?token={quote(token, safe='')}")
    else:
        lines.append(f"    {url}")
        if token:  # a service's log (the journal) has more readers than a terminal
            kept = "OARLOCK_TOKEN" if settings.token else settings.resolved_data_dir / "token"
            lines.append(f"  and log in with the token ({kept}): it is shown in a terminal only.")
    if not is_loopback(settings.host) and not settings.allowed_hosts:
        lines.append(
            "  Listening beyond this machine: set OARLOCK_ALLOWED_HOSTS to the name you use."
        )
    lines.append("")
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal to the
    # handlers that were there before it: make those end the process with status 0.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: sys.exit(0))
    # `kill -USR1 <pid>`: every thread's Python stack on stderr (a relay that hangs says where).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        **server_options(settings),
    )
    server = RelayServer(config)
    threading.Thread(target=announce, args=(server, lines), daemon=True).start()
    server.run()
    if not server.started:
        sys.exit(3)  # as uvicorn.run: the server could not start (port taken, …)


def provider_error(settings: Settings) -> str | None:
    """Why OARLOCK_DEFAULT_PROVIDER (or the default permission mode) cannot be used, or None."""
    from app.providers import TRAITS, mode_refused

    names = list(TRAITS)
    if settings.default_provider is not None and settings.default_provider not in names:
        return f"OARLOCK_DEFAULT_PROVIDER: {settings.default_provider!r} is not one of {names}."
    # (else every new Claude Code conversation was refused, unless its dialog changed the mode)
    if refused := mode_refused("claude", settings.permission_mode, settings):
        return f"OARLOCK_PERMISSION_MODE: {refused}"
    return None


def port_error(settings: Settings) -> str | None:
    """Why the port cannot be listened on because another program does, or None (uvicorn
    says what else is wrong)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((settings.host, settings.port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                return None
            return (
                f"The port {settings.port} is in use (OARLOCK_PORT or --port): another program "
                "listens there. If it is oarlock, it is running already."
            )
    return None


def host_error(settings: Settings) -> str | None:
    """Why the host cannot be listened on (a name that does not resolve), or None."""
    try:
        socket.getaddrinfo(settings.host, settings.port)
    except OSError as error:
        reason = error.strerror or str(error)
        return f"The host {settings.host} cannot be used (OARLOCK_HOST or --host): {reason}."
    return None


def app_or_exit(settings: Settings, create: Callable[[Settings], FastAPI]) -> FastAPI:
    """The app; a Redis that cannot be used (not listening, a wrong password, no such
    database) ends the command with one line naming OARLOCK_REDIS_URL, not a traceback."""
    if settings.redis_url is None:
        return create(settings)
    import redis

    from app.cluster.alive import unusable

    try:
        return create(settings)
    except (redis.RedisError, OSError) as error:  # (it failed between the check and now)
        sys.exit(unusable(error))


class RelayServer(uvicorn.Server):
    """uvicorn's server, with two fixes to its stop.

    A connection accepted while the stop begins (its accept already under way when uvicorn
    told the open connections to close) was never told, and the stop waited for it: a kept-
    alive connection for up to its 75 s, a browser reconnecting then for ever. Each one
    arriving during the stop is now told as the others were.

    A forced exit (Ctrl+C a second time) still stops the relay: uvicorn then skips the app's
    shutdown, and the relay's is what stops the agents and writes "Interrupted: the relay was
    shut down." in the turns it cuts (a second Ctrl+C left a turn cut without a word). It no
    longer waits for connections to close; the app's shutdown runs as after one Ctrl+C.
    """

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown, telling late connections too, then the app's if uvicorn
        skipped it."""
        told = set(self.server_state.connections)  # those uvicorn's shutdown tells
        late = asyncio.create_task(self._tell_late(told), name="oarlock-late-connections")
        try:
            await super().shutdown(sockets)
        finally:
            late.cancel()
        if self.force_exit:
            await self.lifespan.shutdown()

    async def _tell_late(self, told: set[Any]) -> None:
        while True:
            await asyncio.sleep(LATE_CHECK)
            for connection in list(self.server_state.connections):
                if connection not in told:
                    told.add(connection)
                    connection.shutdown()


def announce(server: uvicorn.Server, lines: list[str]) -> None:
    """Print the URL once the server listens: a URL printed earlier would not answer yet."""
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.05)
    click.echo("\n".join(lines))


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="Data directory.")
def migrate(data_dir: Path | None) -> None:
    """Create or upgrade the database schema (OARLOCK_DATABASE_URL, else SQLite in the data
    directory: OARLOCK_DATA_DIR or --data-dir)."""
    from app.db import display_url

    settings = _settings(data_dir=data_dir)
    click.echo(f"{open_data(settings).said()}: {display_url(settings.db_url)}")


if __name__ == "__main__":  # python -m app.cli (python -m app and `oarlock` call main too)
    main()
