"""Benchmark: write and fully read a large synthetic profile.db + cct.db, against ``cp``.

A synthetic database (hundreds of thread profiles, ~100k contexts, 5-20% of the contexts non-zero
per profile, a few metrics per context, a summary profile) is built in memory, then:

- *write*: :func:`pyhpctk.formats.profiledb.write` and :func:`pyhpctk.formats.cctdb.write`;
- *read*: ``read(path, lazy=False)`` (every block checked) plus a sum touching every value;
- *cp*: ``cp`` of the same files, in the same run, into the same temporary directory.

Each of ours is printed as a ratio to ``cp``. The temporary directory (``--dir``, default the
system's) is removed at the end. Example::

    .venv/bin/python benchmarks/formats.py --profiles 800 --contexts 100000

This file never touches the repository: everything it writes goes to the temporary directory.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from pyhpctk.formats import cctdb, profiledb
from pyhpctk.formats.profiledb import (
    PROFILE_CTX_INDEX_DTYPE,
    PROFILE_VALUE_DTYPE,
    IdTupleElement,
    ProfileDB,
    ProfileInfo,
    ProfileValues,
)


def synthetic_profile(
    rng: np.random.Generator, n_contexts: int, n_metrics: int, density: float
) -> ProfileValues:
    """One thread's values: ``density`` of the contexts, each with a random non-empty metric set."""
    ctx = np.flatnonzero(rng.random(n_contexts) < density).astype(np.uint32)
    # A random non-empty subset of the metrics per context, as bits of a byte.
    bits = rng.integers(1, 1 << n_metrics, len(ctx), dtype=np.uint16)
    present = ((bits[:, None] >> np.arange(n_metrics, dtype=np.uint16)) & 1).astype(bool)
    counts = present.sum(axis=1)
    values = np.empty(int(counts.sum()), PROFILE_VALUE_DTYPE)
    values["metric_id"] = np.nonzero(present)[1]
    values["value"] = rng.random(len(values)) + 0.5
    index = np.empty(len(ctx), PROFILE_CTX_INDEX_DTYPE)
    index["ctx_id"] = ctx
    index["start"] = np.cumsum(counts) - counts
    return ProfileValues(index, values)


def synthetic_database(
    n_profiles: int, n_contexts: int, n_metrics: int, seed: int
) -> tuple[ProfileDB, cctdb.CctDB]:
    """A profile.db (summary first, then ``n_profiles`` threads) and its cct.db (the transpose)."""
    rng = np.random.default_rng(seed)
    threads = [
        synthetic_profile(rng, n_contexts, n_metrics, float(rng.uniform(0.05, 0.20)))
        for _ in range(n_profiles)
    ]
    infos = [ProfileInfo(True, None)] + [
        ProfileInfo(False, (IdTupleElement(1, True, 0, 0x0A000001), IdTupleElement(3, False, t, t)))
        for t in range(n_profiles)
    ]
    empty = ProfileValues.empty()
    contexts = cctdb.transpose(ProfileDB(infos, [empty, *threads]), n_contexts)
    # The summary (sum over threads) from the context-major values: one reduceat, no loops.
    packed = contexts.values
    assert isinstance(packed, cctdb.PackedContexts)
    nm = np.diff(packed.metric_bounds)
    run_at = np.repeat(packed.value_bounds[:-1], nm) + packed.metric_indices["start"].astype(
        np.int64
    )
    sums = np.add.reduceat(packed.values["value"], run_at) if len(run_at) else np.zeros(0)
    ctx_ids = np.repeat(np.arange(n_contexts), nm)
    summary = ProfileValues.from_triples(ctx_ids, packed.metric_indices["metric_id"], sums)
    return ProfileDB(infos, [summary, *threads]), contexts


def timed(action: Callable[[], object], repeat: int) -> float:
    """The best wall time of ``repeat`` runs of ``action``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - start)
    return best


def full_read_profiles(path: str) -> float:
    db = profiledb.read(path, lazy=False)
    return float(sum(float(block.values["value"].sum()) for block in db.values))


def full_read_contexts(path: str) -> float:
    db = cctdb.read(path, lazy=False)
    packed = db.values
    if isinstance(packed, cctdb.PackedContexts):
        return float(packed.values["value"].sum())
    return float(sum(float(b.values["value"].sum()) for b in db.values))


def copy(source: str, dest: str) -> None:
    subprocess.run(["cp", source, dest], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", type=int, default=800, help="thread profiles (800)")
    parser.add_argument("--contexts", type=int, default=100_000, help="contexts (100000)")
    parser.add_argument("--metrics", type=int, default=8, help="metrics per context, max (8)")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--repeat", type=int, default=3, help="best of N timings (3)")
    parser.add_argument("--dir", default=None, help="where the temporary directory goes")
    args = parser.parse_args(argv)
    if not 1 <= args.metrics <= 15:
        parser.error("--metrics must be between 1 and 15")

    start = time.perf_counter()
    profiles, contexts = synthetic_database(args.profiles, args.contexts, args.metrics, args.seed)
    built = time.perf_counter() - start
    n_values = int(profiles.value_counts()[0].sum())
    print(
        f"synthetic: {args.profiles} thread profiles + summary, {args.contexts} contexts, "
        f"{n_values} values in profile.db (threads and summary), built in {built:.1f} s"
    )
    expected = float(sum(float(b.values["value"].sum()) for b in profiles.values))

    tmp = tempfile.mkdtemp(prefix="pyhpctk-bench-", dir=args.dir)
    try:
        pdb, cdb = os.path.join(tmp, "profile.db"), os.path.join(tmp, "cct.db")
        rows = []
        cases: list[tuple[str, str, Callable[[], None], Callable[[], float]]] = [
            (
                "profile.db",
                pdb,
                partial(profiledb.write, profiles, pdb),
                partial(full_read_profiles, pdb),
            ),
            ("cct.db", cdb, partial(cctdb.write, contexts, cdb), partial(full_read_contexts, cdb)),
        ]
        for name, path, write, read in cases:
            t_write = timed(write, args.repeat)
            size = os.path.getsize(path)
            t_cp = timed(partial(copy, path, path + ".copy"), args.repeat)
            os.remove(path + ".copy")
            t_read = timed(read, args.repeat)
            rows.append((name, size, t_write, t_read, t_cp))
        # The full reads saw every value: profile.db's sum includes the summary, cct.db's not.
        summary_sum = float(profiles.values[0].values["value"].sum())
        assert np.isclose(full_read_profiles(pdb), expected)
        assert np.isclose(full_read_contexts(cdb), expected - summary_sum)

        print(
            f"{'file':<11} {'size MB':>9} {'cp s':>7} {'write s':>8} {'x cp':>6} "
            f"{'read s':>7} {'x cp':>6}"
        )
        sizes = t_cps = t_writes = t_reads = 0.0
        for name, size, t_write, t_read, t_cp in rows:
            print(
                f"{name:<11} {size / 1e6:9.1f} {t_cp:7.2f} {t_write:8.2f} {t_write / t_cp:6.2f} "
                f"{t_read:7.2f} {t_read / t_cp:6.2f}"
            )
            sizes += size
            t_cps += t_cp
            t_writes += t_write
            t_reads += t_read
        print(
            f"{'both':<11} {sizes / 1e6:9.1f} {t_cps:7.2f} {t_writes:8.2f} "
            f"{t_writes / t_cps:6.2f} {t_reads:7.2f} {t_reads / t_cps:6.2f}"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
