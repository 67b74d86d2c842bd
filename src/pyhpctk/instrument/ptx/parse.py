"""PTX text into a module of kernels and functions, each a flat list of statements.

The parser knows PTX's lexical shape (PTX ISA §4: comments, strings, statements ending in ``;``,
labels ending in ``:``, scopes in ``{ }``, the line-ended ``.loc`` and ``.file`` directives and
the ``.section`` blocks of debug data) but not the meaning of instructions: an instruction is a
guard, an opcode and its operands, kept as written so the rewriter can emit it unchanged. It never
executes, assembles or changes anything.
"""

from __future__ import annotations

import bisect
import enum
import re
from dataclasses import dataclass, field

from pyhpctk.instrument.ptx.errors import PtxError

# Strings are kept, comments become blanks of the same length (newlines kept), so every offset
# into the cleaned text is an offset into the original and line numbers stay right.
_COMMENT_OR_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/', re.DOTALL)
_IDENT = r"[A-Za-z_$%][\w$]*"
_LABEL = re.compile(rf"({_IDENT})\s*:(?!:)")
_SPACE = re.compile(r"\s+")
_LINE_DIRECTIVE = re.compile(r"\.(loc|file)\b[^\n]*")
_MODULE_DIRECTIVE = re.compile(r"\.(version|target|address_size)\b([^\n;]*);?")
_FUNCTION_HEAD = re.compile(r"(?:\.(?:visible|extern|weak|common)\s+)*\.(entry|func)\b")
_FUNCTION_NAME = re.compile(rf"\.(?:entry|func)\s*(?:\([^)]*\)\s*)?({_IDENT})")
_PARAM_NAME = re.compile(rf"\.param\b[^,()]*?({_IDENT})\s*(?:\[[^\]]*\])?\s*(?:[,)]|$)")
_LABELLED_DIRECTIVE = re.compile(r"\.(?:branchtargets|calltargets|callprototype)\b")
_GUARD = re.compile(r"@(!?)(%?[\w$]+)\s*")


