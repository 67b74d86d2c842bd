"""Which metrics a view shows, and how each is computed from the database's summary statistics.

Every displayed metric is a pair of formulas (inclusive, exclusive) over *inputs*: one summary
statistic each (metric, propagation scope, per-profile formula, combine; formats.md §3.2 {SS}).
A plain meta.db metric is ``inclusive = sum of execution``, ``exclusive = sum of lex_aware``
(the viewer terms of formats.md §3.2); the taxonomy's derived metrics (``GSAMP:UTIL``) and the
user's ``--derive`` formulas are built the same way, so views that aggregate (flat, bottom-up)
sum the inputs first and apply the formula after, which keeps ratios right.

Metric names are matched case-insensitively, with or without their unit (``gker`` finds
``GKER (sec)``), or by shell-style pattern (``GXCOPY:*``); an unknown name is a usage error that
lists close matches.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from pyhpctk.errors import FormatError, FormatWarning, UsageError
from pyhpctk.present import formula as fx
from pyhpctk.present.model import (
    EXCLUSIVE_SCOPE,
    INCLUSIVE_SCOPE,
    SCOPE_FUNCTION,
    Experiment,
    FloatArray,
)
from pyhpctk.present.taxonomy import Input, TaxonomyMetric, parse_taxonomy


class MetricError(UsageError):
    """An unknown or ambiguous metric name."""


@dataclass(frozen=True, slots=True)
class DisplayMetric:
    """A metric as views show it: formulas over inputs for its inclusive and exclusive values."""

    name: str
    inclusive: fx.Expr | None
    exclusive: fx.Expr | None
    inputs: dict[str, Input]
    description: str = ""
    format: str | None = None
    derived: bool = False
    percent: bool = True

    @property
    def raw_metric(self) -> str | None:
        """The meta.db metric behind a plain (non-derived) metric, for per-profile views."""
        if self.derived or not isinstance(self.inclusive, fx.Ref):
            return None
        return self.inputs[self.inclusive.name].metric


def _plain(name: str, description: str = "") -> DisplayMetric:
    inputs = {
        "#i": Input(name, INCLUSIVE_SCOPE),
        "#e": Input(name, EXCLUSIVE_SCOPE),
    }
    return DisplayMetric(name, fx.Ref("#i"), fx.Ref("#e"), inputs, description)


def _short(name: str) -> str:
    """A metric name without its unit suffix, lower-cased: ``GKER (sec)`` -> ``gker``."""
    return re.sub(r"\s*\([^)]*\)\s*$", "", name).strip().lower()


@dataclass
class MetricCatalog:
    """The metrics of one experiment, their columns by node (computed on demand and cached)."""

    experiment: Experiment
    metrics: list[DisplayMetric] = field(default_factory=list)
    _stat_cache: dict[int, FloatArray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        exp = self.experiment
        for tm in _checked_taxonomy(exp):
            derived = not (
                isinstance(tm.inclusive, fx.Ref) and tm.inputs[tm.inclusive.name].metric == tm.name
            )
            self.metrics.append(
                DisplayMetric(
                    tm.name,
                    tm.inclusive,
                    tm.exclusive,
                    tm.inputs,
                    tm.description,
                    tm.format,
                    derived,
                    tm.percent and not derived,
                )
            )
        shown = {m.name for m in self.metrics}
        self.metrics.extend(
            _plain(m.name, m.description) for m in exp.metrics if m.name not in shown
        )

    # -- naming ------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [m.name for m in self.metrics]

    def get(self, name: str) -> DisplayMetric:
        for m in self.metrics:
            if m.name == name:
                return m
        raise self._unknown(name)

    def _unknown(self, name: str) -> MetricError:
        lowered = {n.lower(): n for n in self.names}
        shorts = {_short(n): n for n in self.names}
        close = [lowered[c] for c in difflib.get_close_matches(name.lower(), lowered, 3, 0.6)]
        close += [shorts[c] for c in difflib.get_close_matches(name.lower(), shorts, 3, 0.6)]
        close = list(dict.fromkeys(close))[:3]
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        return MetricError(f"unknown metric {name!r}{hint} (pyview --list-metrics shows all)")

    def resolve(self, name: str) -> str:
        """The one metric ``name`` designates (exact, case-insensitive, or without unit)."""
        if re.fullmatch(r"[#$]\d+", name):
            index = int(name[1:])
            if index >= len(self.metrics):
                raise MetricError(
                    f"metric {name} out of range: there are {len(self.metrics)}, "
                    f"numbered from {name[0]}0 in --list-metrics order"
                )
            return self.metrics[index].name
        for test in (
            lambda n: n == name,
            lambda n: n.lower() == name.lower(),
            lambda n: _short(n) == name.lower(),
        ):
            found = [n for n in self.names if test(n)]
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise MetricError(f"metric name {name!r} is ambiguous: {', '.join(found)}")
        raise self._unknown(name)

    def select(self, patterns: Iterable[str]) -> list[str]:
        """Names matching each pattern (a name as in :meth:`resolve`, or a glob), in order."""
        out: list[str] = []
        for pattern in patterns:
            if any(c in pattern for c in "*?["):
                found = [n for n in self.names if fnmatch.fnmatchcase(n.lower(), pattern.lower())]
                if not found:
                    raise MetricError(f"no metric matches {pattern!r}")
            else:
                found = [self.resolve(pattern)]
            out.extend(n for n in found if n not in out)
        return out

    def default_selection(self, limit: int = 4) -> list[str]:
        """Metrics with a non-zero total (taxonomy order), at most ``limit``."""
        out = []
        for m in self.metrics:
            total = self.column(m.name, inclusive=True)
            if total.size and np.nan_to_num(total[0]) != 0:
                out.append(m.name)
            if len(out) == limit:
                break
        return out or self.names[:1]

    def derive(self, definition: str) -> str:
        """Add ``NAME = FORMULA``; references resolve to existing metrics. Returns the name."""
        name, expr = fx.parse_definition(definition)
        if name in self.names:
            raise MetricError(
                f"a metric named {name!r} already exists: give the new one another name"
            )
        inputs: dict[str, Input] = {}
        mapping_i: dict[str, fx.Expr] = {}
        mapping_e: dict[str, fx.Expr] = {}
        for ref in fx.references(expr):
            try:
                target = self.get(self.resolve(ref))
            except MetricError as error:
                raise fx.FormulaError(definition, str(error)) from None
            prefix = f"#{len(mapping_i)}."
            for key, inp in target.inputs.items():
                inputs[prefix + key] = inp
            mapping_i[ref] = _rename(target.inclusive, prefix) if target.inclusive else fx.Num(0)
            mapping_e[ref] = _rename(target.exclusive, prefix) if target.exclusive else fx.Num(0)
        inclusive, exclusive = _substitute(expr, mapping_i), _substitute(expr, mapping_e)
        # Derived metrics can build on derived metrics: the trees grow with each, and the
        # evaluator recurses, so the whole tree is bounded as well as the typed formula.
        if max(fx.depth(inclusive), fx.depth(exclusive)) > 2 * fx.MAX_DEPTH:
            raise fx.FormulaError(
                definition,
                f"with the metrics it uses written out, more than {2 * fx.MAX_DEPTH} "
                "operations deep",
            )
        metric = DisplayMetric(
            name,
            inclusive,
            exclusive,
            inputs,
            f"derived: {definition.partition('=')[2].strip()}",
            derived=True,
            percent=False,
        )
        self.metrics.append(metric)
        return name

    # -- values ------------------------------------------------------------------------------
    def input_column(self, inp: Input) -> FloatArray:
        """The summary statistic ``inp`` by node (zeros when the database lacks it)."""
        exp = self.experiment
        try:
            metric = exp.metric(inp.metric)
        except FormatError:
            return np.zeros(exp.tree.size)
        stat = metric.stat_id(inp.scope, inp.combine, inp.formula)
        if stat is None:
            return np.zeros(exp.tree.size)
        if stat not in self._stat_cache:
            self._stat_cache[stat] = exp.by_node(exp.values.summary_column(stat))
        return self._stat_cache[stat]

    def column(self, name: str, inclusive: bool) -> FloatArray:
        """Inclusive or exclusive values of a metric, by node of the context tree."""
        metric = self.get(name)
        expr = metric.inclusive if inclusive else metric.exclusive
        size = self.experiment.tree.size
        if expr is None:
            return np.full(size, np.nan)
        return fx.evaluate(expr, lambda ref: self.input_column(metric.inputs[ref]), size)

    def exclusive_input(self, inp: Input) -> Input:
        """The input to decompose into self costs for ``inp`` (its function-scope twin)."""
        return Input(inp.metric, SCOPE_FUNCTION, inp.formula, inp.combine)


def taxonomy_problems(exp: Experiment) -> list[str]:
    """What the views would say of ``metrics/default.yaml`` before showing meta.db's metrics
    instead (a file they cannot parse, or one that disagrees with meta.db): ``pyhpctk verify``'s
    problems of the file; [] for a file the views use, or none."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FormatWarning)
        _checked_taxonomy(exp)
    return [str(w.message) for w in caught if issubclass(w.category, FormatWarning)]


