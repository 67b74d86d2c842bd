"""Score pystruct against the structure files HPCToolkit's hpcstruct wrote for the test binaries.

``python -m pyhpctk.structure.accuracy REFERENCE_DIR`` prints the Markdown table of
``docs/pystruct.md``; the accuracy tests call :func:`score_binary` on the same pairs, so the
table and the tests cannot disagree. ``REFERENCE_DIR`` is HPCToolkit's test data
(``bin/`` binaries, ``struct/`` hpcstruct outputs, ``+gpucfg`` for cubins).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from pyhpctk.errors import PyhpctkError
from pyhpctk.structure.compare import KINDS, Score, compare
from pyhpctk.structure.driver import StructOptions, analyze_target

# The machine that wrote the +gpucfg references resolved the /usr/local/cuda symlink
# (hpcstruct's RealPathMgr canonicalises paths of files that exist where it runs). pystruct runs
# with resolve_paths=False here so that scores do not depend on the machine running the test.
MACHINE_ALIASES = {"/usr/local/cuda/bin/../targets/": "/usr/local/cuda-12.5/targets/"}


@dataclass(frozen=True, slots=True)
class BinaryScore:
    """Scores of one binary (and variant), raw and with the machine's path aliases."""

    name: str
    gpucfg: bool
    raw: dict[str, Score] | None
    aliased: dict[str, Score] | None
    error: str = ""

    @property
    def label(self) -> str:
        return self.name + ("+gpucfg" if self.gpucfg else "")


def reference_pairs(reference: Path) -> list[tuple[str, bool]]:
    """(binary name, gpucfg) for every reference structure file with a binary."""
    out = []
    for struct_file in sorted((reference / "struct").glob("*.hpcstruct")):
        stem = struct_file.name.removesuffix(".hpcstruct")
        gpucfg = stem.endswith("+gpucfg")
        name = stem.removesuffix("+gpucfg")
        if (reference / "bin" / name).is_file():
            out.append((name, gpucfg))
    return out


def score_binary(reference: Path, name: str, gpucfg: bool) -> BinaryScore:
    """Run pystruct on ``bin/NAME`` and compare with ``struct/NAME[+gpucfg].hpcstruct``."""
    from pyhpctk.formats import hpcstruct

    suffix = "+gpucfg" if gpucfg else ""
    ref = hpcstruct.read(reference / "struct" / f"{name}{suffix}.hpcstruct")
    try:
        ours = analyze_target(
            reference / "bin" / name, StructOptions(gpucfg=gpucfg, resolve_paths=False)
        )
    except PyhpctkError as error:
        return BinaryScore(name, gpucfg, None, None, str(error))
    # Only the +gpucfg references come from the machine with /usr/local/cuda-12.5.
    aliases = MACHINE_ALIASES if gpucfg else None
    return BinaryScore(name, gpucfg, compare(ours, ref), compare(ours, ref, aliases))


def _cell(score: Score) -> str:
    return f"{score.precision:.2f} / {score.recall:.2f}"


def markdown_table(scores: list[BinaryScore]) -> str:
    """One row per binary: precision / recall per kind (aliased; raw in brackets if different)."""
    head = "| binary | " + " | ".join(KINDS) + " |"
    rule = "| --- |" + " --- |" * len(KINDS)
    rows = [head, rule]
    for item in scores:
        if item.aliased is None or item.raw is None:
            rows.append(f"| {item.label} | " + " | ".join(["—"] * len(KINDS)) + " |")
            continue
        cells = []
        for kind in KINDS:
            text = _cell(item.aliased[kind])
            if item.raw[kind] != item.aliased[kind]:
                text += f" (raw {_cell(item.raw[kind])})"
            cells.append(text)
        rows.append(f"| {item.label} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the accuracy table for a reference directory."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pyhpctk.structure.accuracy REFERENCE_DIR", file=sys.stderr)
        return 2
    reference = Path(args[0])
    scores = [score_binary(reference, n, g) for n, g in reference_pairs(reference)]
    sys.stdout.write(markdown_table(scores))
    for item in scores:
        if item.error:
            print(f"\n{item.label}: {item.error}", file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
