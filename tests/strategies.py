"""Hypothesis strategies for schemas: random valid ones, with the facts needed to check them, and
random invalid ones, made by mutating valid text.

`valid_schemas()` draws layouts with every dtype, array shapes, scalars and every alignment (or none),
members grouped into statements in any order, doc comments of any text, and models whose blocks are
random runs of adjacent alike members in any axis order the language allows (or the default order);
sometimes the layouts are split over two files, the root importing the other. Names are random
identifiers mixed with ones the generated code itself uses (`n`, `self`, `typing`, `pitch_4`, ...).
Texts vary in spacing, line ends (`\\n` or `\\r\\n`), comments and number spellings (`+3`, `03`).

`invalid_schemas()` mutates such text: tokens deleted, duplicated, swapped or replaced with bad dtypes,
bad axes, unicode, control characters, huge numbers, deep nesting; plus empty and degenerate files.

Sizes here are bounded to keep one example cheap: the properties run many of them.
"""

from __future__ import annotations

import keyword
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from soagen.dsl.check import CLASS_BODY_BUILTINS, MODULE_BUILTINS
from soagen.dsl.names import COLLECTION_ATTRIBUTES
from soagen.dsl.parser import keywords
from tests.dsl.test_layout_reference import SIZES, RefMember, adjacent_alike_run, axis_orders

DTYPES = sorted(SIZES)
# Every alignment the checker accepts (powers of two up to 2**20), the largest ones rarer.
ALIGNMENTS = [1 << k for k in range(13)] + [1 << 16, 1 << 20]
SOA_KEYWORDS = frozenset(keywords())
# Valid names that the generated module, its runtime or Python also use somewhere.
TRICKY_NAMES = [
    "n", "c", "self", "cls", "out", "stream", "batch_size", "pitch_4", "stride_8", "pitch_1",
    "typing", "torch", "soagen", "annotations", "TYPE_CHECKING", "ClassVar", "object", "type",
    "match", "case", "print", "len", "exec", "os", "sys", "Tensor", "StridedView", "Collection",
    "ModelBinding", "MemberSpec", "BlockSpec", "BindingSpec", "float32", "bool", "int8",
    "bfloat16", "dep", "schema", "view_x", "x", "X", "a" * 60, "A1", "l_", "O0",
    "check_generated_version", "INPUTS_", "Any", "Optional", "float", "bytes", "super",
]  # fmt: skip


def scaled(ci_examples: int, **options: Any) -> settings:
    """Settings for a property that runs `ci_examples` examples in CI and 40 times more with
    `HYPOTHESIS_PROFILE=long` (the profiles are registered in conftest.py); the rest of the
    settings come from the profile."""
    long = os.environ.get("HYPOTHESIS_PROFILE") == "long"
    return settings(max_examples=ci_examples * 40 if long else ci_examples, **options)


def is_valid_name(name: str, reserved: frozenset[str] = frozenset(), keywords: bool = True) -> bool:
    """What the checker accepts as a name (README: ASCII, not a Python keyword, no leading `_`);
    `keywords=True` also keeps out the .soa keywords, which strategies avoid for readability."""
    return (
        name.isascii()
        and name.isidentifier()
        and not keyword.iskeyword(name)
        and not name.startswith("_")
        and not (keywords and name in SOA_KEYWORDS)
        and name not in reserved
    )


LAYOUT_RESERVED = frozenset(MODULE_BUILTINS)
MEMBER_RESERVED = frozenset(COLLECTION_ATTRIBUTES | CLASS_BODY_BUILTINS)
BINDING_RESERVED: frozenset[str] = frozenset()

IDENTIFIERS = st.one_of(
    st.sampled_from(TRICKY_NAMES),
    st.from_regex(re.compile(r"[A-Za-z][A-Za-z0-9_]{0,12}"), fullmatch=True),
)
# Names of 40 to 120 characters, mixed with the others: most lines holding one need splitting.
LONG_IDENTIFIERS = st.one_of(
    st.from_regex(re.compile(r"[A-Za-z][A-Za-z0-9_]{39,119}"), fullmatch=True), IDENTIFIERS
)

