"""The metric taxonomy hpcprof writes beside a database (``metrics/default.yaml``).

The file lists *inputs* (a metric, a propagation scope, a per-profile formula and a combine
function, i.e. one summary statistic of meta.db, formats.md §3.2 {SS}) and a tree of *roots*
(the metrics a viewer shows). Each root has variants (``Sum``, ...) whose ``inclusive`` and
``exclusive`` formulas are either an input or an expression written as nested one-key mappings,
e.g. ``{min: [100, {max: [0, {/: [{"*": [100, *TOT]}, *EXP]}]}]}`` for ``GSAMP:UTIL``; the
``exclusive`` side has a ``standard`` (function scope) and a ``custom`` (lex_aware) formula.

The project has no YAML dependency, so :func:`load_yaml` parses the subset hpcprof emits (block
mappings and sequences, flow ``{}``/``[]``, anchors and aliases, plain and double-quoted scalars).
It is not a general YAML parser and says so when it meets something else. Both parsers here
recurse, so documents nested deeper than :data:`MAX_YAML_NESTING` levels, and formulas deeper
than the formula language allows, are refused with a FormatError.
"""

from __future__ import annotations

import json
import re
import reprlib
from dataclasses import dataclass
from typing import Any

from pyhpctk.errors import FormatError
from pyhpctk.formats.vocabulary import SCOPE_EXECUTION, Combine
from pyhpctk.present.formula import MAX_DEPTH, BinOp, Call, Expr, Neg, Num, Ref, depth

_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
MAX_YAML_NESTING = 64  # block and flow collections inside one another (hpcprof writes ~10)


class _YamlError(Exception):
    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line + 1}: {problem}")


def _scalar(text: str) -> Any:
    text = text.strip()
    if text in ("", "~", "null"):
        return None
    if text in ("true", "false"):
        return text == "true"
    if _NUMBER.fullmatch(text):
        return float(text) if any(c in text for c in ".eE") else int(text)
    return text


