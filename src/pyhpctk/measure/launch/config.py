"""Measurement options: the one object pyrun exports and every process it measures reads whole.

``pyrun`` builds one :class:`MeasureOptions` and exports it whole in one environment variable,
``PYHPCTK_PYRUN_OPTIONS`` (``NAME=VALUE`` fields separated by ``;``; a ``%``, ``;`` or ``=`` in
a value is written ``%25``, ``%3B``, ``%3D``: not JSON, whose import with ``re``'s costs every
measured process 1.5 to 3 ms at start-up), next to a bootstrap directory on ``PYTHONPATH``.
Every Python process that inherits that environment (the program, its ``subprocess`` and
``multiprocessing`` children, interpreters started by shell scripts, MPI ranks) reads it back
once with :meth:`MeasureOptions.from_env`, with the settings a user may set
(:class:`~pyhpctk.measure.settings.RunSettings`), and measures itself. Standard library only:
this runs in every measured process.
"""

from __future__ import annotations

import os

from pyhpctk.errors import UsageError
from pyhpctk.measure.events import EventSpec, events_from_env, format_events, parse_events
from pyhpctk.measure.settings import (  # the names of the variables (settings.py: one place)
    ENV_BOOTSTRAP,
    ENV_MARK,
    ENV_OPTIONS,
    ENV_PACKAGE_ROOT,
    ENV_PAUSED,
    RunSettings,
)

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping

DEFAULT_CHECKPOINT_S = 10.0
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
PACKAGE_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


def check_options(events: tuple[EventSpec, ...], checkpoint_s: float) -> None:
    """Refuse what no measurement can take (pyrun checks before it creates anything)."""
    if not events:
        raise UsageError("at least one event is needed")
    if checkpoint_s < 0:
        raise UsageError("the checkpoint interval cannot be negative")
    if checkpoint_s != checkpoint_s:
        raise UsageError("the checkpoint interval must be a number of seconds, not nan")


