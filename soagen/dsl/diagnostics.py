"""Problems found in schemas, as structured data with coordinates.

Every check returns `Diagnostic`s rather than raising, so one run reports all of them together. Each
code has one row in `CODES` (its summary) and one in `EXPLANATIONS` (what triggers it, why it matters,
how to fix it): `soagen explain` prints both.
"""

from __future__ import annotations

import difflib
import json
import textwrap
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Span:
    """Where something is in a schema file: 1-based line and column, end exclusive."""

    path: str
    line: int
    column: int
    end_line: int
    end_column: int


@dataclass(frozen=True, slots=True)
class Diagnostic:
    code: str
    message: str
    span: Span
    hint: str | None = None
    severity: str = "error"
    # Other places the message refers to (the first declaration of a duplicate, say).
    related: tuple[tuple[str, Span], ...] = field(default=())

    def sort_key(self) -> tuple[str, int, int, str]:
        return (self.span.path, self.span.line, self.span.column, self.code)


class SchemaError(Exception):
    """Raised by the loading API when a schema has errors; carries all of them."""

    def __init__(self, diagnostics: list[Diagnostic], sources: Mapping[str, str]) -> None:
        self.diagnostics = sorted(diagnostics, key=Diagnostic.sort_key)
        self.sources = dict(sources)
        super().__init__(render_text(self.diagnostics, self.sources, color=False))


# code -> one-line purpose. Codes are stable: tools may match on them.
CODES: dict[str, str] = {
    "SOA001": "syntax error: the text does not follow the .soa grammar",
    "SOA002": "a file cannot be read",
    "SOA101": "unknown dtype",
    "SOA102": "unknown layout",
    "SOA103": "unknown member in a block",
    "SOA104": "duplicate layout or model name",
    "SOA105": "duplicate member name in a layout",
    "SOA106": "duplicate binding name in a model",
    "SOA107": "a name is reserved: a Python keyword, or a member of the generated class",
    "SOA108": "a name would collide with another generated name",
    "SOA109": "a layout declares `align` more than once",
    "SOA110": "a layout or model is empty",
    "SOA201": "alignment is not a power of two",
    "SOA202": "alignment is smaller than the largest item",
    "SOA203": "array shape has a zero or negative extent",
    "SOA204": "a number is too large",
    "SOA301": "a block mixes dtypes",
    "SOA302": "a block mixes array shapes",
    "SOA303": "the columns of a block are not adjacent in memory",
    "SOA304": "the columns of a block are not in declaration order",
    "SOA305": "a block names a member twice",
    "SOA306": "a block mixes columns and scalars",
    "SOA307": "the axis list does not match the block",
    "SOA308": "two models declare different blocks under one name on the same layout",
    "SOA309": "an output block holds scalars, which cannot take one value per element",
    "SOA310": "an `indexes` clause does not name another input, or is not on an integer input",
    "SOA311": "a `contiguous` clause stands on an output",
    "SOA312": "a `same n as` clause stands on an output, or names no input of another layout",
    "SOA313": "a `whole` clause stands on an output, or inputs disagree on `whole`",
    "SOA401": "an imported file does not exist",
    "SOA402": "imports form a cycle",
    "SOA403": "a name is declared in two files",
}


def _text(text: str) -> str:
    return textwrap.dedent(text).strip()


