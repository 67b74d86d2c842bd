"""The ``pyview`` command: views in the terminal, exports, and clear messages for bad input."""

from __future__ import annotations

import csv
import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from limits import within
from pyhpctk.analysis.metrics import PARTIALS_STATS, MeasuredMetric
from pyhpctk.analysis.taxonomy import default_yaml
from pyhpctk.cli.pyview import main
from pyhpctk.formats import tracedb

CPU = "CPUTIME (sec)"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def small(reference: Path) -> Path:
    return reference / "dbase" / "small.d"


def test_top_down_text_is_plain_when_piped(capsys: pytest.CaptureFixture[str], small: Path) -> None:
    code, out, err = run(capsys, str(small))
    assert code == 0 and err == ""
    assert "\x1b[" not in out
    lines = out.splitlines()
    assert lines[0] == f"testmeas-small - top-down view, sorted by {CPU} (I)"
    assert "1.21e+00 100.0%" in lines[2] and lines[2].endswith("testmeas-small")
    # Indented, hot path marked, one row per call: the function and the line it came from.
    assert any(line.endswith("      * caller ← small.c: 11") for line in lines)
    assert not any(c in out for c in "├└│")  # no tree glyphs when piped


def test_colour_and_tree_options(capsys: pytest.CaptureFixture[str], small: Path) -> None:
    _, coloured, _ = run(capsys, str(small), "--color")
    assert "\x1b[" in coloured
    _, ascii_tree, _ = run(capsys, str(small), "--tree", "ascii")
    assert "`- " in ascii_tree and "└" not in ascii_tree
    _, drawn, _ = run(capsys, str(small), "--tree", "unicode")
    assert any(line.endswith("├─ * caller ← small.c: 11") for line in drawn.splitlines())


@pytest.mark.parametrize(
    ("flag", "expected_first_child"), [("--bottom-up", "spinsleep"), ("--flat", "testmeas-small")]
)
def test_other_views(
    capsys: pytest.CaptureFixture[str], small: Path, flag: str, expected_first_child: str
) -> None:
    code, out, _ = run(capsys, str(small), flag, "--tree", "unicode")
    assert code == 0
    assert flag.strip("-") in out.splitlines()[0]
    lines = out.splitlines()
    scope = lines[1].index("Scope")
    top_level = [
        line[scope + 3 :] for line in lines[3:] if line[scope : scope + 3] in ("├─ ", "└─ ")
    ]
    named = expected_first_child
    assert any(c == named or c.startswith(named + " (") for c in top_level)


def test_depth_and_threshold_prune(capsys: pytest.CaptureFixture[str], reference: Path) -> None:
    path = reference / "dbase" / "loops-cputime-t.d"
    _, full, _ = run(capsys, str(path))
    _, pruned, _ = run(capsys, str(path), "--threshold", "10", "--depth", "2")
    assert len(pruned.splitlines()) < len(full.splitlines())
    assert "hidden)" in pruned


def test_csv_and_json_exports(
    capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path
) -> None:
    out_csv, out_json = tmp_path / "v.csv", tmp_path / "v.json"
    code, _, _ = run(
        capsys, str(small), "--bottom-up", "--csv", str(out_csv), "--json", str(out_json)
    )
    assert code == 0
    rows = list(csv.DictReader(out_csv.open()))
    spin = next(r for r in rows if r["scope"].startswith("spinsleep (") and r["depth"] == "1")
    assert float(spin[f"{CPU} (I)"]) == pytest.approx(1.210259)
    doc = json.loads(out_json.read_text())
    assert doc["view"] == "bottom-up"
    assert doc["root"]["values"][f"{CPU} (I)"] == pytest.approx(1.210259)
    code, out, _ = run(capsys, str(small), "--json", "-")
    assert json.loads(out)["view"] == "top-down"


