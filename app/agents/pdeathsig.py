"""Exec a command that the kernel kills (SIGKILL) when the relay dies; standalone, stdlib only.

Run as `python -I -S pdeathsig.py RELAY_PID COMMAND [ARG...]`: sets PR_SET_PDEATHSIG in this
process, then replaces itself with COMMAND (the pid stays the same, the setting survives exec),
handing it exactly the environment this process got.

The command gets a process group of its own: Ctrl+C in the relay's terminal signals the
terminal's foreground group, and an agent in it stopped its turn itself before the relay could
(the turn said "Interrupted by the user." or "exited unexpectedly", not that the relay stopped).
The relay stops its agents when it stops; when it dies, the parent-death signal does.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def original_environment() -> dict[bytes, bytes]:
    """The environment this process was started with, before Python changed it.

    Python's start-up sets LC_CTYPE in a C locale (PEP 538, not avoidable under -I); the
    kernel's copy in /proc/self/environ is what the relay handed over.
    """
    with open("/proc/self/environ", "rb") as dump:
        items = dump.read().split(b"\0")
    pairs = (item.partition(b"=") for item in items if b"=" in item)
    return {name: value for name, _, value in pairs}


def main(argv: list[str]) -> None:
    """Arm the parent-death signal, check the relay is still there, exec the command."""
    relay, command = int(argv[1]), argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        error = os.strerror(ctypes.get_errno())
        print(f"oarlock: prctl(PR_SET_PDEATHSIG) failed: {error}", file=sys.stderr)
    if os.getppid() != relay:  # the relay died before the signal was armed: nobody to serve
        sys.exit(1)
    os.setpgid(0, 0)  # out of the relay's (the terminal's) process group
    try:
        os.execvpe(command[0], command, original_environment())
    except OSError as e:
        print(f"oarlock: cannot run {command[0]}: {e.strerror}", file=sys.stderr)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv)
