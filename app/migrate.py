"""Bring the database schema up to date with Alembic."""

from __future__ import annotations

from alembic import command
from alembic.config import Config

from app.resources import resource_dir


def alembic_config(url: str) -> Config:
    """Alembic's configuration for a database URL (no alembic.ini needed: it is not shipped)."""
    config = Config()
    config.set_main_option("script_location", str(resource_dir("alembic")))
    # ConfigParser reads % as interpolation: a password's %40 must reach Alembic as %%40.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str) -> None:
    """Apply every migration not yet applied."""
    command.upgrade(alembic_config(url), "head")
