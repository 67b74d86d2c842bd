"""pyrun's library side: prepare the output directory, run the command, keep its exit status.

:func:`run` runs the user's command unchanged, with pyrun's bootstrap on ``PYTHONPATH`` and the
options in ``PYHPCTK_PYRUN_*`` variables, so every Python process the command starts measures
itself (:mod:`pyhpctk.measure.launch.runtime`). pyrun itself measures nothing; it only
launches, forwards termination signals, and reports when the command turned out not to be a
Python program.
This module must stay light to import: its start-up time is part of every measured run.

Exit status (docs/pyrun.md): the command's own; a command killed by a signal makes pyrun die of
that signal. Only when the command succeeded but measurement was lost (a profile could not be
written: a full disk) does pyrun exit with :data:`MEASUREMENT_LOST` instead: the program's own
failure is the first thing a script must see, and the message on stderr tells the rest.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import TextIO

from pyhpctk.errors import PyhpctkError, UsageError
from pyhpctk.measure import naming, signals
from pyhpctk.measure.census import Census, PythonProcess
from pyhpctk.measure.events import EventSpec
from pyhpctk.measure.launch import rendezvous
from pyhpctk.measure.launch.config import (
    BOOTSTRAP_DIR,
    DEFAULT_CHECKPOINT_S,
    MeasureOptions,
    check_options,
)
from pyhpctk.measure.launch.pythonargs import missing_script
from pyhpctk.measure.losses import LossReport
from pyhpctk.measure.settings import RunSettings, unknown_setting

#: Signals pyrun passes on to the command: every catchable one that would end pyrun, but SIGINT
#: (a terminal's Ctrl-C reaches the command directly) and SIGPIPE/SIGXFSZ (pyrun's own writes).
FORWARDED_SIGNALS: tuple[int, ...] = signals.FORWARDED

#: pyrun's exit status when the command succeeded but some of its measurement could not be
#: written (sysexits.h's EX_IOERR).
MEASUREMENT_LOST = 74

#: The file that says which run a measurement directory belongs to (hidden: no reader lists it).
LAUNCH_MARKER = ".pyrun-launch"


class OutputDirectoryError(PyhpctkError):
    """The measurement directory cannot be created or written: reported before the program runs."""

    exit_code = 2


class CommandNotFoundError(PyhpctkError):
    """The command does not exist or cannot be executed; exit statuses as a shell's."""

    exit_code = 127


class ScriptNotFoundError(CommandNotFoundError):
    """The Python script the command names is not there: Python's own exit status."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Everything ``pyrun`` was asked to do: the command, and what :func:`run` turns into the
    one :class:`MeasureOptions` it exports once the measurement directory is made."""

    command: tuple[str, ...]
    output_dir: str | None = None
    events: tuple[EventSpec, ...] = (EventSpec("CPUTIME"),)
    trace: bool = False
    checkpoint_s: float = DEFAULT_CHECKPOINT_S
    gpu: str | None = None  # a parsed and re-rendered ``gpu=...`` event (pyhpctk.measure.gpu)
    append: bool = False  # add this run to a directory that already holds measurements
    native: bool = True  # samples record native frames too (docs/pyrun.md, "Native frames")
    control: bool = False  # every measured process listens for pyrun ctl
    start_paused: bool = False  # ... and samples only once pyrun ctl PID start says so
    async_aware: bool = False  # a coroutine's time under the tasks awaiting it
    ranges: bool = False  # PyTorch modules and annotated ranges as context nodes

    def measure_options(
        self, output_dir: str, report: str, env: Mapping[str, str]
    ) -> MeasureOptions:
        """The one options object every measured process reads back: these options, the loss
        report's socket and the settings the user set in ``env``."""
        return MeasureOptions(
            output_dir,
            self.events,
            self.trace,
            self.checkpoint_s,
            native=self.native,
            gpu=self.gpu or "",
            report=report,
            settings=RunSettings(env),
            control=self.control,
            paused=self.start_paused,
            async_aware=self.async_aware,
            ranges=self.ranges,
        )

    def __post_init__(self) -> None:
        if not self.command:
            raise UsageError("no command given: pyrun [OPTIONS] COMMAND [ARGS...]")
        if self.output_dir == "":
            raise UsageError("-o: the measurement directory name is empty")
        check_options(self.events, self.checkpoint_s)  # before anything is created
        unknown = unknown_setting(os.environ)
        if unknown:  # (read by every measured process, which could only ignore it)
            raise UsageError(unknown)


