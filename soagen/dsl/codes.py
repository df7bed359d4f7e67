"""Every code soagen reports, in one registry: schema errors, lint rules, breaking-change rules.

Each code has one `Code` here (in the spirit of buf's rule engine: an ID, a category, a purpose):

- `error`: what the schema checker refuses (`SOAnnn`); the category is the phase that finds it:
  syntax, files, names, layout, binding, imports;
- `lint`: a rule of `soagen lint`; the category is MINIMAL, BASIC or STANDARD (each holds the ones
  before it, as buf's do);
- `breaking`: a change `soagen breaking` reports; the category is its level, source or memory.

IDs are stable: tools and editors match on them. The code that emits them lives where it runs (the
checks of `soagen.dsl`, `CHECKS` of `soagen.tools.lint`, the comparer of `soagen.tools.breaking`),
keyed by the ID; tests keep those and this table equal, and README's tables equal to
`markdown_table`. `soagen explain`, `soagen lint --list-rules` and shell completion read only this.
Pure Python: imports nothing outside the standard library.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Literal

Kind = Literal["error", "lint", "breaking"]
ERROR: Kind = "error"
LINT: Kind = "lint"
BREAKING: Kind = "breaking"
KINDS: tuple[Kind, ...] = (ERROR, LINT, BREAKING)

# The categories of each kind, in order.
CATEGORIES: dict[Kind, tuple[str, ...]] = {
    ERROR: ("syntax", "files", "names", "layout", "binding", "imports", "cpp", "cmssw"),
    LINT: ("MINIMAL", "BASIC", "STANDARD"),
    BREAKING: ("source", "memory"),
}


def _text(text: str) -> str:
    return textwrap.dedent(text).strip()


@dataclass(frozen=True, slots=True)
class Example:
    """A schema that reports the code and, where one helps, the schema corrected (the tests load
    both: `bad` must report the code, `fixed` must not). `language` says what they are: `.soa`
    schemas, or C++ headers for `soagen import-cmssw` (the SOA6xx codes; their tests import them)."""

    bad: str
    fixed: str | None = None
    language: Literal["soa", "cpp"] = "soa"

    def __post_init__(self) -> None:
        object.__setattr__(self, "bad", _text(self.bad))
        if self.fixed is not None:
            object.__setattr__(self, "fixed", _text(self.fixed))


@dataclass(frozen=True, slots=True)
class Code:
    id: str
    kind: Kind
    category: str
    purpose: str  # one line
    explanation: str  # what it catches, why it matters, how to fix it
    examples: tuple[Example, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "explanation", _text(self.explanation))

    @property
    def heading(self) -> str:
        """The first line `soagen explain` prints."""
        if self.kind == LINT:
            return f"{self.id} ({self.category}): {self.purpose}"
        if self.kind == BREAKING:
            return f"{self.id} (breaking, {self.category} level): {self.purpose}"
        return f"{self.id}: {self.purpose}"

    def text(self) -> str:
        """The explanation followed by the examples: a line `Gives ID:` or `Fixed:`, a blank
        line, then the schema indented by four spaces."""
        parts = [self.explanation]
        for example in self.examples:
            parts.append(f"Gives {self.id}:\n\n{textwrap.indent(example.bad, '    ')}")
            if example.fixed is not None:
                parts.append(f"Fixed:\n\n{textwrap.indent(example.fixed, '    ')}")
        return "\n\n".join(parts)

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "kind": self.kind,
            "category": self.category,
            "purpose": self.purpose,
            "explanation": self.text(),
            "examples": [{"bad": e.bad, "fixed": e.fixed} for e in self.examples],
        }


def _error(id: str, category: str, purpose: str, explanation: str, *examples: Example) -> Code:
    return Code(id, ERROR, category, purpose, explanation, examples)


def _lint(id: str, category: str, purpose: str, explanation: str, *examples: Example) -> Code:
    return Code(id, LINT, category, purpose, explanation, examples)


def _breaking(id: str, level: str, purpose: str, explanation: str) -> Code:
    return Code(id, BREAKING, level, purpose, explanation)


# --- schema errors: what the checker refuses -----------------------------------------------------

_ERRORS = (
    _error(
        "SOA001",
        "syntax",
        "syntax error: the text does not follow the .soa grammar",
        """
        The file does not follow the .soa grammar: a misspelt keyword, a missing `}` or `,`, a
        character the language does not use, or a `///` doc comment with no declaration after
        it. The message says what was found and what the grammar expects there; the hint, where
        there is one, names the keyword that was probably meant. Parsing a file stops at its
        first syntax error, so fix it and run again to see the file's other problems.
        """,
        Example(
            """
            layout Hits { colum float32 x }
            """,
            """
            layout Hits { column float32 x }
            """,
        ),
    ),
    _error(
        "SOA002",
        "files",
        "a file cannot be read",
        """
        A schema file given to soagen cannot be read: it is not a regular file (a FIFO or a
        device), it is not UTF-8 text, or the system refuses to open it (permissions; through
        the Python API `load()`, also a missing file, which the command line reports as a usage
        error instead). Nothing of the file is checked. Fix the permissions or save the file as
        UTF-8 (a byte order mark is accepted). A file reached through `import` reports SOA401.
        """,
    ),
    _error(
        "SOA101",
        "names",
        "unknown dtype",
        """
        A member's dtype is not one soagen knows. The dtypes are `bool`, `int8`, `int16`,
        `int32`, `int64`, `uint8`, `uint16`, `uint32`, `uint64`, `float16`, `bfloat16`,
        `float32` and `float64`; each is the dtype of the member's tensor and fixes its item size
        in the byte layout. C++ spellings (`float`, `double`, `int`, `int32_t`, ...) get a hint
        naming the soagen dtype. Blocks that bind the member are checked once the dtype is fixed.
        """,
        Example(
            """
            layout Hits { column float x }
            """,
            """
            layout Hits { column float32 x }
            """,
        ),
    ),
    _error(
        "SOA102",
        "names",
        "unknown layout",
        """
        A binding names a layout that is declared neither in its file nor in a file that file
        imports (directly or through other imports). Names are case-sensitive. Fix the spelling
        (the hint names a close layout), declare the layout, or import the file that declares it.
        """,
        Example(
            """
            layout Nodes { column float32 x }
            layout Scores { column float32 s }
            model M { input features = Node{x}  output scores = Scores{s} }
            """,
            """
            layout Nodes { column float32 x }
            layout Scores { column float32 s }
            model M { input features = Nodes{x}  output scores = Scores{s} }
            """,
        ),
    ),
    _error(
        "SOA103",
        "names",
        "unknown member in a block",
        """
        A block `Layout{...}` names a member its layout does not declare: a typo, or a member of
        another layout. Fix the name (the hint names the closest member of the layout), or add
        the member to the layout.
        """,
        Example(
            """
            layout Nodes { column float32 x, y }
            layout Scores { column float32 s }
            model M { input features = Nodes{x, yy}  output scores = Scores{s} }
            """,
            """
            layout Nodes { column float32 x, y }
            layout Scores { column float32 s }
            model M { input features = Nodes{x, y}  output scores = Scores{s} }
            """,
        ),
    ),
    _error(
        "SOA104",
        "names",
        "duplicate layout or model name",
        """
        Two layouts or models of one file have the same name. Layouts and models share one
        namespace: each becomes a class of the generated module, named as declared. Rename one
        of them. The same name declared in two different files is SOA403.
        """,
        Example(
            """
            layout Hits { column float32 x }
            layout Hits { column float32 y }
            """,
            """
            layout Hits { column float32 x }
            layout Clusters { column float32 y }
            """,
        ),
    ),
    _error(
        "SOA105",
        "names",
        "duplicate member name in a layout",
        """
        A layout declares one member name twice, as two columns or as a column and a scalar.
        Each member becomes a property of the generated class and a key of `MEMBERS` and
        `offsets(n)`, so member names are unique within a layout. Rename or remove one of them.
        """,
        Example(
            """
            layout Hits { column float32 x, y  scalar float32 x }
            """,
            """
            layout Hits { column float32 x, y  scalar float32 x0 }
            """,
        ),
    ),
    _error(
        "SOA106",
        "names",
        "duplicate binding name in a model",
        """
        A model declares two bindings of one name, say an input and an output. A binding's name
        identifies its tensor in the model's `INPUTS` and `OUTPUTS`, in the mapping the generated
        `__call__` passes to `run`, and in the layout's `BLOCKS`, so binding names are unique
        within a model. Rename one of them.
        """,
        Example(
            """
            layout Nodes { column float32 x }
            layout Scores { column float32 s }
            model M { input features = Nodes{x}  output features = Scores{s} }
            """,
            """
            layout Nodes { column float32 x }
            layout Scores { column float32 s }
            model M { input features = Nodes{x}  output scores = Scores{s} }
            """,
        ),
    ),
    _error(
        "SOA107",
        "names",
        "a name is reserved: a Python keyword, or a member of the generated class",
        """
        A name cannot be used in the generated Python: it is not ASCII, it starts with `_`
        (reserved for the generated code), it is a Python keyword (`class`, `lambda`, `None`, ...;
        soft keywords such as `type` and `match` are allowed), or, for a member, an attribute every
        generated layout class already has: `size`, `buffer`, `allocate`, `view`, ... (the list
        is in soagen/dsl/names.py). Rename it.
        """,
        Example(
            """
            layout Tracks { column int32 size }
            """,
            """
            layout Tracks { column int32 n_hits }
            """,
        ),
    ),
    _error(
        "SOA108",
        "names",
        "a name would collide with another generated name",
        """
        A name would collide with one the generated module itself uses. A layout or model named
        `annotations`, `dict`, `int`, `property`, `staticmethod`, `str` or `tuple` would hide that
        builtin in the whole module, and a member named `property` or `staticmethod` the decorator
        in its class. A file whose name cannot be a Python module name (`my-schema.soa`, `2d.soa`,
        `class.soa`) gets it too: the generated module is named after the file. Rename the
        declaration, or the file (letters, digits and `_`, not starting with a digit).
        """,
        Example(
            """
            layout Cells { column uint8 property }
            """,
            """
            layout Cells { column uint8 quality }
            """,
        ),
    ),
    _error(
        "SOA109",
        "names",
        "a layout declares `align` more than once",
        """
        A layout has more than one `align` statement. One alignment holds for the whole layout
        (it pads every member), and picking either statement silently could give a byte layout
        other than the C++ producer's. Keep one `align`.
        """,
        Example(
            """
            layout Hits { align 128  column float32 x  align 64 }
            """,
            """
            layout Hits { align 128  column float32 x }
            """,
        ),
    ),
    _error(
        "SOA110",
        "names",
        "a layout or model is empty",
        """
        A layout has no members, or a model has no input or no output. An empty layout describes
        no data, and a model's generated `__call__` takes its input collections and writes into
        its output collections, so it needs at least one of each. Add the missing members or
        bindings, or remove the declaration.
        """,
        Example(
            """
            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x} }
            """,
            """
            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x}  output scores = Nodes{y} }
            """,
        ),
    ),
    _error(
        "SOA201",
        "layout",
        "alignment is not a power of two",
        """
        A layout's `align` is not a power of two (or is zero or negative). As in CMSSW's
        GENERATE_SOA_LAYOUT, every member starts at a multiple of the alignment and its pitch is
        rounded up to one, and alignments there are powers of two (128 by default, as in soagen).
        Write the power of two the C++ producer uses, so that the byte layouts agree.
        """,
        Example(
            """
            layout Hits { align 100  column float32 x }
            """,
            """
            layout Hits { align 128  column float32 x }
            """,
        ),
    ),
    _error(
        "SOA202",
        "layout",
        "alignment is smaller than the largest item",
        """
        A layout's `align` is smaller than the item size of one of its dtypes, e.g. `align 4`
        with a float64 member: members would start at addresses not aligned for their own dtype,
        and so would the tensor views of them. Use at least the largest item size (the hint
        gives it). The item size is the dtype's, whatever the shape of an array column.
        """,
        Example(
            """
            layout Hits { align 4  column float64 energy }
            """,
            """
            layout Hits { align 8  column float64 energy }
            """,
        ),
    ),
    _error(
        "SOA203",
        "layout",
        "array shape has a zero or negative extent",
        """
        An array column has an extent of zero or less (`float32[0]`, `float32[3, -1]`), or a
        scalar has an array shape. Each element of an array column holds prod(shape) values, so
        every extent is at least 1. A scalar holds exactly one value per collection; for several
        values per element declare an array column.
        """,
        Example(
            """
            layout Tracks { column float32[0] covariance }
            """,
            """
            layout Tracks { column float32[5, 5] covariance }
            """,
        ),
    ),
    _error(
        "SOA204",
        "layout",
        "a number is too large",
        """
        A number is too large to be meant: a literal of more than 30 digits, an `align` above
        1048576 (2**20) bytes, or an array column of more than 16777216 (2**24) values per
        element. The generated arithmetic would still work, but such a schema is almost always a
        typo, and its buffers would be huge. Fix the number.
        """,
        Example(
            """
            layout Images { column float32[4096, 8192] pixels }
            """,
            """
            layout Images { column float32[64, 64] pixels }
            """,
        ),
    ),
    _error(
        "SOA205",
        "layout",
        "a packed column has no array shape",
        """
        `packed` after a column statement stores each element's array values together in one
        padded column (CMSSW's `SOA_COLUMN(edm::StdArray<T, N>, name)`), so the column needs an
        array shape: `column uint16[10] adc packed`. A plain column holds one value per element
        and has nothing to pack: drop `packed`, or give the column its shape.
        """,
        Example(
            """
            layout Digis { column uint16 adc packed }
            """,
            """
            layout Digis { column uint16[10] adc packed }
            """,
        ),
    ),
    _error(
        "SOA301",
        "binding",
        "a block mixes dtypes",
        """
        The members of a block have different dtypes. A block is passed to the model as one
        tensor, a strided view of the buffer, and one tensor has one dtype, so it cannot span a
        float32 and an int32 column. Bind such columns as separate inputs, one block per dtype.
        """,
        Example(
            """
            layout Nodes { column float32 x, y  column int32 id }
            model M { input features = Nodes{x, y, id}  output scores = Nodes{x} }
            """,
            """
            layout Nodes { column float32 x, y  column int32 id }
            model M {
                input features = Nodes{x, y}
                input ids = Nodes{id}
                output scores = Nodes{x}
            }
            """,
        ),
    ),
    _error(
        "SOA302",
        "binding",
        "a block mixes array shapes",
        """
        The members of a block share a dtype but not an array shape (`float32 x` and
        `float32[3] v`, or `float32[3]` and `float32[4]`). A block is one strided view with one
        shape per element, and an array column's values are spread over several padded rows of
        the buffer, unlike a plain column's, so the two cannot form one tensor. Bind them as
        separate inputs.
        """,
        Example(
            """
            layout Tracks { column float32 pt  column float32[3] momentum }
            model M { input features = Tracks{pt, momentum}  output scores = Tracks{pt} }
            """,
            """
            layout Tracks { column float32 pt  column float32[3] momentum }
            model M {
                input pt = Tracks{pt}
                input momentum = Tracks{momentum}
                output scores = Tracks{pt}
            }
            """,
        ),
    ),
    _error(
        "SOA303",
        "binding",
        "the columns of a block are not adjacent in memory",
        """
        The columns of a block are not adjacent: the layout declares other members between them.
        A block reaches the model as one `as_strided` view of the buffer without a copy; columns
        of one dtype lie one pitch apart, so they form one [n, c] tensor only when nothing lies
        between them. Reorder the layout so the block's columns are adjacent, or bind them as
        separate inputs. Reordering changes the byte layout: change the C++ GENERATE_SOA_LAYOUT
        the same way (`soagen breaking` reports the moved offsets).
        """,
        Example(
            """
            layout Nodes { column float32 x  column int32 id  column float32 y }
            model M { input features = Nodes{x, y}  output scores = Nodes{x} }
            """,
            """
            layout Nodes { column float32 x, y  column int32 id }
            model M { input features = Nodes{x, y}  output scores = Nodes{x} }
            """,
        ),
    ),
    _error(
        "SOA304",
        "binding",
        "the columns of a block are not in declaration order",
        """
        A block lists adjacent columns in another order than the layout declares them
        (`Nodes{y, x}` where `x` comes first). The strided view walks the columns in buffer
        order, so the `c` axis of the tensor follows declaration order; any other order would
        need a copy. Write the members in declaration order, or reorder the layout's columns (a
        change of byte layout) if the model needs another order.
        """,
        Example(
            """
            layout Nodes { column float32 x, y }
            model M { input features = Nodes{y, x}  output scores = Nodes{x} }
            """,
            """
            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x, y}  output scores = Nodes{x} }
            """,
        ),
    ),
    _error(
        "SOA305",
        "binding",
        "a block names a member twice",
        """
        A block names one member twice (`Nodes{x, x}`). A view of the buffer sees each column
        once, so it cannot hold one twice without a copy. Name each member once, and repeat
        the values inside the model if it needs them twice.
        """,
        Example(
            """
            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x, x}  output scores = Nodes{y} }
            """,
            """
            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x}  output scores = Nodes{y} }
            """,
        ),
    ),
    _error(
        "SOA306",
        "binding",
        "a block mixes member kinds: columns, packed columns, scalars",
        """
        A block mixes columns and scalars, or packed and unpacked array columns. A column holds
        n values and its view steps through them; a scalar holds one value per collection in
        its own padded slot, and its view broadcasts that value over n (stride 0). A packed
        column keeps each element's values together, an array column each coefficient in a
        column of its own. No one strided view steps over two kinds: bind them separately.
        """,
        Example(
            """
            layout Hits { column float32 x  scalar float32 bfield }
            model M { input features = Hits{x, bfield}  output scores = Hits{x} }
            """,
            """
            layout Hits { column float32 x  scalar float32 bfield }
            model M {
                input features = Hits{x}
                input bfield = Hits{bfield}
                output scores = Hits{x}
            }
            """,
        ),
    ),
    _error(
        "SOA307",
        "binding",
        "the axis list does not match the block",
        """
        The `as [...]` axis list does not describe the block. Its axes are `n` (the elements,
        required), `c` (the block's members, required when there are several) and the array
        extents written as their sizes in declared order (`as [n, 20, 100]` for
        `float32[20, 100]`); `n` and `c` appear once each, in any order (`as [c, n]` transposes
        the view). Fix the list, or leave out `as [...]` for the default `[n, c, extents...]`.
        """,
        Example(
            """
            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x, y} as [n]  output scores = Nodes{x} }
            """,
            """
            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x, y} as [n, c]  output scores = Nodes{x} }
            """,
        ),
    ),
    _error(
        "SOA308",
        "binding",
        "two models declare different blocks under one name on the same layout",
        """
        Two models of one file bind one name to different blocks of the same layout (other
        members or other axes). The generated layout class lists the blocks of the file's models
        in `BLOCKS`, keyed by binding name, so a name means one block per layout. Rename one of
        the bindings, or let both bind the same block (for several members, `as [n, c]` and no
        `as` are the same block).
        """,
        Example(
            """
            layout Nodes { column float32 x, y }
            model A { input features = Nodes{x, y}  output scores = Nodes{x} }
            model B { input features = Nodes{x}  output y = Nodes{y} }
            """,
            """
            layout Nodes { column float32 x, y }
            model A { input features = Nodes{x, y}  output scores = Nodes{x} }
            model B { input x = Nodes{x}  output y = Nodes{y} }
            """,
        ),
    ),
    _error(
        "SOA309",
        "binding",
        "an output block holds scalars, which cannot take one value per element",
        """
        An output binds scalars. The model writes one value per element into an output, but a
        scalar holds one value per collection (its view has stride 0 along n), so every
        element's result would land on that one value. Declare the output members as columns;
        scalars can only be inputs.
        """,
        Example(
            """
            layout Hits { column float32 x  scalar float32 score }
            model M { input features = Hits{x}  output scores = Hits{score} }
            """,
            """
            layout Hits { column float32 x, score }
            model M { input features = Hits{x}  output scores = Hits{score} }
            """,
        ),
    ),
    _error(
        "SOA310",
        "binding",
        "an `indexes` clause does not name another input, or is not on an integer input",
        """
        `indexes NAME` says that every value of an integer input is an element number of the
        input NAME of the same model (an edge list's node numbers, say): soagen checks that each
        value lies in [0, number of elements of NAME) before every call, because a compiled
        (AOTInductor) model aborts the whole process on an index out of range, and a negative
        one can silently read from the end. So the clause must be on an input, hold integers, and
        name another input of the model.
        """,
        Example(
            """
            layout Nodes { column float32 x, y }
            layout Edges { column int64 src, dst }
            model M {
                input nodes = Nodes{x, y}
                input edges = Edges{src, dst} indexes node
                output scores = Nodes{x}
            }
            """,
            """
            layout Nodes { column float32 x, y }
            layout Edges { column int64 src, dst }
            model M {
                input nodes = Nodes{x, y}
                input edges = Edges{src, dst} indexes nodes
                output scores = Nodes{x}
            }
            """,
        ),
    ),
    _error(
        "SOA311",
        "binding",
        "a `contiguous` clause stands on an output",
        """
        `contiguous` on an input hands the model one row-major (device-local) copy of the block
        per call instead of the strided view of its columns: for models whose own operations on
        the column-major `[n, c]` view (row gathers, a `torch.cat` with row-major tensors) cost
        more than the copy. Outputs are always written into their columns, so the clause has no
        meaning there.
        """,
        Example(
            """
            layout Hits { column float32 x, y }
            model M {
                input points = Hits{x, y} as [n, c]
                output scores = Hits{x} contiguous
            }
            """,
            """
            layout Hits { column float32 x, y }
            model M {
                input points = Hits{x, y} as [n, c] contiguous
                output scores = Hits{x}
            }
            """,
        ),
    ),
    _error(
        "SOA312",
        "binding",
        "a `same n as` clause stands on an output, or names no input of another layout",
        """
        `same n as NAME` on an input says that its collection holds as many elements as the
        collection of input NAME (a mask made for a particle collection, say): soagen checks the
        two sizes before every call, and `soagen compile` exports one size for both. So the
        clause must be on an input and name another input of the model, one that binds another
        layout: inputs of one layout come from one collection and share its size already.
        """,
        Example(
            """
            layout Particles { column float32 pt, eta }
            layout Masks { column bool mask }
            model M {
                input features = Particles{pt, eta}
                input mask = Masks{mask} same n as feature
                output scores = Particles{pt}
            }
            """,
            """
            layout Particles { column float32 pt, eta }
            layout Masks { column bool mask }
            model M {
                input features = Particles{pt, eta}
                input mask = Masks{mask} same n as features
                output scores = Particles{pt}
            }
            """,
        ),
    ),
    _error(
        "SOA313",
        "binding",
        "a `whole` clause stands on an output, or inputs disagree on `whole`",
        """
        `whole` on an input makes a `batch_size` call pass its collection entire to every slice
        instead of slicing it (the nodes an edge list indexes, say). Outputs are always sliced
        with the call, so they take no `whole`. Inputs of one layout in a model are one
        collection, sliced or not, so they all say `whole` or none does; and two inputs tied by
        `same n as` are both whole or both sliced, or a slice of one would no longer match the
        other.
        """,
        Example(
            """
            layout Nodes { column float32 x, y }
            layout Masks { column bool mask }
            layout Edges { column int64 src, dst }
            layout Scores { column float32 score }
            model M {
                input nodes = Nodes{x, y} whole
                input mask = Masks{mask} same n as nodes
                input edges = Edges{src, dst} as [c, n] indexes nodes
                output scores = Scores{score}
            }
            """,
            """
            layout Nodes { column float32 x, y }
            layout Masks { column bool mask }
            layout Edges { column int64 src, dst }
            layout Scores { column float32 score }
            model M {
                input nodes = Nodes{x, y} whole
                input mask = Masks{mask} same n as nodes whole
                input edges = Edges{src, dst} as [c, n] indexes nodes
                output scores = Scores{score}
            }
            """,
        ),
    ),
    _error(
        "SOA401",
        "imports",
        "an imported file does not exist",
        """
        An `import` names a file that cannot be read: it does not exist, it is not a regular
        file, it is not UTF-8 text, or the path is empty or holds a NUL character. Import paths
        are relative to the importing file, not to the working directory. Fix the path or create
        the file; `import "../common/tracks.soa"` reaches a sibling folder.
        """,
        Example(
            """
            import "no_such_file.soa"
            """,
        ),
    ),
    _error(
        "SOA402",
        "imports",
        "imports form a cycle",
        """
        Imports form a cycle: `a.soa` imports `b.soa`, which imports `a.soa` (or a file imports
        itself). Each file's module imports the modules of the files it imports, which must exist
        first, so a cycle cannot be generated. Move the layouts both files need into a third
        file that both import, and remove the import that closes the cycle.
        """,
    ),
    _error(
        "SOA403",
        "imports",
        "a name is declared in two files",
        """
        Two files of one schema (a file and every file it imports, directly or not) declare the
        same layout or model name, or would generate modules of one name (`tracks/common.soa`
        and `vertices/common.soa` both give `common`). Generated modules import each other's
        classes by name, so names are unique across the files of a schema. Rename one of the
        declarations or files.
        """,
    ),
    _error(
        "SOA501",
        "cpp",
        "a dtype that a CMSSW column cannot hold in C++",
        """
        Reported by `soagen generate --lang cpp` and `soagen check --lang cpp` only: standard
        C++ (C++20) has no half-precision or bfloat16 type, so a `float16` or `bfloat16` member
        has no type to declare in `GENERATE_SOA_LAYOUT`. Use `float32`, or keep the raw 16 bits
        in a `uint16` member and convert where the values are read. Python output is unaffected.
        """,
        Example(
            """
            layout Hits {
                column float16 energy
            }
            """,
            """
            layout Hits {
                column float32 energy
            }
            """,
        ),
    ),
    _error(
        "SOA502",
        "cpp",
        "an array column of rank above 2, which C++ columns cannot hold",
        """
        Reported by `--lang cpp` only: an array column becomes an Eigen matrix column
        (`SOA_EIGEN_COLUMN`) and a packed one an `edm::StdArray` of `edm::StdArray`s, both of at
        most two extents. Flatten the extents after the first into one (`[3, 2, 2]` becomes
        `[3, 4]`), and index it as the product in C++. Python output is unaffected.
        """,
        Example(
            """
            layout Jets {
                column float32[3, 2, 2] hessian
            }
            """,
            """
            layout Jets {
                column float32[3, 4] hessian
            }
            """,
        ),
    ),
    _error(
        "SOA503",
        "cpp",
        "a name that C++ reserves, or two names that give one C++ name",
        """
        Reported by `--lang cpp` only: a member named with a C++20 keyword or alternative token
        (`class`, `new`, `int`, `bitand`), or a name whose C++ identifiers C++ reserves: a
        double underscore anywhere, or a member ending in `_` (CMSSW's macros declare its field
        `NAME_`, so `x_` gives `x__`). Also two declarations that give one C++ name: layout
        `Hits` and layout `HitsSoA` both give the alias `HitsSoA`. Rename the member or layout.
        """,
        Example(
            """
            layout Hits {
                column bool new
            }
            """,
            """
            layout Hits {
                column bool is_new
            }
            """,
        ),
    ),
)

_CMSSW_ERRORS = (
    _error(
        "SOA601",
        "cmssw",
        "a C++ type in a CMSSW header cannot be resolved",
        """
        `soagen import-cmssw` found a member type that is neither a C++ arithmetic type, an
        enum, an Eigen matrix, `edm::StdArray` nor an alias of one of these in the header or the
        headers it includes. Usually the header declaring it was not found: pass the folder its
        `#include` is relative to with `-I` (`-I $CMSSW_BASE/src`). Or map the name yourself:
        `--type NAME=int32`, or `--type NAME=uint8[24]` for a struct of 24 bytes.
        """,
        Example(
            """
            #include "DataFormats/Hypothetical/interface/Types.h"  // not found
            GENERATE_SOA_LAYOUT(HitLayout, SOA_COLUMN(HitFlags, flags))
            """,
            """
            #include <cstdint>
            using HitFlags = uint16_t;
            GENERATE_SOA_LAYOUT(HitLayout, SOA_COLUMN(HitFlags, flags))
            """,
            language="cpp",
        ),
    ),
    _error(
        "SOA602",
        "cmssw",
        "an integer constant in a CMSSW header cannot be resolved",
        """
        An array extent (`edm::StdArray<float, N>`, `Eigen::Matrix<float, N, 1>`) or an
        alignment names a constant that `soagen import-cmssw` cannot evaluate: it is declared in
        a header that was not found, depends on a template parameter, or is not an integer
        expression it reads (literals, names, arithmetic, shifts, casts). Pass the folder of its
        header with `-I`, or give the value: `--define N=10`.
        """,
        Example(
            """
            #include "DataFormats/Common/interface/StdArray.h"
            GENERATE_SOA_LAYOUT(DigiLayout, SOA_COLUMN(edm::StdArray<uint16_t, kSamples>, adc))
            """,
            """
            #include "DataFormats/Common/interface/StdArray.h"
            constexpr int kSamples = 10;
            GENERATE_SOA_LAYOUT(DigiLayout, SOA_COLUMN(edm::StdArray<uint16_t, kSamples>, adc))
            """,
            language="cpp",
        ),
    ),
    _error(
        "SOA603",
        "cmssw",
        "a CMSSW layout uses a construct soagen cannot represent",
        """
        A member soagen has no equivalent for: a column or scalar of a struct or class, an
        Eigen matrix of dynamic size, an `edm::StdArray` of more than two dimensions, a scalar
        of an array type, an Eigen type outside SOA_EIGEN_COLUMN (or a non-Eigen one in it), or
        a macro argument that is not a member. A struct whose bytes the Python side only
        carries can be mapped to a packed column of its bytes, with the same byte layout:
        `--type NAME=uint8[SIZE]`, SIZE being `sizeof(NAME)` in C++.
        """,
        Example(
            """
            struct Cluster { float energy; int size; };
            GENERATE_SOA_LAYOUT(ClusterLayout, SOA_COLUMN(Cluster, cluster))
            """,
            """
            GENERATE_SOA_LAYOUT(ClusterLayout, SOA_COLUMN(float, energy), SOA_COLUMN(int, hits))
            """,
            language="cpp",
        ),
    ),
    _error(
        "SOA604",
        "cmssw",
        "a header given to import-cmssw declares no (such) layout",
        """
        The header holds no `GENERATE_SOA_LAYOUT` call, or none of the name `--layout` asks for
        (a layout is named by its C++ class, `PFRecHitSoALayout`, or its schema name,
        `PFRecHitSoA`). Only the headers named on the command line are imported; the headers
        they include are read for their types and constants. Name the header that declares the
        layout.
        """,
        Example(
            """
            #include <cstdint>
            using HitFlags = uint16_t;
            """,
            language="cpp",
        ),
    ),
)

# --- lint rules: `soagen lint`, checks in soagen/tools/lint.py -----------------------------------

_LINT = (
    _lint(
        "SCALAR_BETWEEN_COLUMNS",
        "MINIMAL",
        "scalars do not sit between columns of one dtype and shape",
        """
        Catches a run of scalars declared between two columns of the same dtype and shape. A
        block is zero-copy only when its columns are adjacent, so a scalar between two columns
        of the same type keeps them from ever being bound as one tensor, and costs a full
        aligned pitch in the middle of the collection. CMSSW layouts keep scalars at either
        end. Move the scalars before or after the columns (a memory change for existing
        buffers: see `soagen breaking`).
        """,
        Example(
            """
            layout Hits { column float32 x  scalar float32 bfield  column float32 y }
            """,
            """
            layout Hits { column float32 x, y  scalar float32 bfield }
            """,
        ),
    ),
    _lint(
        "COLUMNS_GROUPED_BY_TYPE",
        "MINIMAL",
        "columns of one dtype and shape are declared together",
        """
        Catches a column separated from the earlier columns of its dtype and shape by columns
        of another type. Any run of adjacent columns of one dtype and shape can be bound as one
        zero-copy block; a column of another type in the middle of such a group splits it for
        good: a model that wants all of them needs a copy, or a reordered (and so incompatible)
        layout later. Declare the column right after the others of its type.
        """,
        Example(
            """
            layout Hits { column float32 x  column int32 id  column float32 y }
            """,
            """
            layout Hits { column float32 x, y  column int32 id }
            """,
        ),
    ),
    _lint(
        "ALIGN_CACHE_LINE",
        "BASIC",
        "every layout is aligned to at least the target's cache line (`cache-line`, default 128)",
        """
        Catches a layout whose `align` is below the cache line (`cache-line` in
        [tool.soagen.lint], 128 bytes by default). Columns start at multiples of the alignment.
        Below the cache line, the end of one column and the start of the next share a line, so
        threads writing neighbouring columns contend and GPU loads of a column split into more
        transactions. 128 is CMSSW's default: raise the `align`, or set `cache-line = 64` for
        CPU-only data.
        """,
        Example(
            """
            layout Hits { align 64  column float32 x }
            """,
            """
            layout Hits { align 128  column float32 x }
            """,
        ),
    ),
    _lint(
        "INTEGER_INPUT_INDEXES",
        "BASIC",
        "integer inputs say which input's elements they number (`indexes NAME`)",
        """
        Catches an integer input without `indexes NAME`. Such an input is most often an index
        into another input: an edge list's node numbers. With `indexes NAME`, every call checks
        each value against NAME's element count first. Without it, a value out of range aborts
        the whole process inside a compiled (AOTInductor) model, under `soagen serve` the server
        and every client's events with it, and a negative value can silently read from the end
        (Inductor's kernels, `x[index]`). Write `indexes NAME` after the block, or ignore the
        rule for integer inputs whose values are not element numbers of another input (counts,
        or rows of an embedding table inside the model).
        """,
        Example(
            """
            layout Nodes { column float32 x, y }
            layout Edges { column int64 src, dst }
            model M {
                input nodes = Nodes{x, y}
                input edges = Edges{src, dst}
                output scores = Nodes{x}
            }
            """,
            """
            layout Nodes { column float32 x, y }
            layout Edges { column int64 src, dst }
            model M {
                input nodes = Nodes{x, y}
                input edges = Edges{src, dst} indexes nodes
                output scores = Nodes{x}
            }
            """,
        ),
    ),
    _lint(
        "LAYOUT_PASCAL_CASE",
        "BASIC",
        "layout names are PascalCase",
        """
        Catches a layout name that is not PascalCase (`hit_collection`, `hits`). Layouts become
        Python classes, and PEP 8 names classes in PascalCase. Rename the layout as the hint
        says (a change of the generated API: see `soagen breaking`).
        """,
        Example(
            """
            layout hit_collection { column float32 x }
            """,
            """
            layout HitCollection { column float32 x }
            """,
        ),
    ),
    _lint(
        "MODEL_PASCAL_CASE",
        "BASIC",
        "model names are PascalCase",
        """
        Catches a model name that is not PascalCase (`edge_classifier`). Models become Python
        classes, and PEP 8 names classes in PascalCase. Rename the model as the hint says.
        """,
        Example(
            """
            layout Nodes { column float32 x, y }
            model edge_model { input features = Nodes{x}  output scores = Nodes{y} }
            """,
            """
            layout Nodes { column float32 x, y }
            model EdgeModel { input features = Nodes{x}  output scores = Nodes{y} }
            """,
        ),
    ),
    _lint(
        "MEMBER_SNAKE_CASE",
        "BASIC",
        "column and scalar names are snake_case",
        """
        Catches a column or scalar name that is not snake_case (`posX`, `Energy`). Members
        become properties of the generated class, and PEP 8 names attributes in snake_case.
        Rename the member as the hint says (when the snake_case name would be a Python keyword,
        the hint offers another).
        """,
        Example(
            """
            layout Hits { column float32 posX }
            """,
            """
            layout Hits { column float32 pos_x }
            """,
        ),
    ),
    _lint(
        "BINDING_SNAKE_CASE",
        "BASIC",
        "input and output names are snake_case",
        """
        Catches an input or output name that is not snake_case (`nodeFeatures`). Binding names
        are the keys users type (`index_bounds=`, `contiguous=`) and the tensor names of a
        Triton model; PEP 8 spells such names in snake_case. Rename the binding as the hint
        says.
        """,
        Example(
            """
            layout Nodes { column float32 x, y }
            model M { input nodeFeatures = Nodes{x}  output scores = Nodes{y} }
            """,
            """
            layout Nodes { column float32 x, y }
            model M { input node_features = Nodes{x}  output scores = Nodes{y} }
            """,
        ),
    ),
    _lint(
        "LAYOUT_DOC_COMMENT",
        "STANDARD",
        "every layout has a `///` doc comment",
        """
        Catches a layout with no `///` doc comment above it. The doc comment becomes the
        docstring of the generated class: the one place that says what a collection holds, for
        the C++ producers and the Python consumers alike. Write a `///` line above the layout.
        """,
        Example(
            """
            layout Hits { column float32 x }
            """,
            """
            /// Calorimeter hits of one event.
            layout Hits { column float32 x }
            """,
        ),
    ),
    _lint(
        "MODEL_DOC_COMMENT",
        "STANDARD",
        "every model has a `///` doc comment",
        """
        Catches a model with no `///` doc comment above it. The doc comment becomes the
        docstring of the generated model class, which says what the model computes from its
        inputs. Write a `///` line above the model.
        """,
        Example(
            """
            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x}  output scores = Nodes{y} }
            """,
            """
            layout Nodes { column float32 x, y }
            /// Scores each node from its x.
            model M { input features = Nodes{x}  output scores = Nodes{y} }
            """,
        ),
    ),
    _lint(
        "LAYOUT_UNUSED",
        "STANDARD",
        "every layout is bound by a model of the linted files or of the schemas beside them",
        """
        Catches a layout that no model binds. Such a layout is often left over from a
        refactoring. Usage is counted over the files linted in one run, their imports, and every
        other .soa file in their folders (so a pre-commit run that sees only a changed shared
        file still finds the files that import it). Bind the layout in a model, remove it, lint
        it together with the files that import it, or ignore the rule for layouts that only
        describe data.
        """,
        Example(
            """
            layout Nodes { column float32 x, y }
            layout Leftover { column float32 z }
            model M { input features = Nodes{x}  output scores = Nodes{y} }
            """,
            """
            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x}  output scores = Nodes{y} }
            """,
        ),
    ),
)

# --- breaking-change rules: `soagen breaking`, found by soagen/tools/breaking.py -----------------
# source: code written against the generated classes stops working; memory: a buffer written by
# one side is misread by the other.

_BREAKING = (
    _breaking(
        "LAYOUT_REMOVED",
        "source",
        "a layout was removed or renamed",
        """
        A layout of the old schema is declared nowhere in the new one. Code that imports its
        generated class stops working, and buffers described by it lose their class. Reported
        at the layout in the old schema (`REF:path.soa`). Keep the layout, or rename it in one
        change together with everything that uses it.
        """,
    ),
    _breaking(
        "LAYOUT_MOVED",
        "source",
        "a layout moved to another schema file, so to another module",
        """
        A layout is declared in another file than before. Each schema file generates its own
        module, so `from ...old_module import Name` stops working. Move it back, or update
        every import of the class.
        """,
    ),
    _breaking(
        "LAYOUT_ALIGN_CHANGED",
        "memory",
        "a layout's alignment changed: every pitch may change",
        """
        A layout's `align` changed. Every member starts at a multiple of the alignment and every
        pitch is rounded up to one, so offsets and the buffer size move: a producer and a
        consumer on different sides of the change misread each other's buffers. Member offsets
        are then not reported one by one. Keep the alignment the C++ producer uses.
        """,
    ),
    _breaking(
        "LAYOUT_SIZE_CHANGED",
        "memory",
        "a layout's byte size changed for some n",
        """
        A layout's buffer takes another number of bytes for some n, with no member change
        reported that explains it (the message quotes such an n). Buffers made by one side are
        too small or too large for the other. Reported only when no other memory change of the
        layout is.
        """,
    ),
    _breaking(
        "MEMBER_REMOVED",
        "source",
        "a column or scalar was removed or renamed",
        """
        A column or scalar of the old layout is gone. Code reading the property of the
        generated class stops working, and the members after it move (reported as
        MEMBER_OFFSET_CHANGED). Keep the member, or remove it together with its users and the
        producers' layout.
        """,
    ),
    _breaking(
        "MEMBER_ADDED",
        "memory",
        "a member was added: the buffer grows and later members move",
        """
        A layout has a new column or scalar. Buffers made with the old layout are too small for
        the new one, and every member declared after the new one starts at another offset.
        Change the producers and consumers of the layout together; adding at the end moves
        nothing else but still changes the size.
        """,
    ),
    _breaking(
        "MEMBER_KIND_CHANGED",
        "memory",
        "a column became a scalar or the other way round",
        """
        A member changed from column to scalar or back. A column holds n values and a scalar
        one per collection, so its pitch, and the offsets of the members after it, change, and
        its tensor view changes shape. Keep the kind, or change both sides together.
        """,
    ),
    _breaking(
        "MEMBER_DTYPE_CHANGED",
        "memory",
        "a member's dtype changed",
        """
        A member's dtype changed. The other side reads its bytes as another type, even when the
        item size and so every offset stay the same (float32 and int32, say). Keep the dtype,
        or change producers and consumers together.
        """,
    ),
    _breaking(
        "MEMBER_SHAPE_CHANGED",
        "memory",
        "an array column's shape changed",
        """
        An array column's shape changed (or a column gained or lost one). The number of padded
        rows it takes and the order of its values change, and so do the offsets after it and
        the view's shape. Keep the shape, or change both sides together.
        """,
    ),
    _breaking(
        "MEMBER_OFFSET_CHANGED",
        "memory",
        "a member starts at another byte offset for some n",
        """
        A member starts at another byte for some n (the message quotes one): a member before it
        was added, removed, reordered or resized. Buffers written by one side are read at the
        wrong place by the other. Restore the order, or add new members at the end.
        """,
    ),
    _breaking(
        "MODEL_REMOVED",
        "source",
        "a model was removed or renamed",
        """
        A model of the old schema is declared nowhere in the new one: code importing its
        generated class and packages compiled for it lose their model. Keep the model, or
        rename it together with its users.
        """,
    ),
    _breaking(
        "MODEL_MOVED",
        "source",
        "a model moved to another schema file, so to another module",
        """
        A model is declared in another file than before, so its class is generated into
        another module and `from ...old_module import Name` stops working. Move it back, or
        update every import of the class.
        """,
    ),
    _breaking(
        "BINDING_REMOVED",
        "source",
        "an input or output was removed or renamed",
        """
        An input or output of a model is gone. Callers passing that collection, the model's
        code reading that tensor and packages compiled with it all stop working. Keep the
        binding, or change the model and its callers together.
        """,
    ),
    _breaking(
        "BINDING_ADDED",
        "source",
        "a model has a new input or output: callers must change",
        """
        A model has a new input or output. The generated `__call__` takes one more collection,
        and the model's code receives one more tensor, so callers and the model must change
        together; packages compiled for the old signature are refused.
        """,
    ),
    _breaking(
        "BINDING_ORDER_CHANGED",
        "source",
        "a model's bindings are in another order",
        """
        The bindings a model keeps are declared in another order. Positional arguments of the
        generated `__call__` and the order of INPUTS and OUTPUTS follow the declaration, so
        positional callers pass collections to the wrong bindings. Restore the order.
        """,
    ),
    _breaking(
        "BINDING_DIRECTION_CHANGED",
        "source",
        "an input became an output or the other way round",
        """
        A binding changed from input to output or back: the model now writes what it read, or
        reads what it wrote, and callers pass it on the other side. Use a new binding name for
        the new meaning.
        """,
    ),
    _breaking(
        "BINDING_BLOCK_CHANGED",
        "source",
        "a binding names another layout or other members",
        """
        A binding's block names another layout or other members (`Nodes{x, y}` became
        `Nodes{x, z}`): the model receives a tensor of other values, or another shape, under
        the same name. Change the model and its callers together, or use a new binding name.
        """,
    ),
    _breaking(
        "BINDING_AXES_CHANGED",
        "source",
        "a binding's tensor has another axis order",
        """
        A binding's `as [...]` axes changed (`[n, c]` became `[c, n]`, say): the model receives
        a tensor of another shape. Keep the axes, or change the model's code and recompile its
        packages together.
        """,
    ),
    _breaking(
        "BINDING_CONTIGUOUS_CHANGED",
        "source",
        "an input gained or lost `contiguous`: its tensor has other strides, which packages refuse",
        """
        An input gained or lost `contiguous`: it is handed over as a row-major copy instead of
        the strided view, or the other way round. Packages from `soagen compile` were compiled
        for the old strides and refuse the new ones: compile them again.
        """,
    ),
    _breaking(
        "BINDING_SAME_N_CHANGED",
        "source",
        "an input gained, lost or changed `same n as`: packages compiled for one shared size "
        "refuse the other schema",
        """
        An input gained, lost or changed its `same n as` clause. `soagen compile` exports one
        size for inputs that share it, so packages compiled under one schema refuse the other,
        and calls are now checked against other sizes. Compile the packages again.
        """,
    ),
    _breaking(
        "BINDING_WHOLE_CHANGED",
        "source",
        "an input gained or lost `whole`: `batch_size` calls slice its collection differently",
        """
        An input gained or lost `whole`: `batch_size` calls now pass its collection entire to
        every slice instead of slicing it, or the other way round, so the model receives
        tensors of other sizes. Change the model's code and its callers together.
        """,
    ),
)


def _registry(*codes: Code) -> dict[str, Code]:
    registry: dict[str, Code] = {}
    for code in codes:
        if code.id in registry:
            raise ValueError(f"code {code.id} is registered twice")
        registry[code.id] = code
    return registry


REGISTRY: dict[str, Code] = _registry(*_ERRORS, *_CMSSW_ERRORS, *_LINT, *_BREAKING)


def lookup(code: str) -> Code | None:
    """The code of an ID, in any case; None for an unknown one."""
    return REGISTRY.get(code.strip().upper())


def of_kind(kind: Kind) -> tuple[Code, ...]:
    """The codes of one kind, in registry order."""
    return tuple(code for code in REGISTRY.values() if code.kind == kind)


_TABLE_HEADS: dict[Kind, str] = {
    ERROR: "| code | category | purpose |",
    LINT: "| rule | category | purpose |",
    BREAKING: "| rule | level | purpose |",
}


def markdown_table(kind: Kind) -> str:
    """The codes of one kind as README shows them (a test keeps the two equal)."""
    lines = [_TABLE_HEADS[kind], "|---|---|---|"]
    for code in of_kind(kind):
        purpose = code.purpose.replace("|", "\\|")
        lines.append(f"| `{code.id}` | {code.category} | {purpose} |")
    return "\n".join(lines)
