"""A parent that starts a Python child the way launchers that clear the environment do.

Usage: cleared.py MODE PIDFILE [NAME,...]
  env-i   the child runs as ``env -i PYTHON cleared.py child PIDFILE``;
  list    the child gets only PATH, HOME and the NAMEs given (pyperf's worker environment);
  child   write this process's pid to PIDFILE, then work in ``child_work`` for 0.3 s.
The parent works in ``parent_work`` after its child ended.
"""

import os
import subprocess
import sys
import time


def busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def child_work() -> None:
    time.sleep(0.2)  # alive long enough for pyrun to see it start, whatever the machine's load
    busy(0.1)


def parent_work() -> None:
    busy(0.05)


def main() -> None:
    mode, pidfile = sys.argv[1], sys.argv[2]
    if mode == "child":
        with open(pidfile, "w") as out:
            out.write(str(os.getpid()))
        child_work()
        return
    child = [sys.executable, os.path.abspath(__file__), "child", pidfile]
    if mode == "env-i":
        subprocess.run(["env", "-i", *child], check=True)
    else:
        names = ["PATH", "HOME", *(sys.argv[3].split(",") if len(sys.argv) > 3 else [])]
        env = {name: os.environ[name] for name in names if name in os.environ}
        subprocess.run(child, env=env, check=True)
    parent_work()


main()
