"""Issue #37 item 1 on the device: ResNet-18 and GPT-2 training steps under ``pyrun --ranges``,
two modules' kernels (forward and backward) counted by pyrun and by ``torch.profiler``.

    python3 ranges_device.py steps WORKLOAD STEPS             the steps (run it under pyrun)
    python3 ranges_device.py profile WORKLOAD STEPS OUT.json  torch.profiler's counts
    python3 ranges_device.py check WORKLOAD DATABASE OUT.json  PASS/FAIL per module

``WORKLOAD``: ``resnet18`` (torchvision, batch 64 of 224² images) or ``gpt2``
(``GPT2LMHeadModel`` built from ``GPT2Config(n_layer=6, n_embd=512, n_head=8)``, batch 8 of
256 tokens: nothing downloaded), AdamW; the steps of ``benchmarks/pyrun_gpu.py``.

torch.profiler's own count of a module's kernels, on a run of its own (record_shapes off, no
Python stacks): the module's forward runs inside a ``record_function("TARGET <name>")`` (its
``forward`` wrapped on that instance only); its forward kernels are the device kernels of the
ops below that event; its backward kernels those of the ``autograd::engine::evaluate_function``
events whose sequence number is one of those forward ops' (how torch.profiler links a backward
op to the forward op that made its node). Copies and memsets are not kernels, nor is a range's
own span on the GPU timeline: torch.profiler lists a ``record_function``'s GPU user annotation
(named as the range) among the kernels of the range's event. pyrun's count is ``GKER:COUNT`` of
the module's rows in ``pyview --ranges`` (forward on the main thread, backward on autograd's),
exclusive: the targets are leaf modules.

The check prints, for each target, the kernels by name on both sides (torch.profiler's forward
per call too: a first call's one-time work stands out; pyrun's: the kernel contexts under the
module's range nodes of the database, by thread), and where pyrun put the kernels of a name the
profiler counts more of: a difference says which kernels make it, and which side is wrong.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

# the benchmark's own ResNet-18 and GPT-2 steps (benchmarks/pyrun_gpu.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from pyrun_gpu import model_steps

#: Two leaf modules of each model whose input comes from one producer (no gradient sum of
#: several branches that the backward pass would add in its producer's node)
TARGETS = {
    "resnet18": ("layer1.0.conv2 (Conv2d)", "fc (Linear)"),
    "gpt2": ("transformer.h.0.attn.c_attn (Conv1D)", "transformer.h.0.mlp.c_fc (Conv1D)"),
}


def module_named(model: Any, label: str) -> Any:
    path = label.split(" (", 1)[0]
    return dict(model.named_modules())[path]


def walk(event: Any) -> Iterator[Any]:
    yield event
    for child in event.cpu_children:
        yield from walk(child)


def is_kernel(name: str) -> bool:
    return not name.startswith(("Memcpy", "Memset"))


def range_names(events: Any) -> set[str]:
    """The names of the profile's ranges (``record_function``, a module's scope): a range's GPU
    user annotation is listed among its event's kernels under the range's name."""
    return {
        event.name
        for event in events
        if getattr(event, "is_user_annotation", False) or event.name.startswith("TARGET ")
    }


def kernel_names(event: Any, ranges: set[str]) -> Counter[str]:
    """One event's own kernels on the GPU by name (copies, memsets and ranges left out)."""
    return Counter(
        kernel.name
        for kernel in event.kernels
        if is_kernel(kernel.name) and kernel.name not in ranges
    )


def profiler_counts(
    events: Any, label: str, counted: Callable[[Any], Counter[str]]
) -> dict[str, Any]:
    """torch.profiler's forward and backward count of the module ``label``, and its kernels by
    name (``counted``: one event's own kernels on the GPU by name)."""
    forward: Counter[str] = Counter()
    per_call: list[int] = []  # a first call's one-time work (cuBLAS's setup) stands out
    sequence: set[int] = set()
    for event in events:
        if event.name == f"TARGET {label}":
            before = forward.total()
            for inner in walk(event):
                forward += counted(inner)
                if getattr(inner, "sequence_nr", -1) >= 0 and inner is not event:
                    sequence.add(inner.sequence_nr)
            per_call.append(forward.total() - before)
    backward: Counter[str] = Counter()
    for event in events:
        if event.name.startswith("autograd::engine::evaluate_function") and (
            event.sequence_nr in sequence
        ):
            for inner in walk(event):
                backward += counted(inner)
    return {
        "forward": forward.total(),
        "backward": backward.total(),
        "total": forward.total() + backward.total(),
        "forward_per_call": per_call,
        "forward_kernels": dict(forward.most_common()),
        "backward_kernels": dict(backward.most_common()),
    }


