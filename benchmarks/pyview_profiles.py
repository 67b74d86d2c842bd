"""Reading at scale: pyview on a database of 100,000 profiles (issue #19, item 5).

Writes a synthetic database of ``--ranks`` x ``--threads`` profiles (identifier tuples NODE /
RANK / THREAD, as pyprof-mpi writes an MPI job's) with pyhpctk's own writers, the value blocks
of all profiles built at once with numpy and written with a few ``pwrite`` calls, then measures
in fresh processes (one core: ``taskset`` when available):

* ``pyview DB --depth 4`` (imports, open, top-down view, print);
* ``pyview DB --context C``: the per-profile statistics of one context, then one line per
  profile;
* in one process through the Python API: open, the top-down view, the statistics of one context
  (:meth:`~pyhpctk.present.api.Database.spread`), with the wall time of each step and the peak
  of Python's allocations (``tracemalloc``) and the process's peak RSS.

Every profile has point values at the same ``--hot`` contexts (an SPMD program), two metrics,
``f(p, c, m) = 1 + ((31 p + 17 c + 7 m) % 97) / 1000`` (x1.5 for a few slow profiles, so that
the per-profile statistics show an imbalance), and inclusive values at those contexts and all
their ancestors; the summary holds the exact sums and cct.db is the exact transpose, so the
files are a valid database whose top-down view shows the paths to the hot contexts.

Usage::

    .venv/bin/python benchmarks/pyview_profiles.py [--ranks 12500] [--threads 8] [--hot 32]
                                                   [--contexts 4000] [--out DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pyhpctk.formats import cctdb, metadb, profiledb
from pyhpctk.formats.vocabulary import EntryPoint, LexicalType, Relation

METRICS = ("CPUTIME (sec)", "REALTIME (sec)")
N_IDS = 4 * len(METRICS)  # point, function, lex_aware, execution per metric
KIND_NODE, KIND_RANK, KIND_THREAD = 1, 2, 3


def value(p: np.ndarray, c: np.ndarray, m: np.ndarray) -> np.ndarray:
    slow = np.where(p % 997 == 5, 1.5, 1.0)  # a few slow ranks' threads: an imbalance to find
    return slow * (1.0 + ((31 * p + 17 * c + 7 * m) % 97) / 1000.0)


def build_meta(n_contexts: int) -> metadb.MetaDB:
    """A 4-ary tree alternating call -> function and lexical -> line contexts (ctxIds 2..)."""
    db = metadb.MetaDB(title="synthetic-profiles")
    db.metrics = [metadb.Metric.standard(name, 4 * i) for i, name in enumerate(METRICS)]
    db.modules = [metadb.Module("/bench/app")]
    db.files = [metadb.SourceFile(f"/bench/src/file{k}.c") for k in range(50)]
    db.functions = [
        metadb.Function(f"func{k}", module=0, offset=0x1000 + 16 * k, file=k % 50, line=k)
        for k in range(500)
    ]
    entry = metadb.Entry(1, EntryPoint.MAIN_THREAD, EntryPoint.MAIN_THREAD.pretty_name)
    db.entry_points = [entry]
    nodes: list[metadb.Entry | metadb.Context] = [entry, entry]  # index = ctxId
    is_line = [False, False]
    for i in range(2, n_contexts):
        parent = nodes[1 + (i - 2) // 4]
        line = not is_line[1 + (i - 2) // 4] and isinstance(parent, metadb.Context)
        if line:
            ctx = metadb.Context(
                i, Relation.LEXICAL, LexicalType.LINE, file=i % 50, line=i % 500, propagation=1
            )
        else:
            ctx = metadb.Context(i, Relation.CALL, LexicalType.FUNCTION, function=i % 500)
        parent.children.append(ctx)
        nodes.append(ctx)
        is_line.append(line)
    return db


def profile_infos(ranks: int, threads: int) -> list[profiledb.ProfileInfo]:
    """The summary, then rank-major NODE / RANK r / THREAD t tuples (one node per 64 ranks)."""
    infos = [profiledb.ProfileInfo(True, None)]
    nodes = [
        profiledb.IdTupleElement(KIND_NODE, True, n, 0xBE00 + n) for n in range(ranks // 64 + 1)
    ]
    rank_elements = [profiledb.IdTupleElement(KIND_RANK, False, r, r) for r in range(ranks)]
    thread_elements = [profiledb.IdTupleElement(KIND_THREAD, False, t, t) for t in range(threads)]
    for r in range(ranks):
        for t in range(threads):
            infos.append(
                profiledb.ProfileInfo(False, (nodes[r // 64], rank_elements[r], thread_elements[t]))
            )
    return infos


def closure(hot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The hot contexts and all their ancestors (sorted), and which hot contexts lie below
    each (``below[x, h]``: hot context ``h`` is context ``x`` or a descendant of it)."""
    contexts = set()
    for c in hot.tolist():
        while c >= 1:  # ctxId 1 is the entry point; build_meta's parent of i is 1 + (i - 2) // 4
            contexts.add(c)
            c = 1 + (c - 2) // 4 if c >= 2 else 0
    every = np.array(sorted(contexts), dtype=np.int64)
    below = np.zeros((len(every), len(hot)), dtype=bool)
    for h, c in enumerate(hot.tolist()):
        while c >= 1:
            below[np.searchsorted(every, c), h] = True
            c = 1 + (c - 2) // 4 if c >= 2 else 0
    return every, below


