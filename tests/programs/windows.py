"""A job in three phases, for windows opened and closed by ``pyrun ctl`` (issue #37, item 3).

``windows.py DIR [--children]``: every process burns CPU in ``phase_a``, says it is ready
(``DIR/ready-b-PID``) and waits for ``DIR/go-b``; burns in ``phase_b`` (where the parent also runs
a short child, ``inside_window``, which must begin measuring as its parent is), says so
(``DIR/done-b-PID``) and burns in ``linger`` until ``DIR/go-c``; burns in ``phase_c``, and writes
the truth, ``DIR/truth-PID.json``: each phase's CPU time and when phase B began and ended
(``time.time_ns``). With ``--children`` the parent first starts a ``subprocess`` child and forks
one, which go through the same phases. The test opens the window between ``ready-b`` and
``go-b`` and closes it between ``done-b`` and ``go-c``: only ``phase_b`` (and
``inside_window``) may hold samples.

``windows.py --inside``: the short child, which burns in ``inside_window`` and exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

PHASE_A_S, PHASE_B_S, PHASE_C_S, INSIDE_S = 0.6, 1.0, 0.6, 0.3


def burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    total = 0
    while time.thread_time() < end:
        for i in range(2000):
            total += i * i


def phase_a() -> None:
    burn(PHASE_A_S)


def phase_b() -> None:
    burn(PHASE_B_S)


def phase_c() -> None:
    burn(PHASE_C_S)


def inside_window() -> None:
    burn(INSIDE_S)


def linger(path: str) -> None:
    """Burn CPU until ``path`` exists (after phase B: the mark has samples to hold)."""
    while not os.path.exists(path):
        burn(0.002)


def wait_for(path: str) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"windows.py: {path} never came")
        time.sleep(0.01)


def say(path: str) -> None:
    with open(path + ".tmp", "w") as stream:
        stream.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


def phases(directory: str, inside: bool) -> None:
    pid = os.getpid()
    times = {}
    began = time.thread_time()
    phase_a()
    times["a"] = time.thread_time() - began
    say(os.path.join(directory, f"ready-b-{pid}"))
    wait_for(os.path.join(directory, "go-b"))
    b_began_ns = time.time_ns()
    began = time.thread_time()
    phase_b()
    times["b"] = time.thread_time() - began
    if inside:
        subprocess.run([sys.executable, __file__, "--inside"], check=True)
    b_ended_ns = time.time_ns()
    say(os.path.join(directory, f"done-b-{pid}"))
    linger(os.path.join(directory, "go-c"))
    began = time.thread_time()
    phase_c()
    times["c"] = time.thread_time() - began
    truth = {"times": times, "b_began_ns": b_began_ns, "b_ended_ns": b_ended_ns}
    with open(os.path.join(directory, f"truth-{pid}.json"), "w") as stream:
        json.dump(truth, stream)


def main() -> None:
    if sys.argv[1] == "--inside":
        inside_window()
        return
    directory = sys.argv[1]
    children = []
    if "--children" in sys.argv[2:]:
        children.append(subprocess.Popen([sys.executable, __file__, directory]))
        forked = os.fork()
        if forked == 0:
            phases(directory, inside=False)
            os._exit(0)
    phases(directory, inside=True)
    for child in children:
        child.wait()
    if "--children" in sys.argv[2:]:
        os.waitpid(forked, 0)


if __name__ == "__main__":
    main()
