"""pyrun's library side: prepare the output directory, run the command, keep its exit status.

:func:`run` runs the user's command unchanged, with pyrun's bootstrap on ``PYTHONPATH`` and the
options in ``PYHPCTK_PYRUN_*`` variables, so every Python process the command starts measures
itself (:mod:`pyhpctk.measure.runtime`). pyrun itself measures nothing; it only launches, forwards
termination signals, and reports when the command turned out not to be a Python program.
This module must stay light to import: its start-up time is part of every measured run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import TextIO

from pyhpctk.errors import PyhpctkError, UsageError
from pyhpctk.measure import naming
from pyhpctk.measure.config import DEFAULT_CHECKPOINT_S, MeasureOptions
from pyhpctk.measure.events import EventSpec
from pyhpctk.measure.gpu.spec import ENV_GPU

#: Signals pyrun passes on to the command (SIGINT comes from the terminal to both already).
FORWARDED_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGQUIT,
)


class OutputDirectoryError(PyhpctkError):
    """The measurement directory cannot be created or written: reported before the program runs."""

    exit_code = 2


class CommandNotFoundError(PyhpctkError):
    """The command does not exist or cannot be executed; exit statuses as a shell's."""

    exit_code = 127


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Everything ``pyrun`` was asked to do."""

    command: tuple[str, ...]
    output_dir: str | None = None
    events: tuple[EventSpec, ...] = (EventSpec("CPUTIME"),)
    trace: bool = False
    checkpoint_s: float = DEFAULT_CHECKPOINT_S
    gpu: str | None = None  # a parsed and re-rendered ``gpu=...`` event (pyhpctk.measure.gpu)

    def __post_init__(self) -> None:
        if not self.command:
            raise UsageError("no command given: pyrun [OPTIONS] COMMAND [ARGS...]")
        if self.output_dir == "":
            raise UsageError("-o: the measurement directory name is empty")


@dataclass(slots=True)
class RunResult:
    """What happened: the command's exit status (negative: killed by that signal)."""

    returncode: int
    output_dir: str
    profiles: list[str] = field(default_factory=list)


def prepare_output_dir(
    requested: str | None, command: tuple[str, ...], env: Mapping[str, str]
) -> str:
    """Create the measurement directory and check it can be written; return its absolute path.

    Without ``-o``: hpcrun's default name; under a parallel launch every rank shares the one
    named after the launch, otherwise a fresh directory is taken so runs never mix.
    """
    try:
        if requested is not None:
            path = requested
            os.makedirs(path, exist_ok=True)
        else:
            base = naming.default_output_dir(command, env)
            if naming.launch_key(env):
                path = base
                os.makedirs(path, exist_ok=True)
            else:
                path = naming.fresh_directory(base)
        path = os.path.abspath(path)
        os.makedirs(os.path.join(path, "logical"), exist_ok=True)
        probe = os.path.join(path, f".pyrun-probe-{os.getpid()}")
        with open(probe, "wb") as stream:
            stream.write(b"")
        os.unlink(probe)
    except OSError as error:
        where = error.filename or requested or "the measurement directory"
        raise OutputDirectoryError(
            f"cannot write measurements to {where}: {error.strerror or error}"
        ) from None
    return path


def resolve_command(command: tuple[str, ...], env: Mapping[str, str]) -> str:
    """The executable the command names, or :class:`CommandNotFoundError`."""
    program = command[0]
    found = shutil.which(program, path=env.get("PATH"))
    if found is None:
        if os.sep in program and os.path.exists(program):
            raise CommandNotFoundError(f"{program}: permission denied (not executable)")
        raise CommandNotFoundError(f"{program}: command not found")
    return found


def _profiles(directory: str) -> set[str]:
    try:
        return {name for name in os.listdir(directory) if name.endswith(".hpcrun")}
    except OSError:
        return set()


def run(
    options: RunOptions,
    env: Mapping[str, str] | None = None,
    stderr: TextIO | None = None,
) -> RunResult:
    """Run the command under measurement and return its exit status and what was written."""
    base_env = dict(os.environ if env is None else env)
    resolve_command(options.command, base_env)
    # Check the options before anything is created, so a bad value leaves no directory behind.
    MeasureOptions(options.output_dir or ".", options.events, options.trace, options.checkpoint_s)
    created_fresh = options.output_dir is None or not os.path.exists(options.output_dir)
    output_dir = prepare_output_dir(options.output_dir, options.command, base_env)
    MeasureOptions(output_dir, options.events, options.trace, options.checkpoint_s).export(base_env)
    if options.gpu is not None:
        base_env[ENV_GPU] = options.gpu  # its options hold commas: its own variable
    else:
        base_env.pop(ENV_GPU, None)
    before = _profiles(output_dir)
    returncode = _run_forwarding_signals(list(options.command), base_env)
    written = sorted(_profiles(output_dir) - before)
    if not written and returncode < 0:
        out = stderr if stderr is not None else sys.stderr
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        out.write(
            f"pyrun: {options.command[0]} was killed by {name} before any measured process "
            "wrote its profile, so nothing was measured (profiles are written when a process "
            f"exits, on SIGTERM, and every --checkpoint seconds).\n"
        )
        if created_fresh:
            _remove_if_empty(output_dir)
    elif not written:
        out = stderr if stderr is not None else sys.stderr
        out.write(
            f"pyrun: {options.command[0]} ran (exit status {returncode}) but started no Python "
            "process pyrun could measure, so nothing was measured. pyrun measures Python "
            "programs and the Python processes a command starts (python app.py, scripts, "
            "srun/mpiexec ranks); interpreters run with -I or -E ignore PYTHONPATH and cannot "
            "be measured.\n"
        )
        if created_fresh:
            _remove_if_empty(output_dir)
    return RunResult(returncode, output_dir, written)


def _remove_if_empty(directory: str) -> None:
    try:
        os.rmdir(os.path.join(directory, "logical"))
        os.rmdir(directory)
    except OSError:
        pass


def _run_forwarding_signals(command: list[str], env: dict[str, str]) -> int:
    """Start the command, pass termination signals on to it, wait, return its status."""
    in_main = threading.current_thread() is threading.main_thread()
    try:
        # close_fds=False: the command inherits every descriptor pyrun got, as it would if
        # started directly (MPICH's hydra hands each rank its PMI connection as PMI_FD).
        child = subprocess.Popen(command, env=env, close_fds=False)
    except OSError as error:
        raise CommandNotFoundError(f"{command[0]}: {error.strerror or error}") from None
    if not in_main:
        return child.wait()

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        while True:
            try:
                return child.wait()
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.signal(signal.SIGINT, previous_int)


def reraise_exit_status(returncode: int) -> int:
    """The status to exit with; for a command killed by a signal, die of the same signal.

    Only for the real command line: a test calling ``main([...])`` gets ``128 + signal``.
    """
    if returncode >= 0:
        return returncode
    signum = -returncode
    try:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    except (OSError, ValueError):
        pass
    return 128 + signum
