"""What pyrun does while ``pyrun_ranges.py`` times a configuration (its ``--probe``, issue #37).

On the H100 the *on* steps of ``pyrun_ranges.py`` got slower after its first round (ResNet-18
1.035 then 1.27 and 1.32; GPT-2 1.09 then 1.46 and 1.37) while the *off* steps stayed steady. On
the CPU (the simulated GPU through the C hook, a backward on a worker thread) none of the tables
pyrun keeps grows with the steps and no site goes through Python twice (benchmarks/RESULTS.md).
The probe tells the device's hypotheses apart: each timed block (one configuration of one
round, ``--repeat`` bodies) gets one line of what changed in it:

- ``wall``: the block's wall time;
- ``cpu``: milliseconds on the CPU of each thread of the process
  (``/proc/self/task/*/schedstat``, in ns: native threads too), grouped as ``main``, pyrun's own
  (``pyrun-*``: the drain, the GPU monitor's and tracer's, which take the GIL from the main
  thread; each given) and the others (autograd's device thread, CUDA's and CUPTI's): a main
  thread busier on the CPU is work on the launch path, the same CPU in a longer wall time is
  waiting (the GIL, the GPU);
- ``context switches``: voluntary/involuntary, of the main thread and of the busiest other
  (on the GPU, autograd's device thread: voluntary ones are waits, for the GIL among others);
- ``hook``: the C CUPTI hook's counters (``fast``, ``slow``: through Python, ``sites``: new sites
  remembered, ``resets``: site tables emptied) and ``bumps``: new epochs the monitor started
  (each sends every site of every thread through Python once more);
- ``py-slow``: the monitor's Python slow path, calls and milliseconds, with no frame (autograd's
  device thread) and with;
- ``gc``: the collector's runs per generation and their milliseconds;
- ``gpu``: the monitor's buffers and activities;
- ``sizes`` (at the block's end): the ranges' tables (``children``, ``interned``, ``steps``),
  the threads' logs of changes (``logs``, the longest), the threads' switches and the hooks'
  chains, the CCTs' nodes (sampled threads, GPU threads), the GPU threads known and PyTorch's
  global forward pre- and post-hooks (one each while on, none while off).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from typing import Any

#: The kernel names of pyrun's own threads begin so (measure/thread_names.py: drain, GPU monitor,
#: tracer, CUPTI's buffers)
OWN_PREFIX = "pyrun-"


def context_switches(tid: int | None) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of thread ``tid`` so far."""
    counts = {}
    try:
        with open(f"/proc/self/task/{tid}/status") as stream:
            for line in stream:
                key, _, value = line.partition(":")
                if key.endswith("ctxt_switches"):
                    counts[key] = int(value)
    except (OSError, ValueError):
        pass
    return counts.get("voluntary_ctxt_switches", 0), counts.get("nonvoluntary_ctxt_switches", 0)


def thread_cpu_ns() -> dict[int, tuple[str, int]]:
    """(name, CPU ns) of each thread of this process, by native id."""
    out = {}
    for entry in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{entry}/schedstat") as stream:
                ns = int(stream.read().split()[0])
            with open(f"/proc/self/task/{entry}/comm") as stream:
                name = stream.read().strip()
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry)] = (name, ns)
    return out


