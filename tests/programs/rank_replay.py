"""One rank of a recording of several GPUs, replayed under ``pyrun -e gpu=simulated``.

Usage: RANK=r rank_replay.py (a launcher sets RANK, as torchrun does; ``LOCAL_RANK`` picks
the device, as a DDP program's ``torch.cuda.set_device(LOCAL_RANK)`` does).

The process replays every recorded thread that ran work on device ``LOCAL_RANK`` (its first on
the main thread, the others on threads of their own), each recorded call site from a function
of its own here: recorded site s is issued from the line marked ``SITE s % 8``, so a test knows
which line each kernel belongs under.
"""

import os
import threading

from pyhpctk.measure.gpu import simulated_runtime


def site_0(issue):
    issue()  # SITE 0


def site_1(issue):
    issue()  # SITE 1


def site_2(issue):
    issue()  # SITE 2


def site_3(issue):
    issue()  # SITE 3


def site_4(issue):
    issue()  # SITE 4


def site_5(issue):
    issue()  # SITE 5


def site_6(issue):
    issue()  # SITE 6


def site_7(issue):
    issue()  # SITE 7


SITES = [site_0, site_1, site_2, site_3, site_4, site_5, site_6, site_7]


def main() -> None:
    gpu = simulated_runtime()
    device = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    first, *others = gpu.recording.threads_of_device(device)
    workers = [threading.Thread(target=gpu.replay, args=(t, SITES)) for t in others]
    for worker in workers:
        worker.start()
    gpu.replay(first, SITES)
    for worker in workers:
        worker.join()


if __name__ == "__main__":
    main()
