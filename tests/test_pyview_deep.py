"""pyview on deep recursion: every view in memory and output linear in the number of contexts.

A recursive function 10,000 and 50,000 calls deep (issue #15 item 2: 401 MB of text at 10,000,
out of memory at 50,000) is written as a database with the format writers and shown by the
``pyview`` command in a child process, whose output bytes and peak memory (``wait4``'s
ru_maxrss) are measured. Rows deeper than the text tree's indentation limit carry
``[depth N]``; JSON stops nesting at its limit and lists deeper nodes flat with their depth.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from limits import within
from pyhpctk.cli.pyview import main as pyview_main
from pyhpctk.present import open_database
from pyhpctk.present.html import embedded_json, report_data, report_view
from pyhpctk.present.render import (
    JSON_NESTING_LIMIT,
    TEXT_DEPTH_LIMIT,
    render_csv,
    render_json,
    view_to_dict,
)
from pyhpctk.present.synthetic import Spec, build, write_database

CPU = "CPUTIME (sec)"
BYTES_PER_CONTEXT = 400  # a text row: numbers, at most TEXT_DEPTH_LIMIT levels of tree, label
BASE_RSS = 100 << 20  # the interpreter, numpy and click (about 35 MiB), with room to spare
RSS_PER_CONTEXT = 1500  # meta.db's objects, the tree arrays, one view (about 900 bytes today)


def chain(frames: int, threads: int = 1) -> tuple[Spec, int]:
    """main thread > rec > r.py: 2 > rec > ... ``frames`` calls deep, 1 s at the bottom.

    Thread t spends 1 + t seconds there, so threads differ (for the per-thread views).
    Returns the entry point and the depth of the deepest context (the root has depth 0).
    """
    values = tuple(float(1 + t) for t in range(threads))
    node = Spec("line", file="r.py", line=9, values={CPU: values})
    for _ in range(frames):
        node = Spec(
            "function",
            name="rec",
            file="r.py",
            line=1,
            children=(Spec("line", file="r.py", line=2, children=(node,)),),
        )
    return Spec("entry", name="main thread", children=(node,)), 2 * frames + 2


def deep_database(tmp_path: Path, frames: int, threads: int = 1) -> tuple[Path, int, int]:
    """The database directory, its number of contexts and the deepest context's depth."""
    entry, depth = chain(frames, threads)
    exp = build([entry], [CPU], [(("THREAD", t),) for t in range(threads)], title=f"deep{frames}")
    return write_database(exp, tmp_path / f"deep{frames}.d"), exp.tree.size, depth


# A child forked from this (large) test process counts the parent's resident pages in its
# ru_maxrss, whatever it does after exec. So a small, freshly started launcher forks pyview and
# reports that grandchild's peak, from wait4.
_LAUNCHER = """
import os, sys
report, args = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "-m", "pyhpctk.cli.pyview", *args])
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as out:
    out.write(str(usage.ru_maxrss * 1024))  # Linux reports KiB
sys.exit(os.waitstatus_to_exitcode(status))
"""


