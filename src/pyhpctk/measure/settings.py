"""pyrun's environment variables: their names, and the one place they are read.

``pyrun`` exports its options (:class:`~pyhpctk.measure.launch.config.MeasureOptions`, read
back whole by :meth:`~pyhpctk.measure.launch.config.MeasureOptions.from_env`) and these
settings into the environment of the command; every measured process reads the settings whole
with :func:`run_settings`. No other module reads a ``PYHPCTK_*`` variable, except the bootstrap
(``bootstrap/sitecustomize.py``, ``bootstrap/rescue.py``), which must find the measurement and
the package before pyhpctk can be imported.

Standard library only, and no pyhpctk import: every layer of measure/ reads it.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Mapping

ENV_OUTPUT = "PYHPCTK_PYRUN_OUT"  # absolute measurement directory; its presence turns pyrun on
ENV_EVENTS = "PYHPCTK_PYRUN_EVENTS"  # CPUTIME@5000[,REALTIME@...]
ENV_TRACE = "PYHPCTK_PYRUN_TRACE"  # "1" records traces
ENV_CHECKPOINT = "PYHPCTK_PYRUN_CHECKPOINT"  # seconds between checkpoint writes, 0 = never
ENV_BOOTSTRAP = "PYHPCTK_PYRUN_BOOTSTRAP"  # the bootstrap directory put on PYTHONPATH
ENV_PACKAGE_ROOT = "PYHPCTK_PYRUN_PACKAGE_ROOT"  # where ``import pyhpctk`` finds the package
ENV_DEBUG = "PYHPCTK_PYRUN_DEBUG"  # "1": say on stderr what the bootstrap does
# Windows of long jobs (docs/pyrun.md): "1" opens a control socket pyrun ctl reaches; whether
# the process measures now ("1": paused) and the phase a mark named, kept up to date by each
# measured process, so a child it starts begins as its parent is (pyrun --start-paused, ctl)
ENV_CONTROL = "PYHPCTK_PYRUN_CONTROL"
ENV_PAUSED = "PYHPCTK_PYRUN_PAUSED"
ENV_MARK = "PYHPCTK_PYRUN_MARK"
ENV_ASYNC = "PYHPCTK_PYRUN_ASYNC"  # "1": asyncio-aware stacks (pyrun --async-aware)
ENV_NATIVE = "PYHPCTK_PYRUN_NATIVE"  # "0": samples record no native frames (pyrun --no-native)
ENV_SAMPLER = "PYHPCTK_PYRUN_SAMPLER"  # "thread": the Python sampler thread; else the engine
ENV_FALLBACK_SAID = "PYHPCTK_PYRUN_FALLBACK_SAID"  # the fallback was explained in this run
# "posix": CPU samples from timers, not perf_events; "signal": perf counters that signal through
# O_ASYNC and a realtime signal, not SIGTRAP (the default where the kernel has it: cheaper)
ENV_CPU_TIMER = "PYHPCTK_PYRUN_CPU_TIMER"
# benchmarks: another drain period (s, 0.01 to 2), to weigh what each wake-up of the drain costs
ENV_DRAIN_PERIOD = "PYHPCTK_PYRUN_DRAIN_S"
ENV_REPORT = "PYHPCTK_PYRUN_REPORT"  # the abstract socket name pyrun listens on
ENV_HOOK = "PYHPCTK_GPU_HOOK"  # the default of gpu=...,hook= (c, python, auto)
ENV_RECORDING = "PYHPCTK_GPU_RECORDING"  # the default recording of gpu=simulated
ENV_SAMPLER = "PYHPCTK_PYRUN_SAMPLER"  # "thread": the Python sampler thread; else the engine
ENV_FALLBACK_SAID = "PYHPCTK_PYRUN_FALLBACK_SAID"  # the fallback was explained in this run
# "posix": CPU samples from timers, not perf_events; "signal": perf counters that signal through
# O_ASYNC and a realtime signal, not SIGTRAP (the default where the kernel has it: cheaper)
ENV_CPU_TIMER = "PYHPCTK_PYRUN_CPU_TIMER"
# benchmarks: another drain period (s, 0.01 to 2), to weigh what each wake-up of the drain costs
ENV_DRAIN_PERIOD = "PYHPCTK_PYRUN_DRAIN_S"
ENV_REPORT = "PYHPCTK_PYRUN_REPORT"  # the abstract socket name pyrun listens on
ENV_GPU = "PYHPCTK_PYRUN_GPU"  # str(GpuSpec) for every process pyrun measures
ENV_HOOK = "PYHPCTK_GPU_HOOK"  # the default of gpu=...,hook= (c, python, auto)
ENV_RECORDING = "PYHPCTK_GPU_RECORDING"  # the default recording of gpu=simulated


class RunSettings:
    """pyrun's settings besides its options, read whole (:func:`run_settings`): the sampler,
    the CPU timer, the drain period, native frames, debug output, the GPU event and its hook
    and recording defaults, the loss report's socket, and whether the fallback was said.

    (The bootstrap reads ``PYHPCTK_PYRUN_OUT``, ``_BOOTSTRAP`` and ``_PACKAGE_ROOT`` itself,
    before pyhpctk can be imported.) A value; not a dataclass, to import fast.
    """

    __slots__ = (
        "cpu_timer",
        "debug",
        "drain_s",
        "fallback_said",
        "gpu",
        "gpu_hook",
        "gpu_recording",
        "native",
        "report",
        "sampler",
    )

    def __init__(self, env: Mapping[str, str]) -> None:
        self.sampler = env.get(ENV_SAMPLER, "").strip().lower()  # "thread": no engine
        self.cpu_timer = env.get(ENV_CPU_TIMER, "").strip().lower()  # "posix", "signal"
        self.drain_s = env.get(ENV_DRAIN_PERIOD, "")  # as given (drain_period() checks it)
        self.native = env.get(ENV_NATIVE, "1").strip() != "0"
        self.debug = env.get(ENV_DEBUG) == "1"
        self.fallback_said = bool(env.get(ENV_FALLBACK_SAID))
        self.gpu = env.get(ENV_GPU, "")  # the -e gpu=... event, "" when none
        self.gpu_hook = env.get(ENV_HOOK, "")
        self.gpu_recording = env.get(ENV_RECORDING, "")
        self.report = env.get(ENV_REPORT, "")


def run_settings(env: Mapping[str, str] | None = None) -> RunSettings:
    """pyrun's variables as they are now (``os.environ`` unless ``env``)."""
    return RunSettings(os.environ if env is None else env)
