"""``pyrun``: measure every thread of every Python process a command starts (hpcrun's twin).

A thin click command over :mod:`pyhpctk.measure.launch.launcher`; see ``docs/pyrun.md``.
"""

from __future__ import annotations

import click

from pyhpctk.cli._common import run_command, version_option
from pyhpctk.errors import UsageError
from pyhpctk.measure.events import event_listing, parse_events
from pyhpctk.measure.gpu import check as check_gpu_spec
from pyhpctk.measure.gpu.spec import is_gpu_event, parse_gpu_event
from pyhpctk.measure.launch.config import DEFAULT_CHECKPOINT_S
from pyhpctk.measure.launch.launcher import RunOptions, reraise_exit_status, run
from pyhpctk.measure.launch.rendezvous import PTH_NAME, install_pth, uninstall_pth


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
    "with options such as gpu=nvidia,pc (pyrun -L lists them).",
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
    )
    return run(options).exit_status


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
    status = run_command(pyrun, argv, "pyrun")
    if argv is None and status < 0:
        return reraise_exit_status(status)
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    raise SystemExit(main())
