"""Where agents may work: a working directory inside the allowed roots, existing."""

from collections.abc import Iterable
from pathlib import Path


class WorkspaceError(ValueError):
    """A working directory that cannot be used (the message says why, for the user)."""


def usable_cwd(cwd: str | Path, roots: Iterable[Path]) -> Path:
    """The resolved working directory, when it is inside one of the roots and exists.

    Checked when a conversation is made and again when its agent starts (the roots may
    have changed, the directory gone, a symlink on the way pointed elsewhere since).
    """
    roots = list(roots)
    if "\0" in str(cwd):
        raise WorkspaceError("The working directory cannot contain a NUL character.")
    try:
        raw = Path(cwd).expanduser()
    except RuntimeError:  # "~name" of a user this machine does not know
        raise WorkspaceError(f"The working directory {str(cwd)!r} names an unknown user.") from None
    if not raw.is_absolute():
        raise WorkspaceError("The working directory must be an absolute path.")
    try:
        path = raw.resolve()  # follows symlinks and "..", so escapes show as outside the roots
    except RuntimeError:  # Python 3.11 and 3.12 say "Symlink loop" this way
        raise WorkspaceError("The working directory goes through a symlink loop.") from None
    except OSError as error:  # a name too long for the file system, a loop on 3.13, …
        raise WorkspaceError(f"The working directory cannot be used: {error.strerror}.") from None
    if not any(path == root or root in path.parents for root in roots):
        shown = ", ".join(str(root) for root in roots)
        raise WorkspaceError(
            f"The working directory must be inside {shown} (OARLOCK_WORKSPACE_ROOTS)."
        )
    try:
        exists = path.is_dir()
    except OSError as error:
        raise WorkspaceError(f"The working directory cannot be used: {error.strerror}.") from None
    if not exists:
        raise WorkspaceError(f"The working directory {path} does not exist.")
    return path
