"""Near the open-file limit: COUNT threads each open a file and hold it until all have opened;
then every 100th thread spins SECONDS of its CPU time in ``spin`` while it still holds it.

Prints how many opens failed and the spinning threads' CPU time (their own clocks); exits 5 if
an open failed. Usage: open_files.py [COUNT] [SECONDS]
"""

import sys
import threading
import time

COUNT = int(sys.argv[1]) if len(sys.argv) > 1 else 900
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 0.15
held_together = threading.Barrier(COUNT)
failed: list[str] = []
spun: list[float] = []


def spin(seconds: float) -> float:
    start = time.thread_time()
    while time.thread_time() < start + seconds:
        sum(range(200))
    return time.thread_time() - start


def hold_a_file(number: int) -> None:
    try:
        stream = open(__file__, "rb")  # noqa: SIM115  # held until every thread has one
    except OSError as error:
        failed.append(str(error))
        stream = None
    held_together.wait()
    if number % 100 == 99:
        spun.append(spin(SECONDS))
    held_together.wait()
    if stream is not None:
        stream.close()


threads = [threading.Thread(target=hold_a_file, args=(n,)) for n in range(COUNT)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(f"{len(failed)} of {COUNT} opens failed{': ' + failed[0] if failed else ''}", flush=True)
print(f"spun {sum(spun):.6f} s", flush=True)
sys.exit(5 if failed else 0)