def test_derive_and_metric_selection(capsys: pytest.CaptureFixture[str], reference: Path) -> None:
    path = reference / "dbase" / "loops-cuda-nvidia-t.d"
    code, out, _ = run(
        capsys, str(path), "--derive", "util = gker / gpuop", "-m", "util", "-m", "GKER*"
    )
    assert code == 0
    header = next(line for line in out.splitlines() if line.endswith("Scope"))
    assert "util (I)" in header and "GKER (sec) (I)" in header and "GKER:COUNT (I)" in header
    assert "sorted by util (I)" in out.splitlines()[0]


def test_list_metrics_includes_taxonomy_metrics(
    capsys: pytest.CaptureFixture[str], reference: Path
) -> None:
    code, out, _ = run(
        capsys, str(reference / "dbase" / "loops-cuda-nvidiapc-t.d"), "--list-metrics"
    )
    assert code == 0
    assert "GSAMP:UTIL (derived)  - GPU utilization computed using PC sampling" in out.splitlines()


def test_per_thread_and_imbalance(capsys: pytest.CaptureFixture[str], reference: Path) -> None:
    path = str(reference / "dbase" / "loops-cputime-t.d")
    code, out, _ = run(capsys, path, "--imbalance", "3")
    assert code == 0 and out.startswith("Most imbalanced contexts for CPUTIME (sec)")
    assert len(out.splitlines()) == 5
    code, out, _ = run(capsys, path, "--context", "0")
    assert "4 profiles: min" in out and out.count("THREAD") == 4


def test_trace_options(capsys: pytest.CaptureFixture[str], reference: Path, tmp_path: Path) -> None:
    path = str(reference / "dbase" / "loops-cuda-nvidia-t.d")
    target = tmp_path / "trace.json"
    code, out, _ = run(capsys, path, "--trace-summary", "--blame", "--trace-export", str(target))
    assert code == 0
    assert "GPU stream): 200 samples" in out and "GPU idle time:" in out
    assert json.loads(target.read_text())["traceEvents"]


# -- bad input -----------------------------------------------------------------------------------
def test_not_a_database(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, str(tmp_path))
    assert code == 2 and out == ""
    assert (
        err
        == f"pyview: error: {tmp_path}: database: not a database: no meta.db in this directory\n"
    )
    code, _, err = run(capsys, str(tmp_path / "missing"))
    assert code == 2 and "no such file or directory" in err


def test_measurements_are_not_a_database(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "app-000000-000-0-1-0.hpcrun").write_bytes(b"")
    code, _, err = run(capsys, str(tmp_path))
    # Before: "not measurements (run pyprof on it first)", the reverse of what it is.
    assert code == 2
    assert err.startswith(
        f"pyview: error: {tmp_path}: this is a measurement directory; run pyprof on it "
        f"(pyprof {tmp_path})"
    )


def test_incomplete_database(
    capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path
) -> None:
    shutil.copytree(small, tmp_path / "db")
    (tmp_path / "db" / "cct.db").unlink()
    code, _, err = run(capsys, str(tmp_path / "db"))
    assert code == 2 and "incomplete database: cct.db missing" in err


def test_truncated_file_names_the_file(
    capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path
) -> None:
    shutil.copytree(small, tmp_path / "db")
    meta = tmp_path / "db" / "meta.db"
    meta.write_bytes(meta.read_bytes()[:-20])
    code, _, err = run(capsys, str(tmp_path / "db"))
    assert code == 2 and err.startswith(f"pyview: error: {meta}: ")
    assert "Traceback" not in err


def _damage_trace(trace: Path, how: str) -> None:
    """Damage trace.db in its header, its end, or the elements of one line (read lazily)."""
    data = bytearray(trace.read_bytes())
    if how == "magic":
        data[:4] = b"XXXX"
    elif how == "truncated":
        data = data[: len(data) // 2]
    else:  # line 0's first timestamp made later than the next one: not time-sorted
        first = tracedb.read(trace).lines[0].elements["timestamp"][:2]
        assert len(first) == 2 and first[0] < first[1]
        at = bytes(data).index(struct.pack("<Q", int(first[0])))
        data[at : at + 8] = struct.pack("<Q", int(first[1]) + 1)
    trace.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["magic", "truncated", "line"])
