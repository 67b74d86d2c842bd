"""Ranges in the calling context tree (issue #37 item 1): ``pyrun --ranges``, ``pyview --ranges``.

CI has neither PyTorch nor a GPU: ``tests/programs/ranges_model.py`` trains a model of the
stand-in ``tests/programs/fake_torch`` (the module hooks, autograd nodes with pre-hooks and a
backward run on a worker thread, ``record_function`` and ``torch.cuda.nvtx`` that pyrun hooks
in PyTorch) on the simulated GPU, and writes the truth: how many kernels each module's forward
and backward launched, how much CPU time it spun inside each range. What users read must hold
it: ``pyview --ranges`` shows the modules nested as in the model with each one's kernels
(forward and backward) under it, through the C CUPTI hook's cached sites and through Python's;
the CPU time spent inside a range is under it, with the engine and with the Python sampler.
With PyTorch installed, a small residual CNN's module tree and its backward pass on the CPU.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pyhpctk.analysis.options import ProfOptions
from pyhpctk.analysis.pipeline import run
from pyhpctk.cli.pyrun import main as pyrun_main
from pyhpctk.cli.pyview import main as pyview_main
from pyhpctk.measure.sampling import engine

#: Timing-sensitive (the samplers' accuracy, memory peaks): run alone, after the parallel tests
#: (Makefile: unit), so that the other worker's load does not decide them.
pytestmark = pytest.mark.timing

PROGRAMS = Path(__file__).resolve().parent / "programs"
FAKE_TORCH = PROGRAMS / "fake_torch"
MODULES = ("Net", "fc1 (Linear)", "act (ReLU)", "fc2 (Linear)")


@pytest.fixture
def measure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """``measure(program, options)``: the database of ``pyrun --ranges OPTIONS python
    PROGRAM...`` with the PyTorch stand-in on the path."""
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", f"{FAKE_TORCH}{os.pathsep}{path}" if path else str(FAKE_TORCH))

    def measured(program: list[str], options: list[str]) -> Path:
        out, database = tmp_path / "m", tmp_path / "db"
        command = ["--ranges", *options, "-o", str(out), sys.executable, *program]
        assert pyrun_main(command) == 0
        run(ProfOptions.build([out], output=database))
        return database

    return measured


def view_tree(capsys: pytest.CaptureFixture[str], database: Path, *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    assert pyview_main(["--json", "-", *argv, str(database)]) == 0
    root: dict[str, Any] = json.loads(capsys.readouterr().out)["root"]
    return root


def paths(tree: dict[str, Any], column: str, above: tuple[str, ...] = ()) -> Iterator[Any]:
    """(path of scopes, inclusive value of ``column``, exclusive value) of every row."""
    for child in tree.get("children", []):
        path = (*above, str(child["scope"]))
        values = child["values"]
        yield path, values.get(f"{column} (I)", 0.0), values.get(f"{column} (E)", 0.0)
        yield from paths(child, column, path)


def range_rows(
    tree: dict[str, Any], column: str, above: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], float, dict[str, Any]]]:
    """(path of scopes, inclusive value of ``column``, the node) of every range's node
    (pyview's file ``<range>``: a function of the program may have the range's name)."""
    for child in tree.get("children", []):
        path = (*above, str(child["scope"]))
        if child.get("file") == "<range>":
            yield path, child["values"].get(f"{column} (I)", 0.0), child
        yield from range_rows(child, column, path)


def indent(row: str) -> int:
    """How deep a text row's scope is: the blanks before it (or before its "*" marker)."""
    scope = row.rsplit("%", 1)[-1]
    return len(scope) - len(scope.lstrip(" "))


