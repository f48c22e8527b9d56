"""Where the files shipped beside the code are: static/, templates/, alembic/."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """The directory inside the installed package (a wheel), else the source checkout's."""
    installed = PACKAGE / name
    return installed if installed.is_dir() else PACKAGE.parent / name