def test_a_damaged_trace_db_does_not_block_the_profile_views(
    capsys: pytest.CaptureFixture[str], reference: Path, tmp_path: Path, how: str
) -> None:
    original = reference / "dbase" / "loops-cputime-t.d"
    database = tmp_path / "db"
    shutil.copytree(original, database)
    _damage_trace(database / "trace.db", how)
    _, expected, _ = run(capsys, str(original))
    # Before: "pyview: error: .../trace.db: header: bad magic ..." and no view at all.
    code, out, err = run(capsys, str(database))
    assert code == 0 and out.replace(str(database), str(original)) == expected
    if how == "line":  # lines are read when a view needs them: the profile views never do
        assert err == ""
    else:
        assert err.startswith(f"warning: {database / 'trace.db'}: ")
        assert "trace.db is damaged: the profile views are shown without it" in err
    export = tmp_path / "trace.json"
    for option in (["--trace-summary"], ["--blame"], ["--trace-export", str(export)]):
        code, out, err = run(capsys, str(database), *option)
        assert code == 2 and "Traceback" not in err
        assert err.splitlines()[-1].startswith(f"pyview: error: {database / 'trace.db'}: ")
        assert err.rstrip().endswith(
            "trace.db is damaged, so the views that need the trace (--trace-summary, --blame, "
            "--trace-export) cannot be shown; the profile views do not need it"
        )
    assert not export.exists()
    report = tmp_path / "report.html"
    code, _, _ = run(capsys, str(database), "--html", str(report))
    data = report.read_text().split('id="report-data">', 1)[1].split("</script>", 1)[0]
    assert code == 0 and json.loads(data)["timeline"] is None and json.loads(data)["tree"]


def test_unknown_metric(capsys: pytest.CaptureFixture[str], small: Path) -> None:
    code, _, err = run(capsys, str(small), "-m", "cputim")
    assert code == 2
    assert "unknown metric 'cputim'; did you mean 'CPUTIME (sec)'?" in err


@pytest.mark.parametrize(
    ("definition", "fragment"),
    [
        ("x = cputime +", "expected a number, a metric or '(', found end of formula"),
        ("x = nosuch * 2", "unknown metric 'nosuch'"),
        ("cputime / 2", "expected NAME = FORMULA"),
        ("x = exec('1')", "unexpected character"),
    ],
)
def test_broken_formula(
    capsys: pytest.CaptureFixture[str], small: Path, definition: str, fragment: str
) -> None:
    code, out, err = run(capsys, str(small), "--derive", definition)
    assert code == 2 and out == ""
    assert err.startswith("pyview: error: formula ") and fragment in err


def test_unwritable_output(capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path) -> None:
    code, _, err = run(capsys, str(small), "--csv", str(tmp_path / "no" / "such" / "dir.csv"))
    assert code == 2 and "cannot write" in err