class _Yaml:
    """Recursive-descent parser over the lines of a hpcprof-style YAML document."""

    def __init__(self, text: str) -> None:
        self.lines = [ln.rstrip() for ln in text.splitlines()]
        self.anchors: dict[str, Any] = {}
        self.row = 0
        self.nesting = 0

    def nest(self, step: int) -> None:
        self.nesting += step
        if self.nesting > MAX_YAML_NESTING:
            raise _YamlError(self.row, f"nested more than {MAX_YAML_NESTING} levels deep")

    # -- block structure ---------------------------------------------------------------------
    def skip_blank(self) -> None:
        while self.row < len(self.lines) and (
            not self.lines[self.row].strip() or self.lines[self.row].lstrip().startswith("#")
        ):
            self.row += 1

    def indent_of(self, row: int) -> int:
        line = self.lines[row]
        return len(line) - len(line.lstrip(" "))

    def document(self) -> Any:
        self.skip_blank()
        if self.row >= len(self.lines):
            return None
        value = self.block(self.indent_of(self.row))
        self.skip_blank()
        if self.row < len(self.lines):
            raise _YamlError(self.row, "unexpected indentation")
        return value

    def block(self, indent: int) -> Any:
        self.skip_blank()
        line = self.lines[self.row][indent:]
        self.nest(1)
        try:
            if line.startswith("- ") or line == "-":
                return self.sequence(indent)
            return self.mapping(indent)
        finally:
            self.nest(-1)

    def sequence(self, indent: int) -> list[Any]:
        items: list[Any] = []
        while True:
            self.skip_blank()
            if self.row >= len(self.lines) or self.indent_of(self.row) != indent:
                break
            line = self.lines[self.row]
            if not (line[indent:].startswith("- ") or line[indent:] == "-"):
                break
            content = line[indent + 2 :].strip()
            anchor, content = self.split_anchor(content)
            if not content:
                self.row += 1
                self.skip_blank()
                child = self.indent_of(self.row) if self.row < len(self.lines) else -1
                value = self.block(child) if child > indent else None
            elif self.is_mapping_line(content):
                # "- key: value" opens a mapping whose keys sit two columns to the right.
                self.lines[self.row] = " " * (indent + 2) + content
                value = self.mapping(indent + 2)
            else:
                value = self.inline(content)
                self.row += 1
            if anchor:
                self.anchors[anchor] = value
            items.append(value)
        return items

    def mapping(self, indent: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        while True:
            self.skip_blank()
            if self.row >= len(self.lines) or self.indent_of(self.row) != indent:
                break
            line = self.lines[self.row][indent:]
            if line.startswith("- "):
                break
            key, rest = self.split_key(line)
            anchor, rest = self.split_anchor(rest)
            if rest:
                value = self.inline(rest)
                self.row += 1
            else:
                self.row += 1
                self.skip_blank()
                value = None
                if self.row < len(self.lines):
                    child = self.indent_of(self.row)
                    nested = self.lines[self.row][child:]
                    if child > indent or (child == indent and nested.startswith("- ")):
                        value = self.block(child)
            if anchor:
                self.anchors[anchor] = value
            out[key] = value
        return out

    def is_mapping_line(self, content: str) -> bool:
        if content[0] in "{[*":
            return False
        if content[0] == '"':
            end = content.find('"', 1)
            return end > 0 and content[end + 1 :].startswith(":")
        return bool(re.match(r"[^\s:][^:]*?:(\s|$)", content))

    def split_key(self, line: str) -> tuple[str, str]:
        if line.startswith('"'):
            end = line.find('"', 1)
            if end < 0 or not line[end + 1 :].startswith(":"):
                raise _YamlError(self.row, "bad quoted key")
            return json.loads(line[: end + 1]), line[end + 2 :].strip()
        m = re.match(r"([^:]+?):(\s+|$)(.*)", line)
        if m is None:
            raise _YamlError(self.row, f"expected 'key: value', found {line.strip()!r}")
        return m.group(1).strip(), m.group(3).strip()

    def split_anchor(self, text: str) -> tuple[str | None, str]:
        if text.startswith("&"):
            name, _, rest = text[1:].partition(" ")
            return name, rest.strip()
        return None, text

    # -- flow (inline) values ----------------------------------------------------------------
    def inline(self, text: str) -> Any:
        value, pos = self.flow(text, 0, block=True)
        if text[pos:].strip():
            raise _YamlError(self.row, f"unexpected text {text[pos:].strip()!r}")
        return value

    def flow(self, text: str, pos: int, block: bool = False) -> tuple[Any, int]:
        while pos < len(text) and text[pos] == " ":
            pos += 1
        if pos >= len(text):
            return None, pos
        if text[pos] in "{[&":
            self.nest(1)
            try:
                return self.flow_collection(text, pos, block)
            finally:
                self.nest(-1)
        return self.flow_collection(text, pos, block)

    def flow_collection(self, text: str, pos: int, block: bool) -> tuple[Any, int]:
        c = text[pos]
        if c == "{":
            out: dict[str, Any] = {}
            pos += 1
            while True:
                pos = self.spaces(text, pos)
                if pos < len(text) and text[pos] == "}":
                    return out, pos + 1
                key, pos = self.flow_key(text, pos)
                value, pos = self.flow(text, pos)
                out[key] = value
                pos = self.spaces(text, pos)
                if pos < len(text) and text[pos] == ",":
                    pos += 1
                elif pos >= len(text) or text[pos] != "}":
                    raise _YamlError(self.row, "unterminated flow mapping")
        if c == "[":
            items: list[Any] = []
            pos += 1
            while True:
                pos = self.spaces(text, pos)
                if pos < len(text) and text[pos] == "]":
                    return items, pos + 1
                value, pos = self.flow(text, pos)
                items.append(value)
                pos = self.spaces(text, pos)
                if pos < len(text) and text[pos] == ",":
                    pos += 1
                elif pos >= len(text) or text[pos] != "]":
                    raise _YamlError(self.row, "unterminated flow sequence")
        if c == '"':
            end = pos + 1
            while end < len(text) and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            if end >= len(text):
                raise _YamlError(self.row, "unterminated string")
            return json.loads(text[pos : end + 1]), end + 1
        if c == "*":
            m = re.compile(r"\*([^\s,\]}]+)").match(text, pos)
            if m is None or m.group(1) not in self.anchors:
                raise _YamlError(self.row, f"unknown alias {m.group(0) if m else '*'!r}")
            return self.anchors[m.group(1)], m.end()
        if c == "&":
            name, _, _ = text[pos + 1 :].partition(" ")
            value, end = self.flow(text, pos + 1 + len(name), block)
            self.anchors[name] = value
            return value, end
        end = len(text) if block else pos
        if not block:
            while end < len(text) and text[end] not in ",]}":
                end += 1
        return _scalar(text[pos:end]), end

    def flow_key(self, text: str, pos: int) -> tuple[str, int]:
        if text[pos] == '"':
            key, pos = self.flow(text, pos)
        else:
            end = text.find(":", pos)
            if end < 0:
                raise _YamlError(self.row, "expected ':' in flow mapping")
            key, pos = text[pos:end].strip(), end
        pos = self.spaces(text, pos)
        if pos >= len(text) or text[pos] != ":":
            raise _YamlError(self.row, "expected ':' in flow mapping")
        return str(key), pos + 1

    @staticmethod
    def spaces(text: str, pos: int) -> int:
        while pos < len(text) and text[pos] == " ":
            pos += 1
        return pos


def load_yaml(text: str, path: str | None = None) -> Any:
    """Parse the YAML subset hpcprof writes; raises FormatError naming the line."""
    try:
        return _Yaml(text).document()
    except _YamlError as error:
        raise FormatError(path, "metric taxonomy", str(error)) from None
    except (IndexError, ValueError) as error:
        raise FormatError(path, "metric taxonomy", f"unreadable YAML ({error})") from None


@dataclass(frozen=True, slots=True)
class Input:
    """A summary statistic formulas read: ``combine`` over profiles of ``formula`` in ``scope``."""

    metric: str
    scope: str
    formula: str = "$$"
    combine: str = Combine.SUM.label


@dataclass(frozen=True, slots=True)
class TaxonomyMetric:
    """A metric a viewer shows: name, inclusive and exclusive formulas over :class:`Input`s."""

    name: str
    description: str
    variant: str
    inclusive: Expr | None
    exclusive: Expr | None
    inputs: dict[str, Input]  # reference name used in the formulas -> input
    format: str | None = None
    percent: bool = True  # the variant's "render" list asks for a percentage


_OPS = {"+": "+", "-": "-", "*": "*", "/": "/", "^": "^", "pow": "^"}


MAX_FORMULA_TERMS = 10_000  # aliases can make a small file name a huge (even exponential) tree


@dataclass
class _FormulaReader:
    """Turns one taxonomy formula (nested one-key mappings) into an expression tree."""

    inputs: dict[str, Input]  # filled as inputs are met: reference name -> input
    path: str | None
    terms: int = 0

    def fail(self, problem: str) -> FormatError:
        return FormatError(self.path, "metric taxonomy", problem)

    def read(self, node: Any, level: int = 0) -> Expr:
        # Aliases (*name) can nest anchored values inside one another without the text
        # nesting: bound the recursion and the size here, not only in the YAML parser.
        self.terms += 1
        if level > MAX_YAML_NESTING or self.terms > MAX_FORMULA_TERMS:
            raise self.fail(
                f"a formula nested more than {MAX_YAML_NESTING} levels deep"
                if level > MAX_YAML_NESTING
                else f"a formula of more than {MAX_FORMULA_TERMS:,} terms"
            )
        if isinstance(node, bool) or node is None:
            raise self.fail(f"bad formula term {node!r}")
        if isinstance(node, int | float):
            return Num(float(node))
        if isinstance(node, dict) and "metric" in node:
            inp = Input(
                str(node["metric"]),
                str(node.get("scope", SCOPE_EXECUTION.label)),
                str(node.get("formula", "$$")),
                str(node.get("combine", Combine.SUM.label)),
            )
            ref = f"#in{len(self.inputs)}"
            for name, known in self.inputs.items():
                if known == inp:
                    ref = name
                    break
            self.inputs[ref] = inp
            return Ref(ref)
        if isinstance(node, dict) and len(node) == 1:
            op, args = next(iter(node.items()))
            terms = [self.read(a, level + 1) for a in (args if isinstance(args, list) else [args])]
            if op in ("min", "max", "abs", "sqrt"):
                return Call(op, tuple(terms))
            if op == "-" and len(terms) == 1:
                return Neg(terms[0])
            if op in _OPS and terms:
                out = terms[0]
                for term in terms[1:]:
                    out = BinOp(_OPS[op], out, term)
                return out
        raise self.fail(f"unsupported formula {reprlib.repr(node)}")


def _side(value: Any, inputs: dict[str, Input], path: str | None) -> Expr | None:
    if value is None:
        return None
    if isinstance(value, dict) and ("standard" in value or "custom" in value):
        # formats.md §3.2: the viewer's "exclusive" is lex_aware, i.e. the custom formula.
        value = value.get("custom", value.get("standard"))
        if value is None:
            return None
    expr = _FormulaReader(inputs, path).read(value)
    if depth(expr) > MAX_DEPTH:
        raise FormatError(path, "metric taxonomy", f"a formula more than {MAX_DEPTH} levels deep")
    return expr


MAX_TAXONOMY_METRICS = 100_000  # aliased children could repeat subtrees without end


def _mapping(value: Any, what: str, path: str | None) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FormatError(path, "metric taxonomy", f"{what} is not a mapping")
    return value


def parse_taxonomy(text: str, path: str | None = None) -> list[TaxonomyMetric]:
    """The metrics of a ``metrics/default.yaml`` document, in the file's order."""
    doc = load_yaml(text, path)
    if not isinstance(doc, dict) or not isinstance(doc.get("roots"), list):
        raise FormatError(path, "metric taxonomy", "no 'roots' list")
    out: list[TaxonomyMetric] = []
    # Roots and their children, depth first in file order, with a stack (aliases can nest
    # children deeper than the text does).
    stack: list[Any] = list(reversed(doc["roots"]))
    while stack:
        root = stack.pop()
        if not isinstance(root, dict) or "name" not in root:
            raise FormatError(path, "metric taxonomy", "a root without a name")
        variants = _mapping(root.get("variants"), f"variants of {root['name']!r}", path)
        for k, (variant, body) in enumerate(variants.items()):
            body = _mapping(body, f"variant {variant!r} of {root['name']!r}", path)
            formula = _mapping(body.get("formula"), f"formula of {root['name']!r}", path)
            inputs: dict[str, Input] = {}
            render = body.get("render") or ["percent"]
            # The first variant is the one a viewer shows under the metric's own name;
            # the others (Mean, Min, Max, ... with pyprof -M stats) as "NAME:Variant".
            name = str(root["name"]) if k == 0 else f"{root['name']}:{variant}"
            out.append(
                TaxonomyMetric(
                    name=name,
                    description=str(root.get("description") or ""),
                    variant=str(variant),
                    inclusive=_side(formula.get("inclusive"), inputs, path),
                    exclusive=_side(formula.get("exclusive"), inputs, path),
                    inputs=inputs,
                    format=str(root["format"]) if root.get("format") is not None else None,
                    percent="percent" in (render if isinstance(render, list) else [render]),
                )
            )
            if len(out) > MAX_TAXONOMY_METRICS:
                raise FormatError(
                    path, "metric taxonomy", f"more than {MAX_TAXONOMY_METRICS:,} metrics"
                )
        children = root.get("children") or []
        if not isinstance(children, list):
            raise FormatError(path, "metric taxonomy", f"children of {root['name']!r}: not a list")
        stack.extend(reversed(children))
    return out
