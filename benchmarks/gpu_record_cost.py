"""Where the monitor's CPU goes per activity record, for a launch loop (issue #18).

    python benchmarks/gpu_record_cost.py [--records 40000] [--rounds 7]

No GPU: ``--records`` kernels launched from one line through the C hook (``invoke()``, as CUPTI
calls it), then one CUPTI buffer of their records (``gpu_model_sim.py``'s stand-in layout,
~200-byte kernel records) read by the CUPTI backend's parser and handed to the monitor's buffer
processing, ``--rounds`` times. Printed: the calling thread's CPU time per record (median of the
rounds after a first one) of each part: reading the buffer (``parse_raw``), taking the hook's
operations (``drain``), matching, attribution and, inside it, the metric sums, and the whole
buffer processing. Compare checkouts with ``PYTHONPATH=OTHER/src:benchmarks``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

import gpu_model_sim as sim

from pyhpctk.measure.gpu import activity as act
from pyhpctk.measure.gpu import metrics as gm
from pyhpctk.measure.gpu import simulated
from pyhpctk.measure.gpu.monitor import GpuMonitor
from pyhpctk.measure.gpu.simulated import DEFAULT_RECORDING
from pyhpctk.measure.gpu.simulated import recording as rec
from pyhpctk.measure.gpu.simulated.backend import SimulatedBackend
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session

FIXTURE = DEFAULT_RECORDING


def _timed(owner: object, name: str, label: str, spent: dict[str, list[float]]) -> None:
    original = getattr(owner, name)

    def timed(*args: object, **kwargs: object) -> object:
        began = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent.setdefault(label, []).append(time.thread_time() - began)

    setattr(owner, name, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=40_000, help="kernels per buffer")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    n = args.records
    with tempfile.TemporaryDirectory() as directory:
        session = Session(MeasureOptions(directory, trace=False, checkpoint_s=0))
        session.register_thread(threading.current_thread(), main=True)
        backend = SimulatedBackend(rec.load(FIXTURE), hook="c")
        monitor = GpuMonitor(
            session, session.add_metric_kind(gm.gpu_metric_kind()), backend=backend
        )
        backend.start(monitor, paused=True)
        native = backend.native
        assert native is not None, "the C hook is not built (pip install -e .)"
        cbid = simulated._FIRST_CBID + act.KERNEL
        issue: Callable[[int], object] = functools.partial(
            native.invoke, simulated._DRIVER, cbid, 0
        )
        spent: dict[str, list[float]] = {}
        reader = sim.parser()
        _timed(reader, "parse_raw", "reading (parse_raw)", spent)
        _timed(monitor.matcher, "drain", "operations (drain)", spent)
        _timed(monitor.matcher, "match", "matching", spent)
        _timed(monitor.attributor, "attribute", "attribution", spent)
        _timed(monitor.attributor, "add_metrics", "  of which sums", spent)
        _timed(monitor, "_process", "buffer processing", spent)
        for round_ in range(args.rounds + 1):
            if round_ == 1:
                spent.clear()  # the first round makes the nodes
            base = 1 + round_ * n
            for correlation in range(base, base + n):
                issue(correlation)
            kinds = [(c, sim.KERNEL_RECORD) for c in range(base, base + n)]
            raw = sim.raw_buffer(kinds, 1 << 60)
            monitor._process(reader.parse_raw(raw.ctypes.data, len(raw)), reader.functions, 0)
        stats = monitor.stats
        assert stats.unmatched == 0 and stats.matched == (args.rounds + 1) * n, stats
        for label, times in spent.items():
            print(f"{label:22} {statistics.median(times) / n * 1e9:6.0f} ns per record")
        monitor.close(write=False)
        native.reset()


if __name__ == "__main__":
    main()