def test_help_lists_every_view(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for option in ("--bottom-up", "--flat", "--derive", "--trace-export", "--html", "--imbalance"):
        assert option in out


def test_broken_metric_taxonomy(
    capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path
) -> None:
    """A default.yaml that cannot be read: one warning, and meta.db's metrics are shown."""
    shutil.copytree(small, tmp_path / "db")
    taxonomy = tmp_path / "db" / "metrics" / "default.yaml"
    taxonomy.write_text("roots:\n  - name: X\n    variants: {Sum: {formula: {inclusive: *nope}}}\n")
    code, out, err = run(capsys, str(tmp_path / "db"))
    assert code == 0
    assert err == (
        f"warning: {taxonomy}: metric taxonomy: line 3: unknown alias '*nope'; "
        "showing meta.db's metrics instead\n"
    )
    assert "1.21e+00 100.0%" in out.splitlines()[2]


def aliased(step: Callable[[int], str], count: int) -> str:
    """A taxonomy whose one formula is built from ``count`` anchors, each using the last."""
    anchors = "".join(f"  - &a{k} {step(k)}\n" for k in range(1, count + 1))
    return (
        f"inputs:\n  - &a0 1\n{anchors}roots:\n  - name: X\n"
        f"    variants: {{Sum: {{formula: {{inclusive: *a{count}}}}}}}\n"
    )


@pytest.mark.parametrize(
    "text",
    [
        "roots:\n  - name: X\n    variants: [Sum, Mean]\n",  # a list where a mapping belongs
        "roots:\n  - name: X\n    variants: {Sum: {formula: [1, 2]}}\n",
        "roots:\n  - name: X\n    children: 7\n",
        "roots: " + "[" * 5000 + "]" * 5000 + "\n",  # nested past any parser's stack
        "roots:\n  - name: X\n    variants: {Sum: {formula: {inclusive: "
        + "{+: [" * 3000
        + "1"
        + "]}" * 3000
        + "}}}\n",
        aliased(lambda k: f"{{+: [*a{k - 1}, 1]}}", 200),  # nests 200 deep through aliases
        aliased(lambda k: f"{{+: [*a{k - 1}, *a{k - 1}]}}", 40),  # 2^40 terms
    ],
    ids=[
        "variants-list",
        "formula-list",
        "children-number",
        "deep-flow",
        "deep-formula",
        "alias-chain",
        "alias-bomb",
    ],
)
def test_malformed_metric_taxonomy_falls_back_to_meta_db(
    capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path, text: str
) -> None:
    shutil.copytree(small, tmp_path / "db")
    taxonomy = tmp_path / "db" / "metrics" / "default.yaml"
    taxonomy.write_text(text)
    with within(30):
        code, out, err = run(capsys, str(tmp_path / "db"))
    assert code == 0, err
    assert err.startswith(f"warning: {taxonomy}: metric taxonomy: ") and err.count("\n") == 1
    assert err.endswith("; showing meta.db's metrics instead\n")
    assert "1.21e+00 100.0%" in out.splitlines()[2]


def test_metric_taxonomy_that_disagrees_with_meta_db(
    capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path
) -> None:
    """A default.yaml from another database reads statistics this meta.db does not have.

    Before: CPUTIME (sec) (read as a max over threads, which small.d does not store) showed
    zeros everywhere and REALTIME (sec) was dropped, without a word.
    """
    shutil.copytree(small, tmp_path / "db")
    taxonomy = tmp_path / "db" / "metrics" / "default.yaml"
    taxonomy.write_text(
        "roots:\n"
        "  - name: CPUTIME (sec)\n"
        "    variants:\n"
        "      Max:\n"
        "        formula:\n"
        "          inclusive: {metric: CPUTIME (sec), scope: execution, combine: max}\n"
        "  - name: REALTIME (sec)\n"
        "    variants:\n"
        "      Sum:\n"
        "        formula:\n"
        "          inclusive: {metric: REALTIME (sec), scope: execution}\n"
    )
    code, out, err = run(capsys, str(tmp_path / "db"))
    assert code == 0
    assert err == (
        f"warning: {taxonomy}: metric taxonomy: disagrees with meta.db, which has no "
        "'CPUTIME (sec)' (max of $$ in execution), 'REALTIME (sec)'; "
        "showing meta.db's metrics instead\n"
    )
    assert "1.21e+00 100.0%" in out.splitlines()[2]
    code, out, err = run(capsys, str(tmp_path / "db"), "--list-metrics")
    assert out == "CPUTIME (sec)\n" and err.count("warning:") == 1


def test_stats_taxonomy_on_a_sum_database_warns_once(
    capsys: pytest.CaptureFixture[str], small: Path, tmp_path: Path
) -> None:
    """pyprof -M stats's default.yaml (Mean, Min, ... variants) beside a database of sums."""
    shutil.copytree(small, tmp_path / "db")
    taxonomy = tmp_path / "db" / "metrics" / "default.yaml"
    taxonomy.write_text(default_yaml([MeasuredMetric(CPU)], {}, PARTIALS_STATS))
    code, out, err = run(capsys, str(tmp_path / "db"), "--list-metrics")
    assert code == 0 and out == f"{CPU}\n"
    assert err.count("\n") == 1 and "(min of $$ in execution)" in err and " more;" in err
