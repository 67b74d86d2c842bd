"""Record a torch.distributed program's GPU activity for the simulated backend (on the device).

    PYTHONPATH=src python3 tests/data/gpu/record_nccl.py OUT.json --backend nccl [--steps 4]
    PYTHONPATH=src python3 tests/data/gpu/record_nccl.py OUT.json --backend gloo
    python3 tests/data/gpu/record_nccl.py --plain --backend nccl   # unrecorded (under pyrun)

World size 1 on one GPU (issue #22: no machine with two GPUs was lent), so what NCCL does is
what it does for a communicator of one rank (``enqueue.cc``, ``ncclLaunchOneRank``): an
in-place sum is no work at all, an out-of-place collective is a device copy, and an average
(``ReduceOp.AVG``) runs the kernel ``oneRankReduce<FuncPreMulSum<T>>``. So the program averages
on purpose: a DDP model (three linear layers, random data) whose gradient buckets go through a
comm hook that all-reduces with AVG (``COMM-HOOK``, called on the autograd thread), an explicit
``dist.all_reduce(..., AVG)`` from a line of the training loop (``ALL-REDUCE``), an out-of-place
``all_gather_into_tensor`` (``ALL-GATHER``: a copy) and ``all_to_all_single`` (``ALL-TO-ALL``:
NCCL's point-to-point path, which may run ``ncclDevKernel_SendRecv`` even for one rank; a
failure is reported, not fatal). With ``--backend gloo`` the same program runs on gloo, whose
collectives run on the CPU: the GPU sees the copies of the CUDA tensors to and from the host.

CUPTI (cupti-python's callbacks and activity objects, the documented path) reports every API
call with its call site and every activity. The result is a recording (format 1.2,
``kernel_module``: replayed with a module naming every kernel); the summary line lists every
kernel name with its count and which ones :mod:`pyhpctk.core.communication` calls
communication, the evidence docs/gpu.md's "Communication" section rests on.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections import Counter

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record_graphs import Recorder  # the same stand-in for the monitor

from pyhpctk.core.communication import collective_of
from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu.simulated.recording import OPERATION_DTYPE, Recording, save


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def train(backend: str, steps: int) -> dict[str, object]:
    """The program: DDP steps and explicit collectives; returns what it saw."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:  # under torchrun
        dist.init_process_group(backend, init_method="env://")
    else:
        url = f"tcp://127.0.0.1:{_free_port()}"
        dist.init_process_group(backend, init_method=url, rank=0, world_size=1)
    cuda = torch.cuda.is_available()  # gloo also runs on a machine without one (docs/pyrun.md)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else None
    if device is not None:
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    average = dist.ReduceOp.AVG if backend == "nccl" else dist.ReduceOp.SUM
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(), torch.nn.Linear(1024, 16),
    ).to(device)  # fmt: skip
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None,
                                  bucket_cap_mb=1)  # fmt: skip

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses other annotations
        work = dist.all_reduce(bucket.buffer(), op=average, async_op=True)  # COMM-HOOK
        return work.get_future().then(lambda done: done.value()[0])

    ddp.register_comm_hook(None, hook)  # type: ignore[arg-type]
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    probe = torch.ones(1 << 16, device=device)
    gathered = torch.empty(dist.get_world_size() << 16, device=device)
    exchanged = torch.empty(1 << 16, device=device)
    # all_to_all_single splits dim 0 evenly over the ranks: 1 << 16 is divisible by any power
    # of two; gloo has no all_to_all for CUDA tensors (reported, not fatal)
    seen: dict[str, object] = {"all_gather": "ok", "all_to_all": "ok"}
    loop_began = time.perf_counter()
    for _ in range(steps):
        x = torch.randn(256, 512, device=device)
        loss = ddp(x).square().mean()  # FORWARD
        loss.backward()  # BACKWARD
        optimizer.step()  # STEP
        optimizer.zero_grad()
        dist.all_reduce(probe, op=average)  # ALL-REDUCE
        try:
            dist.all_gather_into_tensor(gathered, probe)  # ALL-GATHER
        except Exception as error:  # reported in the summary: the backend refused
            seen["all_gather"] = f"{type(error).__name__}: {error}"[:200]
        try:
            dist.all_to_all_single(exchanged, probe)  # ALL-TO-ALL
        except Exception as error:  # reported in the summary: the backend refused
            seen["all_to_all"] = f"{type(error).__name__}: {error}"[:200]
    if cuda:
        torch.cuda.synchronize()
    seen["loop_seconds"] = round(time.perf_counter() - loop_began, 4)
    seen["rank"] = dist.get_rank()
    seen["world_size"] = dist.get_world_size()
    seen["loss"] = float(loss.item())
    seen["probe_bytes"] = probe.numel() * probe.element_size()
    seen["torch"] = torch.__version__
    nccl = backend == "nccl" and cuda
    seen["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if nccl else ""
    dist.destroy_process_group()
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--plain", action="store_true", help="run unrecorded (under pyrun)")
    args = parser.parse_args()
    began = time.monotonic()
    if args.plain:  # pyrun subscribes to CUPTI itself: CUPTI takes one subscriber
        print(json.dumps(train(args.backend, args.steps)))
        return 0
    from pyhpctk.measure.gpu.cupti.backend import CuptiBackend

    recorder = Recorder()
    backend = CuptiBackend(records="objects", hook="python")
    backend.start(recorder)  # type: ignore[arg-type]
    seen = train(args.backend, args.steps)
    backend.stop()
    records = np.concatenate(recorder.batches) if recorder.batches else act.empty_activities()
    ops = np.zeros(len(recorder.ops), dtype=OPERATION_DTYPE)
    for index, op in enumerate(recorder.ops):
        ops[index] = op
    names = recorder.functions
    kernels = records[records["kind"] == act.KERNEL]
    counts: Counter[str] = Counter(
        names[f] if 0 <= f < len(names) else "?" for f in kernels["function"].tolist()
    )
    line_of = {site: f"{os.path.basename(f)}:{n}" for (f, n), site in recorder.sites.items()}
    launched = dict(zip(ops["correlation"].tolist(), ops["site"].tolist(), strict=True))
    comm_lines: Counter[str] = Counter()
    for function, correlation in zip(
        kernels["function"].tolist(), kernels["correlation"].tolist(), strict=True
    ):
        if 0 <= function < len(names) and collective_of(names[function]):
            comm_lines[line_of.get(launched.get(correlation, -1), "?")] += 1
    print(
        json.dumps(
            {
                "backend": args.backend,
                "seconds": round(time.monotonic() - began, 1),
                "ops": len(ops),
                "threads": len(recorder.threads),
                "activities": len(records),
                "kinds": dict(Counter(act.KIND_NAMES[int(k)] for k in records["kind"].tolist())),
                "streams": sorted({(int(d), int(c), int(s)) for d, c, s in
                                   records[["device", "context", "stream"]].tolist()}),
                "communication_kernels": {
                    name: [count, str(collective_of(name))]
                    for name, count in counts.items()
                    if collective_of(name)
                },
                "communication_by_line": dict(comm_lines),
                "other_kernels": len(counts) - sum(1 for n in counts if collective_of(n)),
                "unknown_apis": backend.callbacks.unknown_apis,
                "errors": recorder.errors[:3],
                **seen,
            }
        )
    )  # fmt: skip
    if args.out:
        save(
            Recording(
                backend.limits(),
                names,
                ops,
                records,
                [len(batch) for batch in recorder.batches],
                note=(
                    f"tests/data/gpu/record_nccl.py --backend {args.backend} --steps {args.steps}"
                    f" on one NVIDIA H200 (world size 1), torch {seen['torch']}, NCCL "
                    f"{seen['nccl'] or '-'}, cupti-python (objects): DDP of a 3-layer MLP with "
                    "an AVG comm hook, explicit all_reduce, all_gather, all_to_all per step"
                ),
                kernel_module=True,
            ),
            args.out,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
