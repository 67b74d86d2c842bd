"""Values across threads and ranks: per-profile spread of one context, most imbalanced contexts.

Constructed program, three ranks (point values per rank):

    main thread > main > f > f.py: 1     (10, 10, 10)   balanced
                       > g > g.py: 1     (30,  0,  0)   all on rank 0
                       > h > h.py: 1     ( 1,  2,  3)

main's inclusive values are (41, 12, 13): mean 22, max 41.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pyhpctk.present import open_database
from pyhpctk.present.imbalance import most_imbalanced, select_profiles, spread
from pyhpctk.present.metrics import MetricCatalog, MetricError
from pyhpctk.present.model import Experiment
from pyhpctk.present.synthetic import Spec, build

CPU = "CPUTIME (sec)"


def ranks() -> Experiment:
    def leaf(name: str, ctx: int, values: tuple[float, ...]) -> Spec:
        line = Spec("line", file=f"{name}.py", line=1, ctx_id=ctx + 1, values={CPU: values})
        return Spec("function", name=name, file=f"{name}.py", ctx_id=ctx, children=(line,))

    main = Spec(
        "function",
        name="main",
        ctx_id=2,
        children=(leaf("f", 10, (10, 10, 10)), leaf("g", 20, (30, 0, 0)), leaf("h", 30, (1, 2, 3))),
    )
    entry = Spec("entry", name="main thread", ctx_id=1, children=(main,))
    profiles = [(("RANK", r), ("THREAD", 0)) for r in range(3)]
    return build([entry], [CPU], profiles, title="ranks")


def test_spread_of_one_context_over_ranks() -> None:
    catalog = MetricCatalog(ranks())
    s = spread(catalog, 20, CPU)
    assert s.values.tolist() == [30.0, 0.0, 0.0]
    assert (s.stats.minimum, s.stats.mean, s.stats.maximum) == (0.0, 10.0, 30.0)
    assert s.stats.stddev == pytest.approx(math.sqrt(200.0))
    assert s.stats.cv == pytest.approx(math.sqrt(2.0))
    assert s.stats.imbalance == pytest.approx(2.0)
    assert s.path == ("main thread", "main", "g")
    assert [p.label for p in s.profiles] == [
        "RANK 0 / THREAD 0",
        "RANK 1 / THREAD 0",
        "RANK 2 / THREAD 0",
    ]


def test_most_imbalanced_ranks_by_max_over_mean_and_keeps_the_deepest_of_a_chain() -> None:
    found = most_imbalanced(MetricCatalog(ranks()), CPU, count=10)
    assert [(s.label, round(s.stats.imbalance, 4)) for s in found] == [
        ("g.py: 1", 2.0),  # g and its line have the same values: only the line is listed
        ("main", round(41 / 22 - 1, 4)),
        ("h.py: 1", 0.5),
        ("f.py: 1", 0.0),
    ]


def test_min_share_leaves_out_small_contexts() -> None:
    found = most_imbalanced(MetricCatalog(ranks()), CPU, min_share=10.0)  # 10% of 66 = 6.6
    assert "h.py: 1" not in [s.label for s in found]


def test_derived_metrics_have_no_per_thread_values() -> None:
    catalog = MetricCatalog(ranks())
    catalog.derive("twice = 2 * cputime")
    with pytest.raises(MetricError, match="derived"):
        spread(catalog, 2, "twice")


def test_reference_threads_sum_to_the_summary(reference: Path) -> None:
    db = open_database(reference / "dbase" / "loops-cputime-t.d")
    top = db.view("top-down")
    app = next(c for c in top.root.children if c.label == "application thread")
    assert app.ctx_id is not None
    s = db.spread(app.ctx_id, CPU)
    assert s.stats.count == 4
    assert s.stats.total == pytest.approx(float(app.values[0]))
    worst = db.most_imbalanced(CPU, count=3)
    assert worst and worst[0].stats.imbalance >= worst[-1].stats.imbalance


def test_gpu_and_cpu_profiles_can_be_compared_separately(reference: Path) -> None:
    db = open_database(reference / "dbase" / "loops-cuda-nvidia-t.d")
    gpu = select_profiles(db.experiment, "gpu")
    cpu = select_profiles(db.experiment, "cpu")
    assert [p.label for p in gpu] == ["NODE 0 / GPUCONTEXT 1 / GPUSTREAM 7"]
    assert [p.label for p in cpu] == ["NODE 0 / THREAD 0"]
