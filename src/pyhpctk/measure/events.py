"""Sampling events with hpcrun's syntax: ``-e NAME[@MICROSECONDS]``, and the event registry.

:data:`EVENTS` is the one place that says what an event is: its name, the metric it writes (a
real number of seconds with period 1, as hpcrun writes ``CPUTIME (sec)``; see ``meas/small.m`` in
the reference data), the clock whose timer takes its samples, what a sample adds, and its
description. ``pyrun -L``, the option checks and the session's sampling loop are all derived from
it, so an event (a perf_events counter, later) is added here and nowhere else.

This module is imported into every measured process, so it must stay free of numpy and of
anything slow to import.
"""

from __future__ import annotations

from pyhpctk.errors import UsageError
from pyhpctk.measure.gpu.spec import backend_listing

DEFAULT_PERIOD_US = 5000  # hpcrun's default for CPUTIME/REALTIME: 200 samples per second

#: Clocks a sampling timer runs on.
CLOCK_THREAD_CPU = "cpu"  # each thread's own CPU clock: ticks only while the thread runs
CLOCK_WALL = "wall"  # the monotonic clock: ticks for running and blocked threads alike

#: What a sample adds to an event's metric.
READ_DELTA = "delta"  # the clock's time since the thread's previous sample on that clock
READ_GIL_WAIT = "gil-wait"  # that time, if the thread was waiting for the GIL at the sample


class Event:
    """One entry of the registry (a plain slotted class: dataclasses cost imports)."""

    __slots__ = ("clock", "description", "metric", "name", "needs_engine", "reads")

    def __init__(
        self,
        name: str,
        metric: str,
        clock: str,
        reads: str,
        description: str,
        needs_engine: bool = False,
    ) -> None:
        self.name = name
        self.metric = metric
        self.clock = clock
        self.reads = reads
        self.description = description
        self.needs_engine = needs_engine  # only the native engine can measure it


#: The registry: every event pyrun can sample.
EVENTS: dict[str, Event] = {
    event.name: event
    for event in (
        Event(
            "CPUTIME",
            "CPUTIME (sec)",
            CLOCK_THREAD_CPU,
            READ_DELTA,
            "CPU time of each thread (its own CPU clock), sampled every PERIOD microseconds of"
            " that thread's CPU time",
        ),
        Event(
            "REALTIME",
            "REALTIME (sec)",
            CLOCK_WALL,
            READ_DELTA,
            "wall-clock time of each thread, running or blocked, sampled every PERIOD microseconds",
        ),
        Event(
            "GILWAIT",
            "GILWAIT (sec)",
            CLOCK_WALL,
            READ_GIL_WAIT,
            "wall-clock time each thread spends waiting for the GIL, where it waits (wall-clock"
            " samples, every PERIOD microseconds, that find the thread blocked on the GIL)",
            needs_engine=True,
        ),
    )
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
        if self.name not in EVENTS:
            raise UsageError(
                f"unknown event {self.name!r}; known events: {', '.join(EVENTS)} "
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
    def event(self) -> Event:
        """The registry's entry for this event."""
        return EVENTS[self.name]

    @property
    def metric_name(self) -> str:
        """The metric this event produces, e.g. ``CPUTIME (sec)``."""
        return EVENTS[self.name].metric

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
    for event in EVENTS.values():
        lines += [
            f"  {event.name:<10} {part}" if i == 0 else f"  {'':<10} {part}"
            for i, part in enumerate(_wrap(event.description, 78))
        ]
        lines.append(
            f"  {'':<10} metric: {event.metric}; default period {DEFAULT_PERIOD_US} us"
            + ("; needs the sampling engine" if event.needs_engine else "")
        )
    lines.append("")
    lines.append(f"Default: -e CPUTIME@{DEFAULT_PERIOD_US} (200 samples per second).")
    lines += [
        "Events on one clock share a timer, which runs at the shortest of their periods.",
        "CPU samples come from a perf_events counter per thread, through pyrun's realtime",
        "signal. PYHPCTK_PYRUN_CPU_TIMER=sigtrap raises SIGTRAP instead (a cheaper sample, but",
        "a SIGTRAP handler a C library installs, such as LLVM's under Triton, gets samples);",
        "=posix uses CPU-clock timers, which tick with the kernel's scheduler tick (CONFIG_HZ,",
        "often 250/s): a shorter period yields at most that many samples per second per",
        "thread, each carrying the exact CPU time since the previous one (docs/pyrun.md).",
    ]
    lines += [
        "",
        "Native frames: on by default (--no-native turns them off). Each sample also unwinds",
        "the thread's native stack (C, C++, Fortran libraries: numpy, OpenBLAS, torch) with",
        "pyrun's own eh_frame unwinder, inside the signal handler, and writes its frames",
        "as (load module, offset) under the Python line that called into them; the",
        "interpreter's own frames are replaced by the Python frames they run. Cost: about",
        "10-20 us per sample for a 24-frame native stack on the development VM (under 0.5 %",
        "of a thread's CPU time at 200 samples per second; benchmarks/RESULTS.md).",
    ]
    lines += [
        "",
        "GPU work (at most one; combines with the events above and -t; docs/gpu.md):",
        "",
        *backend_listing(),
    ]
    return "\n".join(lines) + "\n"


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters (textwrap costs an import)."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line else lines