def profile(workload: str, steps: int, out: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, record_function

    model, run = model_steps(workload, steps)
    for label in TARGETS[workload]:
        module = module_named(model, label)
        forward = module.forward

        def wrapped(*args: Any, _f: Any = forward, _l: str = label, **kwargs: Any) -> Any:
            with record_function(f"TARGET {_l}"):
                return _f(*args, **kwargs)

        module.forward = wrapped
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, record_shapes=False) as prof:
        run()
    events = prof.events()
    ranges = range_names(events)

    def kernels(event: Any) -> Counter[str]:
        return kernel_names(event, ranges)

    counts = {label: profiler_counts(events, label, kernels) for label in TARGETS[workload]}
    with open(out, "w") as stream:
        json.dump(counts, stream, indent=1)
    print(json.dumps(counts))


def pyrun_counts(database: str) -> dict[str, float]:
    """GKER:COUNT (exclusive) of each range's rows in ``pyview --ranges``, summed by name."""
    counts: dict[str, float] = {}

    def add(node: dict[str, Any]) -> None:
        for child in node.get("children", []):
            name = str(child["scope"])
            counts[name] = counts.get(name, 0.0) + child["values"].get("GKER:COUNT (E)", 0.0)
            add(child)

    add(pyview_tree(database, "--ranges"))
    return counts


def pyview_tree(database: str, *options: str) -> dict[str, Any]:
    """The root of ``pyview --json`` with GKER:COUNT and ``options``."""
    command = [sys.executable, "-m", "pyhpctk.cli.pyview", *options, "--metric", "GKER:COUNT"]
    shown = subprocess.run([*command, "--json", "-", database], capture_output=True, text=True)
    if shown.returncode:
        sys.exit(f"pyview failed: {shown.stderr}")
    root: dict[str, Any] = json.loads(shown.stdout)["root"]
    return root


def kernel_key(name: str) -> str:
    """A kernel's name as both sides can match it: no ``void``, no parameter list, no
    ``[gpubin]`` (CUPTI's demangled names carry the first two, pyrun's rows may not)."""
    name = name.strip().removeprefix("void ")
    if name.endswith("]") and " [" in name:
        name = name[: name.rindex(" [")]
    if name.endswith(")"):
        depth = 0
        for at in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[at], 0)
            if depth == 0:
                return name[:at].strip()
    return name


class PyrunKernels:
    """The kernels of a database's whole calling context tree: each row with kernels of its own,
    named by the context below its ``<gpu kernel>`` placeholder (the kernel's function)."""

    def __init__(self, database: str) -> None:
        from pyhpctk.present.api import open_database
        from pyhpctk.present.ranges import range_contexts

        db = open_database(database)
        arrays = db.arrays(["GKER:COUNT"])
        self.is_range = range_contexts(db.experiment.tree)
        self.label, self.kind, self.parent = arrays["label"], arrays["kind"], arrays["parent"]
        self.own = arrays["GKER:COUNT (E)"]
        self.children: dict[int, list[int]] = {}
        for row, up in enumerate(self.parent.tolist()):
            self.children.setdefault(up, []).append(row)

    def above(self, row: int, stop: Callable[[int], bool]) -> int:
        while row > 0 and not stop(row):
            row = int(self.parent[row])
        return row

    def name(self, row: int) -> str:
        label, parent = self.label, self.parent
        kernel = self.above(row, lambda r: label[parent[r]] == "<gpu kernel>")
        return str(label[kernel if kernel > 0 else row])

    def where(self, row: int) -> str:
        """The range a row is in (the innermost), else its thread."""
        return str(
            self.label[self.above(row, lambda r: self.is_range[r] or self.kind[r] == "entry")]
        )

    def under(self, labels: set[str]) -> dict[str, dict[str, Counter[str]]]:
        """The kernels under each range named one of ``labels`` (not under a range inside it),
        by thread and by name."""
        found: dict[str, dict[str, Counter[str]]] = {name: {} for name in labels}
        for top in np.flatnonzero(self.is_range).tolist():
            if self.label[top] not in labels:
                continue
            thread = str(self.label[self.above(top, lambda r: self.kind[r] == "entry")])
            names = found[str(self.label[top])].setdefault(thread, Counter())
            stack = list(self.children.get(top, []))
            while stack:
                row = stack.pop()
                if not self.is_range[row]:
                    if self.own[row] > 0:
                        names[self.name(row)] += int(self.own[row])
                    stack.extend(self.children.get(row, []))
        return found

    def elsewhere(self, keys: set[str]) -> Counter[tuple[str, str]]:
        """Every kernel whose :func:`kernel_key` is one of ``keys``, by key and by where it is."""
        found: Counter[tuple[str, str]] = Counter()
        for row in np.flatnonzero(self.own > 0).tolist():
            key = kernel_key(self.name(row))
            if key in keys:
                found[key, self.where(row)] += int(self.own[row])
        return found


