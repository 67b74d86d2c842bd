"""Measurement options and how they travel to every process pyrun measures.

``pyrun`` puts its options into environment variables (``PYHPCTK_PYRUN_*``) next to a bootstrap
directory on ``PYTHONPATH``; every Python process that inherits that environment (the program,
its ``subprocess`` and ``multiprocessing`` children, interpreters started by shell scripts, MPI
ranks) reads them back with :meth:`MeasureOptions.from_env` and measures itself. Standard library
only: this runs in every measured process.
"""

from __future__ import annotations

import os

from pyhpctk.errors import UsageError
from pyhpctk.measure.events import EventSpec, events_from_env, format_events, parse_events
from pyhpctk.measure.settings import (  # the names of the variables (settings.py: one place)
    ENV_ASYNC,
    ENV_BOOTSTRAP,
    ENV_CHECKPOINT,
    ENV_CONTROL,
    ENV_EVENTS,
    ENV_MARK,
    ENV_OUTPUT,
    ENV_PACKAGE_ROOT,
    ENV_PAUSED,
    ENV_TRACE,
)

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping

DEFAULT_CHECKPOINT_S = 10.0
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
PACKAGE_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


class MeasureOptions:
    """What to measure and where to write it (a value; not a dataclass, to import fast).

    ``control``: open a control socket that ``pyrun ctl`` reaches; ``paused``: start with
    sampling paused (``--start-paused``, or a parent paused when it started this process), under
    the phase ``mark`` names (``""``: none); ``async_aware``: asyncio-aware stacks.
    """

    __slots__ = (
        "async_aware",
        "checkpoint_s",
        "control",
        "events",
        "mark",
        "output_dir",
        "paused",
        "trace",
    )

    def __init__(
        self,
        output_dir: str,
        events: tuple[EventSpec, ...] = (EventSpec("CPUTIME"),),
        trace: bool = False,
        checkpoint_s: float = DEFAULT_CHECKPOINT_S,
        control: bool = False,
        paused: bool = False,
        mark: str = "",
        async_aware: bool = False,
    ) -> None:
        self.output_dir = output_dir
        self.events = tuple(events)
        self.trace = trace
        self.checkpoint_s = checkpoint_s
        self.control = control or paused  # a paused process must be reachable
        self.paused = paused
        self.mark = mark
        self.async_aware = async_aware
        if not self.events:
            raise UsageError("at least one event is needed")
        if self.checkpoint_s < 0:
            raise UsageError("the checkpoint interval cannot be negative")
        if self.checkpoint_s != self.checkpoint_s:
            raise UsageError("the checkpoint interval must be a number of seconds, not nan")

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MeasureOptions):
            return NotImplemented
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"MeasureOptions({self.output_dir!r}, {self.events!r}, trace={self.trace}, "
            f"checkpoint_s={self.checkpoint_s}, control={self.control}, paused={self.paused}, "
            f"mark={self.mark!r}, async_aware={self.async_aware})"
        )

    @property
    def period_s(self) -> float:
        """The sampler's wake-up period: the shortest period of the events."""
        return min(event.period_us for event in self.events) / 1e6

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MeasureOptions | None:
        """The options pyrun left in ``env``, or None when this process is not under pyrun."""
        output = env.get(ENV_OUTPUT, "")
        if not output:
            return None
        events = events_from_env(env.get(ENV_EVENTS, "")) if env.get(ENV_EVENTS) else None
        checkpoint = env.get(ENV_CHECKPOINT, "")
        try:
            checkpoint_s = float(checkpoint) if checkpoint else DEFAULT_CHECKPOINT_S
        except ValueError:
            raise UsageError(f"{ENV_CHECKPOINT}={checkpoint!r} is not a number") from None
        return cls(
            output_dir=output,
            events=events or parse_events([]),
            trace=env.get(ENV_TRACE, "") == "1",
            checkpoint_s=checkpoint_s,
            control=env.get(ENV_CONTROL, "") == "1",
            paused=env.get(ENV_PAUSED, "") == "1",
            mark=env.get(ENV_MARK, ""),
            async_aware=env.get(ENV_ASYNC, "") == "1",
        )

    def export(self, env: MutableMapping[str, str]) -> None:
        """Put these options and the bootstrap into ``env`` for the processes pyrun starts."""
        env[ENV_OUTPUT] = os.path.abspath(self.output_dir)
        env[ENV_EVENTS] = format_events(self.events)
        env[ENV_TRACE] = "1" if self.trace else "0"
        env[ENV_CHECKPOINT] = repr(self.checkpoint_s)
        env[ENV_CONTROL] = "1" if self.control else "0"
        # Both set even when unused: a measured process rewrites them in place as its window
        # opens and closes (a variable that exists is replaced without moving the environment,
        # which the program's other threads may be reading: docs/pyrun.md).
        env[ENV_PAUSED] = "1" if self.paused else "0"
        env[ENV_MARK] = self.mark
        env[ENV_ASYNC] = "1" if self.async_aware else "0"
        env[ENV_BOOTSTRAP] = BOOTSTRAP_DIR
        env[ENV_PACKAGE_ROOT] = PACKAGE_ROOT
        existing = [part for part in env.get("PYTHONPATH", "").split(os.pathsep) if part]
        if BOOTSTRAP_DIR not in existing:
            existing.insert(0, BOOTSTRAP_DIR)
        env["PYTHONPATH"] = os.pathsep.join(existing)