class MeasureOptions:
    """What to measure and where to write it, and the settings of the run (a value; not a
    dataclass, to import fast).

    ``native``: samples record native frames (``--no-native``: False); ``gpu``: the parsed and
    re-rendered ``gpu=...`` event ("" when none); ``report``: the abstract socket name pyrun
    listens on ("" when none, :mod:`pyhpctk.measure.losses`); ``settings``: what the user set
    in the environment, read when the options are built (:class:`RunSettings`); ``control``:
    open a control socket that ``pyrun ctl`` reaches; ``async_aware``: asyncio-aware stacks;
    ``ranges``: PyTorch modules and annotated ranges as context nodes (``--ranges``).

    ``paused`` (sampling paused: ``--start-paused``, or a parent paused when it started this
    process) and ``mark`` (the phase a mark named, ``""``: none) are the window's state, not
    options: they travel in variables of their own that each measured process rewrites in
    place as its window opens and closes (:mod:`pyhpctk.measure.session.windows`), so that a
    child begins as its parent is.
    """

    __slots__ = (
        "async_aware",
        "checkpoint_s",
        "control",
        "events",
        "gpu",
        "mark",
        "native",
        "output_dir",
        "paused",
        "ranges",
        "report",
        "settings",
        "trace",
    )

    def __init__(
        self,
        output_dir: str,
        events: tuple[EventSpec, ...] = (EventSpec("CPUTIME"),),
        trace: bool = False,
        checkpoint_s: float = DEFAULT_CHECKPOINT_S,
        native: bool = True,
        gpu: str = "",
        report: str = "",
        settings: RunSettings | None = None,
        control: bool = False,
        paused: bool = False,
        mark: str = "",
        async_aware: bool = False,
        ranges: bool = False,
    ) -> None:
        self.output_dir = output_dir
        self.events = tuple(events)
        self.trace = trace
        self.checkpoint_s = checkpoint_s
        self.native = native
        self.gpu = gpu
        self.report = report
        self.settings = RunSettings(os.environ) if settings is None else settings
        self.control = control or paused  # a paused process must be reachable
        self.paused = paused
        self.mark = mark
        self.async_aware = async_aware
        self.ranges = ranges
        check_options(self.events, self.checkpoint_s)

    def _carried(self) -> dict[str, str]:
        """What travels to the measured processes (the settings are each process's own)."""
        return {
            "output_dir": self.output_dir,
            "events": format_events(self.events),
            "trace": "1" if self.trace else "0",
            "checkpoint_s": repr(self.checkpoint_s),
            "native": "1" if self.native else "0",
            "gpu": self.gpu,
            "report": self.report,
            "control": "1" if self.control else "0",
            "async_aware": "1" if self.async_aware else "0",
            "ranges": "1" if self.ranges else "0",
        }

    def _compared(self) -> dict[str, str]:
        return {**self._carried(), "paused": str(self.paused), "mark": self.mark}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MeasureOptions):
            return NotImplemented
        return self._compared() == other._compared()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MeasureOptions({self._compared()!r})"

    @property
    def period_s(self) -> float:
        """The sampler's wake-up period: the shortest period of the events."""
        return min(event.period_us for event in self.events) / 1e6

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MeasureOptions | None:
        """The options pyrun left in ``env`` and the settings set there, or None when this
        process is not under pyrun."""
        text = env.get(ENV_OPTIONS, "")
        if not text:
            return None
        try:
            carried = decode_options(text)
            events = carried.get("events", "")
            checkpoint = carried.get("checkpoint_s", "")
            return cls(
                output_dir=carried["output_dir"],
                events=events_from_env(events) if events else parse_events([]),
                trace=carried.get("trace") == "1",
                checkpoint_s=float(checkpoint) if checkpoint else DEFAULT_CHECKPOINT_S,
                native=carried.get("native") != "0",
                gpu=carried.get("gpu", ""),
                report=carried.get("report", ""),
                settings=RunSettings(env),
                control=carried.get("control") == "1",
                paused=env.get(ENV_PAUSED, "") == "1",
                mark=env.get(ENV_MARK, ""),
                async_aware=carried.get("async_aware") == "1",
                ranges=carried.get("ranges") == "1",
            )
        except (ValueError, KeyError) as error:
            raise UsageError(f"{ENV_OPTIONS} is not pyrun's options: {error!r}") from None

    def export(self, env: MutableMapping[str, str]) -> None:
        """Put these options and the bootstrap into ``env`` for the processes pyrun starts."""
        carried = self._carried()
        carried["output_dir"] = os.path.abspath(self.output_dir)
        env[ENV_OPTIONS] = ";".join(
            f"{name}={value.replace('%', '%25').replace(';', '%3B').replace('=', '%3D')}"
            for name, value in carried.items()
        )
        # Both set even when unused: a measured process rewrites them in place as its window
        # opens and closes (a variable that exists is replaced without moving the environment,
        # which the program's other threads may be reading: docs/pyrun.md).
        env[ENV_PAUSED] = "1" if self.paused else "0"
        env[ENV_MARK] = self.mark
        env[ENV_BOOTSTRAP] = BOOTSTRAP_DIR
        env[ENV_PACKAGE_ROOT] = PACKAGE_ROOT
        existing = [part for part in env.get("PYTHONPATH", "").split(os.pathsep) if part]
        if BOOTSTRAP_DIR not in existing:
            existing.insert(0, BOOTSTRAP_DIR)
        env["PYTHONPATH"] = os.pathsep.join(existing)


def decode_options(text: str) -> dict[str, str]:
    """The fields of :meth:`MeasureOptions.export`'s text (ValueError: not such a text)."""
    fields = {}
    for field in text.split(";"):
        name, equals, value = field.partition("=")
        if not equals:
            raise ValueError(f"no NAME=VALUE in {field!r}")
        head, *escaped = value.split("%")
        fields[name] = head + "".join(chr(int(part[:2], 16)) + part[2:] for part in escaped)
    return fields