# code -> what triggers it, why it matters and how to fix it, for `soagen explain`. An example that
# reports the code follows a line `Gives SOAnnn:`, a corrected one a line `Fixed:`; each is indented
# by four spaces after a blank line, and the tests load every one of them.
EXPLANATIONS: dict[str, str] = {
    "SOA001": _text(
        """
        The file does not follow the .soa grammar: a misspelt keyword, a missing `}` or `,`, a
        character the language does not use, or a `///` doc comment with no declaration after
        it. The message says what was found and what the grammar expects there; the hint, where
        there is one, names the keyword that was probably meant. Parsing a file stops at its
        first syntax error, so fix it and run again to see the file's other problems.

        Gives SOA001:

            layout Hits { colum float32 x }

        Fixed:

            layout Hits { column float32 x }
        """
    ),
    "SOA002": _text(
        """
        A schema file given to soagen cannot be read: it is not a regular file (a FIFO or a
        device), it is not UTF-8 text, or the system refuses to open it (permissions; through
        the Python API `load()`, also a missing file, which the command line reports as a usage
        error instead). Nothing of the file is checked. Fix the permissions or save the file as
        UTF-8 (a byte order mark is accepted). A file reached through `import` reports SOA401.
        """
    ),
    "SOA101": _text(
        """
        A member's dtype is not one soagen knows. The dtypes are `bool`, `int8`, `int16`,
        `int32`, `int64`, `uint8`, `uint16`, `uint32`, `uint64`, `float16`, `bfloat16`,
        `float32` and `float64`; each is the dtype of the member's tensor and fixes its item size
        in the byte layout. C++ spellings (`float`, `double`, `int`, `int32_t`, ...) get a hint
        naming the soagen dtype. Blocks that bind the member are checked once the dtype is fixed.

        Gives SOA101:

            layout Hits { column float x }

        Fixed:

            layout Hits { column float32 x }
        """
    ),
    "SOA102": _text(
        """
        A binding names a layout that is declared neither in its file nor in a file that file
        imports (directly or through other imports). Names are case-sensitive. Fix the spelling
        (the hint names a close layout), declare the layout, or import the file that declares it.

        Gives SOA102:

            layout Nodes { column float32 x }
            layout Scores { column float32 s }
            model M { input features = Node{x}  output scores = Scores{s} }

        Fixed:

            layout Nodes { column float32 x }
            layout Scores { column float32 s }
            model M { input features = Nodes{x}  output scores = Scores{s} }
        """
    ),
    "SOA103": _text(
        """
        A block `Layout{...}` names a member its layout does not declare: a typo, or a member of
        another layout. Fix the name (the hint names the closest member of the layout), or add
        the member to the layout.

        Gives SOA103:

            layout Nodes { column float32 x, y }
            layout Scores { column float32 s }
            model M { input features = Nodes{x, yy}  output scores = Scores{s} }

        Fixed:

            layout Nodes { column float32 x, y }
            layout Scores { column float32 s }
            model M { input features = Nodes{x, y}  output scores = Scores{s} }
        """
    ),
    "SOA104": _text(
        """
        Two layouts or models of one file have the same name. Layouts and models share one
        namespace: each becomes a class of the generated module, named as declared. Rename one
        of them. The same name declared in two different files is SOA403.

        Gives SOA104:

            layout Hits { column float32 x }
            layout Hits { column float32 y }

        Fixed:

            layout Hits { column float32 x }
            layout Clusters { column float32 y }
        """
    ),
    "SOA105": _text(
        """
        A layout declares one member name twice, as two columns or as a column and a scalar.
        Each member becomes a property of the generated class and a key of `MEMBERS` and
        `offsets(n)`, so member names are unique within a layout. Rename or remove one of them.

        Gives SOA105:

            layout Hits { column float32 x, y  scalar float32 x }

        Fixed:

            layout Hits { column float32 x, y  scalar float32 x0 }
        """
    ),
    "SOA106": _text(
        """
        A model declares two bindings of one name, say an input and an output. A binding's name
        identifies its tensor in the model's `INPUTS` and `OUTPUTS`, in the mapping the generated
        `__call__` passes to `run`, and in the layout's `BLOCKS`, so binding names are unique
        within a model. Rename one of them.

        Gives SOA106:

            layout Nodes { column float32 x }
            layout Scores { column float32 s }
            model M { input features = Nodes{x}  output features = Scores{s} }

        Fixed:

            layout Nodes { column float32 x }
            layout Scores { column float32 s }
            model M { input features = Nodes{x}  output scores = Scores{s} }
        """
    ),
    "SOA107": _text(
        """
        A name cannot be used in the generated Python: it is not ASCII, it starts with `_`
        (reserved for the generated code), it is a Python keyword (`class`, `lambda`, `None`, ...;
        soft keywords such as `type` and `match` are allowed), or, for a member, an attribute every
        generated layout class already has: `size`, `buffer`, `allocate`, `view`, ... (the list
        is in soagen/dsl/names.py). Rename it.

        Gives SOA107:

            layout Tracks { column int32 size }

        Fixed:

            layout Tracks { column int32 n_hits }
        """
    ),
    "SOA108": _text(
        """
        A name would collide with one the generated module itself uses. A layout or model named
        `annotations`, `dict`, `int`, `property`, `staticmethod`, `str` or `tuple` would hide that
        builtin in the whole module, and a member named `property` or `staticmethod` the decorator
        in its class. A file whose name cannot be a Python module name (`my-schema.soa`, `2d.soa`,
        `class.soa`) gets it too: the generated module is named after the file. Rename the
        declaration, or the file (letters, digits and `_`, not starting with a digit).

        Gives SOA108:

            layout Cells { column uint8 property }

        Fixed:

            layout Cells { column uint8 quality }
        """
    ),
    "SOA109": _text(
        """
        A layout has more than one `align` statement. One alignment holds for the whole layout
        (it pads every member), and picking either statement silently could give a byte layout
        other than the C++ producer's. Keep one `align`.

        Gives SOA109:

            layout Hits { align 128  column float32 x  align 64 }

        Fixed:

            layout Hits { align 128  column float32 x }
        """
    ),
    "SOA110": _text(
        """
        A layout has no members, or a model has no input or no output. An empty layout describes
        no data, and a model's generated `__call__` takes its input collections and writes into
        its output collections, so it needs at least one of each. Add the missing members or
        bindings, or remove the declaration.

        Gives SOA110:

            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x} }

        Fixed:

            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x}  output scores = Nodes{y} }
        """
    ),
    "SOA201": _text(
        """
        A layout's `align` is not a power of two (or is zero or negative). As in CMSSW's
        GENERATE_SOA_LAYOUT, every member starts at a multiple of the alignment and its pitch is
        rounded up to one, and alignments there are powers of two (128 by default, as in soagen).
        Write the power of two the C++ producer uses, so that the byte layouts agree.

        Gives SOA201:

            layout Hits { align 100  column float32 x }

        Fixed:

            layout Hits { align 128  column float32 x }
        """
    ),
    "SOA202": _text(
        """
        A layout's `align` is smaller than the item size of one of its dtypes, e.g. `align 4`
        with a float64 member: members would start at addresses not aligned for their own dtype,
        and so would the tensor views of them. Use at least the largest item size (the hint
        gives it). The item size is the dtype's, whatever the shape of an array column.

        Gives SOA202:

            layout Hits { align 4  column float64 energy }

        Fixed:

            layout Hits { align 8  column float64 energy }
        """
    ),
    "SOA203": _text(
        """
        An array column has an extent of zero or less (`float32[0]`, `float32[3, -1]`), or a
        scalar has an array shape. Each element of an array column holds prod(shape) values, so
        every extent is at least 1. A scalar holds exactly one value per collection; for several
        values per element declare an array column.

        Gives SOA203:

            layout Tracks { column float32[0] covariance }

        Fixed:

            layout Tracks { column float32[5, 5] covariance }
        """
    ),
    "SOA204": _text(
        """
        A number is too large to be meant: a literal of more than 30 digits, an `align` above
        1048576 (2**20) bytes, or an array column of more than 16777216 (2**24) values per
        element. The generated arithmetic would still work, but such a schema is almost always a
        typo, and its buffers would be huge. Fix the number.

        Gives SOA204:

            layout Images { column float32[4096, 8192] pixels }

        Fixed:

            layout Images { column float32[64, 64] pixels }
        """
    ),
    "SOA301": _text(
        """
        The members of a block have different dtypes. A block is passed to the model as one
        tensor, a strided view of the buffer, and one tensor has one dtype, so it cannot span a
        float32 and an int32 column. Bind such columns as separate inputs, one block per dtype.

        Gives SOA301:

            layout Nodes { column float32 x, y  column int32 id }
            model M { input features = Nodes{x, y, id}  output scores = Nodes{x} }

        Fixed:

            layout Nodes { column float32 x, y  column int32 id }
            model M {
                input features = Nodes{x, y}
                input ids = Nodes{id}
                output scores = Nodes{x}
            }
        """
    ),
    "SOA302": _text(
        """
        The members of a block share a dtype but not an array shape (`float32 x` and
        `float32[3] v`, or `float32[3]` and `float32[4]`). A block is one strided view with one
        shape per element, and an array column's values are spread over several padded rows of
        the buffer, unlike a plain column's, so the two cannot form one tensor. Bind them as
        separate inputs.

        Gives SOA302:

            layout Tracks { column float32 pt  column float32[3] momentum }
            model M { input features = Tracks{pt, momentum}  output scores = Tracks{pt} }

        Fixed:

            layout Tracks { column float32 pt  column float32[3] momentum }
            model M {
                input pt = Tracks{pt}
                input momentum = Tracks{momentum}
                output scores = Tracks{pt}
            }
        """
    ),
    "SOA303": _text(
        """
        The columns of a block are not adjacent: the layout declares other members between them.
        A block reaches the model as one `as_strided` view of the buffer without a copy; columns
        of one dtype lie one pitch apart, so they form one [n, c] tensor only when nothing lies
        between them. Reorder the layout so the block's columns are adjacent, or bind them as
        separate inputs. Reordering changes the byte layout: change the C++ GENERATE_SOA_LAYOUT
        the same way (`soagen breaking` reports the moved offsets).

        Gives SOA303:

            layout Nodes { column float32 x  column int32 id  column float32 y }
            model M { input features = Nodes{x, y}  output scores = Nodes{x} }

        Fixed:

            layout Nodes { column float32 x, y  column int32 id }
            model M { input features = Nodes{x, y}  output scores = Nodes{x} }
        """
    ),
    "SOA304": _text(
        """
        A block lists adjacent columns in another order than the layout declares them
        (`Nodes{y, x}` where `x` comes first). The strided view walks the columns in buffer
        order, so the `c` axis of the tensor follows declaration order; any other order would
        need a copy. Write the members in declaration order, or reorder the layout's columns (a
        change of byte layout) if the model needs another order.

        Gives SOA304:

            layout Nodes { column float32 x, y }
            model M { input features = Nodes{y, x}  output scores = Nodes{x} }

        Fixed:

            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x, y}  output scores = Nodes{x} }
        """
    ),
    "SOA305": _text(
        """
        A block names one member twice (`Nodes{x, x}`). A view of the buffer sees each column
        once, so it cannot hold one twice without a copy. Name each member once, and repeat
        the values inside the model if it needs them twice.

        Gives SOA305:

            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x, x}  output scores = Nodes{y} }

        Fixed:

            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x}  output scores = Nodes{y} }
        """
    ),
    "SOA306": _text(
        """
        A block mixes columns and scalars. A column holds n values and its view steps through
        them; a scalar holds one value per collection in its own padded slot, and its view
        broadcasts that value over n (stride 0). The two cannot be one strided view. Bind the
        scalars as a block of their own.

        Gives SOA306:

            layout Hits { column float32 x  scalar float32 bfield }
            model M { input features = Hits{x, bfield}  output scores = Hits{x} }

        Fixed:

            layout Hits { column float32 x  scalar float32 bfield }
            model M {
                input features = Hits{x}
                input bfield = Hits{bfield}
                output scores = Hits{x}
            }
        """
    ),
    "SOA307": _text(
        """
        The `as [...]` axis list does not describe the block. Its axes are `n` (the elements,
        required), `c` (the block's members, required when there are several) and the array
        extents written as their sizes in declared order (`as [n, 20, 100]` for
        `float32[20, 100]`); `n` and `c` appear once each, in any order (`as [c, n]` transposes
        the view). Fix the list, or leave out `as [...]` for the default `[n, c, extents...]`.

        Gives SOA307:

            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x, y} as [n]  output scores = Nodes{x} }

        Fixed:

            layout Nodes { column float32 x, y }
            model M { input features = Nodes{x, y} as [n, c]  output scores = Nodes{x} }
        """
    ),
    "SOA308": _text(
        """
        Two models of one file bind one name to different blocks of the same layout (other
        members or other axes). The generated layout class lists the blocks of the file's models
        in `BLOCKS`, keyed by binding name, so a name means one block per layout. Rename one of
        the bindings, or let both bind the same block (for several members, `as [n, c]` and no
        `as` are the same block).

        Gives SOA308:

            layout Nodes { column float32 x, y }
            model A { input features = Nodes{x, y}  output scores = Nodes{x} }
            model B { input features = Nodes{x}  output y = Nodes{y} }

        Fixed:

            layout Nodes { column float32 x, y }
            model A { input features = Nodes{x, y}  output scores = Nodes{x} }
            model B { input x = Nodes{x}  output y = Nodes{y} }
        """
    ),
    "SOA309": _text(
        """
        An output binds scalars. The model writes one value per element into an output, but a
        scalar holds one value per collection (its view has stride 0 along n), so every
        element's result would land on that one value. Declare the output members as columns;
        scalars can only be inputs.

        Gives SOA309:

            layout Hits { column float32 x  scalar float32 score }
            model M { input features = Hits{x}  output scores = Hits{score} }

        Fixed:

            layout Hits { column float32 x, score }
            model M { input features = Hits{x}  output scores = Hits{score} }
        """
    ),
    "SOA310": _text(
        """
        `indexes NAME` says that every value of an integer input is an element number of the
        input NAME of the same model (an edge list's node numbers, say): soagen checks that each
        value lies in [0, number of elements of NAME) before every call, because a compiled
        (AOTInductor) model aborts the whole process on an index out of range, and a negative
        one can silently read from the end. So the clause must be on an input, hold integers, and
        name another input of the model.

        Gives SOA310:

            layout Nodes { column float32 x, y }
            layout Edges { column int64 src, dst }
            model M {
                input nodes = Nodes{x, y}
                input edges = Edges{src, dst} indexes node
                output scores = Nodes{x}
            }

        Fixed:

            layout Nodes { column float32 x, y }
            layout Edges { column int64 src, dst }
            model M {
                input nodes = Nodes{x, y}
                input edges = Edges{src, dst} indexes nodes
                output scores = Nodes{x}
            }
        """
    ),
    "SOA311": _text(
        """
        `contiguous` on an input hands the model one row-major (device-local) copy of the block
        per call instead of the strided view of its columns: for models whose own operations on
        the column-major `[n, c]` view (row gathers, a `torch.cat` with row-major tensors) cost
        more than the copy. Outputs are always written into their columns, so the clause has no
        meaning there.

        Gives SOA311:

            layout Hits { column float32 x, y }
            model M {
                input points = Hits{x, y} as [n, c]
                output scores = Hits{x} contiguous
            }

        Fixed:

            layout Hits { column float32 x, y }
            model M {
                input points = Hits{x, y} as [n, c] contiguous
                output scores = Hits{x}
            }
        """
    ),
    "SOA312": _text(
        """
        `same n as NAME` on an input says that its collection holds as many elements as the
        collection of input NAME (a mask made for a particle collection, say): soagen checks the
        two sizes before every call, and `soagen compile` exports one size for both. So the
        clause must be on an input and name another input of the model, one that binds another
        layout: inputs of one layout come from one collection and share its size already.

        Gives SOA312:

            layout Particles { column float32 pt, eta }
            layout Masks { column bool mask }
            model M {
                input features = Particles{pt, eta}
                input mask = Masks{mask} same n as feature
                output scores = Particles{pt}
            }

        Fixed:

            layout Particles { column float32 pt, eta }
            layout Masks { column bool mask }
            model M {
                input features = Particles{pt, eta}
                input mask = Masks{mask} same n as features
                output scores = Particles{pt}
            }
        """
    ),
    "SOA313": _text(
        """
        `whole` on an input makes a `batch_size` call pass its collection entire to every slice
        instead of slicing it (the nodes an edge list indexes, say). Outputs are always sliced
        with the call, so they take no `whole`. Inputs of one layout in a model are one
        collection, sliced or not, so they all say `whole` or none does; and two inputs tied by
        `same n as` are both whole or both sliced, or a slice of one would no longer match the
        other.

        Gives SOA313:

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

        Fixed:

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
        """
    ),
    "SOA401": _text(
        """
        An `import` names a file that cannot be read: it does not exist, it is not a regular
        file, it is not UTF-8 text, or the path is empty or holds a NUL character. Import paths
        are relative to the importing file, not to the working directory. Fix the path or create
        the file; `import "../common/tracks.soa"` reaches a sibling folder.

        Gives SOA401:

            import "no_such_file.soa"
        """
    ),
    "SOA402": _text(
        """
        Imports form a cycle: `a.soa` imports `b.soa`, which imports `a.soa` (or a file imports
        itself). Each file's module imports the modules of the files it imports, which must exist
        first, so a cycle cannot be generated. Move the layouts both files need into a third
        file that both import, and remove the import that closes the cycle.
        """
    ),
    "SOA403": _text(
        """
        Two files of one schema (a file and every file it imports, directly or not) declare the
        same layout or model name, or would generate modules of one name (`tracks/common.soa`
        and `vertices/common.soa` both give `common`). Generated modules import each other's
        classes by name, so names are unique across the files of a schema. Rename one of the
        declarations or files.
        """
    ),
}


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """A hint naming the closest choice; among equally close ones the first, so `flot` suggests
    `float32`."""
    best, best_score = None, 0.0
    for choice in choices:
        score = difflib.SequenceMatcher(None, word, choice).ratio()
        if score >= 0.6 and score > best_score:
            best, best_score = choice, score
    return f"did you mean `{best}`?" if best is not None else None


