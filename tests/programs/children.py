"""Run the func_hi -> func_mid -> func_lo chain in a child process.

Usage: children.py fork|spawn|forkserver|subprocess [SECONDS]
"""

import multiprocessing
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chain import func_hi


def main() -> None:
    mode = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0.2
    if mode == "subprocess":
        here = os.path.dirname(os.path.abspath(__file__))
        script = os.path.join(here, "call_chain.py")
        subprocess.run([sys.executable, script, str(seconds)], check=True)
        return
    context = multiprocessing.get_context(mode)
    child = context.Process(target=func_hi, args=(seconds,))
    child.start()
    child.join()
    sys.exit(child.exitcode)


if __name__ == "__main__":
    main()
