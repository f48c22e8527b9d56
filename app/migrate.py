"""Bring the database schema up to date with Alembic."""

from __future__ import annotations

from typing import NamedTuple

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from app.resources import resource_dir


def alembic_config(url: str) -> Config:
    """Alembic's configuration for a database URL (no alembic.ini needed: it is not shipped)."""
    config = Config()
    config.set_main_option("script_location", str(resource_dir("alembic")))
    # ConfigParser reads % as interpolation: a password's %40 must reach Alembic as %%40.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


class Upgraded(NamedTuple):
    """What an upgrade found and left: revisions (found None: the database had no schema)."""

    found: str | None
    head: str | None

    def said(self) -> str:
        """What `oarlock migrate` says it did."""
        if self.found is None:
            return f"Created the database's tables (schema {self.head})"
        if self.found != self.head:
            return f"Upgraded the database's schema {self.found} → {self.head}"
        return f"Database is up to date (schema {self.head})"


def upgrade(url: str) -> Upgraded:
    """Apply every migration not yet applied."""
    config = alembic_config(url)
    command.upgrade(config, "head")
    head = ScriptDirectory.from_config(config).get_current_head()
    return Upgraded(config.attributes.get("found"), head)
