"""``pyrun``: measure every thread of every Python process a command starts (hpcrun's twin).

A thin click command over :mod:`pyhpctk.measure.launch.launcher`; ``pyrun ctl`` (windows of a
job: :mod:`pyhpctk.measure.launch.ctl`) and ``pyrun attach`` (PEP 768:
:mod:`pyhpctk.measure.launch.attach`) are commands of their own, chosen by the first argument.
See ``docs/pyrun.md``.
"""

from __future__ import annotations

import os
import sys

import click

from pyhpctk.cli._common import run_command, version_option
from pyhpctk.errors import PyhpctkError, UsageError
from pyhpctk.measure.control import COMMANDS
from pyhpctk.measure.events import event_listing, parse_events
from pyhpctk.measure.gpu import check as check_gpu_spec
from pyhpctk.measure.gpu.spec import is_gpu_event, parse_gpu_event
from pyhpctk.measure.launch import attach as attaching
from pyhpctk.measure.launch import ctl
from pyhpctk.measure.launch.config import DEFAULT_CHECKPOINT_S
from pyhpctk.measure.launch.launcher import (
    RunOptions,
    prepare_output_dir,
    remove_if_empty,
    reraise_exit_status,
    run,
)
from pyhpctk.measure.launch.rendezvous import PTH_NAME, install_pth, uninstall_pth

#: pyrun's own commands, chosen by the first argument (a program named so: give its path).
SUBCOMMANDS = ("ctl", "attach")