@dataclass(slots=True)
class RunResult:
    """What happened: the command's exit status (negative: killed by that signal).

    ``lost`` names the profiles measured processes could not write (with why); ``exit_status``
    is what pyrun exits with.
    """

    returncode: int
    output_dir: str
    profiles: list[str] = field(default_factory=list)
    lost: dict[str, str] = field(default_factory=dict)
    python_started: int | None = None  # Python processes seen in the command's tree, or measured
    python_measured: int = 0  # of those, the ones that measured themselves
    unmeasured: list[PythonProcess] = field(default_factory=list)

    @property
    def exit_status(self) -> int:
        """The command's status, or :data:`MEASUREMENT_LOST` when only the measurement failed."""
        if self.returncode == 0 and self.lost:
            return MEASUREMENT_LOST
        return self.returncode


def prepare_output_dir(
    requested: str | None,
    command: tuple[str, ...],
    env: Mapping[str, str],
    append: bool = False,
) -> str:
    """Create the measurement directory and check it can be written; return its absolute path.

    Without ``-o``: hpcrun's default name; under a parallel launch every rank shares the one
    named after the launch, otherwise a fresh directory is taken so runs never mix. A directory
    that holds another run's files is refused unless ``append`` (:func:`claim_directory`).
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
        if not append:
            claim_directory(path, env)
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


def launch_claim(env: Mapping[str, str]) -> str:
    """What this run writes into :data:`LAUNCH_MARKER`: ``SCOPE KEY``.

    Every rank of one parallel launch computes the same claim (``launch`` and the launch key);
    under MPICH's hydra the key holds the node's proxy pid (``node``); a run outside any launch
    claims with a key of its own (``run``).
    """
    key = naming.launch_key(env)
    if not key:
        return f"run {naming.host_id():08x}-{os.getpid()}-{os.urandom(4).hex()}"
    return f"{'node' if naming.launch_key_is_per_node(env) else 'launch'} {key}"


def same_launch(claim: str, owner: str) -> bool:
    """Whether a directory claimed by ``owner`` belongs to the launch claiming ``claim``.

    Hydra names no launch, so its ranks on different nodes have different keys
    (``JOB.PROXY_PID``); within one batch job they are taken as one launch.
    """
    if claim == owner:
        return True
    scope, _, key = claim.partition(" ")
    owner_scope, _, owner_key = owner.partition(" ")
    job, dot, _ = key.rpartition(".")
    return scope == owner_scope == "node" and bool(dot and job) and owner_key.startswith(job + ".")


def claim_directory(directory: str, env: Mapping[str, str]) -> None:
    """Refuse ``directory`` if it holds another run's files; else mark it as this launch's.

    Empty, or already claimed by this launch (the ranks of one ``srun``/``mpiexec`` all pass the
    same ``-o``): fine. The claim is created with ``link(2)``, atomic and exclusive, so two runs
    started at once into one empty directory cannot both pass.
    """
    claim = launch_claim(env)
    marker = os.path.join(directory, LAUNCH_MARKER)
    others = _foreign_entries(directory)
    if not os.path.exists(marker):
        if others:
            shown = ", ".join(sorted(others)[:3]) + (", ..." if len(others) > 3 else "")
            raise OutputDirectoryError(
                f"{directory} already holds files ({shown}): measuring into it would add a"
                " second run that pyprof merges with the first. Give a new or empty directory,"
                " or --append to add this run to it on purpose"
            )
        temporary = f"{marker}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w", encoding="utf-8") as stream:
                stream.write(claim + "\n")
            os.link(temporary, marker)
            return
        except FileExistsError:  # another rank (or run) claimed it first: whose is it?
            pass
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
    with open(marker, encoding="utf-8", errors="replace") as stream:
        owner = stream.read().strip()
    if not same_launch(claim, owner):
        raise OutputDirectoryError(
            f"{directory} holds the measurements of another run ({owner}): measuring into it"
            " would add a second run that pyprof merges with the first. Give a new or empty"
            " directory, or --append to add this run to it on purpose"
        )


def _foreign_entries(directory: str) -> list[str]:
    """The entries of ``directory`` other than pyrun's own bookkeeping and an empty logical/."""
    found = []
    for name in os.listdir(directory):
        if name.startswith((LAUNCH_MARKER, ".pyrun-probe-")):
            continue  # a claim or a probe of a rank of this launch, in flight
        logical = os.path.join(directory, name)
        if name == "logical" and os.path.isdir(logical) and not os.listdir(logical):
            continue  # made by a rank of this launch, or left empty by a run that measured none
        found.append(name)
    return found


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
    script_problem = missing_script(options.command, resolve_command(options.command, base_env))
    if script_problem is not None:
        raise ScriptNotFoundError(script_problem)
    created_fresh = options.output_dir is None or not os.path.exists(options.output_dir)
    output_dir = prepare_output_dir(
        options.output_dir, options.command, base_env, append=options.append
    )
    before = _profiles(output_dir)
    report = LossReport()
    measure = options.measure_options(output_dir, report.listening, base_env)
    measure.export(base_env)  # the one options object, whole, for every measured process
    census = Census(BOOTSTRAP_DIR) if Census.available() else None
    settings = None
    try:
        settings = rendezvous.publish(base_env)
        watch = census.watch if census is not None else None
        returncode = _run_forwarding_signals(list(options.command), base_env, watch)
        ended = time.time()
    finally:
        rendezvous.withdraw(settings)
        lost = report.close()
        seen = census.stop() if census is not None else None
    written = sorted(_profiles(output_dir) - before)
    out = stderr if stderr is not None else sys.stderr
    measured = set(report.started) | {pid for pid in map(_profile_pid, written) if pid}
    unmeasured = [p for p in seen or () if p.pid not in measured]
    started = None if seen is None else len(measured | {p.pid for p in seen})
    if unmeasured:
        _tell_unmeasured(out, options.command[0], started or 0, unmeasured, settings is not None)
    elif started is not None and measure.settings.debug:
        out.write(f"pyrun: {started} Python process(es) started, all measured\n")
    result = RunResult(returncode, output_dir, written, lost, started, len(measured), unmeasured)
    if lost:
        _tell_lost(out, options.command[0], output_dir, lost, returncode)
    elif written and returncode < 0:
        _tell_kept(out, options.command[0], output_dir, written, -returncode, ended)
    elif not written and returncode < 0:
        out.write(
            f"pyrun: {options.command[0]} was killed by {signals.name_of(-returncode)} before "
            "any measured process wrote its profile, so nothing was measured (profiles are "
            "written when a process exits or dies of a signal it could catch, and at "
            "checkpoints, 0.25 s after start and then ever less often; SIGKILL leaves only the "
            "last checkpoint).\n"
        )
        remove_if_empty(output_dir, created_fresh)
    elif not written and unmeasured:  # the list above says why
        out.write(
            f"pyrun: {options.command[0]} exited with status {returncode}; nothing was measured.\n"
        )
        remove_if_empty(output_dir, created_fresh)
    elif not written:
        out.write(
            f"pyrun: {options.command[0]} ran (exit status {returncode}) but started no Python "
            "process pyrun could measure, so nothing was measured. pyrun measures Python "
            "programs and the Python processes a command starts (python app.py, scripts, "
            "srun/mpiexec ranks); interpreters run with -I or -E ignore PYTHONPATH and are "
            "measured only through pyrun --install-pth.\n"
        )
        remove_if_empty(output_dir, created_fresh)
    return result


