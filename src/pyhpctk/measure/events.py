"""Sampling events with hpcrun's syntax: ``-e NAME[@MICROSECONDS]``.

pyrun knows two events, as hpcrun names them: ``CPUTIME`` (each thread's own CPU clock) and
``REALTIME`` (wall-clock time). Each becomes one metric, ``CPUTIME (sec)`` / ``REALTIME (sec)``,
stored as a real number of seconds with period 1, exactly as hpcrun writes it (see
``meas/small.m`` in the reference data). This module is imported into every measured process, so
it must stay free of numpy and of anything slow to import.
"""

from __future__ import annotations

from pyhpctk.errors import UsageError

DEFAULT_PERIOD_US = 5000  # hpcrun's default for CPUTIME/REALTIME: 200 samples per second

#: name -> (one-line description, metric name as hpcrun writes it)
KNOWN_EVENTS: dict[str, tuple[str, str]] = {
    "CPUTIME": (
        "CPU time of each thread (its own CPU clock), sampled every PERIOD microseconds",
        "CPUTIME (sec)",
    ),
    "REALTIME": (
        "wall-clock time of each thread, running or blocked, sampled every PERIOD microseconds",
        "REALTIME (sec)",
    ),
}

#: The smallest period accepted: below 100 us a Python sampler thread cannot keep up.
MIN_PERIOD_US = 100
#: The largest: one hour (longer periods overflow the sampler's timed waits).
MAX_PERIOD_US = 3_600_000_000


class EventSpec:
    """One ``-e`` argument: the event name and its sampling period in microseconds.

    An immutable value (a plain slotted class rather than a dataclass: importing dataclasses
    would cost every measured process several milliseconds).
    """

    __slots__ = ("name", "period_us")
    name: str
    period_us: int

    def __init__(self, name: str, period_us: int = DEFAULT_PERIOD_US) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "period_us", period_us)
        if self.name not in KNOWN_EVENTS:
            raise UsageError(
                f"unknown event {self.name!r}; known events: {', '.join(KNOWN_EVENTS)} "
                "(pyrun -L lists them)"
            )
        if self.period_us < MIN_PERIOD_US:
            raise UsageError(
                f"event {self.name}: period {self.period_us} us is below the minimum "
                f"{MIN_PERIOD_US} us"
            )
        if self.period_us > MAX_PERIOD_US:
            raise UsageError(
                f"event {self.name}: period {self.period_us} us is above the maximum "
                f"{MAX_PERIOD_US} us (one hour)"
            )

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"EventSpec is immutable (cannot set {name})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EventSpec):
            return NotImplemented
        return (self.name, self.period_us) == (other.name, other.period_us)

    def __hash__(self) -> int:
        return hash((self.name, self.period_us))

    def __repr__(self) -> str:
        return f"EventSpec({self.name!r}, {self.period_us})"

    @property
    def metric_name(self) -> str:
        """The metric this event produces, e.g. ``CPUTIME (sec)``."""
        return KNOWN_EVENTS[self.name][1]

    @property
    def is_cpu_time(self) -> bool:
        return self.name == "CPUTIME"

    def __str__(self) -> str:
        return f"{self.name}@{self.period_us}"


def parse_event(text: str) -> EventSpec:
    """Parse ``NAME`` or ``NAME@PERIOD`` (hpcrun's syntax; PERIOD in microseconds).

    hpcrun also accepts ``NAME@fFREQ`` (samples per second); so does pyrun.
    """
    name, sep, period = text.strip().partition("@")
    name = name.strip().upper()
    if not sep:
        return EventSpec(name)
    period = period.strip()
    try:
        if period[:1] in ("f", "F"):
            frequency = int(period[1:])
            if frequency <= 0:
                raise ValueError(period)
            return EventSpec(name, max(1, round(1_000_000 / frequency)))
        return EventSpec(name, int(period))
    except ValueError:
        raise UsageError(
            f"bad event {text!r}: the period after '@' is a whole number of microseconds "
            "(or fFREQUENCY in samples per second)"
        ) from None


def parse_events(texts: list[str] | tuple[str, ...]) -> tuple[EventSpec, ...]:
    """Parse every ``-e`` argument; the default is ``CPUTIME@5000``. An event may appear once."""
    if not texts:
        return (EventSpec("CPUTIME"),)
    events = tuple(parse_event(text) for text in texts)
    names = [event.name for event in events]
    for name in names:
        if names.count(name) > 1:
            raise UsageError(f"event {name} is given more than once")
    return events


def format_events(events: tuple[EventSpec, ...]) -> str:
    """The inverse of :func:`parse_events` for an environment variable: ``CPUTIME@5000,...``."""
    return ",".join(str(event) for event in events)


def events_from_env(text: str) -> tuple[EventSpec, ...]:
    """Events carried to a child process in :func:`format_events` form."""
    return parse_events([part for part in text.split(",") if part.strip()])


def event_listing() -> str:
    """The text ``pyrun -L`` prints."""
    lines = ["Events pyrun can sample (-e NAME[@PERIOD], PERIOD in microseconds):", ""]
    for name, (description, metric) in KNOWN_EVENTS.items():
        lines.append(f"  {name:<10} {description}")
        lines.append(f"  {'':<10} metric: {metric}; default period {DEFAULT_PERIOD_US} us")
    lines.append("")
    lines.append(f"Default: -e CPUTIME@{DEFAULT_PERIOD_US} (200 samples per second).")
    lines += [
        "",
        "GPU work (at most one; combines with the events above and -t; docs/gpu.md):",
        "",
        "  gpu=nvidia[,OPTION...]     kernels, copies, memsets, syncs and allocations through",
        "                             CUPTI, under the Python line that issued them",
        "      pc[,period=N]          also PC samples with stall reasons (2^N cycles, default 12)",
        "      inst                   also exact instruction counts (CUPTI SASS metrics) of the",
        "                             kernel launched first after cudaProfilerStart()",
        "      hook=c|python|auto     how API calls are seen: the C hook (built by pip",
        "                             install where a C compiler is present) or cupti-python's",
        "                             Python callbacks; auto (default) picks the C hook if built",
        "      buffer=BYTES, records=raw|objects, pcmode=serialized|continuous",
        "  gpu=simulated[,OPTION...]  replays activity recorded on an H200 (no GPU needed):",
        "      recording=FILE, pc=FILE, inst=FILE, buffer=N, pending=N, hook=...",
        "  gpu=amd                    HIP (refused with a reason where ROCm tracing is absent)",
    ]
    return "\n".join(lines) + "\n"
