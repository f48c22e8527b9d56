"""Exec a command that the kernel kills (SIGKILL) when the relay dies; standalone, stdlib only.

Run as `python -I -S pdeathsig.py RELAY_PID COMMAND [ARG...]`: sets PR_SET_PDEATHSIG in this
process, then replaces itself with COMMAND (the pid stays the same, the setting survives exec).
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def main(argv: list[str]) -> None:
    """Arm the parent-death signal, check the relay is still there, exec the command."""
    relay, command = int(argv[1]), argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        error = os.strerror(ctypes.get_errno())
        print(f"oarlock: prctl(PR_SET_PDEATHSIG) failed: {error}", file=sys.stderr)
    if os.getppid() != relay:  # the relay died before the signal was armed: nobody to serve
        sys.exit(1)
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"oarlock: cannot run {command[0]}: {e.strerror}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv)
