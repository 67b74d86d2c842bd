"""Plots of measurements and models (matplotlib, optional: imported only when asked for)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import numpy as np

from pyhpctk.errors import UsageError
from pyhpctk.formats import output
from pyhpctk.formats.output import OutputError
from pyhpctk.model.analyze import ContextModel, ScalingAnalysis
from pyhpctk.model.pmnf import FloatArray


def model_curves(
    context: ContextModel, x: FloatArray, grid: FloatArray
) -> list[tuple[FloatArray, FloatArray, str]]:
    """The curves to draw over ``grid``: the model's, or where it is piecewise each segment's
    over its own range (the first up to its last measured value ``x``, the last onwards)."""
    segmentation = context.segmentation
    if segmentation is None:
        return [(grid, context.model.evaluate(grid), context.model.render(3))]
    early = grid[grid <= x[segmentation.split - 1]]
    late = grid[grid >= segmentation.start]
    return [
        (early, segmentation.before.evaluate(early), segmentation.before.render(3)),
        (late, segmentation.after.evaluate(late), segmentation.after.render(3)),
    ]


def plot_contexts(
    analysis: ScalingAnalysis,
    directory: Path,
    count: int = 6,
    force: bool = False,
    prefix: str = "",
) -> list[Path]:
    """One PNG per top-ranked context: measured means with spread, and the model curve (each
    segment's over its range where the model is piecewise).

    An existing image is replaced only with ``force``; each is written whole or not at all
    (:mod:`pyhpctk.formats.output`).
    """
    try:
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        pyplot = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install matplotlib") from None
    series = analysis.series
    if len(series.params) != 1:
        raise UsageError("--plot draws single-parameter series only")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"{directory}: cannot make it: {error.strerror or error}") from None
    x = series.points[:, 0]
    grid = np.geomspace(x.min(), max(x.max(), analysis.target[0]), 200)
    written = []
    index = {path: i for i, path in enumerate(series.paths)}
    for rank, context in enumerate(analysis.contexts[:count], 1):
        c = index[context.path]
        figure, axes = pyplot.subplots(figsize=(6, 4))
        axes.errorbar(x, series.mean[:, c], yerr=series.spread[:, c], fmt="o", label="measured")
        segmentation = context.segmentation
        if segmentation is None:
            axes.plot(grid, context.model.evaluate(grid), label=context.model.render(3))
        else:  # a piecewise model: each segment over its own range, the last one onwards
            last = x[segmentation.split - 1]
            early, late = grid[grid <= last], grid[grid >= segmentation.start]
            axes.plot(
                early, segmentation.before.evaluate(early), label=segmentation.before.render(3)
            )
            axes.plot(late, segmentation.after.evaluate(late), label=segmentation.after.render(3))
            axes.axvline(segmentation.start, color="grey", linestyle=":", linewidth=1)
        axes.set_xscale("log", base=2)
        axes.set_xlabel(series.params[0])
        axes.set_ylabel(series.metric)
        axes.set_title(" > ".join(context.label[-3:])[-90:], fontsize=8)
        axes.legend(fontsize=7)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", context.label[-1])[:40]
        path = directory / f"{prefix}{rank:02d}-{name}.png"
        figure.tight_layout()
        try:
            with output.open_binary(path, force, "--plot") as stream:
                figure.savefig(stream, format="png", dpi=100)
        finally:
            pyplot.close(figure)
        written.append(path)
    return written
