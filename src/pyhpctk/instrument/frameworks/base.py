"""What every framework hook shares: the collector the hooks feed, their records, the version
pin, and the patches they undo.

A hook hands each PTX module it reaches to :class:`Collector.rewrite`, which instruments it with
the counters in module-level ``.global`` arrays (``Buffer.GLOBAL``: the framework's launcher
passes only the signature it compiled), and reports each module it loads with
:class:`Collector.loaded` and a way to read and zero a global of that module. What never shows
the hook PTX (a cubin, LTO-IR) is reported with :class:`Collector.skipped` and the reason.
"""

from __future__ import annotations

import importlib.metadata
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from pyhpctk.errors import PyhpctkError
from pyhpctk.instrument.ptx import (
    Buffer,
    Counts,
    Instrumented,
    Mode,
    PtxError,
    Sites,
    Strategy,
    TracedModule,
    derive,
    instrument,
    instrument_traces,
)


class FrameworkError(PyhpctkError):
    """A framework pyhpctk cannot hook (missing, or a version whose private hook points were
    never tested); the message is one line naming the framework, its version and what works."""

    exit_code = 2


NO_PTX = (
    "no PTX reached pyhpctk: a precompiled library's kernel or a cubin (cuBLAS, cuDNN, "
    "a loaded cubin or fatbin), or a module loaded before the hooks were installed"
)
LEFT_OUT = "kernel-name={} leaves it out"  # a kernel the filter did not choose (pyrun's)
ReadGlobal = Callable[[str, int], np.ndarray]  # (symbol, bytes) -> its bytes as uint8
ZeroGlobal = Callable[[str, int], None]
LocateGlobal = Callable[[str], int]  # symbol -> its device address
Rewritten = Instrumented | TracedModule  # counted (Mode) or traced (Strategy) PTX


@dataclass
class LoadedModule:
    """One instrumented module as the framework loaded it: its kernels' plans and counter
    arrays, and how to read them back (after the launch has finished)."""

    framework: str
    rewritten: Rewritten
    read_global: ReadGlobal
    zero_global: ZeroGlobal
    locate: LocateGlobal | None = None  # a global's device address (traced modules' control)

    @property
    def kernels(self) -> list[str]:
        return sorted(self.rewritten.plans)

    @property
    def instrumented(self) -> Instrumented:
        """The counted module (a traced one is a TypeError: it has no counters)."""
        if not isinstance(self.rewritten, Instrumented):
            raise TypeError(f"{self.framework}: a traced module has no counters")
        return self.rewritten

    @property
    def traced(self) -> TracedModule | None:
        return self.rewritten if isinstance(self.rewritten, TracedModule) else None

    def counters(self, kernel: str) -> np.ndarray:
        """The kernel's counters, shape (counters, 2): warps, threads; summed over every launch
        since the module was loaded or last reset."""
        module = self.instrumented
        raw = self.read_global(module.counter_globals[kernel], module.counter_bytes(kernel))
        return module.fold(kernel, raw)

    def counts(self, kernel: str) -> Counts:
        return derive(self.instrumented.plans[kernel], self.counters(kernel))

    def reset(self) -> None:
        if self.traced is not None:
            return
        module = self.instrumented
        for kernel in module.plans:
            self.zero_global(module.counter_globals[kernel], module.counter_bytes(kernel))


@dataclass(frozen=True)
class Skipped:
    """A module or kernel that reached the driver without PTX the hook could instrument."""

    framework: str
    what: str
    reason: str