# Doc comment text: anything on one line. A lone `\r` is kept out: the parser reads it as a line end.
HOSTILE_DOCS = [
    '"""; import os; os.system("touch {sentinel}") #',
    "'''; open('{sentinel}', 'w') #",
    '\\"""; raise SystemExit(3) #',
    "\\N{BULLET} \\u2028 \\x00 \\",
    "\\",
    '"',
    "'''",
    '""""""',
    '\x0c"""\x0b',
    '\u2028"""\u2029; import os #',
    "\x00\x01\x1b[31m\x7f",
    "\x85 next line",
    "{{ module_doc }} {% raw %} {# x #}",
    "    indented",
    "trailing backslash \\",
    "#",
    "// not a comment",
    'ends with a quote"',
    "\t\ttabs",
    "\U0001f600 wide \u540d\u524d",
]
DOC_TEXT = st.one_of(
    st.sampled_from(HOSTILE_DOCS),
    st.text(
        alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=["Cs"]),
        max_size=30,
    ),
)


def parsed_doc(lines: list[str]) -> str | None:
    """What the parser keeps of `///` lines: one leading space dropped from each, trailing blanks
    stripped, the lines joined with `\\n`, blank lines at either end dropped."""
    kept = [(line[1:] if line.startswith(" ") else line).rstrip() for line in lines]
    return "\n".join(kept).strip("\n") or None


@dataclass(frozen=True)
class MemberStatement:
    kind: str  # "column", "packed" or "scalar"
    dtype: str
    shape: tuple[int, ...]
    names: tuple[str, ...]
    doc_lines: tuple[str, ...]

    @property
    def doc(self) -> str | None:
        return parsed_doc(list(self.doc_lines))


@dataclass(frozen=True)
class LayoutCase:
    name: str
    align: int | None  # None: no `align` statement (128)
    align_position: int
    statements: tuple[MemberStatement, ...]
    doc_lines: tuple[str, ...]
    file: str  # the file that declares it

    @property
    def alignment(self) -> int:
        return 128 if self.align is None else self.align

    @property
    def members(self) -> list[RefMember]:
        return [
            RefMember(name, s.kind, s.dtype, s.shape) for s in self.statements for name in s.names
        ]

    @property
    def docs(self) -> dict[str, str | None]:
        return {name: s.doc for s in self.statements for name in s.names}

    @property
    def doc(self) -> str | None:
        return parsed_doc(list(self.doc_lines))


@dataclass(frozen=True)
class BindingCase:
    direction: str
    name: str
    layout: str
    members: tuple[str, ...]
    axes: tuple[str, ...] | None
    doc_lines: tuple[str, ...]
    indexes: str | None = None  # `indexes NAME`: on integer inputs, another input of the model
    contiguous: bool = False  # `contiguous`: on inputs
    # `same n as NAME`: on inputs, another input of another layout, as whole as this one.
    same_n_as: str | None = None
    whole: bool = False  # `whole`: on inputs, on every input of its layout in the model or none

    @property
    def doc(self) -> str | None:
        return parsed_doc(list(self.doc_lines))


@dataclass(frozen=True)
class ModelCase:
    name: str
    bindings: tuple[BindingCase, ...]
    doc_lines: tuple[str, ...]

    @property
    def doc(self) -> str | None:
        return parsed_doc(list(self.doc_lines))


@dataclass(frozen=True)
class SchemaCase:
    """A valid schema: the files to write (name -> text), and what they declare."""

    files: dict[str, str]
    root: str  # file name of the root schema
    layouts: tuple[LayoutCase, ...]
    models: tuple[ModelCase, ...]
    module_docs: dict[str, str | None] = field(default_factory=dict)  # module name -> doc

    def layout(self, name: str) -> LayoutCase:
        return next(layout for layout in self.layouts if layout.name == name)


