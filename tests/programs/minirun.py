"""A launcher of our own with torchrun's environment (CI has no PyTorch): N local workers.

Usage: minirun.py --nproc-per-node N COMMAND [ARGS...]

Like ``torchrun --nproc-per-node N --no-python COMMAND`` with its default static rendezvous:
each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK,
MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RUN_ID=none (the variables torch.distributed.run
sets; docs/pyrun.md, "torchrun"). The workers run at once; the exit status is the first
non-zero one of theirs, else 0.
"""

import os
import subprocess
import sys


def main() -> int:
    args = sys.argv[1:]
    if len(args) < 3 or args[0] != "--nproc-per-node":
        sys.stderr.write("usage: minirun.py --nproc-per-node N COMMAND [ARGS...]\n")
        return 2
    count, command = int(args[1]), args[2:]
    workers = []
    for rank in range(count):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(count),
            LOCAL_WORLD_SIZE=str(count),
            GROUP_RANK="0",
            ROLE_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT="29500",
            TORCHELASTIC_RUN_ID="none",
        )
        workers.append(subprocess.Popen(command, env=env))
    codes = [worker.wait() for worker in workers]
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main())
