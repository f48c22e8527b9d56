"""What a whole-file write would replace: the file's text now (I/O; app/edits.py diffs it).

Read only for a permission question (the tool waits for the answer, so the file is as it was)
and only inside the conversation's working directory: a write elsewhere is not read, and its
card shows the new text alone, as for a new file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_BYTES = 1024 * 1024  # a bigger file is not read: "overwrite", without its old lines


def existing_text(path: str, cwd: str) -> tuple[bool, str | None]:
    """(whether a regular file is there, inside cwd; its text, or None: too big, not UTF-8)."""
    if not path or not cwd:
        return False, None
    try:
        root = Path(cwd).resolve(strict=True)
        target = (root / path).resolve(strict=True)  # an absolute path stays itself
        if not target.is_relative_to(root):
            return False, None
        # Not opened at all unless a regular file (a FIFO would block, a device never end).
        if not stat.S_ISREG(target.stat().st_mode):
            return False, None
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                return False, None
            data = file.read(MAX_BYTES + 1)
    except (OSError, RuntimeError):  # gone, unreadable, a symlink loop
        return False, None
    if len(data) > MAX_BYTES or b"\x00" in data:
        return True, None
    try:
        return True, data.decode()
    except UnicodeDecodeError:
        return True, None