def _profile_pid(name: str) -> int | None:
    """The pid in a profile's name, ``<exe>-<rank>-<thread>-<host>-<pid>-<gen>.hpcrun``."""
    parts = name.removesuffix(".hpcrun").rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def _tell_unmeasured(
    out: TextIO, program: str, started: int, unmeasured: list[PythonProcess], rescue: bool
) -> None:
    """Name the Python processes pyrun saw start but could not measure, and why."""
    listed = "\n".join(
        f"  pid {p.pid} ({p.command}){': ' + p.why if p.why else ''}" for p in unmeasured[:10]
    )
    if len(unmeasured) > 10:
        listed += f"\n  ... and {len(unmeasured) - 10} more"
    count = len(unmeasured)
    enough = "on this machine PYTHONPATH alone is enough, and " if rescue else ""
    if count == started:
        verdict = "it was not measured" if count == 1 else "none of them was measured"
    else:
        verdict = f"{count} of them {'was' if count == 1 else 'were'} not measured"
    out.write(
        f"pyrun: {program} started {started} Python process{'es' if started != 1 else ''}; "
        f"{verdict} (pyrun reaches a process only through its environment):\n{listed}\n"
        "pyrun: a launcher must pass PYTHONPATH and the PYHPCTK_PYRUN_* variables on (docs/"
        f'pyrun.md, "Launchers that clear the environment"); {enough}`pyrun --install-pth '
        "VENV` reaches the interpreters of VENV even in a cleared environment.\n"
    )


def _tell_lost(
    out: TextIO, program: str, directory: str, lost: dict[str, str], returncode: int
) -> None:
    """Name the profiles that could not be written, and why; say what pyrun exits with."""
    names = sorted(lost)
    reasons = sorted(set(lost.values()))
    earlier = " (an earlier copy is there: complete, but it ends early)"
    listed = "\n".join(
        f"  {name}: {lost[name]}{earlier if os.path.exists(os.path.join(directory, name)) else ''}"
        for name in names[:20]
    )
    if len(names) > 20:
        listed += f"\n  ... and {len(names) - 20} more"
    if returncode == 0:
        status = f"exiting with status {MEASUREMENT_LOST} although {program} succeeded"
    else:
        status = f"{program} failed too: its exit status is passed on"
    out.write(
        f"pyrun: measurement lost: {len(names)} profile(s) could not be written to {directory}"
        f" ({'; '.join(reasons)}); {status}. Files left there from an earlier checkpoint are"
        f" complete but end early.\n{listed}\n"
    )


