"""pymodel on Extra-P 4.2.5's own test inputs (tests/data/extrap), against Extra-P's models.

For every call path and metric of every file, pymodel's model (as ``pymodel FILE`` makes it) is
compared with Extra-P's default modeler's: the lead-order factor of every parameter, and where
they differ, the leave-one-out SMAPE of each model's hypothesis refitted by ordinary least
squares to the same means (:func:`pyhpctk.model.compare.loo_smape`). Extra-P's models come from
an Extra-P installed beside pyhpctk (``--extrap PATH/bin/extrap``, run on each file) or from the
record ``tests/data/extrap/extrap_models.json`` (``--record`` writes it from a live run).

    python benchmarks/extrap_data.py --extrap /work/extrap-venv/bin/extrap --record \\
        tests/data/extrap/extrap_models.json
    python benchmarks/extrap_data.py            # against the record
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from pyhpctk.model.compare import compare_with_extrap
from pyhpctk.model.extrap_input import DEFAULT_METRIC

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "extrap"
RECORD = DATA / "extrap_models.json"
FORMAT = "{callpath}@@{metric}@@{model:python}"
PROVENANCE = (
    "Extra-P's default modeler, run by benchmarks/extrap_data.py --extrap: `extrap "
    "--disable-progress --print '" + FORMAT + "' --text|--json FILE` on each input file; keys "
    "are the file, then 'callpath@@metric' (Extra-P's empty metric written <default>)"
)


def inputs() -> list[Path]:
    """Extra-P's text and JSON Lines test inputs (the 45 files the issue counts)."""
    return sorted((DATA / "text").rglob("*.txt")) + sorted((DATA / "jsonlines").glob("*.jsonl"))


def run_extrap(extrap: str, path: Path) -> dict[str, str]:
    """Extra-P's model of every 'callpath@@metric' of one file, in Python syntax."""
    kind = "--text" if path.suffix == ".txt" else "--json"
    done = subprocess.run(
        [extrap, "--disable-progress", "--print", FORMAT, kind, str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    out = {}
    for line in done.stdout.splitlines():
        if line.count("@@") == 2:
            callpath, metric, model = line.split("@@")
            out[f"{callpath}@@{metric or DEFAULT_METRIC}"] = model
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extrap", help="Extra-P's extrap executable (else: the record)")
    parser.add_argument("--record", type=Path, help="write Extra-P's models here (with --extrap)")
    arguments = parser.parse_args()
    recorded: dict[str, dict[str, str]] = {}
    if arguments.extrap:
        for path in inputs():
            recorded[str(path.relative_to(DATA))] = run_extrap(arguments.extrap, path)
        if arguments.record:
            document = {"provenance": PROVENANCE, "models": recorded}
            arguments.record.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    else:
        recorded = json.loads(RECORD.read_text())["models"]
    rows = []
    started = time.perf_counter()
    for path in inputs():
        name = str(path.relative_to(DATA))
        rows.extend(compare_with_extrap(path, name, recorded.get(name, {})))
    elapsed = time.perf_counter() - started
    same = [r for r in rows if r.get("same_lead")]
    differ = [r for r in rows if r.get("same_lead") is False]
    better = [r for r in differ if float(r["loo_pymodel"]) <= float(r["loo_extrap"])]  # type: ignore[arg-type]
    for row in differ:
        print(
            f"{row['file']}: {row['key']}: pymodel {row['pymodel']}"
            f" (LOO {row['loo_pymodel']:.3g} %)"
            f" | Extra-P {row['extrap']} (LOO {row['loo_extrap']:.3g} %)",
            file=sys.stdout,
        )
    print(
        f"{len(inputs())} files, {len(rows)} models in {elapsed:.1f} s: lead terms equal in "
        f"{len(same)}, different in {len(differ)} (pymodel's LOO SMAPE lower or equal in "
        f"{len(better)} of those)"
    )


if __name__ == "__main__":
    main()
