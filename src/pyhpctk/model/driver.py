"""pymodel's job, from its options to the table and the files: what ``pymodel`` runs.

:class:`ModelOptions` is the one object the command line builds (from click's values,
:meth:`ModelOptions.from_arguments`); :func:`run` checks that the options agree, reads the
parameter values (``--param``, ``--csv`` or the titles), loads the series of databases
(:mod:`.series`) or the Extra-P experiment (:mod:`.extrap_input`, one series per metric),
models every context (:mod:`.analyze`) and writes the tables and the ``--json`` / ``--extrap``
/ ``--plot`` outputs (:mod:`.report`, :mod:`.plot`), each output refused before the analysis
when it exists and ``force`` is not given.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TextIO

from pyhpctk.errors import UsageError
from pyhpctk.formats import output
from pyhpctk.model.advise import advise
from pyhpctk.model.analyze import AnalysisOptions, analyze
from pyhpctk.model.extrap_input import experiment_series, read_experiment
from pyhpctk.model.fit import FitOptions
from pyhpctk.model.report import write_advice, write_extrap_jsonl, write_json, write_table
from pyhpctk.model.series import (
    Series,
    check_design,
    load_series,
    params_from_titles,
    parse_param,
    read_param_csv,
)


@dataclass(frozen=True, slots=True)
class ModelOptions:
    """One pymodel run: the databases and their parameter values, what to model, what to write.

    ``databases`` is a series of databases or one Extra-P experiment file (text, JSON or JSON
    Lines: :mod:`.extrap_input`), which names its own parameters. A database series takes its
    parameter values from exactly one of ``params`` (``NAME=V1,V2,...``), ``csv`` or
    ``param_names`` (read from the titles); ``metric`` and ``scope`` choose the values,
    ``measure`` how repetitions become one value (mean, median, minimum, maximum); ``terms``,
    ``weighting`` and ``refine`` the model search; ``expect``, ``target`` and ``threshold`` the
    ranking; ``advise`` asks for the next measurements to take (:mod:`.advise`); ``top``,
    ``json_out``, ``extrap_out`` and ``plot`` the outputs (replaced only with
    ``force``); ``allow_mixed`` models databases of different programs together.
    """

    databases: tuple[Path, ...] = ()
    params: tuple[str, ...] = ()
    csv: Path | None = None
    param_names: tuple[str, ...] = ()
    metric: str | None = None
    scope: str = "inclusive"
    terms: int = 2
    weighting: str = "auto"
    refine: bool = False
    expect: str | None = None
    target: tuple[str, ...] = ()
    threshold: float | None = None  # None: 0.001 for databases, 0 for an Extra-P experiment
    measure: str = "mean"
    negative_exponents: bool = False
    advise: bool = False
    top: int = 20
    json_out: Path | None = None
    extrap_out: Path | None = None
    plot: Path | None = None
    allow_mixed: bool = False
    force: bool = False

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> ModelOptions:
        """The options of click's values (pymodel's parameter names are the field names)."""
        return cls(**{f.name: arguments[f.name] for f in fields(cls) if f.name in arguments})


def _parse_target(texts: tuple[str, ...], names: tuple[str, ...]) -> tuple[float, ...] | None:
    if not texts:
        return None
    given = dict(parse_param(t, "--target") for t in texts)
    missing = [n for n in names if n not in given]
    if missing:
        raise UsageError(f"--target needs a value for {', '.join(missing)}")
    return tuple(given[n][0] for n in names)


# Names that say "an Extra-P experiment" (a missing one is reported as a missing file).
EXTRAP_SUFFIXES = (".txt", ".json", ".jsonl")


def _is_extrap_input(databases: list[Path]) -> bool:
    """One argument that is a file, not a database directory: an Extra-P experiment."""
    return len(databases) == 1 and databases[0].is_file()


def _load(options: ModelOptions) -> tuple[list[Series], float]:
    """The series to model and the threshold of contexts too small to model."""
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
    single = databases[0] if len(databases) == 1 else None
    if single is not None and single.suffix.lower() in EXTRAP_SUFFIXES and not single.exists():
        raise UsageError(f"{single}: no such file")
    if _is_extrap_input(databases):
        if sources:
            raise UsageError(f"{databases[0]} names its parameters: {sources[0]} is not needed")
        if options.extrap_out is not None:
            raise UsageError(f"{databases[0]} is an Extra-P experiment already: drop --extrap")
        experiment = read_experiment(databases[0])
        series = experiment_series(experiment, databases[0].name, options.metric, options.measure)
        for one in series:
            check_design(one)
        # Extra-P models every call path: none is skipped unless --threshold asks.
        return series, options.threshold if options.threshold is not None else 0.0
    if len(sources) > 1:
        raise UsageError(f"{' and '.join(sources)} both give the parameter values: choose one")
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
        raise UsageError(
            "say which parameter values each database has (--param p=2,4,8,16,32), "
            "or give one Extra-P experiment file"
        )
    if not databases:
        raise UsageError("no databases given")
    loaded = load_series(
        databases, params, options.metric, options.scope, options.allow_mixed, options.measure
    )
    return [loaded], options.threshold if options.threshold is not None else 0.001


def run(options: ModelOptions, out: TextIO | None = None) -> int:
    if options.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install matplotlib")
    if options.json_out is not None and options.json_out == options.extrap_out:
        raise UsageError(f"--json and --extrap both write {options.json_out}: choose two files")
    for option, path in (("--json", options.json_out), ("--extrap", options.extrap_out)):
        if path is not None:  # refuse before the analysis rather than after it
            output.check_new(path, options.force, option)
    all_series, threshold = _load(options)
    fit = FitOptions(max_terms=options.terms, refine=options.refine, weighting=options.weighting)
    analyses = [
        analyze(
            series,
            AnalysisOptions(
                fit=fit,
                target=_parse_target(options.target, series.params),
                expect=options.expect,
                threshold=threshold,
                negative_exponents="always" if options.negative_exponents else "auto",
            ),
        )
        for series in all_series
    ]
    stream_out = out if out is not None else sys.stdout
    for number, analysis in enumerate(analyses):
        if number:
            stream_out.write("\n")
        write_table(analysis, stream_out, top=options.top)
        if options.advise:
            write_advice(analysis.series, advise(analysis.series, fit), stream_out)
    if options.json_out is not None:
        with output.open_text(options.json_out, options.force, "--json") as stream:
            write_json(analyses, stream)
    if options.extrap_out is not None:
        with output.open_text(options.extrap_out, options.force, "--extrap") as stream:
            write_extrap_jsonl(all_series[0], stream)
    if options.plot is not None:
        from pyhpctk.model.plot import plot_contexts

        for number, analysis in enumerate(analyses):
            prefix = f"{number + 1}-" if len(analyses) > 1 else ""
            plot_contexts(analysis, options.plot, min(options.top, 6), options.force, prefix=prefix)
    return 0


__all__ = ["ModelOptions", "run"]