def block_values(
    p: np.ndarray, hot: np.ndarray, every: np.ndarray, below: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Profiles ``p``'s (context, metric id, value) triples, one row per profile, in block order:
    point / function / lex_aware at the hot contexts, execution (inclusive) at every context of
    the closure, summed over the hot contexts below it."""
    n_metrics, n_hot = len(METRICS), len(hot)
    point = value(p[:, None, None], hot[None, None, :], np.arange(n_metrics)[None, :, None])
    inclusive = point @ below.T.astype(np.float64)  # (profiles, metrics, closure)
    both = np.concatenate([point, inclusive], axis=2).reshape(len(p), -1)
    is_hot = np.isin(every, hot)
    ctx: list[int] = []
    ids: list[int] = []
    column: list[int] = []  # of ``both``: metric m's hot h, then metric m's closure x
    width = n_hot + len(every)
    for x, c in enumerate(every.tolist()):
        h = int(np.searchsorted(hot, c)) if is_hot[x] else -1
        for m in range(n_metrics):
            for scope in range(4):
                if scope == 3:
                    ctx.append(c)
                    ids.append(4 * m + scope)
                    column.append(m * width + n_hot + x)
                elif h >= 0:
                    ctx.append(c)
                    ids.append(4 * m + scope)
                    column.append(m * width + h)
    return np.array(ctx), np.array(ids), both[:, column]


Triples = tuple[np.ndarray, np.ndarray, np.ndarray]


def write_profiles(path: Path, infos: list[profiledb.ProfileInfo], triples: Triples) -> None:
    """profile.db: every profile's block built at once (they all have the same shape)."""
    n_profiles = len(infos) - 1
    ctx, ids, values = triples
    block = profiledb.ProfileValues.from_triples(ctx, ids, values[0])
    nv = [block.n_values] * len(infos)
    nc = [block.n_contexts] * len(infos)
    plan = profiledb.layout(infos, nv, nc)
    size = block.nbytes
    starts = plan.values_at[1:]
    if n_profiles > 1 and not np.all(np.diff(starts) == size):
        raise SystemExit("profile blocks are not back to back; the generator needs them so")
    records = np.zeros((n_profiles, block.n_values), profiledb.PROFILE_VALUE_DTYPE)
    records["metric_id"] = ids[None, :]
    records["value"] = values
    image = np.zeros((n_profiles, size), np.uint8)
    image[:, : records.itemsize * block.n_values] = records.view(np.uint8).reshape(n_profiles, -1)
    index = np.frombuffer(block.ctx_indices.tobytes(), np.uint8)
    image[:, size - len(index) :] = index[None, :]
    summary = profiledb.ProfileValues.from_triples(ctx, ids, values.sum(axis=0))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        profiledb.write_head(fd, plan)
        os.pwrite(fd, image.data, int(starts[0]))
        profiledb.write_block(fd, plan, 0, summary)
        profiledb.write_footer(fd, plan)
    finally:
        os.close(fd)


def write_contexts(path: Path, n_profiles: int, n_contexts: int, triples: Triples) -> None:
    """cct.db, the exact transpose: each context of the closure holds every profile's values."""
    profiles = np.arange(1, n_profiles + 1)
    ctx, ids, values = triples
    every = np.unique(ctx)
    counts = np.bincount(ctx, minlength=n_contexts) * n_profiles
    metrics = np.bincount(ctx, minlength=n_contexts)
    plan = cctdb.layout(counts, metrics)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        cctdb.write_head(fd, plan)
        for c in every.tolist():
            mine = np.flatnonzero(ctx == c)
            block = cctdb.ContextValues.from_triples(
                np.repeat(ids[mine], n_profiles),
                np.tile(profiles, len(mine)),
                values[:, mine].T.ravel(),
            )
            cctdb.write_block(fd, plan, c, block)
        cctdb.write_footer(fd, plan)
    finally:
        os.close(fd)


def generate(directory: Path, ranks: int, threads: int, n_contexts: int, n_hot: int) -> float:
    """Write the database; returns the seconds it took."""
    began = time.perf_counter()
    directory.mkdir(parents=True)
    hot = np.unique(np.linspace(n_contexts // 2, n_contexts - 1, n_hot).astype(np.int64))
    metadb.write(build_meta(n_contexts), directory / "meta.db")
    infos = profile_infos(ranks, threads)
    every, below = closure(hot)
    triples = block_values(np.arange(1, ranks * threads + 1), hot, every, below)
    write_profiles(directory / "profile.db", infos, triples)
    write_contexts(directory / "cct.db", ranks * threads, n_contexts, triples)
    return time.perf_counter() - began


PROBE = """
import json, sys, time, tracemalloc
def peak_rss():  # VmHWM: this process's own peak (ru_maxrss keeps the launcher's across exec)
    status = open("/proc/self/status").read()
    return int(status.split("VmHWM:")[1].split()[0]) * 1024
began = time.perf_counter()
from pyhpctk.present import open_database
imported = time.perf_counter()
tracemalloc.start()  # after the imports: what opening and viewing allocate
db = open_database(sys.argv[1])
opened = time.perf_counter()
view = db.view("top-down", depth=4)
viewed = time.perf_counter()
spread = db.spread(int(sys.argv[2]), "CPUTIME (sec)")
spread_done = time.perf_counter()
print(json.dumps({
    "import": imported - began, "open": opened - imported, "top-down": viewed - opened,
    "spread": spread_done - viewed, "profiles": spread.stats.count, "mean": spread.stats.mean,
    "max": spread.stats.maximum, "peak_alloc": tracemalloc.get_traced_memory()[1],
    "peak_rss": peak_rss(),
}))
"""


def one_core(command: list[str]) -> list[str]:
    """``command`` pinned to one core where ``taskset`` exists (the goal is for one core)."""
    return ["taskset", "-c", "0", *command] if shutil.which("taskset") else command


def timed(command: list[str]) -> tuple[float, str]:
    began = time.perf_counter()
    done = subprocess.run(one_core(command), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - began, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=12_500)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--contexts", type=int, default=4000)
    parser.add_argument("--hot", type=int, default=32, help="contexts every profile has values at")
    parser.add_argument("--out", type=Path, help="where to write the database (kept)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary database")
    args = parser.parse_args()
    base = args.out or Path(tempfile.mkdtemp(prefix="pyview-profiles-"))
    db_dir = base / "profiles.d"
    try:
        made = generate(db_dir, args.ranks, args.threads, args.contexts, args.hot)
        sizes = {f.name: f.stat().st_size for f in db_dir.iterdir()}
        n_profiles = args.ranks * args.threads
        print(
            f"database: {n_profiles} profiles ({args.ranks} ranks x {args.threads} threads), "
            f"{args.contexts} contexts, {sum(sizes.values()) / 2**20:.0f} MiB "
            f"({', '.join(f'{k} {v / 2**20:.0f}' for k, v in sorted(sizes.items()))}), "
            f"written in {made:.1f} s"
        )
        context = args.contexts - 1  # a hot context: every profile has values there
        pyview = [sys.executable, "-m", "pyhpctk.cli.pyview", str(db_dir)]
        view_s, out = timed([*pyview, "--depth", "4"])
        print(f"pyview DB --depth 4: {view_s:.2f} s ({len(out.splitlines())} lines)")
        stats_s, out = timed([*pyview, "--context", str(context)])
        print(
            f"pyview DB --context {context}: {stats_s:.2f} s ({len(out.splitlines())} lines: "
            "the statistics, then one line per profile)"
        )
        probe_s, out = timed([sys.executable, "-c", PROBE, str(db_dir), str(context)])
        probe = json.loads(out)
        print(
            f"API in one process ({probe_s:.2f} s): import {probe['import']:.2f} s, open "
            f"{probe['open']:.2f} s, top-down view {probe['top-down']:.2f} s, statistics of "
            f"context {context} over {probe['profiles']} profiles {probe['spread']:.2f} s "
            f"(these three under tracemalloc); peak Python allocations after the imports "
            f"{probe['peak_alloc'] / 2**20:.1f} MiB, peak RSS "
            f"{probe['peak_rss'] / 2**20:.0f} MiB"
        )
    finally:
        if args.out is None and not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