class Kind(enum.Enum):
    """What a statement of a function body is."""

    INSTRUCTION = "instruction"
    LABEL = "label"
    DIRECTIVE = "directive"  # .reg, .pragma, .branchtargets, .callprototype, ...
    LOC = "loc"
    OPEN = "open"  # '{' of a nested scope
    CLOSE = "close"  # '}' of a nested scope


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of a function body as written (without its ``;``)."""

    kind: Kind
    text: str
    line: int  # 1-based line of the PTX text where the statement starts
    label: str = ""  # LABEL: its name; DIRECTIVE: the label before it (``$t: .branchtargets``)
    guard: str = ""  # INSTRUCTION: "@%p1" or "@!%p1", empty when unguarded
    opcode: str = ""  # INSTRUCTION: "bra.uni", "ld.param.u64"; DIRECTIVE: ".reg"
    operands: tuple[str, ...] = ()

    @property
    def base_opcode(self) -> str:
        """The opcode without its type and option suffixes (``bra`` for ``bra.uni``)."""
        return self.opcode.split(".", 1)[0]


@dataclass(frozen=True, slots=True)
class PtxFunction:
    """A kernel (``.entry``) or device function (``.func``) with a body."""

    name: str
    is_entry: bool
    header: str  # from the linkage directive to the character before the body's '{'
    params: tuple[str, ...]
    body: tuple[Statement, ...]
    start: int  # offset of the header in the module text
    end: int  # offset just past the body's closing '}'
    line: int


@dataclass(frozen=True)
class PtxModule:
    """A PTX module: its header directives, functions with bodies, files and debug strings."""

    text: str
    version: str
    target: str
    functions: tuple[PtxFunction, ...]
    files: dict[int, str] = field(default_factory=dict)
    strings: dict[str, str] = field(default_factory=dict)  # .debug_str labels -> their text

    def function(self, name: str) -> PtxFunction:
        for function in self.functions:
            if function.name == name:
                return function
        raise PtxError(0, f"no function named {name!r}")

    @property
    def kernels(self) -> tuple[PtxFunction, ...]:
        return tuple(f for f in self.functions if f.is_entry)


def clean(text: str) -> str:
    """``text`` with every comment blanked out, offsets and newlines unchanged."""

    def blank(match: re.Match[str]) -> str:
        s = match.group(0)
        return s if s.startswith('"') else re.sub(r"[^\n]", " ", s)

    return _COMMENT_OR_STRING.sub(blank, text)


class _Scanner:
    """A cursor over cleaned PTX text that reads statements and balanced blocks."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self._newlines = [m.start() for m in re.finditer("\n", text)]

    def line(self, offset: int | None = None) -> int:
        return bisect.bisect_right(self._newlines, self.pos if offset is None else offset - 1) + 1

    def skip_space(self) -> bool:
        m = _SPACE.match(self.text, self.pos)
        if m:
            self.pos = m.end()
        return self.pos < len(self.text)

    def until(self, stops: str, *, nest: bool) -> tuple[str, str]:
        """Text up to the first character of ``stops`` outside strings (and outside brackets,
        parentheses and braces when ``nest``), and that character ('' at the end of text)."""
        i, text = self.pos, self.text
        if stops in (";", ";}") and nest:  # a statement with no string, scope or vector in it
            end = text.find(";", i)
            if end >= 0 and not any(c in text[i:end] for c in '"{}'):
                self.pos = end + 1
                return text[i:end], ";"
        depth = 0
        while i < len(text):
            c = text[i]
            if c == '"':
                end = text.find('"', i + 1)
                i = len(text) if end < 0 else end + 1
                continue
            if nest and c in "([{":
                if depth == 0 and c in stops:
                    break
                depth += 1
            elif nest and c in ")]}" and depth > 0:
                depth -= 1
            elif depth == 0 and c in stops:
                break
            i += 1
        chunk, stop = text[self.pos : i], text[i : i + 1]
        self.pos = i + 1 if stop else i
        return chunk, stop

    def balanced_block(self) -> str:
        """From a '{' at the cursor to its matching '}' (both included)."""
        start = self.pos
        if self.text[start : start + 1] != "{":
            raise PtxError(self.line(), "expected '{'")
        self.pos += 1
        self.until("}", nest=True)
        return self.text[start : self.pos]


def _instruction(text: str, line: int) -> Statement:
    guard = ""
    m = _GUARD.match(text)
    if m:
        guard = f"@{m.group(1)}{m.group(2)}"
        text = text[m.end() :]
    parts = text.split(None, 1)
    if not parts:
        raise PtxError(line, "a guard with no instruction")
    operands = tuple(o.strip() for o in _split_operands(parts[1])) if len(parts) > 1 else ()
    whole = f"{guard} {text}" if guard else text
    return Statement(Kind.INSTRUCTION, whole, line, guard=guard, opcode=parts[0], operands=operands)


def _split_operands(text: str) -> list[str]:
    if "{" not in text and "(" not in text:  # addresses in [ ] hold no comma
        return [o for o in text.split(",") if o.strip()]
    out, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [o for o in out if o.strip()]