def named(counts: dict[str, int], width: int = 110) -> str:
    return "; ".join(f"{n} x {name[:width]}" for name, n in counts.items()) or "none"


def check(workload: str, database: str, profiled: str) -> int:
    with open(profiled) as stream:
        truth = json.load(stream)
    measured = pyrun_counts(database)
    failed = 0
    for label in TARGETS[workload]:
        expected = truth[label]["total"]
        got = measured.get(label, 0.0)
        ok = got == expected and expected > 0
        failed += not ok
        print(
            f"{'PASS' if ok else 'FAIL'} {workload} {label}: pyrun --ranges {got:.0f} kernels, "
            f"torch.profiler {expected} (forward {truth[label]['forward']}, backward "
            f"{truth[label]['backward']})"
        )
    tree = PyrunKernels(database)
    kernels = tree.under(set(TARGETS[workload]))
    for label in TARGETS[workload]:
        print_names(label, truth[label], kernels[label], tree)
    modules = sorted((n for n in measured if "(" in n), key=lambda n: -measured[n])
    print(
        f"{workload}: {len(modules)} module rows; kernels (own) of the first: "
        + ", ".join(f"{n} {measured[n]:.0f}" for n in modules[:6])
    )
    return 1 if failed else 0


def print_names(
    label: str, profiled: dict[str, Any], ours: dict[str, Counter[str]], tree: PyrunKernels
) -> None:
    """Both sides' kernels of one module by name, and where pyrun put the kernels the profiler
    counts more of than pyrun has under the module."""
    print(f"  {label} forward per call, torch.profiler: {profiled.get('forward_per_call')}")
    theirs: Counter[str] = Counter()
    for side in ("forward", "backward"):
        names = profiled.get(f"{side}_kernels", {})
        theirs.update({kernel_key(name): n for name, n in names.items()})
        print(f"  {label} {side}, torch.profiler: {named(names)}")
    mine: Counter[str] = Counter()
    for thread, names in sorted(ours.items()):
        mine.update({kernel_key(name): n for name, n in names.items()})
        counts = dict(names.most_common())
        print(
            f"  {label} under the range, pyrun, {thread}: {names.total()} kernels: {named(counts)}"
        )
    missing = {key for key, n in theirs.items() if n > mine[key]}
    places = tree.elsewhere(missing)
    for (key, where), n in places.most_common(10):
        print(f"  {label}: pyrun has {n} x {key[:110]} under {where}")
    if len(places) > 10:
        print(f"  {label}: ... and in {len(places) - 10} more places")


def main() -> int:
    mode, workload = sys.argv[1], sys.argv[2]
    if mode == "steps":
        _, run = model_steps(workload, int(sys.argv[3]))
        run()
        return 0
    if mode == "profile":
        profile(workload, int(sys.argv[3]), sys.argv[4])
        return 0
    return check(workload, sys.argv[3], sys.argv[4])


if __name__ == "__main__":
    sys.exit(main())
