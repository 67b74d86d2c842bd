"""How fast does pyview show a big database? (issue #8, item 8)

Writes a synthetic database (meta.db with a deep calling context tree, profile.db and cct.db
with many profiles) with pyhpctk's own format writers, then times

* ``pyview DB --depth 4`` as a command (a fresh Python process: imports, open, view, print), and
* in-process: opening the database, building the top-down view, rendering it as text.

The values follow a fixed pattern: profile ``p`` has values at context ``c`` when
``(p + 7c) % K == 0`` (density 1/K), ``f(p, c, m) = 1 + ((31p + 17c + 7m) % 97) / 1000``; the
summary profile holds the exact sums, and cct.db is the exact transpose, so the files are a
valid database (though the values do not add up along the tree the way measured ones do).

Usage::

    .venv/bin/python benchmarks/pyview.py [--profiles 1200] [--contexts 100000] [--density 10]
                                          [--out DIR] [--keep]

Without ``--out`` the database goes to a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pyhpctk.formats import cctdb, metadb, profiledb
from pyhpctk.present import open_database
from pyhpctk.present.render import render_text

METRICS = ("CPUTIME (sec)", "REALTIME (sec)")
N_IDS = 4 * len(METRICS)  # point, function, lex_aware, execution per metric


def value(p: np.ndarray, c: np.ndarray, m: int) -> np.ndarray:
    return 1.0 + ((31 * p + 17 * c + 7 * m) % 97) / 1000.0


def build_meta(n_contexts: int) -> metadb.MetaDB:
    """A 4-ary tree alternating call -> function and lexical -> line contexts."""
    db = metadb.MetaDB(title="synthetic-big")
    db.metrics = [metadb.Metric.standard(name, 4 * i) for i, name in enumerate(METRICS)]
    db.modules = [metadb.Module("/bench/app")]
    db.files = [metadb.SourceFile(f"/bench/src/file{k}.py") for k in range(100)]
    db.functions = [
        metadb.Function(f"func{k}", module=0, offset=0x1000 + 16 * k, file=k % 100, line=k)
        for k in range(1000)
    ]
    entry = metadb.Entry(1, metadb.EntryPointKind.MAIN_THREAD, "main thread")
    db.entry_points = [entry]
    nodes: list[metadb.Entry | metadb.Context] = [entry, entry]  # index = ctxId
    is_line = [False, False]
    for i in range(2, n_contexts):
        parent = nodes[1 + (i - 2) // 4]
        line = not is_line[1 + (i - 2) // 4] and isinstance(parent, metadb.Context)
        if line:
            ctx = metadb.Context(
                i,
                metadb.Relation.LEXICAL,
                metadb.LexicalType.LINE,
                file=i % 100,
                line=i % 500,
                propagation=1,
            )
        else:
            ctx = metadb.Context(
                i, metadb.Relation.CALL, metadb.LexicalType.FUNCTION, function=i % 1000
            )
        parent.children.append(ctx)
        nodes.append(ctx)
        is_line.append(line)
    return db


def write_profiles(path: Path, n_profiles: int, n_contexts: int, k: int) -> None:
    infos = [profiledb.ProfileInfo(True, None)]
    for p in range(1, n_profiles + 1):
        infos.append(
            profiledb.ProfileInfo(
                False,
                (
                    profiledb.IdTupleElement(1, True, 0, 0xBE0C),
                    profiledb.IdTupleElement(2, False, (p - 1) // 8, (p - 1) // 8),
                    profiledb.IdTupleElement(3, False, (p - 1) % 8, (p - 1) % 8),
                ),
            )
        )
    ctx_all = np.arange(n_contexts, dtype=np.int64)
    inv7 = pow(7, -1, k)

    def contexts_of(p: int) -> np.ndarray:
        first = (-p * inv7) % k
        return ctx_all[first::k]

    nc = [n_contexts] + [len(contexts_of(p)) for p in range(1, n_profiles + 1)]
    nv = [n * N_IDS for n in nc]
    plan = profiledb.layout(infos, nv, nc)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        profiledb.write_head(fd, plan)
        summary = np.zeros((n_contexts, N_IDS))
        for p in range(1, n_profiles + 1):
            ctx = contexts_of(p)
            vals = np.stack([value(np.full(len(ctx), p), ctx, m) for m in range(N_IDS)], axis=1)
            summary[ctx] += vals
            block = profiledb.ProfileValues.from_triples(
                np.repeat(ctx, N_IDS), np.tile(np.arange(N_IDS), len(ctx)), vals.ravel()
            )
            profiledb.write_block(fd, plan, p, block)
        block = profiledb.ProfileValues.from_triples(
            np.repeat(ctx_all, N_IDS), np.tile(np.arange(N_IDS), n_contexts), summary.ravel()
        )
        profiledb.write_block(fd, plan, 0, block)
        profiledb.write_footer(fd, plan)
    finally:
        os.close(fd)


def write_contexts(path: Path, n_profiles: int, n_contexts: int, k: int) -> None:
    profiles_all = np.arange(1, n_profiles + 1, dtype=np.int64)

    def profiles_of(c: int) -> np.ndarray:
        first = (-7 * c) % k  # p + 7c = 0 (mod k)
        return profiles_all[(profiles_all % k) == first]

    counts = [len(profiles_of(c)) for c in range(n_contexts)]
    nv = [n * N_IDS for n in counts]
    nm = [N_IDS if n else 0 for n in counts]
    plan = cctdb.layout(nv, nm)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        cctdb.write_head(fd, plan)
        for c in range(n_contexts):
            profs = profiles_of(c)
            if not len(profs):
                continue
            vals = np.concatenate([value(profs, np.full(len(profs), c), m) for m in range(N_IDS)])
            block = cctdb.ContextValues.from_triples(
                np.repeat(np.arange(N_IDS), len(profs)), np.tile(profs, N_IDS), vals
            )
            cctdb.write_block(fd, plan, c, block)
        cctdb.write_footer(fd, plan)
    finally:
        os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=int, default=1200)
    parser.add_argument("--contexts", type=int, default=100_000)
    parser.add_argument("--density", type=int, default=10, help="1 context in K per profile")
    parser.add_argument("--out", type=Path, help="where to write the database (kept)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary database")
    args = parser.parse_args()
    base = args.out or Path(tempfile.mkdtemp(prefix="pyview-bench-"))
    db_dir = base / "synthetic.d"
    db_dir.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        metadb.write(build_meta(args.contexts), db_dir / "meta.db")
        write_profiles(db_dir / "profile.db", args.profiles, args.contexts, args.density)
        write_contexts(db_dir / "cct.db", args.profiles, args.contexts, args.density)
        made = time.perf_counter() - t0
        sizes = {f.name: f.stat().st_size for f in db_dir.iterdir()}
        total = sum(sizes.values())
        print(f"database: {db_dir}  ({total / 2**30:.2f} GiB, written in {made:.1f} s)")
        for name, size in sorted(sizes.items()):
            print(f"  {name:10} {size / 2**20:10.1f} MiB")

        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "pyhpctk.cli.pyview", str(db_dir), "--depth", "4"]
        result = subprocess.run(cmd, capture_output=True, text=True, check=True)
        command_s = time.perf_counter() - t0
        print(
            f"pyview DB --depth 4 (new process): {command_s:.2f} s, "
            f"{len(result.stdout.splitlines())} lines"
        )

        t0 = time.perf_counter()
        db = open_database(db_dir)
        t1 = time.perf_counter()
        view = db.view("top-down", depth=4)
        t2 = time.perf_counter()
        render_text(view, io.StringIO())
        t3 = time.perf_counter()
        print(
            f"in-process: open {t1 - t0:.2f} s, top-down view {t2 - t1:.2f} s, "
            f"render {t3 - t2:.2f} s"
        )
        t0 = time.perf_counter()
        spread = db.spread(2, METRICS[0])
        print(
            f"per-thread values of one context ({spread.stats.count} profiles): "
            f"{time.perf_counter() - t0:.3f} s"
        )
    finally:
        if args.out is None and not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