def _checked_taxonomy(exp: Experiment) -> list[TaxonomyMetric]:
    """The metrics of ``metrics/default.yaml`` if it agrees with meta.db, else none.

    The taxonomy is only a view of meta.db's summary statistics: every input it reads must be
    one (metric, scope, formula, combine) that meta.db lists, or its formulas evaluate to zeros.
    A file that cannot be read, or that names statistics meta.db lacks (a copy from another
    database, an edit gone wrong), is reported in one warning and left out: the views then show
    meta.db's own metrics.
    """
    if exp.taxonomy_text is None:
        return []
    path = f"{exp.path}/metrics/default.yaml"
    try:
        found = parse_taxonomy(exp.taxonomy_text, path)
    except FormatError as error:
        warnings.warn(FormatWarning(f"{error}; showing meta.db's metrics instead"), stacklevel=2)
        return []
    metrics = {m.name: m for m in exp.metrics}
    lacking: dict[str, None] = {}
    for tm in found:
        for inp in tm.inputs.values():
            meta = metrics.get(inp.metric)
            if meta is None:
                lacking[repr(inp.metric)] = None
            elif meta.stat_id(inp.scope, inp.combine, inp.formula) is None:
                lacking[f"{inp.metric!r} ({inp.combine} of {inp.formula} in {inp.scope})"] = None
    if not lacking:
        return found
    names = list(lacking)
    listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    warnings.warn(
        FormatWarning(
            f"{path}: metric taxonomy: disagrees with meta.db, which has no {listed}; "
            "showing meta.db's metrics instead"
        ),
        stacklevel=2,
    )
    return []


def _rename(expr: fx.Expr, prefix: str) -> fx.Expr:
    if isinstance(expr, fx.Ref):
        return fx.Ref(prefix + expr.name)
    if isinstance(expr, fx.Neg):
        return fx.Neg(_rename(expr.operand, prefix))
    if isinstance(expr, fx.BinOp):
        return fx.BinOp(expr.op, _rename(expr.left, prefix), _rename(expr.right, prefix))
    if isinstance(expr, fx.Call):
        return fx.Call(expr.function, tuple(_rename(a, prefix) for a in expr.args))
    return expr


def _substitute(expr: fx.Expr, mapping: dict[str, fx.Expr]) -> fx.Expr:
    if isinstance(expr, fx.Ref):
        return mapping[expr.name]
    if isinstance(expr, fx.Neg):
        return fx.Neg(_substitute(expr.operand, mapping))
    if isinstance(expr, fx.BinOp):
        return fx.BinOp(expr.op, _substitute(expr.left, mapping), _substitute(expr.right, mapping))
    if isinstance(expr, fx.Call):
        return fx.Call(expr.function, tuple(_substitute(a, mapping) for a in expr.args))
    return expr
