"""A scikit-learn pipeline with OpenMP and OpenBLAS threads (issue #36's scikit-learn program).

Usage: sklearn_pipeline.py TRUTH.json SCALE

Scales and projects a data set (``StandardScaler``, ``PCA``: OpenBLAS), then fits a
``HistGradientBoostingClassifier`` (OpenMP threads) on it. The program writes the process's CPU
time and the part of it spent inside the ``fit`` line (every thread's, read from the process's
clock around the call): the truth the worker-thread test reads.
"""

import json
import sys
import time

import numpy as np
from sklearn.decomposition import PCA
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler


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
        json.dump({"fit_cpu": fit_cpu, "process_cpu": time.process_time(), "score": score}, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
