"""``pymodel``: empirical scaling models for every calling context of a database series.

A thin click command: it builds a :class:`~pyhpctk.model.driver.ModelOptions` from its values and
calls :func:`pyhpctk.model.driver.run` (docs/pymodel.md).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from pyhpctk.cli._common import run_command, version_option
from pyhpctk.model.driver import ModelOptions, run
from pyhpctk.model.fit import WEIGHTINGS
from pyhpctk.model.series import MEASURES, SCOPE_ALIASES, SCOPES


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("pymodel")
@click.argument("databases", nargs=-1, type=click.Path(path_type=Path), metavar="DATABASES|FILE")
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
    "--measure",
    default="mean",
    show_default=True,
    type=click.Choice(list(MEASURES)),
    help="How a configuration's repetitions become the value modelled.",
)
@click.option(
    "--terms",
    default=2,
    show_default=True,
    type=click.IntRange(0, 3),
    help="Most non-constant terms per single-parameter model (a second one is kept only when "
    "an F-test against the repetitions' scatter calls it significant).",
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
    "--negative-exponents",
    is_flag=True,
    help="Let every context's model have negative exponents (strong scaling: c0 + c1 * p^-1); "
    "without it, only contexts whose values fall as a parameter grows.",
)
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
    type=click.FloatRange(0, 1),
    help="Skip contexts below this fraction of the largest one at the largest scale "
    "(default: 0.001 for databases, 0 for an Extra-P file).",
)
@click.option(
    "--advise",
    is_flag=True,
    help="Also say which parameter values to measure next: where the models the runs cannot "
    "yet reject differ most.",
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
def cli(**arguments: Any) -> int:
    """Model how every calling context scales, from a series of databases or an Extra-P file.

    Give the databases of runs at several scales (five or more values per parameter, repetitions
    allowed) and the parameter value of each, or one Extra-P experiment (its text, JSON or JSON
    Lines format), which names its parameters, call paths and metrics: each metric gets a table.
    For every context pymodel searches the Performance Model Normal Form
    f(p) = c0 + c1 * p^i * log2(p)^j (exponents i from 0 to 3 in simple fractions, j in 0, 1,
    2), keeps an extra term only when an F-test against the repetitions' scatter calls it
    significant, and ranks contexts by how badly they will scale (docs/pymodel.md).

    \b
    Examples:
      pymodel run2.d run4.d run8.d run16.d run32.d --param p=2,4,8,16,32
      pymodel --csv runs.csv --expect 'p*log2(p)' --json models.json
      pymodel a.d b.d c.d d.d e.d --param p=2,4,8,16,32 --extrap data.jsonl
      pymodel experiment.jsonl --measure median --json models.json

    Output files are never replaced unless --force is given; each is written under a temporary
    name and renamed when complete, so a full disk gives one error line, exit status 2 and no
    partial file.
    """
    return run(ModelOptions.from_arguments(arguments))


def main(argv: list[str] | None = None) -> int:
    return run_command(cli, argv, "pymodel")


if __name__ == "__main__":
    sys.exit(main())
