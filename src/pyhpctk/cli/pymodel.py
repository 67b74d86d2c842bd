"""``pymodel``: empirical scaling models for every calling context of a database series."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from pyhpctk.cli._common import run_command
from pyhpctk.errors import UsageError
from pyhpctk.formats import output
from pyhpctk.model.analyze import AnalysisOptions, analyze
from pyhpctk.model.fit import WEIGHTINGS, FitOptions
from pyhpctk.model.report import write_extrap_jsonl, write_json, write_table
from pyhpctk.model.series import (
    SCOPE_ALIASES,
    SCOPES,
    load_series,
    params_from_titles,
    parse_param,
    read_param_csv,
)


@dataclass(frozen=True, slots=True)
class Options:
    databases: tuple[Path, ...]
    params: tuple[str, ...]
    csv: Path | None
    param_names: tuple[str, ...]
    metric: str | None
    scope: str
    terms: int
    weighting: str
    refine: bool
    expect: str | None
    target: tuple[str, ...]
    threshold: float
    top: int
    json_out: Path | None
    extrap_out: Path | None
    plot: Path | None
    allow_mixed: bool
    force: bool = False


def _parse_target(texts: tuple[str, ...], names: tuple[str, ...]) -> tuple[float, ...] | None:
    if not texts:
        return None
    given = dict(parse_param(t, "--target") for t in texts)
    missing = [n for n in names if n not in given]
    if missing:
        raise UsageError(f"--target needs a value for {', '.join(missing)}")
    return tuple(given[n][0] for n in names)


def run(options: Options) -> int:
    databases = list(options.databases)
    sources = [
        name
        for name, given in (
            ("--csv", options.csv is not None),
            ("--param", bool(options.params)),
            ("--param-from-title", bool(options.param_names)),
        )
        if given
    ]
    if len(sources) > 1:
        raise UsageError(f"{' and '.join(sources)} both give the parameter values: choose one")
    if options.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install matplotlib")
    if options.json_out is not None and options.json_out == options.extrap_out:
        raise UsageError(f"--json and --extrap both write {options.json_out}: choose two files")
    for option, path in (("--json", options.json_out), ("--extrap", options.extrap_out)):
        if path is not None:  # refuse before the analysis rather than after it
            output.check_new(path, options.force, option)
    if options.csv is not None:
        if databases:
            raise UsageError("give databases either on the command line or in --csv, not both")
        databases, params = read_param_csv(options.csv)
    elif options.params:
        parsed = [parse_param(p) for p in options.params]
        names = [name for name, _ in parsed]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise UsageError(f"--param {', '.join(twice)} given more than once")
        params = dict(parsed)
    elif options.param_names:
        from pyhpctk.formats import metadb

        titles = [metadb.read(Path(d) / "meta.db").title for d in databases]
        params = params_from_titles(titles, options.param_names)
    else:
        raise UsageError("say which parameter values each database has: --param p=2,4,8,16,32")
    if not databases:
        raise UsageError("no databases given")
    series = load_series(databases, params, options.metric, options.scope, options.allow_mixed)
    fit = FitOptions(max_terms=options.terms, refine=options.refine, weighting=options.weighting)
    analysis = analyze(
        series,
        AnalysisOptions(
            fit=fit,
            target=_parse_target(options.target, series.params),
            expect=options.expect,
            threshold=options.threshold,
        ),
    )
    write_table(analysis, sys.stdout, top=options.top)
    if options.json_out is not None:
        with output.open_text(options.json_out, options.force, "--json") as stream:
            write_json(analysis, stream)
    if options.extrap_out is not None:
        with output.open_text(options.extrap_out, options.force, "--extrap") as stream:
            write_extrap_jsonl(series, stream)
    if options.plot is not None:
        from pyhpctk.model.plot import plot_contexts

        plot_contexts(analysis, options.plot, count=min(options.top, 6), force=options.force)
    return 0


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("databases", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="NAME=V1,V2,...",
    help="Parameter values, one per database in order (repeat for several parameters).",
)
@click.option(
    "--csv",
    type=click.Path(path_type=Path, dir_okay=False),
    help="CSV with a 'database' column and one column per parameter, instead of "
    "DATABASES and --param.",
)
@click.option(
    "--param-from-title",
    "param_names",
    multiple=True,
    metavar="NAME",
    help="Read parameter NAME's value from each database title (e.g. app.p16).",
)
@click.option("-m", "--metric", help="Metric to model (name or prefix; default: the first).")
@click.option(
    "--scope",
    default="inclusive",
    show_default=True,
    type=click.Choice([*SCOPE_ALIASES, *SCOPES]),
    help="Which values: inclusive (execution) or exclusive (lex_aware).",
)
@click.option(
    "--terms",
    default=1,
    show_default=True,
    type=click.IntRange(0, 3),
    help="Most non-constant terms per single-parameter model.",
)
@click.option(
    "--weighting",
    default="auto",
    show_default=True,
    type=click.Choice(list(WEIGHTINGS)),
    help="Least-squares weights: auto (per context, from how its repeated runs scatter: "
    "absolute when each configuration ran once), absolute (additive error, as sampled "
    "profiles have), poisson (1/value), relative (1/value^2, for multiplicative noise).",
)
@click.option("--refine", is_flag=True, help="Refine exponents by mediant search.")
@click.option(
    "--expect",
    metavar="FORMULA",
    help="Expected behaviour, e.g. 'p*log2(p)': each model is compared with it.",
)
@click.option(
    "--target",
    multiple=True,
    metavar="NAME=VALUE",
    help="Scale to predict at (default: 8x the largest measured value).",
)
@click.option(
    "--threshold",
    default=0.001,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Skip contexts below this fraction of the whole program.",
)
@click.option(
    "--top", default=20, show_default=True, type=click.IntRange(1), help="Rows of the table."
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write the models as JSON.",
)
@click.option(
    "--extrap",
    "extrap_out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also export the measurements in Extra-P's JSON Lines format.",
)
@click.option(
    "--plot",
    type=click.Path(path_type=Path, file_okay=False),
    help="Plot measurements and models of the top contexts into this directory (needs matplotlib).",
)
@click.option("--allow-mixed", is_flag=True, help="Model databases of different programs together.")
@click.option(
    "--force",
    is_flag=True,
    help="Replace existing --json/--extrap files and --plot images (refused without it).",
)
def cli(
    databases: tuple[Path, ...],
    params: tuple[str, ...],
    csv: Path | None,
    param_names: tuple[str, ...],
    metric: str | None,
    scope: str,
    terms: int,
    weighting: str,
    refine: bool,
    expect: str | None,
    target: tuple[str, ...],
    threshold: float,
    top: int,
    json_out: Path | None,
    extrap_out: Path | None,
    plot: Path | None,
    allow_mixed: bool,
    force: bool,
) -> int:
    """Model how every calling context scales, from a series of databases.

    Give the databases of runs at several scales (five or more values per parameter, repetitions
    allowed) and the parameter value of each. For every context pymodel searches the Performance
    Model Normal Form f(p) = c0 + c1 * p^i * log2(p)^j (exponents i from 0 to 3 in simple
    fractions, j in 0, 1, 2), chooses by cross-validated SMAPE, and ranks contexts by how badly
    they will scale.

    \b
    Examples:
      pymodel run2.d run4.d run8.d run16.d run32.d --param p=2,4,8,16,32
      pymodel --csv runs.csv --expect 'p*log2(p)' --json models.json
      pymodel a.d b.d c.d d.d e.d --param p=2,4,8,16,32 --extrap data.jsonl

    Output files are never replaced unless --force is given; each is written under a temporary
    name and renamed when complete, so a full disk gives one error line, exit status 2 and no
    partial file.
    """
    return run(
        Options(
            databases,
            params,
            csv,
            param_names,
            metric,
            scope,
            terms,
            weighting,
            refine,
            expect,
            target,
            threshold,
            top,
            json_out,
            extrap_out,
            plot,
            allow_mixed,
            force,
        )
    )


def main(argv: list[str] | None = None) -> int:
    return run_command(cli, argv, "pymodel")


if __name__ == "__main__":
    sys.exit(main())