class Counting:
    """``inner`` (the C hook module) with its ``bump`` counted."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.bumps = 0

    def bump(self) -> int:
        self.bumps += 1
        return int(self._inner.bump())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Probe:
    """The per-block line (see the module docstring) of a pyrun session with ranges."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.monitor = session.gpu
        self.slow = [0, 0, 0.0]  # calls without a frame, with one, seconds
        self.gc_ms = 0.0
        self.gc_runs = [0, 0, 0]
        self._gc_began = 0.0
        gc.callbacks.append(self._gc)
        monitor = self.monitor
        self.hook = None
        if monitor is not None:
            if getattr(monitor, "hook", None) is not None:
                self.hook = monitor.hook = monitor.matcher.hook = Counting(monitor.hook)
            slow = monitor._slow_operation
            counts = self.slow

            def counted(state: Any, frame: Any, *rest: Any) -> Any:
                began = time.perf_counter()
                try:
                    return slow(state, frame, *rest)
                finally:
                    counts[0 if frame is None else 1] += 1
                    counts[2] += time.perf_counter() - began

            monitor._slow_operation = counted
        self._before = self._snapshot()

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        else:
            self.gc_ms += (time.perf_counter() - self._gc_began) * 1e3
            self.gc_runs[info["generation"]] += 1

    def _snapshot(self) -> dict[str, Any]:
        hook = self.hook
        stats = self.monitor.stats if self.monitor is not None else None
        return {
            "wall": time.perf_counter(),
            "switches": {tid: context_switches(tid) for tid in thread_cpu_ns()},
            "cpu": thread_cpu_ns(),
            "hook": dict(hook.stats(), bumps=hook.bumps) if hook is not None else {},
            "slow": list(self.slow),
            "gc": (list(self.gc_runs), self.gc_ms),
            "gpu": (stats.buffers, stats.activities) if stats is not None else (0, 0),
        }

    def begin(self) -> None:
        self._before = self._snapshot()

    def line(self, label: str) -> str:
        """What changed since :meth:`begin`, and the sizes now."""
        before, after = self._before, self._snapshot()
        main = threading.main_thread().native_id
        groups = {"main": 0, "pyrun": 0, "other": 0}
        own: dict[str, int] = {}
        busiest = ("", 0, 0)
        for tid, (name, ns) in after["cpu"].items():
            spent = ns - before["cpu"].get(tid, (name, 0))[1]
            group = "main" if tid == main else "pyrun" if name.startswith(OWN_PREFIX) else "other"
            groups[group] += spent
            if group == "pyrun":
                own[name] = own.get(name, 0) + spent
            elif group == "other" and spent > busiest[1]:
                busiest = (name, spent, tid)

        def switched(tid: int | None) -> str:
            now, then = after["switches"].get(tid, (0, 0)), before["switches"].get(tid, (0, 0))
            return f"{now[0] - then[0]}/{now[1] - then[1]}"

        cpu = " ".join(f"{name} {ns / 1e6:.1f}" for name, ns in groups.items())
        cpu += " (" + ", ".join(f"{name} {ns / 1e6:.1f}" for name, ns in sorted(own.items())) + ")"
        hook = " ".join(
            f"{key} {after['hook'][key] - before['hook'].get(key, 0)}"
            for key in ("fast", "slow", "sites", "resets", "bumps")
            if key in after["hook"]
        )
        slow = [a - b for a, b in zip(after["slow"], before["slow"], strict=True)]
        runs = [a - b for a, b in zip(after["gc"][0], before["gc"][0], strict=True)]
        gpu = [a - b for a, b in zip(after["gpu"], before["gpu"], strict=True)]
        return (
            f"probe {label}: wall {(after['wall'] - before['wall']) * 1e3:.1f} ms"
            f" | cpu ms {cpu} (busiest other: {busiest[0]} {busiest[1] / 1e6:.1f})"
            f" | context switches main {switched(main)} busiest other {switched(busiest[2])}"
            f" | hook {hook or '-'} | py-slow frameless {slow[0]} framed {slow[1]}"
            f" {slow[2] * 1e3:.1f} ms | gc {runs} {after['gc'][1] - before['gc'][1]:.1f} ms"
            f" | gpu buffers {gpu[0]} activities {gpu[1]} | sizes {self.sizes()}"
        )

    def sizes(self) -> str:
        ranges = self.session.ranges
        threads = list(ranges._threads.values())
        logs = [len(t.log) + len(t.changes) for t in threads]
        cct = sum(len(state.cct) for state in self.session.states.values())
        gpu = self.monitor.threads if self.monitor is not None else []
        module = sys.modules.get("torch.nn.modules.module")
        hooks = [
            len(getattr(module, name, ()))
            for name in ("_global_forward_pre_hooks", "_global_forward_hooks")
        ]
        return (
            f"children {len(ranges._children)} interned {len(ranges._interned)}"
            f" steps {len(ranges._steps)} logs {sum(logs)} (longest {max(logs, default=0)})"
            f" switches {sum(len(t.switches) for t in threads)}"
            f" chains {len(ranges.hooks.switches)} cct {cct}"
            f" gpu-cct {sum(len(state.cct) for state in gpu)} gpu-threads {len(gpu)}"
            f" torch-global-hooks {hooks}"
        )

    def close(self) -> None:
        gc.callbacks.remove(self._gc)
