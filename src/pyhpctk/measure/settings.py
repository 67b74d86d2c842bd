"""pyrun's environment variables: their names, and the settings a user may set in them.

``pyrun`` exports its options whole in one variable, :data:`ENV_OPTIONS` (written and read by
:class:`~pyhpctk.measure.launch.config.MeasureOptions`), beside the bootstrap's two
(:data:`ENV_BOOTSTRAP`, :data:`ENV_PACKAGE_ROOT`: where the bootstrap and the package are, read
by ``bootstrap/sitecustomize.py`` and ``bootstrap/rescue.py`` before pyhpctk can be imported)
and the window's state (:data:`ENV_PAUSED`, :data:`ENV_MARK`).
The other variables are settings a user (or a test, or a benchmark) may set for a run:
:class:`RunSettings` reads them, once, into the options. No other module reads a
``PYHPCTK_*`` variable.

Standard library only, and no pyhpctk import: every layer of measure/ reads it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Mapping

# What pyrun exports: its options whole (MeasureOptions.export), and where the bootstrap finds
# itself and pyhpctk.
ENV_OPTIONS = "PYHPCTK_PYRUN_OPTIONS"  # its presence turns pyrun's measurement on
ENV_BOOTSTRAP = "PYHPCTK_PYRUN_BOOTSTRAP"  # the bootstrap directory put on PYTHONPATH
ENV_PACKAGE_ROOT = "PYHPCTK_PYRUN_PACKAGE_ROOT"  # where ``import pyhpctk`` finds the package
# The window's state (pyrun --start-paused, pyrun ctl; docs/pyrun.md), not an option: whether the
# process measures now ("1": paused) and the phase a mark named, kept up to date in place by each
# measured process, so a child it starts begins as its parent is.
ENV_PAUSED = "PYHPCTK_PYRUN_PAUSED"
ENV_MARK = "PYHPCTK_PYRUN_MARK"

# The settings a user may set (docs/pyrun.md), read whole by RunSettings.
ENV_DEBUG = "PYHPCTK_PYRUN_DEBUG"  # "1": say on stderr what the bootstrap does
ENV_SAMPLER = "PYHPCTK_PYRUN_SAMPLER"  # "thread": the Python sampler thread; else the engine
# "posix": CPU samples from timers, not perf_events; "sigtrap": perf counters that raise SIGTRAP
# (cheaper, but shared with the program); else ("signal", the default) perf counters that signal
# through O_ASYNC and the engine's realtime signal
ENV_CPU_TIMER = "PYHPCTK_PYRUN_CPU_TIMER"
# benchmarks: another drain period (s, 0.01 to 2), to weigh what each wake-up of the drain costs
ENV_DRAIN_PERIOD = "PYHPCTK_PYRUN_DRAIN_S"
ENV_HOOK = "PYHPCTK_GPU_HOOK"  # the default of gpu=...,hook= (c, python, auto)
ENV_RECORDING = "PYHPCTK_GPU_RECORDING"  # the default recording of gpu=simulated
# Set by the first measured process that explains the fallback: its children say it no more.
ENV_FALLBACK_SAID = "PYHPCTK_PYRUN_FALLBACK_SAID"


#: The values each setting takes ("" is the default); pyrun refuses another in one line.
CHOICES = {
    ENV_SAMPLER: ("", "thread", "engine"),
    ENV_CPU_TIMER: ("", "signal", "sigtrap", "posix"),
}


def unknown_setting(env: Mapping[str, str]) -> str:
    """The one line for a setting in ``env`` that takes none of its values; '' if none."""
    for name, values in CHOICES.items():
        value = env.get(name, "").strip().lower()
        if value not in values:
            known = ", ".join(v for v in values if v)
            return f"{name}={env[name]!r} is none of {known} (unset: the default)"
    return ""


class RunSettings:
    """The settings a user may set in the environment, read whole once: the sampler, the CPU
    timer, the drain period, debug output, the GPU hook's and recording's defaults, and whether
    the fallback was said. A value; not a dataclass, to import fast."""

    __slots__ = (
        "cpu_timer",
        "debug",
        "drain_s",
        "fallback_said",
        "gpu_hook",
        "gpu_recording",
        "sampler",
    )

    def __init__(self, env: Mapping[str, str]) -> None:
        self.sampler = env.get(ENV_SAMPLER, "").strip().lower()  # "thread": no engine
        self.cpu_timer = env.get(ENV_CPU_TIMER, "").strip().lower()  # "posix", "sigtrap", "signal"
        self.drain_s = env.get(ENV_DRAIN_PERIOD, "")  # as given (drain_period() checks it)
        self.debug = env.get(ENV_DEBUG) == "1"
        self.fallback_said = bool(env.get(ENV_FALLBACK_SAID))
        self.gpu_hook = env.get(ENV_HOOK, "")
        self.gpu_recording = env.get(ENV_RECORDING, "")