@pytest.mark.parametrize("hook", ["c", "python"])
def test_each_modules_forward_and_backward_kernels_are_under_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, measure: Callable[..., Path], hook: str
) -> None:
    truth_file = tmp_path / "truth.json"
    program = [str(PROGRAMS / "ranges_model.py"), str(truth_file), "6"]
    database = measure(program, ["-e", f"gpu=simulated,hook={hook}"])
    truth = json.loads(truth_file.read_text())
    tree = view_tree(capsys, database, "--ranges", "--metric", "GKER:COUNT")
    rows = list(paths(tree, "GKER:COUNT"))
    # every module's own kernels (exclusive: its inner modules' are theirs), wherever its
    # forward (main thread) and backward (the worker thread, or the main thread) ran
    for module in MODULES:
        own = sum(exclusive for path, _, exclusive in rows if path[-1] == module)
        assert own == truth["kernels"][module], (module, hook, rows)
    # nested as in the model: the layers only under the net, right under it
    for path, inclusive, _ in rows:
        if path[-1] in MODULES[1:] and inclusive:
            assert path[-2] == "Net", path
    # the loss's kernels, outside the model, under no module: forward and backward (which
    # the worker thread runs after the last module's backward of the step before)
    outside = sum(exclusive for path, _, exclusive in rows if path[-1] not in MODULES)
    assert outside == truth["kernels"]["outside"], rows
    # the first screen: the ranges, indented under the net, and the note that says why
    capsys.readouterr()
    assert pyview_main(["--ranges", "--metric", "GKER:COUNT", "--no-color", str(database)]) == 0
    screen = capsys.readouterr().out
    assert "folded to its" in screen and "range contexts (pyview --ranges)" in screen
    net = re.search(r"^.*[ *]Net$", screen, re.M)
    fc1 = re.search(r"^.* fc1 \(Linear\)$", screen, re.M)
    assert net is not None and fc1 is not None, screen
    assert indent(fc1[0]) > indent(net[0]), screen


