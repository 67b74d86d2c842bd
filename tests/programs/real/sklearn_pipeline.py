"""A scikit-learn pipeline with OpenMP and OpenBLAS threads (issue #36's scikit-learn program).

Usage: sklearn_pipeline.py TRUTH.json SCALE

Scales and projects a data set (``StandardScaler``, ``PCA``: OpenBLAS), then fits a
``HistGradientBoostingClassifier`` (OpenMP threads) on it. The program writes the process's CPU
time and the part of it spent inside the ``fit`` line (every thread's, read from the process's
clock around the call): the truth the worker-thread test reads. It also writes the CPU time
spent in garbage collections, timed by ``gc.callbacks`` from before its imports (``gc_cpu``):
the truth of the ``<gc>`` row the perf test reads (``tests/test_pyview_perf.py``).
"""

import json
import sys
import time

from selftime import time_collections

collecting = time_collections()  # before the imports: importing scikit-learn collects too

import numpy as np  # noqa: E402
from sklearn.decomposition import PCA  # noqa: E402
from sklearn.ensemble import HistGradientBoostingClassifier  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402


def data(scale: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(scale, 40))
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(int)
    return x, y


def main(truth: str, scale: int) -> None:
    x, y = data(scale)
    features = make_pipeline(StandardScaler(), PCA(n_components=20)).fit_transform(x)
    model = HistGradientBoostingClassifier(max_iter=40, early_stopping=False, random_state=0)
    before = time.process_time()
    model.fit(features, y)  # the fit line: OpenMP workers do most of its work
    fit_cpu = time.process_time() - before
    score = model.score(features, y)
    with open(truth, "w") as out:
        cpu = time.process_time()
        found = {"fit_cpu": fit_cpu, "process_cpu": cpu, "gc_cpu": collecting[0], "score": score}
        json.dump(found, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
