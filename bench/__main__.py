"""Run the benchmarks and print one markdown table: `python -m bench [NAME ...]`.

Names: fanout, overhead, size, conversations, memory, warming, writes, stall, backups, search,
steer, cluster (default: all, in that order; cluster starts Debian's postgresql and
redis-server). Each row is a ratio of two things measured side by side in the same run, with
its target and the command that produced it. Progress goes to stderr,
the table to stdout; the exit status is 1 when a row misses its target.

Crash safety is measured apart: `python -m bench.reliability` (make reliability).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable

from bench import (
    backups,
    cluster,
    conversations,
    fanout,
    memory,
    overhead,
    search,
    size,
    stall,
    steer,
    warming,
    writes,
)
from bench.common import Row, load_average, table

BENCHES: dict[str, Callable[[argparse.Namespace], list[Row]]] = {
    "fanout": lambda args: fanout.run(args.repeat or 3),
    "overhead": lambda args: overhead.run(args.turns),
    "size": lambda args: size.run(args.repeat or 300),
    "conversations": lambda args: conversations.run(args.repeat or 300),
    "memory": lambda _args: memory.run(),
    "warming": lambda _args: warming.run(),
    "writes": lambda _args: writes.run(),
    "stall": lambda _args: stall.run(),
    "backups": lambda _args: backups.run(),
    "search": lambda args: search.run(args.repeat or 300),
    "steer": lambda args: steer.run(args.repeat or 300),
    "cluster": lambda args: cluster.run(args.repeat or 3),
}


def machine() -> str:
    """nproc, memory and Python: what the figures were measured on."""
    with open("/proc/meminfo") as meminfo:
        total = int(meminfo.readline().split()[1]) / 1024 / 1024
    return f"{os.cpu_count()} CPUs, {total:.0f} GiB, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    """Run the chosen benchmarks; print the table."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(BENCHES))
    parser.add_argument("--repeat", type=int, help="repetitions (fanout runs, size/list requests)")
    parser.add_argument("--turns", type=int, default=overhead.TURNS, help="overhead turns")
    args = parser.parse_args(argv)
    names = args.names or list(BENCHES)
    unknown = [name for name in names if name not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(BENCHES)}")
    start_load = load_average()
    print(f"bench: {machine()}, load average {start_load:.2f}", file=sys.stderr)
    started = time.monotonic()
    rows: list[Row] = []
    for name in names:
        print(f"bench: {name}…", file=sys.stderr)
        try:
            rows += BENCHES[name](args)
        except Exception as error:  # noqa: BLE001 - one module's crash must not lose the table
            traceback.print_exc()
            reason = f"crashed: {type(error).__name__}: {error}"[:200]
            rows.append(Row(f"`{name}`", None, reason, "runs", False, f"python -m bench {name}"))
    print(table(rows))
    print(
        f"\n{machine()}; load average {start_load:.2f} at the start, "
        f"{load_average():.2f} at the end; {time.monotonic() - started:.0f} s"
    )
    return 0 if all(row.passed is not False for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
