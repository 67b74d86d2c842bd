"""Make the SYNTHETIC recordings of issue #22: one device, and two devices derived from one.

    python3 tests/data/gpu/make_multi_fixture.py base tests/data/gpu/nccl_synthetic.json
    python3 tests/data/gpu/make_multi_fixture.py derive BASE.json OUT.json [--offset-ns N]

No machine with two GPUs was lent for issue #22, so the two-device fixture CI replays is made,
not recorded, and says so in its note.

``base`` writes a one-device recording shaped like a DDP step, by hand: thread 0 (the training
loop) launches two forward kernels (site 0), an explicit all-reduce (site 3) and a host copy
(site 4) and synchronizes (site 5); thread 1 (the autograd thread) launches three backward
kernels on stream 7 (site 1) and, on NCCL's stream 13, one bucket all-reduce after each of the
first two (site 2), so communication overlaps the next backward kernel. Kernel names are
NCCL's (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``) and PyTorch-like; times are round numbers
of nanoseconds, so every overlap is known exactly.

``derive`` makes a two-device recording out of any one-device recording (the base above, or
the H200's ``record_nccl.py`` recording once it exists), a documented transformation:

* device 0 is the recording as it is;
* device 1 is a copy in which every activity has ``device`` 1, ``context`` + 10, ``stream`` +
  100, ``correlation`` + 2^28 (so no id of the copy is one of the original's; CUPTI's ids are
  32-bit and the simulated runtime numbers its own from 2^31), and every time +
  ``--offset-ns`` (default 25 µs: device 1's work, collectives included, starts that much
  later, so rank 1 arrives last at every collective);
* the copy's operations are issued by threads numbered after the original's (thread t of
  device 0 is thread t + T of device 1, T the number of recorded threads), from the same sites;
* buffers: each original buffer is followed by its copy.

What the copy does not model: a rank that arrives early at a collective waits inside its
kernel, so its kernel lasts longer; here both copies of a kernel last as long as the
original's. The waits a reader computes from the fixture are the start skews, not longer
kernels.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.simulated.recording import OPERATION_DTYPE, Recording, load, save

BASE_TIME = 1_764_800_000_000_000_000
NCCL = "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE"
GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1"
ELEMENTWISE = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEEEEviT0_T1_"
#: CUPTI's correlation ids are 32-bit, and the simulated runtime numbers its own from 2^31.
CORRELATION_SHIFT = 1 << 28


def synthetic_base(steps: int = 3) -> Recording:
    """The hand-made one-device DDP-like recording (see the module docstring)."""
    functions = [GEMM, ELEMENTWISE, NCCL]
    ops: list[tuple[int, int, int, int]] = []
    rows: list[dict[str, int]] = []
    correlation = 100

    def issue(thread: int, kind: int, site: int, **activity: int) -> None:
        nonlocal correlation
        correlation += 1
        ops.append((thread, correlation, kind, site))
        if activity:
            rows.append({"kind": kind, "correlation": correlation, **activity})

    # one operation a line
    # fmt: off
    for step in range(steps):
        t0 = step * 1_000_000  # one step a millisecond
        kernel = {"device": 0, "context": 1, "block_threads": 256}
        issue(0, act.KERNEL, 0, **kernel, stream=7, start=t0, end=t0 + 100_000, function=0,
              registers=64, grid_blocks=132)
        issue(0, act.KERNEL, 0, **kernel, stream=7, start=t0 + 110_000, end=t0 + 150_000,
              function=1, registers=16, grid_blocks=1024)
        # backward on the autograd thread, a bucket all-reduce after each of the first two
        # kernels overlapping the next kernel, the last bucket after the last kernel
        for start, end in ((200_000, 300_000), (300_000, 400_000), (400_000, 450_000)):
            issue(1, act.KERNEL, 1, **kernel, stream=7, start=t0 + start, end=t0 + end,
                  function=0, registers=64, grid_blocks=264)
            begin = t0 + end + 5_000
            issue(1, act.KERNEL, 2, **kernel, stream=13, start=begin, end=begin + 40_000,
                  function=2, registers=96, grid_blocks=16)
        issue(0, act.KERNEL, 3, **kernel, stream=13, start=t0 + 600_000, end=t0 + 640_000,
              function=2, registers=96, grid_blocks=16)
        issue(0, act.COPY, 4, device=0, context=1, stream=7, start=t0 + 700_000,
              end=t0 + 720_000, copy_kind=act.COPY_H2D, bytes=1 << 20)
        issue(0, act.SYNC, 5, device=0, context=1, stream=7, start=t0 + 720_000,
              end=t0 + 800_000, sync_kind=3)
    # fmt: on
    operations = np.zeros(len(ops), dtype=OPERATION_DTYPE)
    for index, op in enumerate(ops):
        operations[index] = op
    activities = act.empty_activities(len(rows))
    for index, row in enumerate(rows):
        for field, value in row.items():
            activities[index][field] = value
    activities["start"] += BASE_TIME
    activities["end"] += BASE_TIME
    order = np.argsort(activities["end"], kind="stable")  # completed in end order, as CUPTI
    activities = activities[order]
    half = len(activities) // 2
    return Recording(
        act.DeviceLimits("SYNTHETIC (issue #22: no GPU ran this)"),
        functions,
        operations,
        activities,
        [half, len(activities) - half],
        note=(
            "SYNTHETIC: made by tests/data/gpu/make_multi_fixture.py base, not recorded: a "
            f"DDP-like step on one device, {steps} steps, NCCL kernel names, round times"
        ),
        kernel_module=True,
    )


def derive(base: Recording, offset_ns: int = 25_000) -> Recording:
    """``base`` on device 0 and its shifted copy on device 1 (the module docstring's rules)."""
    if len(base.devices()) > 1:
        raise SystemExit("derive: the base recording already has several devices")
    threads = (max(base.threads()) + 1) if len(base.operations) else 0
    if len(base.operations) and int(base.operations["correlation"].max()) >= CORRELATION_SHIFT:
        raise SystemExit("derive: correlation ids of 2^28 and more: no room for a copy")
    ops = base.operations.copy()
    copy_ops = base.operations.copy()
    copy_ops["thread"] += threads
    copy_ops["correlation"] += CORRELATION_SHIFT
    node = copy_ops["kind"] == act.GRAPH_NODE
    copy_ops["correlation"][node] = base.operations["correlation"][node]  # node ids: not ids
    parts, sizes = [], []
    for piece in base.buffer_slices():
        original = base.activities[piece]
        twin = original.copy()
        twin["device"] = 1
        twin["context"] += 10
        twin["stream"] += 100
        twin["correlation"] += np.where(twin["correlation"] > 0, CORRELATION_SHIFT, 0).astype(
            np.uint64
        )
        twin["start"] += np.uint64(offset_ns)
        twin["end"] += np.uint64(offset_ns)
        parts += [original, twin]
        sizes += [len(original), len(twin)]
    activities = np.concatenate(parts) if parts else act.empty_activities()
    return Recording(
        base.device,
        list(base.functions),
        np.concatenate([ops, copy_ops]),
        activities,
        sizes,
        base.dropped * 2,
        note=(
            "SYNTHETIC two-device recording: make_multi_fixture.py derive (device 1 = device 0's "
            f"activity, context +10, stream +100, correlation +2^28, times +{offset_ns} ns, "
            f"threads +{threads}) of: {base.note}"
        ),
        clones=dict(base.clones),
        kernel_module=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    made = sub.add_parser("base", help="the hand-made one-device recording")
    made.add_argument("out")
    made.add_argument("--steps", type=int, default=3)
    derived = sub.add_parser("derive", help="two devices out of a one-device recording")
    derived.add_argument("base")
    derived.add_argument("out")
    derived.add_argument("--offset-ns", type=int, default=25_000)
    args = parser.parse_args()
    if args.command == "base":
        save(synthetic_base(args.steps), args.out)
    else:
        save(derive(load(args.base), args.offset_ns), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