def pyview(*args: str, timeout: float = 120) -> tuple[bytes, int, float]:
    """Run the pyview command; (stdout, peak resident bytes, seconds). Fails on errors."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "maxrss"
        child = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, str(report), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # one process group: a timeout ends pyview too
        )
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            pytest.fail(f"pyview {' '.join(args)} ran past {timeout} s")
        assert child.returncode == 0, err.decode(errors="replace")[-2000:]
        return out, int(report.read_text()), time.monotonic() - start


@pytest.fixture(scope="module")
def deep10k(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    return deep_database(tmp_path_factory.mktemp("deep"), 10_000, threads=2)


@pytest.mark.parametrize("view", ["--top-down", "--bottom-up", "--flat"])
def test_text_views_of_10000_frames_are_linear(deep10k: tuple[Path, int, int], view: str) -> None:
    db, contexts, depth = deep10k
    out, rss, seconds = pyview(str(db), view, "--tree", "unicode", "--full")
    text = out.decode()
    lines = text.splitlines()
    assert len(out) <= BYTES_PER_CONTEXT * contexts, f"{len(out) / contexts:.0f} bytes/context"
    assert rss <= BASE_RSS + RSS_PER_CONTEXT * contexts, f"{rss >> 20} MiB"
    assert seconds < 60
    assert max(len(line) for line in lines) < 300  # no row grows with its depth
    if view == "--top-down":
        # Every context is a row (the chain is the hot path); deep ones say how deep they are.
        assert len(lines) == 2 + contexts
        assert lines[-1].endswith(f"[depth {depth}] * r.py: 9")
        assert f"[depth {TEXT_DEPTH_LIMIT + 1}] " in text
        assert f"[depth {TEXT_DEPTH_LIMIT}] " not in text
        assert lines[2 + TEXT_DEPTH_LIMIT].endswith("└─ * rec")  # still drawn as a tree
    elif view == "--bottom-up":
        # The callers of rec: rec, rec, rec, ... cut where the rows or steps would pass the
        # budget, with a note saying so and the cut callers counted.
        assert lines[1].startswith("note: callers shown to level ")
        assert lines[-1].endswith(" rec (r.py: 1) (+2 hidden)")  # rec and main thread
        assert "3.00e+00 100.0%" in lines[4] and lines[4].endswith("rec (r.py: 1)")
    else:
        scope = lines[1].index("Scope")
        assert [line[scope:].lstrip(" │├└─") for line in lines[2:]] == [
            "deep10000",
            "app",
            "r.py",
            "rec (r.py: 1)",
            "r.py: 2",
            "r.py: 9",
        ]


class _Capped(io.StringIO):
    """A text sink that fails the test as soon as more than ``cap`` characters arrive."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def write(self, text: str) -> int:
        if self.tell() + len(text) > self.cap:
            raise AssertionError(f"output passed {self.cap:,} characters")
        return super().write(text)


def test_csv_and_json_of_10000_frames_are_linear_and_readable(
    deep10k: tuple[Path, int, int],
) -> None:
    db_path, contexts, depth = deep10k
    view = open_database(db_path).view("top-down")
    out = _Capped(BYTES_PER_CONTEXT * contexts)
    render_csv(view, out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert len(rows) == contexts and max(int(r["depth"]) for r in rows) == depth
    out = _Capped(2 * BYTES_PER_CONTEXT * contexts)
    render_json(view, out)
    doc = json.loads(out.getvalue())  # json.loads recurses: nesting stops at the limit
    assert doc == view_to_dict(view)
    node, level = doc["root"], 0
    while node["children"]:
        (node,) = node["children"]
        level += 1
    assert level == JSON_NESTING_LIMIT
    deeper = node["deeper"]
    assert len(deeper) == depth - JSON_NESTING_LIMIT
    assert [d["depth"] for d in deeper[:2]] == [JSON_NESTING_LIMIT + 1, JSON_NESTING_LIMIT + 2]
    assert [d["parent"] for d in deeper[:3]] == [-1, 0, 1]
    assert deeper[-1]["depth"] == depth and deeper[-1]["scope"] == "r.py: 9"
    assert deeper[-1]["values"][f"{CPU} (I)"] == 3.0


def test_per_thread_views_of_10000_frames(
    deep10k: tuple[Path, int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    db, _, depth = deep10k
    with within(20):
        assert pyview_main([str(db), "--imbalance", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # Every context has (1, 2): one chain of identical spreads, listed once at its deepest.
    assert len(lines) == 3 and lines[2].endswith("r.py: 9 [ctx 20002]")
    with within(20):
        assert pyview_main([str(db), "--context", "20002"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"{CPU} at context 20002: main thread > rec > r.py: 2 > ")
    assert f"… {depth - 20:,} more …" in first and len(first) < 400


def test_report_of_10000_frames_is_linear(deep10k: tuple[Path, int, int]) -> None:
    db = open_database(deep10k[0])
    with within(20):
        view = report_view(db, None, None, None, 0.0, False)
        data = embedded_json(report_data(db, view))
    assert len(data) <= BYTES_PER_CONTEXT * deep10k[1]
    assert json.loads(data)["tree"]["depthLimit"] == TEXT_DEPTH_LIMIT


@pytest.mark.slow  # about 5 s: 100,003 rows
def test_50000_frames_in_linear_memory_and_output(tmp_path: Path) -> None:
    db, contexts, depth = deep_database(tmp_path, 50_000)
    out, rss, _ = pyview(str(db), "--tree", "unicode", "--full")
    assert len(out) <= BYTES_PER_CONTEXT * contexts, f"{len(out) / contexts:.0f} bytes/context"
    assert rss <= BASE_RSS + RSS_PER_CONTEXT * contexts, f"{rss >> 20} MiB"
    assert out.decode().rstrip().endswith(f"[depth {depth}] * r.py: 9")
