"""Check a window of a long job (issue #37, item 3): run by device_window.sh after the job.

    python window_check.py DATABASE LOG OPENED_NS CLOSED_NS KERNELS_PER_STEP

The job (window_job.py) ran its steps in one function per 10-second slot and logged each slot's
bounds and each step's start. pyrun was paused except between OPENED_NS and CLOSED_NS (taken
by the script around ``pyrun ctl PID start`` and ``stop``). The database must hold:

- time (REALTIME) only in slots that overlap the window, and in all of them;
- in all, the window's length within 15 % (pyrun ctl acts within 50 ms of the command);
- as many kernels as the steps that started inside the window launched, within 5 % plus one
  step's (the steps around the window's edges may fall either way): the whole database's (the
  root's inclusive ``GKER:COUNT``), not the slots': a step's backward kernels are launched by
  autograd's own thread, which has no slot frame, and pyrun kept nothing from outside the
  window, so every kernel in the database must be one of the window's steps' (kernels leaked
  from the hours around it would be many times the window's).

Each check prints PASS or FAIL; the exit status is the number of failures.
"""

import json
import re
import sys
from typing import Any

import numpy as np

from pyhpctk.present.api import open_database

SLOT = re.compile(r"\bslot_(\d{3})\b")


def per_slot(db: Any) -> tuple[dict[int, float], dict[int, float], float]:
    """Each slot's largest inclusive REALTIME and kernel count over its contexts, and the
    kernels of the whole database (the root's inclusive count, every thread's)."""
    names = db.metric_names
    wall = next(n for n in names if n.startswith("REALTIME"))
    kernels = next((n for n in names if n.startswith("GKER:COUNT")), None)  # None: a dry run
    arrays = db.arrays([wall] if kernels is None else [wall, kernels])
    seconds: dict[int, float] = {}
    launches: dict[int, float] = {}
    for row, label in enumerate(arrays["label"]):
        found = SLOT.search(str(label))
        if found is None:
            continue
        slot = int(found.group(1))
        seconds[slot] = max(seconds.get(slot, 0.0), float(arrays[f"{wall} (I)"][row]))
        count = 0.0 if kernels is None else float(arrays[f"{kernels} (I)"][row])
        launches[slot] = max(launches.get(slot, 0.0), count)
    total_wall = float(np.nansum(arrays[f"{wall} (I)"][:1]))
    total_kernels = 0.0 if kernels is None else float(np.nansum(arrays[f"{kernels} (I)"][:1]))
    print(
        f"database: {total_wall:.2f} s of REALTIME and {total_kernels:.0f} kernels in all,"
        f" slots {sorted(seconds)} (kernels under them, the main thread's:"
        f" {sum(launches.values()):.0f})"
    )
    return seconds, launches, total_kernels


def kernels_check(counted: float, steps: int, per_step: int) -> tuple[bool, str]:
    """Whether the database's kernels are the window's steps' (within 5 % plus one step's)."""
    expected = steps * per_step
    return (
        abs(counted - expected) <= 0.05 * expected + per_step,
        f"kernels {counted:.0f} (all threads), the window's {steps} steps x {per_step}"
        f" = {expected}",
    )


def main(argv: list[str]) -> int:
    database, log_path = argv[0], argv[1]
    opened, closed, per_step = int(argv[2]), int(argv[3]), int(argv[4])
    with open(log_path) as file:
        log = json.load(file)
    seconds, launches, total_kernels = per_slot(open_database(database))
    overlapping = {
        i for i, (start, end) in enumerate(log["slots"]) if start < closed and end > opened
    }
    seen = {slot for slot, value in seconds.items() if value > 0 or launches[slot] > 0}
    window = (closed - opened) / 1e9
    steps = sum(1 for slot in log["steps"] for t in slot if opened <= t < closed)
    failures = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failures
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'}: {what}")

    check(
        bool(seen) and seen <= overlapping,
        f"time and kernels only in the window's slots: seen {sorted(seen)},"
        f" window's {sorted(overlapping)}",
    )
    check(overlapping <= seen, "every slot the window overlaps has time")
    measured = sum(seconds.values())
    check(
        abs(measured - window) <= 0.15 * window,
        f"REALTIME in the slots {measured:.2f} s, the window {window:.2f} s",
    )
    check(*kernels_check(total_kernels, steps, per_step))
    return failures


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