def source_lines(text: str) -> list[str]:
    """The lines of a schema as the parser numbers them: split at newlines only (not at form feeds
    or U+2028 as `str.splitlines` would), without the carriage return of CRLF files."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def _shown(source_line: str) -> str:
    """A source line safe to print: each control or invisible character becomes one U+FFFD, so the
    terminal shows the line as it is and every column keeps its place."""
    return "".join(ch if ch in "\t " or ch.isprintable() else "\ufffd" for ch in source_line)


def _padding(ch: str) -> str:
    """What goes under one character so the caret lines up: tabs stay tabs, wide characters take
    two cells, combining marks none."""
    if ch == "\t":
        return ch
    if unicodedata.combining(ch):
        return ""
    return "  " if unicodedata.east_asian_width(ch) in ("W", "F") else " "


def _caret_line(source_line: str, span: Span) -> str:
    end = span.end_column if span.end_line == span.line else span.column + 1
    under = source_line[span.column - 1 : max(end, span.column + 1) - 1]
    width = max(1, sum(len(_padding(ch).replace("\t", " ")) for ch in under))
    prefix = "".join(_padding(ch) for ch in source_line[: span.column - 1])
    return prefix + "^" * width


def render_one(diagnostic: Diagnostic, sources: Mapping[str, str], color: bool = False) -> str:
    span = diagnostic.span
    bold, red, blue, reset = ("\x1b[1m", "\x1b[31m", "\x1b[34m", "\x1b[0m") if color else ("",) * 4
    head = (
        f"{bold}{span.path}:{span.line}:{span.column}: {red}{diagnostic.severity}"
        f"[{diagnostic.code}]{reset}{bold}: {diagnostic.message}{reset}"
    )
    lines = [head]
    text = sources.get(span.path)
    if text is not None:
        lines_of_text = source_lines(text)
        if 1 <= span.line <= len(lines_of_text):
            source_line = _shown(lines_of_text[span.line - 1])
            gutter = f"{span.line} | "
            lines.append(f"{blue}{gutter}{reset}{source_line}")
            lines.append(" " * len(gutter) + f"{red}{_caret_line(source_line, span)}{reset}")
    for note, where in diagnostic.related:
        lines.append(f"  note: {note} at {where.path}:{where.line}:{where.column}")
    if diagnostic.hint:
        lines.append(f"  hint: {diagnostic.hint}")
    return "\n".join(lines)


def render_text(
    diagnostics: Iterable[Diagnostic], sources: Mapping[str, str], color: bool = False
) -> str:
    return "\n".join(render_one(d, sources, color) for d in diagnostics)


def to_json_object(diagnostic: Diagnostic) -> dict[str, object]:
    span = diagnostic.span
    return {
        "code": diagnostic.code,
        "severity": diagnostic.severity,
        "message": diagnostic.message,
        "hint": diagnostic.hint,
        "path": span.path,
        "line": span.line,
        "column": span.column,
        "end_line": span.end_line,
        "end_column": span.end_column,
        "related": [
            {"message": note, "path": where.path, "line": where.line, "column": where.column}
            for note, where in diagnostic.related
        ],
    }


def render_json(diagnostics: Iterable[Diagnostic]) -> str:
    return json.dumps({"diagnostics": [to_json_object(d) for d in diagnostics]}, indent=2)


def _github_escape(text: str, property_value: bool = False) -> str:
    """GitHub workflow commands' escaping: `%`, CR and LF always; `:` and `,` in properties."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_value else text


def _from_root(path: str, root: str | None) -> str:
    if not root:
        return path
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except (ValueError, OSError):
        return path


def render_github(diagnostics: Iterable[Diagnostic], root: str | None = None) -> str:
    """One workflow annotation per diagnostic (`::error file=...,line=...,col=...::message`).
    GitHub places annotations by path from the repository's root: with `root` (the workflow's
    `GITHUB_WORKSPACE`), paths under it are given from there, whatever the working folder."""
    lines = []
    for diagnostic in diagnostics:
        span = diagnostic.span
        level = "warning" if diagnostic.severity == "warning" else "error"
        properties = ",".join(
            f"{key}={_github_escape(str(value), property_value=True)}"
            for key, value in (
                ("file", _from_root(span.path, root)),
                ("line", span.line),
                ("col", span.column),
                ("endLine", span.end_line),
                ("endColumn", span.end_column),
                ("title", f"soagen {diagnostic.code}"),
            )
        )
        message = diagnostic.message + (f" ({diagnostic.hint})" if diagnostic.hint else "")
        lines.append(f"::{level} {properties}::{_github_escape(message)}")
    return "\n".join(lines)
