"""The measurement runtime's entry points: what the bootstrap calls, and a Python API.

``start_from_env()`` is called by pyrun's ``sitecustomize`` in every Python process started
under pyrun; :func:`attach` by the script ``pyrun attach`` has a running process execute.
:func:`start` / :func:`stop` let a program (or a test) measure itself without pyrun, e.g. to
measure only part of a run; threads that already exist are measured too.
Standard library only: this runs inside the measured program.
"""

from __future__ import annotations

import os
import sys

from pyhpctk.errors import UsageError
from pyhpctk.measure import gpu, hooks
from pyhpctk.measure.events import EventSpec
from pyhpctk.measure.launch.config import MeasureOptions
from pyhpctk.measure.session import Session

TYPE_CHECKING = False  # typing costs every measured process milliseconds to import
if TYPE_CHECKING:
    from collections.abc import Mapping


def start_from_env() -> Session | None:
    """Start measuring this process as pyrun's options ask (read whole, once, from the
    environment); None if this process is not under pyrun."""
    options = MeasureOptions.from_env(os.environ)
    if options is None or hooks.current_session() is not None:
        return None
    session = hooks.start(Session(options))
    if options.gpu:
        session.gpu = gpu.install(session, options.gpu)
        if session.windows.paused:  # pyrun --start-paused: nothing of the GPU's until start
            session.gpu.window(paused=True)
    _hook_ranges(session)
    if options.settings.debug:
        sys.stderr.write(f"pyrun: measuring pid {os.getpid()} into {options.output_dir}\n")
    return session


def attach(settings: Mapping[str, str]) -> Session:
    """Start measuring this process with the options pyrun put in ``settings`` (the script of
    ``pyrun attach`` runs this in the process's main thread: PEP 768), control on. The options
    also go into the process's environment, with pyrun's bootstrap on ``PYTHONPATH``, so the
    Python processes it starts from now on are measured too."""
    options = MeasureOptions.from_env(settings)
    if options is None:
        raise UsageError("pyrun attach gave no measurement directory")
    if hooks.current_session() is not None:
        raise UsageError("this process is already being measured")
    options.export(os.environ)
    session = hooks.start(Session(options))
    _hook_ranges(session)
    return session


def start(
    output_dir: str,
    events: tuple[EventSpec, ...] = (EventSpec("CPUTIME"),),
    trace: bool = False,
    checkpoint_s: float = 0.0,
    install_hooks: bool = True,
    gpu_event: str | None = None,
    native: bool = True,
    ranges: bool = False,
) -> Session:
    """Measure this process from now on, writing into ``output_dir`` (created if missing).

    ``gpu_event`` (``gpu=nvidia``, ``gpu=simulated,...``) also measures GPU work; ``native``:
    samples record native frames (pyrun's ``--native``); ``ranges``: PyTorch's modules and
    annotated ranges as context nodes (pyrun's ``--ranges``; :func:`push_range` too).
    """
    if hooks.current_session() is not None:
        raise UsageError("this process is already being measured")
    os.makedirs(output_dir, exist_ok=True)
    options = MeasureOptions(
        os.path.abspath(output_dir),
        events,
        trace,
        checkpoint_s,
        native,
        gpu_event or "",
        ranges=ranges,
    )
    session = Session(options)
    hooks.start(session, install_hooks=install_hooks)
    if options.gpu:
        session.gpu = gpu.install(session, options.gpu)
    _hook_ranges(session)
    return session


def _hook_ranges(session: Session) -> None:
    """With ``--ranges``: PyTorch's and nvtx's ranges are hooked (now, or at their import)."""
    if session.ranges is not None:
        from pyhpctk.measure import torch_ranges

        session.ranges.hooks = torch_ranges.install(session.ranges)


def push_range(name: str) -> None:
    """Open the range ``name`` on the calling thread (measured with ranges: else nothing)."""
    session = hooks.current_session()
    if session is not None and session.ranges is not None:
        session.ranges.push(name)


def pop_range() -> None:
    """Close the calling thread's innermost range."""
    session = hooks.current_session()
    if session is not None and session.ranges is not None:
        session.ranges.pop()


def stop(session: Session | None = None) -> None:
    """Stop measuring and write every thread's files."""
    if session is not None and session is not hooks.current_session():
        session.finish()
        return
    hooks.stop()