@dataclass
class Collector:
    """What the hooks share: how to instrument, and what they instrumented, loaded or skipped."""

    mode: Mode = Mode.EDGES
    kernels: re.Pattern[str] | None = None  # instrument only kernels whose name matches
    #: Trace instead of counting (``gpu=nvidia,trace``): per-warp events at every block's head.
    traces: Strategy | None = None
    #: Loops' counters in registers, added to the buffer at the kernel's exits (``registers``
    #: of :func:`~pyhpctk.instrument.ptx.instrument`).
    registers: bool = False
    loaded_modules: list[LoadedModule] = field(default_factory=list)
    skips: list[Skipped] = field(default_factory=list)
    #: Told of each module as it is loaded, before its kernels can run (pyrun's monitor).
    listener: Callable[[LoadedModule], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def key(self) -> str:
        """What sets instrumented kernels apart in a framework's cache."""
        pattern = self.kernels.pattern if self.kernels is not None else ""
        if self.traces is not None:
            return f"pyhpctk-ptx-trace-{self.traces.value}-{pattern}"
        registers = "-registers" if self.registers else ""
        return f"pyhpctk-ptx-{self.mode.value}{registers}-{pattern}"

    def rewrite(self, framework: str, ptx: str) -> Rewritten | None:
        """``ptx`` instrumented, or None when it holds no kernel to instrument (or the pass
        refuses it: then it is recorded as skipped and the framework goes on with the original)."""
        if ".entry" not in ptx:
            return None
        try:
            from pyhpctk.instrument.ptx import parse

            names = {k.name for k in parse(ptx).kernels}
            chosen = {n for n in names if self.kernels is None or self.kernels.search(n)}
            if names - chosen and self.kernels is not None:
                left = ", ".join(sorted(names - chosen))
                self.skipped(framework, left, LEFT_OUT.format(self.kernels.pattern))
            if not chosen:
                return None
            if self.traces is not None:
                return instrument_traces(ptx, self.traces, Sites.BLOCKS, kernels=chosen)
            return instrument(
                ptx, self.mode, kernels=chosen, buffer=Buffer.GLOBAL, registers=self.registers
            )
        except PtxError as e:
            self.skipped(framework, ", ".join(sorted(names)) or "module", f"the PTX pass: {e}")
            return None

    def loaded(
        self,
        framework: str,
        result: Rewritten,
        read: ReadGlobal,
        zero: ZeroGlobal,
        locate: LocateGlobal | None = None,
    ) -> LoadedModule:
        record = LoadedModule(framework, result, read, zero, locate)
        with self._lock:
            self.loaded_modules.append(record)
        if self.listener is not None:
            self.listener(record)
        return record

    def skipped(self, framework: str, what: str, reason: str) -> None:
        with self._lock:
            self.skips.append(Skipped(framework, what, reason))

    def find(self, kernel: str) -> list[LoadedModule]:
        """The loaded modules holding an instrumented ``kernel``, oldest first."""
        return [m for m in self.loaded_modules if kernel in m.rewritten.plans]

    def unreached(self, launched: Iterable[str]) -> list[Skipped]:
        """Each kernel of ``launched`` (names as the driver saw them launched) that no hook
        instrumented, once, with why: a reason a hook recorded, else that no PTX reached one."""
        counted = {k for m in self.loaded_modules for k in m.rewritten.plans}
        out: dict[str, Skipped] = {}
        for kernel in launched:
            if kernel in counted or kernel in out:
                continue
            known = [s for s in self.skips if kernel in s.what.split(", ")]
            out[kernel] = known[0] if known else Skipped("", kernel, NO_PTX)
        return list(out.values())


class Framework(Protocol):
    """A framework whose kernels' PTX pyhpctk reaches at load time."""

    name: str  # as users write it: triton, cupy, numba
    distributions: tuple[str, ...]  # the packages (any one) whose version is pinned
    supported: tuple[tuple[int, int], ...]  # (major, minor) versions whose hook points were tested

    def install(self, collector: Collector) -> None:
        """Start instrumenting: every kernel compiled from now on goes through ``collector``."""

    def uninstall(self) -> None:
        """Stop: the framework is as before, and its next compile of a kernel is the original."""


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_version(framework: Framework) -> str:
    """The installed version of ``framework``'s distribution; a FrameworkError if it is
    missing or not one whose hook points were tested."""
    found = [(d, v) for d in framework.distributions if (v := installed_version(d)) is not None]
    pinned = ", ".join(f"{a}.{b}.x" for a, b in framework.supported)
    if not found:
        names = " or ".join(framework.distributions)
        raise FrameworkError(f"{framework.name}: {names} is not installed")
    distribution, version = found[0]
    number = re.match(r"(\d+)\.(\d+)", version)
    if number is None or (int(number[1]), int(number[2])) not in framework.supported:
        raise FrameworkError(
            f"{framework.name}: {distribution} {version} is not supported by pyhpctk's "
            f"PTX hooks (tested: {pinned}); its kernels would run uninstrumented"
        )
    return version


class Patches:
    """Attributes a hook replaced, restored in reverse order by :meth:`undo`."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any, bool]] = []

    def set(self, owner: Any, name: str, value: Any) -> Any:
        """Replace ``owner.name`` by ``value``; return what it was."""
        had = name in vars(owner)
        old = getattr(owner, name)
        self._saved.append((owner, name, vars(owner).get(name) if had else None, had))
        setattr(owner, name, value)
        return old

    def undo(self) -> None:
        while self._saved:
            owner, name, old, had = self._saved.pop()
            if had:
                setattr(owner, name, old)
            else:
                delattr(owner, name)

    def __bool__(self) -> bool:
        return bool(self._saved)