class _Style:
    """Random but valid spellings of the same schema."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.newline = draw(st.sampled_from(["\n", "\n", "\r\n"]))
        self.space = draw(st.sampled_from([" ", " ", "  ", "\t"]))
        self.indent = draw(st.sampled_from(["    ", "", "\t", "  "]))
        self.comments = draw(st.booleans())
        self.draw = draw

    def number(self, value: int) -> str:
        return self.draw(st.sampled_from([str(value), str(value), f"+{value}", f"0{value}"]))

    def comment(self) -> str:
        if not self.comments:
            return ""
        return self.draw(st.sampled_from(["", "", " # note", " // note", " //// four slashes"]))


def _unique(
    draw: st.DrawFn,
    taken: set[str],
    reserved: frozenset[str],
    names: st.SearchStrategy[str] = IDENTIFIERS,
) -> str:
    name = draw(names.filter(lambda s: is_valid_name(s, reserved) and s not in taken))
    taken.add(name)
    return name


def _docs(draw: st.DrawFn, sentinel: str, max_lines: int = 2) -> tuple[str, ...]:
    lines = draw(st.lists(DOC_TEXT, max_size=max_lines))
    # `////` opens a plain comment, not a doc comment: a doc line never starts with `/`.
    return tuple(line.replace("{sentinel}", sentinel).lstrip("/") for line in lines)


@st.composite
def layout_cases(
    draw: st.DrawFn,
    taken: set[str],
    file: str,
    sentinel: str,
    max_statements: int = 5,
    names: st.SearchStrategy[str] = IDENTIFIERS,
    dtypes: list[str] = DTYPES,
    max_rank: int = 3,
) -> LayoutCase:
    name = _unique(draw, taken, LAYOUT_RESERVED, names)
    member_names: set[str] = set()
    statements = []
    for _ in range(draw(st.integers(1, max_statements))):
        kind = draw(st.sampled_from(["column", "column", "packed", "scalar"]))
        dtype = draw(st.sampled_from(dtypes))
        shape: tuple[int, ...] = ()
        if kind == "column":
            shape = tuple(draw(st.lists(st.integers(1, 3), max_size=max_rank)))
        elif kind == "packed":
            shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=max_rank)))
        declared = tuple(
            _unique(draw, member_names, MEMBER_RESERVED, names)
            for _ in range(draw(st.integers(1, 3)))
        )
        statements.append(MemberStatement(kind, dtype, shape, declared, _docs(draw, sentinel, 1)))
    largest = max(SIZES[s.dtype] for s in statements)
    align = draw(st.none() | st.sampled_from([a for a in ALIGNMENTS if a >= largest]))
    position = draw(st.integers(0, len(statements)))
    return LayoutCase(name, align, position, tuple(statements), _docs(draw, sentinel), file)


def _block(
    draw: st.DrawFn, layout: LayoutCase, direction: str
) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """A random run of adjacent members of one kind, dtype and shape, and its axes; outputs take
    columns only (a scalar holds one value per collection, not one per element: SOA309)."""
    kinds = ("column", "packed") if direction == "output" else ("column", "packed", "scalar")
    run = adjacent_alike_run(draw, layout.members, kinds)
    names = tuple(m.name for m in run)
    if draw(st.booleans()):
        return names, None  # default axes
    with_c = len(names) > 1 or draw(st.booleans())
    return names, tuple(draw(st.sampled_from(axis_orders(run[0].shape, with_c))))


def _layout_text(layout: LayoutCase, style: _Style) -> list[str]:
    nl, sp, ind = style.newline, style.space, style.indent
    lines = [f"///{line}" for line in layout.doc_lines]
    lines.append(f"layout{sp}{layout.name}{sp}{{{style.comment()}")
    body = []
    for statement in layout.statements:
        body += [f"{ind}///{line}" for line in statement.doc_lines]
        shape = ""
        if statement.shape:
            shape = "[" + f",{sp}".join(style.number(e) for e in statement.shape) + "]"
        names = f",{sp}".join(statement.names)
        keyword, packed = statement.kind, ""
        if statement.kind == "packed":
            keyword, packed = "column", f"{sp}packed"
        body.append(
            f"{ind}{keyword}{sp}{statement.dtype}{shape}{sp}{names}{packed}{style.comment()}"
        )
    if layout.align is not None:
        # Counted in statements, so the align never splits a statement from its doc comment.
        index = len(body)
        statement_starts = _statement_starts(body)
        if layout.align_position < len(statement_starts):
            index = statement_starts[layout.align_position]
        body.insert(index, f"{ind}align{sp}{style.number(layout.align)}")
    lines += body
    lines.append("}")
    return [line + nl for line in lines] + [nl]


def _statement_starts(body: list[str]) -> list[int]:
    """Index of the first line (doc comment or statement) of each statement."""
    starts = []
    previous_was_doc = False
    for index, line in enumerate(body):
        if not previous_was_doc:
            starts.append(index)
        previous_was_doc = line.lstrip().startswith("///")
    return starts


def _model_text(model: ModelCase, style: _Style) -> list[str]:
    nl, sp, ind = style.newline, style.space, style.indent
    lines = [f"///{line}" for line in model.doc_lines]
    lines.append(f"model{sp}{model.name}{sp}{{")
    for binding in model.bindings:
        lines += [f"{ind}///{line}" for line in binding.doc_lines]
        text = f"{ind}{binding.direction}{sp}{binding.name}{sp}={sp}{binding.layout}"
        text += "{" + f",{sp}".join(binding.members) + "}"
        if binding.axes is not None:
            axes = [a if a in ("n", "c") else style.number(int(a)) for a in binding.axes]
            text += f"{sp}as{sp}[" + f",{sp}".join(axes) + "]"
        if binding.indexes is not None:
            text += f"{sp}indexes{sp}{binding.indexes}"
        if binding.same_n_as is not None:
            text += f"{sp}same{sp}n{sp}as{sp}{binding.same_n_as}"
        if binding.whole:
            text += f"{sp}whole"
        if binding.contiguous:
            text += f"{sp}contiguous"
        lines.append(text + style.comment())
    lines.append("}")
    return [line + nl for line in lines] + [nl]


def _layout_named(layouts: list[LayoutCase], name: str) -> LayoutCase:
    return next(layout for layout in layouts if layout.name == name)


@st.composite
def valid_schemas(
    draw: st.DrawFn,
    sentinel: str = "/nonexistent/soagen-sentinel",
    max_layouts: int = 3,
    max_models: int = 2,
    names: st.SearchStrategy[str] = IDENTIFIERS,
    dtypes: list[str] = DTYPES,
    max_rank: int = 3,
) -> SchemaCase:
    """A valid schema, sometimes over two files (`schema.soa` importing `dep.soa`).

    Hostile doc comments name `sentinel` as the file they would create if their text ran as code.
    `names` draws the names of layouts, members, models and bindings; `dtypes` and `max_rank` bound
    the members' dtypes and array ranks.
    """
    taken: set[str] = set()
    split = draw(st.booleans())
    count = draw(st.integers(2 if split else 1, max_layouts))
    layouts = []
    for index in range(count):
        file = "dep.soa" if split and index < count // 2 + 1 and index < count - 1 else "schema.soa"
        layouts.append(
            draw(layout_cases(taken, file, sentinel, names=names, dtypes=dtypes, max_rank=max_rank))
        )
    binding_names: set[str] = set()
    models = []
    with_columns = [layout for layout in layouts if any(m.kind != "scalar" for m in layout.members)]
    # Every model has an output, and outputs bind columns.
    for _ in range(draw(st.integers(0, max_models if with_columns else 0))):
        name = _unique(draw, taken, LAYOUT_RESERVED, names)
        bindings = []
        local: set[str] = set()
        directions = ["input", "output"]
        directions += draw(st.lists(st.sampled_from(["input", "output"]), max_size=2))
        directions = draw(st.permutations(directions))
        for direction in directions:
            layout = draw(st.sampled_from(with_columns if direction == "output" else layouts))
            members, axes = _block(draw, layout, direction)
            # Binding names are unique over the whole schema: one name, one block per layout.
            binding_name = _unique(draw, binding_names, BINDING_RESERVED, names)
            local.add(binding_name)
            bindings.append(
                BindingCase(
                    direction, binding_name, layout.name, members, axes, _docs(draw, sentinel, 1)
                )
            )
        # Some integer inputs say which other input's elements they number.
        inputs = [b.name for b in bindings if b.direction == "input"]
        for position, binding in enumerate(bindings):
            first = {m.name: m for m in _layout_named(layouts, binding.layout).members}[
                binding.members[0]
            ]
            others = [other for other in inputs if other != binding.name]
            if (
                binding.direction == "input"
                and first.dtype.startswith(("int", "uint"))
                and others
                and draw(st.booleans())
            ):
                bindings[position] = replace(binding, indexes=draw(st.sampled_from(others)))
            if binding.direction == "input" and draw(st.integers(0, 5)) == 0:
                bindings[position] = replace(bindings[position], contiguous=True)
        # Some input layouts are passed whole; some inputs share the size of another layout's.
        input_layouts = sorted({b.layout for b in bindings if b.direction == "input"})
        whole = {layout for layout in input_layouts if draw(st.integers(0, 3)) == 0}
        for position, binding in enumerate(bindings):
            if binding.direction != "input":
                continue
            alike = [
                other.name
                for other in bindings
                if other.direction == "input"
                and other.layout != binding.layout
                and (other.layout in whole) == (binding.layout in whole)
            ]
            shared = draw(st.sampled_from(alike)) if alike and draw(st.booleans()) else None
            bindings[position] = replace(binding, same_n_as=shared, whole=binding.layout in whole)
        models.append(ModelCase(name, tuple(bindings), _docs(draw, sentinel)))
    files: dict[str, str] = {}
    module_docs: dict[str, str | None] = {}
    for file in sorted({layout.file for layout in layouts} | {"schema.soa"}):
        style = _Style(draw)
        parts: list[str] = []
        doc_lines = list(_docs(draw, sentinel))
        module_docs[file.removesuffix(".soa")] = parsed_doc(doc_lines)
        parts += [f"//!{line}{style.newline}" for line in doc_lines]
        if file == "schema.soa" and split:
            parts.append(f'import{style.space}"dep.soa"{style.newline}')
        for layout in layouts:
            if layout.file == file:
                parts += _layout_text(layout, style)
        if file == "schema.soa":
            for model in models:
                parts += _model_text(model, style)
        files[file] = "".join(parts)
    return SchemaCase(files, "schema.soa", tuple(layouts), tuple(models), module_docs)


# --- invalid text ------------------------------------------------------------------------------------

TOKEN = re.compile(r"\w+|[^\w\s]|\s+")
ODD_TOKENS = [
    "{", "}", "[", "]", ",", "=", "as", "n", "c", "m", "k", "-1", "0", "+0", "-3",
    "99999999999999999999999999999999999999", "1" * 5000, "4096", "1048576", "2097152",
    "float", "double", "float33", "int128", "Float32", "uint", "string",
    "\u00e9", "\u540d", "\u0661", "\uff11", "\u2028", "\u2029", "\x00", "\x0c", "\x0b", "\x85",
    "\ufeff", "\u200b", "\t", "\r", "\r\n", '"', '"dep.soa"', '"missing.soa"', '"schema.soa"',
    '"/dev/zero"', '"."', '""', "///", "/// doc", "//!", "//", "#", "/*",
    "import", "layout", "model", "align", "column", "scalar", "input", "output", "indexes",
    "contiguous", "same", "whole",
    "class", "None", "_private", "size", "buffer", "property", "int", "run",
    "{" * 500, "[" * 500, "}" * 50, "layout A {" * 200,
]  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, text: str) -> str:
    """`text` with 1 to 6 token edits."""
    tokens = TOKEN.findall(text) or [""]
    for _ in range(draw(st.integers(1, 6))):
        position = draw(st.integers(0, max(0, len(tokens) - 1)))
        action = draw(st.sampled_from(["delete", "duplicate", "swap", "replace", "insert"]))
        odd = draw(st.sampled_from(ODD_TOKENS) | st.text(max_size=3))
        if action == "delete" and tokens:
            del tokens[position]
        elif action == "duplicate" and tokens:
            tokens.insert(position, tokens[position])
        elif action == "swap" and len(tokens) > 1:
            other = draw(st.integers(0, len(tokens) - 1))
            tokens[position], tokens[other] = tokens[other], tokens[position]
        elif action == "replace" and tokens:
            tokens[position] = odd
        else:
            tokens.insert(position, odd)
    return "".join(tokens)


DEGENERATE = [
    "",
    "\n",
    "\ufeff",
    "   \t\r\n  ",
    "\x00",
    "// only a comment",
    "///",
    "//!",
    "layout",
    "layout A",
    "layout A {",
    "layout A {}",
    "model M {}",
    "}",
    "{" * 10_000,
    "[" * 10_000,
    "layout A { column float32" + "[1" * 2000,
    "layout A {\n    column float32[" + ", ".join(["2"] * 64) + "] x\n}\n",
    "layout A {\n    column float32[65536, 65536] x\n}\n",
    "layout A {\n    align " + "9" * 5000 + "\n    column float32 x\n}\n",
    "layout A {\n    column float32 x\n}\n" * 50,
    'import "schema.soa"\n',
    'import "dep.soa"\nimport "dep.soa"\n',
]


@st.composite
def invalid_schemas(draw: st.DrawFn) -> dict[str, str]:
    """Files (name -> text) that are mostly invalid: a valid schema mutated, or degenerate text.
    A mutation may leave a schema valid; properties over these hold for any input."""
    if draw(st.integers(0, 9)) == 0:
        return {"schema.soa": draw(st.sampled_from(DEGENERATE))}
    case = draw(valid_schemas(max_layouts=2, max_models=1))
    files = dict(case.files)
    target = draw(st.sampled_from(sorted(files)))
    files[target] = draw(mutated(files[target]))
    return files
