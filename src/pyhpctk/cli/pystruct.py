"""``pystruct``: recover program structure (hpcstruct XML) from binaries, cubins, Python sources.

A thin click command over :mod:`pyhpctk.structure.driver`; see ``docs/pystruct.md``::

    pystruct [-o OUT] [-j N] [--gpucfg yes|no] [--cache DIR | --no-cache]
             [--functions auto|all|sampled] TARGET

TARGET is an ELF binary or shared library, a CUDA cubin, a Python source file, or a measurement
directory (then every referenced load module, captured cubin and Python source is written to
``structs/``, through a shared cache by default). Errors print one line and exit non-zero; in
directory mode every target is still attempted and the failures are listed at the end (exit
status 4).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import click

from pyhpctk.cli._common import run_command, version_option
from pyhpctk.errors import UsageError
from pyhpctk.structure.cache import default_cache_dir
from pyhpctk.structure.driver import (
    FUNCTIONS_CHOICES,
    StructOptions,
    Target,
    TargetsFailed,
    classify,
    measurement_targets,
    struct_measurements,
    struct_target,
)


@dataclass(frozen=True, slots=True)
class PystructOptions:
    """Everything the command line asked for."""

    target: Path
    output: Path | None
    jobs: int | None
    gpucfg: bool
    cache: Path | None
    nvdisasm: str | None
    quiet: bool
    resolve_paths: bool = True
    force: bool = False
    use_cache: bool = True  # measurement directories: the shared cache unless --no-cache
    functions: str = "auto"

    @property
    def struct_options(self) -> StructOptions:
        return StructOptions(
            self.jobs,
            self.gpucfg,
            self.cache,
            self.nvdisasm,
            self.resolve_paths,
            self.force,
            self.functions,
        )

    @property
    def measurement_options(self) -> StructOptions:
        """The options of directory mode: the shared cache by default (docs/pystruct.md)."""
        cache = self.cache if self.cache is not None else default_cache_dir()
        return StructOptions(
            self.jobs,
            self.gpucfg,
            cache if self.use_cache else None,
            self.nvdisasm,
            self.resolve_paths,
            self.force,
            self.functions,
        )


def _run(options: PystructOptions) -> int:
    kind = classify(options.target)
    show = not options.quiet and sys.stderr.isatty()
    if kind != "measurements":
        with click.progressbar(
            length=1,
            label=f"pystruct {options.target.name}",
            file=sys.stderr,
            hidden=not show,
        ) as bar:
            # The number of procedures is known after the skeleton; the bar learns it then.
            out = struct_target(
                options.target,
                options.output,
                options.struct_options,
                progress=bar.update,
                total=lambda n: setattr(bar, "length", max(1, n)),
            )
        if not options.quiet:
            click.echo(f"wrote {out}", err=True)
        return 0
    targets, _ = measurement_targets(options.target)
    with click.progressbar(
        length=len(targets), label="pystruct", file=sys.stderr, hidden=not show
    ) as bar:

        def starting(target: Target) -> None:  # a large library takes a while: name it
            bar.label = f"pystruct {target.source.name}"
            bar.render_progress()

        report = struct_measurements(
            options.target,
            options.measurement_options,
            options.output,
            progress=bar.update,
            targets=targets,
            starting=starting if show else None,
        )
    if not report.results and not options.quiet:
        click.echo(
            f"pystruct: nothing to analyze in {options.target}: its profiles name no binary, "
            "cubin or Python source file (code run with python -c or from stdin has none)",
            err=True,
        )
    for result in report.results:
        if result.status == "failed":
            click.echo(f"pystruct: error: {result.message}", err=True)
        elif not options.quiet:
            where = result.output if result.output is not None else result.message
            note = f" ({result.message})" if result.output is not None and result.message else ""
            click.echo(f"{result.status:9s} {where}{note}", err=True)
    if report.failed:
        raise TargetsFailed(
            f"{len(report.failed)} of {len(report.results)} targets failed "
            f"(the others were written)"
        )
    return 0


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("pystruct")
@click.argument("target", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Output file (one target) or directory (measurements; default MEAS/structs).",
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes: binaries of a measurement directory, or the functions "
    "of one large binary, in parallel. Default: 1 for one target; for a measurement "
    "directory the CPUs pystruct may use (at most 8, one per 100 targets).",
)
@click.option(
    "--gpucfg",
    type=click.Choice(["yes", "no"]),
    default="no",
    show_default=True,
    help="CUDA cubins: recover CFGs, loops and call sites (sm_70 and newer through nvdisasm, "
    "which must read the cubin's architecture; sm_5x/sm_6x decoded by pystruct).",
)
@click.option(
    "--cache",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory of results keyed by content hash, shared between runs (measurement "
    "directories: $PYHPCTK_CACHE_DIR/structs, $XDG_CACHE_HOME/pyhpctk/structs or "
    "~/.cache/pyhpctk/structs by default).",
)
@click.option(
    "--no-cache",
    is_flag=True,
    help="Measurement directories: analyze every binary afresh, keep no results.",
)
@click.option(
    "--functions",
    type=click.Choice(FUNCTIONS_CHOICES),
    default="auto",
    show_default=True,
    help="Measurement directories: analyze every procedure of each binary (all), only those "
    "holding sampled addresses with symbols for the rest (sampled), or 'sampled' for binaries "
    "with more than 64 KiB of machine code (auto).",
)
@click.option(
    "--nvdisasm",
    type=click.Path(dir_okay=False),
    default=None,
    help="The nvdisasm to use (default: $NVDISASM, PATH, the nvidia-cuda-nvdisasm wheel).",
)
@click.option("-q", "--quiet", is_flag=True, help="Only errors on stderr.")
@click.option(
    "--force",
    is_flag=True,
    help="Replace an existing output file (one target). MEAS/structs is always refreshed.",
)
@click.option(
    "--keep-paths",
    is_flag=True,
    help="Record source paths as the debug information has them (default: canonical "
    "paths for files that exist here, as hpcstruct does).",
)
def command(
    target: Path,
    output: Path | None,
    jobs: int | None,
    gpucfg: str,
    cache: Path | None,
    nvdisasm: str | None,
    quiet: bool,
    keep_paths: bool,
    force: bool,
    no_cache: bool,
    functions: str,
) -> int:
    """Recover program structure from TARGET and write hpcstruct XML (DTD 4.9).

    \b
    One target writes TARGET.hpcstruct in the current directory (or -o FILE); an existing
    file is replaced only with --force. A measurement directory writes MEAS/structs/ (or -o
    DIR), refreshing what is there, as hpcstruct MEAS does. Every file is written under a
    temporary name and renamed when complete: on a full disk pystruct says so in one line,
    stops, exits with status 2 and leaves no partial file (an existing one stays as it was).
    """
    if no_cache and cache is not None:
        raise UsageError("--cache and --no-cache exclude each other")
    return _run(
        PystructOptions(
            target,
            output,
            jobs,
            gpucfg == "yes",
            cache,
            nvdisasm,
            quiet,
            not keep_paths,
            force,
            not no_cache,
            functions,
        )
    )


def main(argv: list[str] | None = None) -> int:
    """Console entry point of ``pystruct``."""
    return run_command(command, argv, "pystruct")


if __name__ == "__main__":
    sys.exit(main())