@click.command(
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]}
)
@version_option("pyrun")
@click.option(
    "-o",
    "--output",
    "output",
    metavar="DIR",
    help="Measurement directory (default: hpctoolkit-<program>-measurements[-<job>]); an "
    "existing one must be empty (see --append).",
)
@click.option(
    "-e",
    "--event",
    "events",
    multiple=True,
    metavar="EVENT[@PERIOD]",
    help="Sample EVENT every PERIOD microseconds: CPUTIME (default, @5000), REALTIME or GILWAIT "
    "(time waiting for the GIL); "
    "or measure GPU work: gpu=nvidia (CUPTI), gpu=amd, gpu=simulated (replays a recording), "
    "with options such as gpu=nvidia,pc or gpu=nvidia,memory (GPU memory with the Python lines "
    "that allocated it; pyrun -L lists them).",
)
@click.option("-t", "--trace", is_flag=True, help="Also record a trace (.hpctrace) per thread.")
@click.option("-L", "--list-events", is_flag=True, help="List the events pyrun can sample.")
@click.option(
    "--native/--no-native",
    default=True,
    show_default=True,
    help="Also record each sample's native frames (C, C++, Fortran libraries) under the Python "
    "line that called them (pyrun -L says the cost).",
)
@click.option(
    "--checkpoint",
    type=float,
    default=DEFAULT_CHECKPOINT_S,
    show_default=True,
    metavar="SECONDS",
    help="Rewrite the files at least this often while running, so that a crash or SIGKILL"
    " keeps the last ones (the first 0.25 s after start, then ever less often up to SECONDS;"
    " 0: only at the end).",
)
@click.option(
    "--start-paused",
    is_flag=True,
    help="Run the command but sample nothing until `pyrun ctl PID start` (PID: pyrun's, or of "
    "any process it measures); `pyrun ctl PID stop` closes the window and writes the files, "
    "`pyrun ctl PID mark NAME` names the phase that follows. Implies --control.",
)
@click.option(
    "--control",
    is_flag=True,
    help="Measure from the start, and let `pyrun ctl` stop, start and mark the measurement.",
)
@click.option(
    "--async-aware",
    is_flag=True,
    help="Put a coroutine's time under the chain of asyncio tasks awaiting it, each task a "
    "context node <task NAME>, instead of under the event loop's frames.",
)
@click.option(
    "--ranges",
    is_flag=True,
    help="Put time and GPU work under the ranges they ran in, each a context node: PyTorch "
    "modules by their path in the model (`layer1.0.conv1 (Conv2d)`, the backward pass's "
    "kernels under the module whose forward made them), torch.profiler.record_function, "
    "torch.cuda.nvtx and nvtx ranges (pyview --ranges folds the tree to them).",
)
@click.option(
    "--append",
    is_flag=True,
    help="Add this run to a measurement directory that already holds one (pyprof then merges "
    "them). Without it an existing non-empty DIR is refused, except by the ranks of one "
    "parallel launch, which share it.",
)
@click.option(
    "--install-pth",
    metavar="VENV",
    help="Let the Python processes of VENV (a venv, or an interpreter) that a launcher starts "
    "with a cleared environment (env -i, pyperf's workers) find pyrun: writes one .pth line "
    "into its site-packages, and exits. Nothing changes for runs outside pyrun.",
)
@click.option(
    "--uninstall-pth", metavar="VENV", help="Remove what --install-pth VENV wrote, and exit."
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def pyrun(
    output: str | None,
    events: tuple[str, ...],
    trace: bool,
    list_events: bool,
    native: bool,
    checkpoint: float,
    start_paused: bool,
    control: bool,
    async_aware: bool,
    ranges: bool,
    append: bool,
    install_pth: str | None,
    uninstall_pth: str | None,
    command: tuple[str, ...],
) -> int:
    """Run COMMAND [ARGS...] unchanged and measure every Python process and thread it starts.

    Each thread, Python's or a native library's, is sampled where it is at each tick of its own
    timer (docs/pyrun.md).

    \b
    pyrun reaches a process through its environment (PYTHONPATH, PYHPCTK_PYRUN_*); at the end
    it names the Python processes it saw start but could not measure, and why. A launcher
    that clears the environment must pass PYTHONPATH on (docs/pyrun.md), or see --install-pth.

    \b
    Windows of a long job (--start-paused, --control):
      pyrun ctl PID start|stop|mark NAME    pyrun ctl --help
      pyrun attach PID [-o DIR]             CPython 3.14+ (PEP 768): pyrun attach --help
    """
    if list_events:
        click.echo(event_listing(), nl=False)
        return 0
    if install_pth is not None or uninstall_pth is not None:
        return _pth(install_pth, uninstall_pth, command)
    gpu_events = [parse_gpu_event(e) for e in events if is_gpu_event(e)]
    if len(gpu_events) > 1:
        raise UsageError("give at most one gpu=... event")
    for spec in gpu_events:  # option values and recordings: refused before the command runs
        check_gpu_spec(spec)
    options = RunOptions(
        command=command,
        output_dir=output,
        events=parse_events([e for e in events if not is_gpu_event(e)]),
        trace=trace,
        checkpoint_s=checkpoint,
        gpu=str(gpu_events[0]) if gpu_events else None,
        append=append,
        native=native,
        control=control,
        start_paused=start_paused,
        async_aware=async_aware,
        ranges=ranges,
    )
    return run(options).exit_status


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("pid", type=int)
@click.argument("command", type=click.Choice(COMMANDS))
@click.argument("name", required=False, default="")
def pyrun_ctl(pid: int, command: str, name: str) -> int:
    """Open, close or name a window of a job measured under pyrun --start-paused (or --control).

    \b
      pyrun ctl PID start        sample from now on
      pyrun ctl PID stop         stop sampling; each process writes its files now
      pyrun ctl PID mark NAME    the samples that follow go under a context node <mark NAME>

    PID is pyrun's own, or of any process it measures: the command reaches that process and
    every measured process below it (workers, subprocesses, forked children), each through a
    socket only your user can reach; it returns once each has acted, and says which.
    """
    result = ctl.control(pid, command, name)
    for line in ctl.summary(command, name, result):
        click.echo(line, err=True)
    return 1 if result.silent or any(not answer.ok for answer in result.answers) else 0


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("pid", type=int)
@click.option("-o", "--output", "output", metavar="DIR", help="Measurement directory.")
@click.option("-e", "--event", "events", multiple=True, help="As pyrun's -e (CPU events only).")
@click.option("-t", "--trace", is_flag=True, help="Also record a trace per thread.")
@click.option("--checkpoint", type=float, default=DEFAULT_CHECKPOINT_S, help="As pyrun's.")
@click.option("--start-paused", is_flag=True, help="Attach, but sample from pyrun ctl PID start.")
@click.option("--async-aware", is_flag=True, help="As pyrun's --async-aware.")
def pyrun_attach(
    pid: int,
    output: str | None,
    events: tuple[str, ...],
    trace: bool,
    checkpoint: float,
    start_paused: bool,
    async_aware: bool,
) -> int:
    """Start measuring a running Python process PID that pyrun did not start (CPython 3.14+:
    sys.remote_exec, PEP 768); then pyrun ctl PID stop|start|mark opens and closes windows.
    """
    missing = attaching.remote_exec_missing()
    if missing:
        raise UsageError(missing)
    attaching.check_target(pid)
    command = ctl.command_argv(pid)
    options = RunOptions(
        command=command,
        output_dir=output,
        events=parse_events(list(events)),
        trace=trace,
        checkpoint_s=checkpoint,
        control=True,
        start_paused=start_paused,
        async_aware=async_aware,
    )
    created = output is None or not os.path.exists(output)
    directory = prepare_output_dir(output, command, {})
    try:
        said = attaching.attach(pid, options.measure_options(directory, "", os.environ))
    except PyhpctkError:
        remove_if_empty(directory, created)  # nothing of a failed attach is left behind
        raise
    click.echo(said, err=True)
    return 0


def _pth(install: str | None, uninstall: str | None, command: tuple[str, ...]) -> int:
    if install is not None and uninstall is not None:
        raise UsageError("--install-pth and --uninstall-pth contradict each other: choose one")
    if command:
        raise UsageError("--install-pth and --uninstall-pth run no command: give them alone")
    if install is not None:
        path = install_pth(install)
        click.echo(
            f"pyrun: wrote {path}: Python processes of {install} started under pyrun with a "
            f"cleared environment are measured; pyrun --uninstall-pth {install} removes it",
            err=True,
        )
        return 0
    assert uninstall is not None
    removed = uninstall_pth(uninstall)
    if removed is None:
        click.echo(f"pyrun: {uninstall} has no {PTH_NAME}: nothing to remove", err=True)
    else:
        click.echo(f"pyrun: removed {removed}", err=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The ``pyrun`` console script; returns the command's exit status.

    From the real command line (``argv`` None) a command killed by a signal makes pyrun die of
    the same signal; called with ``argv``, it returns ``128 + signal`` instead. A command that
    succeeded while some of its profiles could not be written gives 74 (docs/pyrun.md).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in SUBCOMMANDS:
        command = pyrun_ctl if args[0] == "ctl" else pyrun_attach
        return run_command(command, args[1:], f"pyrun {args[0]}")
    status = run_command(pyrun, args, "pyrun")
    if argv is None and status < 0:
        return reraise_exit_status(status)
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    raise SystemExit(main())