def _tell_kept(
    out: TextIO, program: str, directory: str, written: list[str], signum: int, ended: float
) -> None:
    """The command died of ``signum`` at ``ended``: say so, and what its profiles hold."""
    newest = 0.0
    for name in written:
        with contextlib.suppress(OSError):
            newest = max(newest, os.stat(os.path.join(directory, name)).st_mtime)
    age = max(0.0, ended - newest)
    count = f"{len(written)} profile{'s' if len(written) != 1 else ''}"
    if signum in signals.WRITE_BEFORE_DYING:
        what = f"kept {count}, written as it died"
    else:  # no handler can write: the last checkpoint is what remains
        what = (
            f"kept {count} from its last checkpoint, {age:.1f} s before it died (what it did"
            " after is lost; checkpoints come 0.25 s after start, then ever less often, every"
            " --checkpoint seconds at most)"
        )
    out.write(f"pyrun: {program} died of {signals.name_of(signum)} (signal {signum}); {what}\n")


def remove_if_empty(directory: str, created: bool) -> None:
    """Undo what pyrun made in a directory nothing was written to (it stays if it existed)."""
    if _foreign_entries(directory):
        return
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(directory, LAUNCH_MARKER))
    with contextlib.suppress(OSError):
        os.rmdir(os.path.join(directory, "logical"))
        if created:
            os.rmdir(directory)


def _run_forwarding_signals(
    command: list[str], env: dict[str, str], watch: Callable[[int], None] | None = None
) -> int:
    """Start the command, pass termination signals on to it, wait, return its status.

    ``watch`` learns the command's pid as soon as it runs (the census of its processes).
    """
    in_main = threading.current_thread() is threading.main_thread()
    try:
        # close_fds=False: the command inherits every descriptor pyrun got, as it would if
        # started directly (MPICH's hydra hands each rank its PMI connection as PMI_FD).
        child = subprocess.Popen(command, env=env, close_fds=False, preexec_fn=_die_with_pyrun())
    except OSError as error:
        raise CommandNotFoundError(f"{command[0]}: {error.strerror or error}") from None
    if watch is not None:
        watch(child.pid)
    if not in_main:
        return child.wait()

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            child.send_signal(signum)

    # A signal pyrun inherited as ignored (nohup's SIGHUP, a shell's background SIGQUIT) is
    # ignored by the command too: it stays ignored here.
    previous = {
        sig: signal.signal(sig, forward)
        for sig in FORWARDED_SIGNALS
        if signal.getsignal(sig) != signal.SIG_IGN
    }
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


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_pyrun() -> Callable[[], None] | None:
    """What the command's process runs between ``fork`` and ``exec``: it dies of SIGKILL when
    pyrun dies (Linux's ``PR_SET_PDEATHSIG``, kept across ``exec``), so a batch system or a
    user that kills pyrun, even with SIGKILL, does not leave the program running as an orphan:
    it ends as it would have were it the process killed. Its own children are left as the
    program's death would leave them without pyrun. None where there is no ``prctl``.

    The signal comes when the *thread* that forked ends: pyrun forks from the thread that
    then waits for the command, which lives as long as the command. A pyrun that died
    between the fork and the ``prctl`` is seen by the parent pid having changed.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here, not at import: pyrun's start-up is part of every measured run

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pyrun = os.getpid()

    def die_with_pyrun() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != pyrun:  # pyrun is already gone: nothing would come
            os.kill(os.getpid(), signal.SIGKILL)

    return die_with_pyrun


def reraise_exit_status(returncode: int) -> int:
    """The status to exit with; for a command killed by a signal, die of the same signal.

    Only for the real command line: a test calling ``main([...])`` gets ``128 + signal``.
    pyrun dumps no core of its own where the command's signal dumps one: the command's core,
    the one worth reading, would be overwritten where both are named ``core``.
    """
    if returncode >= 0:
        return returncode
    signum = -returncode
    if signum in signals.DUMPS_CORE:
        import resource

        with contextlib.suppress(OSError, ValueError):
            _, hard = resource.getrlimit(resource.RLIMIT_CORE)
            resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signals.die_of(signum, exit_=lambda status: None)
    return 128 + signum