def _body(scanner: _Scanner, name: str, opened: int) -> list[Statement]:
    """Statements from after a function's '{' to its matching '}' (consumed)."""
    body: list[Statement] = []
    depth = 0
    while scanner.skip_space():
        line, c = scanner.line(), scanner.text[scanner.pos]
        if c == "{":
            scanner.pos += 1
            depth += 1
            body.append(Statement(Kind.OPEN, "{", line))
            continue
        if c == "}":
            scanner.pos += 1
            if depth == 0:
                return body
            depth -= 1
            body.append(Statement(Kind.CLOSE, "}", line))
            continue
        m = _LINE_DIRECTIVE.match(scanner.text, scanner.pos)
        if m:
            scanner.pos = m.end()
            kind = Kind.LOC if m.group(1) == "loc" else Kind.DIRECTIVE
            body.append(Statement(kind, m.group(0).strip(), line, opcode="." + m.group(1)))
            continue
        label = ""
        m = _LABEL.match(scanner.text, scanner.pos)
        if m:
            scanner.pos = m.end()
            scanner.skip_space()
            if not _LABELLED_DIRECTIVE.match(scanner.text, scanner.pos):
                body.append(Statement(Kind.LABEL, m.group(1) + ":", line, label=m.group(1)))
                continue
            label = m.group(1)  # a labelled directive: `$t: .branchtargets L1, L2;`
        chunk, stop = scanner.until(";}", nest=True)
        if stop != ";":
            raise PtxError(line, f"statement not ended by ';': {chunk.strip()[:60]!r}")
        text = " ".join(chunk.split())
        if text.startswith("."):
            parts = text.split(None, 1)
            operands = tuple(o.strip() for o in _split_operands(parts[1])) if len(parts) > 1 else ()
            body.append(
                Statement(
                    Kind.DIRECTIVE, text, line, label=label, opcode=parts[0], operands=operands
                )
            )
        else:
            body.append(_instruction(text, line))
    raise PtxError(opened, f"the body of {name!r} is not closed by '}}'")


def _function(scanner: _Scanner, start: int, head: str, line: int) -> PtxFunction:
    m = _FUNCTION_NAME.search(head)
    if not m:
        raise PtxError(line, f"cannot find the function's name in {head.strip()[:60]!r}")
    is_entry = ".entry" in head.split(m.group(1), 1)[0]
    params_text = head[m.end() :]
    params = tuple(p.group(1) for p in _PARAM_NAME.finditer(params_text))
    body = _body(scanner, m.group(1), line)
    return PtxFunction(m.group(1), is_entry, head, params, tuple(body), start, scanner.pos, line)


def _debug_strings(block: str) -> dict[str, str]:
    """Labels of a ``.debug_str`` section and the NUL-ended text of the bytes after each."""
    out: dict[str, str] = {}
    pieces = re.split(rf"({_IDENT})\s*:", block)
    for name, data in zip(pieces[1::2], pieces[2::2], strict=True):
        raw = bytes(int(b) & 0xFF for b in re.findall(r"\b\d+\b", data.replace(".b8", " ")))
        out[name] = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
    return out


def parse(text: str) -> PtxModule:
    """Parse PTX ``text``: every function with a body, the file table and the debug strings."""
    scanner = _Scanner(clean(text))
    version = target = ""
    functions: list[PtxFunction] = []
    files: dict[int, str] = {}
    strings: dict[str, str] = {}
    while scanner.skip_space():
        start, line = scanner.pos, scanner.line()
        m = _LINE_DIRECTIVE.match(scanner.text, start)
        if m:
            scanner.pos = m.end()
            f = re.match(r'\.file\s+(\d+)\s+"((?:[^"\\]|\\.)*)"', m.group(0))
            if f:
                files[int(f.group(1))] = f.group(2)
            continue
        m = _MODULE_DIRECTIVE.match(scanner.text, start)
        if m:
            scanner.pos = m.end()
            value = " ".join(m.group(2).split())
            if m.group(1) == "version":
                version = value
            elif m.group(1) == "target":
                target = value
            continue
        if scanner.text.startswith(".section", start):
            name, _ = scanner.until("{", nest=False)
            scanner.pos -= 1
            block = scanner.balanced_block()
            if name.split()[-1:] == [".debug_str"]:
                strings.update(_debug_strings(block[1:-1]))
            continue
        if _FUNCTION_HEAD.match(scanner.text, start):
            head, stop = scanner.until("{;", nest=True)
            if stop == "{":
                functions.append(_function(scanner, start, head, line))
            continue
        chunk, stop = scanner.until(";", nest=True)
        if not stop and chunk.strip():
            raise PtxError(line, f"statement not ended by ';': {chunk.strip()[:60]!r}")
    if not version:
        raise PtxError(0, "no .version directive: this is not PTX")
    return PtxModule(text, version, target, tuple(functions), files, strings)