@pytest.fixture(params=["engine", "thread"])
def sampler(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each sampler in turn (the engine where it is built)."""
    if request.param == "engine" and engine.load_engine()[0] is None:
        pytest.skip("the sampling engine is not built here")
    monkeypatch.setenv("PYHPCTK_PYRUN_SAMPLER", request.param)
    return str(request.param)


#: What runs inside the spins' ranges: the spinning, and the rest of the call that opens a
#: range or the start of the one that closes it (a sample may find the thread there)
INSIDE = {
    "spin",
    "range_push",
    "range_pop",
    "record_function.__enter__",
    "record_function.__exit__",
}
PROGRAM_NAME = "tests/programs/ranges_model.py"
#: the lines of main in ranges_model.py inside each range, from the one that opens it
OPENED_AT = {"spin": (72, 73), "nvtx spin": (74, 75, 76)}


def test_cpu_time_inside_a_range_is_under_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, measure: Callable[..., Path], sampler: str
) -> None:
    truth_file = tmp_path / "truth.json"
    program = [str(PROGRAMS / "ranges_model.py"), str(truth_file), "6"]
    options = ["-e", "gpu=simulated", "-e", "CPUTIME@1000"]
    database = measure(program, options)
    spent = json.loads(truth_file.read_text())["cpu"]
    tree = view_tree(capsys, database, "--full")
    rows = list(paths(tree, "CPUTIME (sec)"))
    for name in ("spin", "nvtx spin"):
        # the range's node holds the range's time; below it only what ran inside it. A late
        # sample (the Python sampler's thread waits for a CPU on a loaded machine, and waited
        # for the GIL through each write of a checkpoint: 0.4-0.7 s) finds the thread past
        # ranges that opened and closed meanwhile: their time is their own, under the line
        # that opened them, no function below them.
        ranges = [row for row in range_rows(tree, "CPUTIME (sec)") if row[0][-1] == name]
        measured = sum(inclusive for _, inclusive, _ in ranges)
        assert measured == pytest.approx(spent[name], rel=0.2), (name, sampler, ranges)
        below = {
            str(child["scope"])
            for _, _, node in ranges
            for child in node.get("children", [])
            if child["values"].get("CPUTIME (sec) (I)")
        }
        assert below <= INSIDE, (name, sampler, below)
        # under a line of main inside it: the one that opened it, or where a sample saw it
        lines = {path[-2] for path, inclusive, _ in ranges if inclusive}
        assert lines <= {f"{PROGRAM_NAME}: {line}" for line in OPENED_AT[name]}, (name, lines)
    # the spin after a backward run on the main thread is under no range: that backward's
    # ranges ended with it
    outside = [path for path, inclusive, _ in rows if path[-1] == "spin" and inclusive]
    bare = [p for p in outside if not ({"spin", "nvtx spin"} & set(p[:-1]))]
    assert bare and all(not set(MODULES) & set(p) for p in bare), bare


LATE_SAMPLES = """
import json, sys, threading, time
import torch

def spin(seconds):
    began = time.thread_time()
    while time.thread_time() - began < seconds:
        pass
    return time.thread_time() - began

# a second thread, and a switch interval that keeps the sampler from the GIL until the
# program sleeps: each sample comes after both ranges have closed
threading.Thread(target=threading.Event().wait, daemon=True).start()
sys.setswitchinterval(5.0)
def pause():  # where each late sample finds the thread: a function that runs in no range
    time.sleep(0.005)

spent = {"first": 0.0, "second": 0.0}
for _ in range(6):
    pause()
    with torch.autograd.profiler.record_function("first"):
        spent["first"] += spin(0.03)
    torch.cuda.nvtx.range_push("second")
    spent["second"] += spin(0.02)
    torch.cuda.nvtx.range_pop()
with open(sys.argv[1], "w") as stream:
    json.dump(spent, stream)
"""


def test_cpu_time_of_ranges_that_closed_before_the_next_sample_is_under_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, measure: Callable[..., Path], sampler: str
) -> None:
    """A sample that comes late (the sampling thread waited for a CPU, for the GIL, or wrote
    a checkpoint) must not give the time of the ranges that opened and closed meanwhile to
    the stack it finds, nor put below them a function that never ran in them (``pause``,
    where each sample finds the thread): such a stretch is the range's own time."""
    program, truth_file = tmp_path / "late.py", tmp_path / "truth.json"
    program.write_text(LATE_SAMPLES)
    database = measure([str(program), str(truth_file)], ["-e", "CPUTIME@1000"])
    spent = json.loads(truth_file.read_text())
    rows = list(paths(view_tree(capsys, database, "--full"), "CPUTIME (sec)"))
    for name in ("first", "second"):
        measured = sum(inclusive for path, inclusive, _ in rows if path[-1] == name)
        assert measured == pytest.approx(spent[name], rel=0.2), (name, sampler, rows)
        below = {
            path[path.index(name) + 1]
            for path, inclusive, _ in rows
            if inclusive > 0.0 and name in path[:-1]
        }
        assert below <= INSIDE, (name, sampler, below)


def test_pyview_ranges_of_a_measurement_without_ranges_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    program = tmp_path / "plain.py"
    program.write_text("total = sum(i * i for i in range(300000))\n")
    assert pyrun_main(["-o", str(tmp_path / "m"), sys.executable, str(program)]) == 0
    run(ProfOptions.build([tmp_path / "m"], output=tmp_path / "db"))
    capsys.readouterr()
    assert pyview_main(["--ranges", "--no-color", str(tmp_path / "db")]) == 0
    screen = capsys.readouterr().out
    assert "this measurement has no ranges (pyrun --ranges measures them)" in screen
    assert "main thread" in screen and "<genexpr>" not in screen


TORCH_PROGRAM = """
import sys
import torch

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.relu = torch.nn.ReLU(inplace=True)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return self.relu(self.conv2(self.relu(self.conv1(x))) + x)

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.layer1 = torch.nn.Sequential(Block(), Block())
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(self.layer1(self.stem(x)).mean((2, 3)))

torch.set_num_threads(1)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data, target = torch.randn(16, 3, 48, 48), torch.randint(0, 10, (16,))
for _ in range(int(sys.argv[1])):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()
"""


def test_a_torch_models_modules_and_its_backward_pass_on_the_cpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    program = tmp_path / "model.py"
    program.write_text(TORCH_PROGRAM)
    out, database = tmp_path / "m", tmp_path / "db"
    command = ["--ranges", "-e", "CPUTIME@2000", "-o", str(out), sys.executable, str(program)]
    assert pyrun_main([*command, "8"]) == 0
    run(ProfOptions.build([out], output=database))
    rows = list(paths(view_tree(capsys, database, "--ranges"), "CPUTIME (sec)"))
    found = {path[1:] for path, inclusive, _ in rows if inclusive}
    # the modules by their path in the model, nested as the model nests them
    chain = ("Net", "layer1 (Sequential)", "layer1.0 (Block)", "layer1.0.conv1 (Conv2d)")
    assert chain in found, sorted(found)
    # the backward pass: in the full tree, below loss.backward()'s frames, its CPU time is
    # (nearly all) under the modules whose forward made the work
    full = list(paths(view_tree(capsys, database, "--full"), "CPUTIME (sec)"))
    backward = [(p, i) for p, i, _ in full if p[-1] == "backward" and "Net" not in p]
    total = sum(inclusive for _, inclusive in backward)
    in_modules = sum(
        inclusive
        for path, inclusive, _ in full
        if path[-1] == "Net" and "backward" in path and "Net" not in path[:-1]
    )
    assert total > 0.05, backward
    assert in_modules > 0.8 * total, (in_modules, total)
    conv = [
        path
        for path, inclusive, _ in full
        if path[-1] == "layer1.1.conv2 (Conv2d)" and "backward" in path and inclusive
    ]
    assert conv, "no backward time under layer1.1.conv2"
