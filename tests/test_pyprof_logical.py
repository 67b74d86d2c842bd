"""Python logical frames (formats.md §1.10, §3.8) and ``-M stats`` summaries, end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from output_helpers import record_loaded
from pyhpctk.analysis.compare import read_view
from pyhpctk.analysis.context import LexicalType, Relation
from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.formats import hpcrun, logical
from pyhpctk.formats.hpcrun_model import (
    CCT_NODE_DTYPE,
    ID_TUPLE_ELEMENT_DTYPE,
    INTERP_LOGIC_LOCAL,
    INTERP_LOGIC_ONLY,
    KIND_NODE,
    KIND_THREAD,
    METRIC_VALUE_DTYPE,
    NODE_START_DTYPE,
    HpcrunProfile,
    LoadModule,
    MetricDescriptor,
    placeholder_ip,
)

SCRIPT = "/work/app.py"


def _frame(fid: int, line: int) -> int:
    return fid << 32 | line


def _python_profile(thread: int, seconds: float) -> HpcrunProfile:
    nodes = [
        (12, 0, 0, placeholder_ip("^Primary"), 1),
        (14, 12, 0, placeholder_ip("| Main  "), 1),
        (16, 14, 1, _frame(2, 10), 1),  # module-level code, line 10
        (18, 16, 1, _frame(1, 5), 1),  # main(), line 5
        (20, 18, 1, _frame(3, 0), 1),  # len(), a C function
        (22, 16, 1, _frame(1, 6), 1),  # main(), line 6 (another call from line 10)
    ]
    samples = {20: seconds, 22: 2 * seconds}
    values = np.zeros(len(samples), dtype=METRIC_VALUE_DTYPE)
    values["value_bits"] = np.array(list(samples.values()), dtype=np.float64).view(np.uint64)
    starts = np.zeros(len(samples), dtype=NODE_START_DTYPE)
    starts["node_id"] = list(samples)
    starts["start"] = np.arange(len(samples))
    return HpcrunProfile(
        nvpairs=[("program-name", "python3"), ("thread-id", str(thread))],
        load_modules=[LoadModule(1, "logical/python.0000abcd")],
        cct=np.array(nodes, dtype=CCT_NODE_DTYPE),
        metrics=[MetricDescriptor("CPUTIME (sec)", "CPUTIME (sec)")],
        id_tuple=np.array(
            [
                (KIND_NODE | INTERP_LOGIC_LOCAL << 14, 0xABC, 0),
                (KIND_THREAD | INTERP_LOGIC_ONLY << 14, thread, thread),
            ],
            dtype=ID_TUPLE_ELEMENT_DTYPE,
        ),
        values=values,
        node_starts=starts,
    )


def _measurement(tmp_path: Path, script: str = SCRIPT) -> Path:
    measurement = tmp_path / "py.m"
    (measurement / "logical").mkdir(parents=True)
    logical.write(
        logical.LogicalMetadata(
            [
                logical.LogicalStanza(1, "main", filename=script, lineno=4),
                logical.LogicalStanza(2, "", filename=script, lineno=1),
                logical.LogicalStanza(3, "len"),
            ]
        ),
        measurement / "logical" / "python.0000abcd",
    )
    record_loaded(measurement, [script])  # pyrun's table: the program loaded the script
    for thread, seconds in ((0, 1.0), (1, 3.0)):
        hpcrun.write(
            _python_profile(thread, seconds),
            measurement / f"python3-000000-00{thread}-00000abc-1-0.hpcrun",
        )
    return measurement


def test_python_frames_become_functions_and_lines(tmp_path: Path) -> None:
    output = tmp_path / "db"
    report = run(ProfOptions.build([_measurement(tmp_path)], output=output))
    assert report.problems == ()
    view = read_view(output)
    paths = view.paths()
    call, lexical = int(Relation.CALL), int(Relation.LEXICAL)
    line, function = int(LexicalType.LINE), int(LexicalType.FUNCTION)
    main_fn = ("main", "<logical python>", 0, SCRIPT, 4)
    expected = {
        (("entry", 1),),
        (("entry", 1), (call, line, None, SCRIPT, 10, None, 0)),
        (
            ("entry", 1),
            (call, line, None, SCRIPT, 10, None, 0),
            (call, function, main_fn, None, 0, None, 0),
        ),
        (
            ("entry", 1),
            (call, line, None, SCRIPT, 10, None, 0),
            (call, function, main_fn, None, 0, None, 0),
            (lexical, line, None, SCRIPT, 5, None, 0),
        ),
        (
            ("entry", 1),
            (call, line, None, SCRIPT, 10, None, 0),
            (call, function, main_fn, None, 0, None, 0),
            (lexical, line, None, SCRIPT, 5, None, 0),
            (call, function, ("len", "<logical python>", 0, None, 0), None, 0, None, 0),
        ),
        (
            ("entry", 1),
            (call, line, None, SCRIPT, 10, None, 0),
            (call, function, main_fn, None, 0, None, 0),
            (lexical, line, None, SCRIPT, 6, None, 0),
        ),
    }
    assert {paths[c] for c in view.contexts} == expected
    assert view.modules == ["<logical python>"]


def test_stats_summary_has_min_mean_max_partials(tmp_path: Path) -> None:
    output = tmp_path / "db"
    run(ProfOptions.build([_measurement(tmp_path)], output=output, metrics="stats"))
    view = read_view(output)
    by_name = {name: ident for ident, name in view.stat_names.items()}
    summary = view.profiles[0]
    root = summary.ctx == 0

    def at_root(statistic: tuple[str, str, str, int]) -> float:
        return float(summary.value[root & (summary.metric == by_name[statistic])][0])

    name = "CPUTIME (sec)"
    assert at_root((name, "execution", "$$", 0)) == 3.0 + 9.0  # sum
    assert at_root((name, "execution", "$$", 1)) == 3.0  # min
    assert at_root((name, "execution", "$$", 2)) == 9.0  # max
    assert at_root((name, "execution", "$$^2", 0)) == 9.0 + 81.0  # sum of squares
    assert at_root((name, "execution", "1", 0)) == 2.0  # count
    taxonomy = (output / "metrics" / "default.yaml").read_text()
    for variant in ("Sum:", "Mean:", "Min:", "Max:", "StdDev:", "CfVar:"):
        assert f"      {variant}" in taxonomy


def test_existing_sources_are_copied_and_flagged(tmp_path: Path) -> None:
    from pyhpctk.formats import metadb

    script = tmp_path / "real_app.py"
    script.write_text("print('hello')\n")
    output = tmp_path / "db"
    run(ProfOptions.build([_measurement(tmp_path, str(script))], output=output))
    copy = output / "src" / str(script).lstrip("/")
    assert copy.read_text() == "print('hello')\n"
    files = metadb.read(output / "meta.db").files
    assert [(f.path, f.copied) for f in files] == [(str(script), True)]
    run(
        ProfOptions.build(
            [_measurement(tmp_path / "again", str(script))],
            output=tmp_path / "db2",
            copy_sources=False,
        )
    )
    assert not (tmp_path / "db2" / "src").exists()
