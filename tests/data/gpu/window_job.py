"""A long training job for the window check of issue #37 (item 3), run by device_window.sh.

A small MLP trains on the GPU, one synchronized step after another, for SECONDS seconds. Every
10-second slot of the job runs its steps inside a function of its own, ``slot_000``,
``slot_001``, ...: a profile says by its function names which slots it saw. At the end the job
writes LOG (JSON): each slot's wall-clock start and end (``time.time_ns``) and its steps' start
times.

    python window_job.py SECONDS LOG
    python window_job.py count      # the kernels one step launches, by torch.profiler

Count without pyrun: torch.profiler and pyrun's CUPTI subscriber cannot share the process.
"""

import json
import os
import sys
import time

import torch

SLOT_SECONDS = 10
# a data loader's pause after each step (s): the GPU idles a little; WINDOW_JOB_PAUSE sets a longer
# one where other measurements share the card and should see little of the job
PAUSE = float(os.environ.get("WINDOW_JOB_PAUSE", "0.002"))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run of the plumbing


def make_slot(index: int) -> object:
    namespace: dict[str, object] = {}
    source = f"def slot_{index:03d}(step, steps):\n    return step(steps)\n"
    exec(compile(source, __file__ + f":slot_{index:03d}", "exec"), namespace)
    return namespace[f"slot_{index:03d}"]


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
    ).to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(256, 512, device=DEVICE)
    labels = torch.randint(0, 10, (256,), device=DEVICE)

    def one_step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(data), labels)
        loss.backward()
        optimizer.step()
        return float(loss.item())

    one_step()  # warm up: the allocator, cuBLAS handles, lazy modules
    if sys.argv[1] == "count" and DEVICE == "cpu":
        print(0)
        return
    if sys.argv[1] == "count":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            one_step()
            torch.cuda.synchronize()
        kinds = torch.autograd.DeviceType.CUDA
        print(sum(1 for event in prof.events() if event.device_type == kinds))
        return
    seconds, log = float(sys.argv[1]), sys.argv[2]

    slots = [make_slot(i) for i in range(int(seconds // SLOT_SECONDS) + 1)]
    times: list[list[int]] = [[] for _ in slots]
    bounds: list[list[int]] = [[0, 0] for _ in slots]
    began = time.monotonic()

    def steps_of(slot: int) -> int:
        bounds[slot][0] = time.time_ns()
        while time.monotonic() - began < min(seconds, (slot + 1) * SLOT_SECONDS):
            times[slot].append(time.time_ns())
            one_step()
            time.sleep(PAUSE)
        bounds[slot][1] = time.time_ns()
        return slot

    for index, slot in enumerate(slots):
        if time.monotonic() - began >= seconds:
            break
        slot(steps_of, index)  # type: ignore[operator]
    with open(log, "w") as out:
        json.dump({"slots": bounds, "steps": times}, out)
    print(f"window_job: {sum(map(len, times))} steps in {time.monotonic() - began:.0f} s")


main()
