"""One vocabulary: the formats' enumerations and constants are declared once and shared.

style.md item 16: relations, lexical types, combine operators, entry points, scopes and the
hpcrun constants live in two stdlib-only modules at the bottom of ``formats/``; every layer uses
those very objects, and the code inside measured processes can import them cheaply.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pyhpctk
from pyhpctk.analysis import context
from pyhpctk.core import metrics
from pyhpctk.formats import hpcrun, hpcrun_constants, hpcrun_model, metadb, vocabulary
from pyhpctk.measure import cct, encode

SRC = Path(__file__).resolve().parent.parent / "src" / "pyhpctk"
HOMES = {SRC / "formats" / "vocabulary.py", SRC / "formats" / "hpcrun_constants.py"}


def test_every_layer_uses_the_same_enumerations() -> None:
    assert context.Relation is metadb.Relation is vocabulary.Relation
    assert context.LexicalType is metadb.LexicalType is vocabulary.LexicalType
    assert context.EntryPoint is metadb.EntryPointKind is vocabulary.EntryPoint
    assert metrics.Combine is metadb.Combine is vocabulary.Combine
    assert metrics.NO_PROPAGATION_INDEX == metadb.NO_PROPAGATION_INDEX == 255
    # The names the files and the dumps use are unchanged.
    assert metadb.Relation(2).name == "INLINED" and metadb.EntryPointKind(0).name == "UNKNOWN_ENTRY"
    assert [s.name for s in metadb.STANDARD_SCOPES] == [
        "point",
        "function",
        "lex_aware",
        "execution",
    ]
    assert [s.propagation_index for s in metadb.STANDARD_SCOPES] == [255, 0, 255, 255]


def test_pyrun_writes_with_the_format_modules_constants() -> None:
    assert hpcrun.MAGIC + hpcrun.VERSION.encode() + b"b" == encode.PROFILE_HEADER_PREFIX
    assert hpcrun_model.KIND_THREAD is hpcrun_constants.KIND_THREAD
    assert cct.placeholder_ip is hpcrun_model.placeholder_ip is hpcrun_constants.placeholder_ip
    assert cct.MAIN_FENCE == hpcrun_constants.MAIN_FENCE == "| Main  "


def test_the_vocabulary_is_cheap_to_import_inside_a_measured_process() -> None:
    """No numpy, no typing: pyrun's bootstrap imports these in every measured process.

    The child runs without ``site`` (``-S``), its paths given: a ``.pth`` file of the
    environment runs at every interpreter's start and may import anything (numba-cuda's, in the
    dev extra, imports typing), which would hide what pyhpctk itself imports."""
    code = (
        "import sys, site; sys.path[:0] = [*SRC, *site.getsitepackages()]; "
        "import pyhpctk.formats.hpcrun_constants, pyhpctk.formats.vocabulary; "
        "print(sorted({'numpy', 'typing'} & set(sys.modules)))"
    ).replace("SRC", repr([str(Path(pyhpctk.__file__).resolve().parent.parent)]))
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _declared(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names.add(leaf.id)
    return names


def test_no_module_redeclares_the_vocabulary() -> None:
    """A module that needs a relation, a combine operator or an id kind imports it."""
    vocabulary_names = {
        name
        for home in HOMES
        for name in _declared(ast.parse(home.read_text()))
        if not name.startswith("_")
    } | {"LEX_FUNCTION", "LEX_LOOP", "LEX_LINE", "LEX_INSTRUCTION", "REL_CALL", "REL_LEXICAL"}
    # Names a format module gives its own constants (an alias of the shared value) are fine:
    # what must not happen is a second *definition* by value.
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path in HOMES:
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            enum = isinstance(node, ast.ClassDef) and any(
                "Enum" in ast.unparse(b) for b in node.bases
            )
            if enum and node.name in vocabulary_names:
                offenders.append(f"{path.relative_to(SRC)}: class {node.name}")
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant | ast.Tuple):
                for target in node.targets:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Name) and leaf.id in vocabulary_names:
                            offenders.append(f"{path.relative_to(SRC)}: {leaf.id} = ...")
    assert offenders == []
