"""Every diagnostic code, through `load()` on files written to disk: code, line, column and wording.

Schemas below mark where the error must point with `‸` (removed before the file is written), so each
case states its exact line and column next to the text it refers to.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soagen.dsl.codes import ERROR, of_kind
from soagen.dsl.diagnostics import Diagnostic, render_text
from soagen.dsl.loader import LoadResult, load
from soagen.dsl.parser import keywords
from soagen.generator.cpp import cpp_problems, generate_cpp
from soagen.generator.python import generate
from tests.helpers import REPO

MARK = "\u2038"  # ‸
CODES = {code.id: code for code in of_kind(ERROR)}


def marked(text: str) -> tuple[str, int, int]:
    """The text without its mark, and the 1-based line and column the mark stood at."""
    assert text.count(MARK) == 1, "one mark per case"
    before = text[: text.index(MARK)]
    line = before.count("\n") + 1
    column = len(before) - (before.rfind("\n") + 1) + 1
    return text.replace(MARK, ""), line, column


def load_text(tmp_path: Path, text: str, name: str = "schema.soa") -> LoadResult:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))
    return load(path)


def load_for(tmp_path: Path, text: str, code: str) -> LoadResult:
    """The schema loaded as a command reporting `code` would: the C++ target's codes (SOA5xx)
    come from `cpp_problems` of a schema the checker accepts, as `--lang cpp` runs it."""
    result = load_text(tmp_path, text)
    if CODES[code].category != "cpp" or result.schema is None:
        return result
    problems = cpp_problems(result.schema)
    return LoadResult(None if problems else result.schema, problems, result.sources)


def only(result: LoadResult) -> Diagnostic:
    assert result.schema is None
    assert len(result.diagnostics) == 1, [(d.code, d.message) for d in result.diagnostics]
    return result.diagnostics[0]


# (code, marked schema, words the message must hold, words the hint must hold)
CASES = [
    # SOA001: syntax errors say what they found and what was expected.
    (
        "SOA001",
        "layout A {\n    column float32 x, \u2038}\n",
        ["unexpected `}`", "expected a name"],
        [],
    ),
    (
        "SOA001",
        "layout A {\n    column float32[\u2038] x\n}\n",
        ["unexpected `]`", "expected a number"],
        [],
    ),
    (
        "SOA001",
        "layout A {\n    column float32 x\u2038\n",
        ["unexpected end of file", "expected", "`}`"],
        ["`{` is not closed"],
    ),
    (
        "SOA001",
        "layout A {\n    \u2038colum float32 x\n}\n",
        ["unexpected `colum`", "expected `align`, `column`, `scalar` or `}`"],
        ["did you mean `column`?"],
    ),
    (
        "SOA001",  # inside a binding's members only `,` or `}` can follow (not a layout's words)
        "layout A {\n    column float32 x, y\n}\nmodel M {\n    input a = A{x, y \u2038as [n, c]\n}\n",
        ["unexpected `as`", "expected `,` or `}`"],
        [],
    ),
    (
        "SOA001",
        "layout A {\n    column float32[2\u2038*3] x\n}\n",
        ["unexpected character `*`"],
        [],
    ),
    (
        "SOA001",
        'import \u2038"never closed\nlayout A {\n    column float32 x\n}\n',
        ['unexpected character `"`'],
        ["close on the same line"],
    ),
    (
        "SOA001",
        "layout A {\n    column float32[\u2038\u0663] x\n}\n",  # ARABIC-INDIC DIGIT THREE
        ["unexpected character"],
        ["ASCII digits"],
    ),
    (
        "SOA001",
        "layout A {\n    column float32 x\u2038\u00a0\n}\n",  # no-break space
        ["U+00A0"],
        ["invisible"],
    ),
    (
        "SOA001",
        "layout A {\n    column float32 x\n    \u2038/// documents nothing\n}\n",
        ["doc comment", "followed by `}`"],
        ["`//`"],
    ),
    (
        "SOA001",
        "layout A {\n    column float32 x\n}\n\u2038/// dangling at the end\n",
        ["doc comment", "end of the file"],
        ["`//`"],
    ),
    (
        "SOA001",
        "model M {\n    input a = A{x} as [n,\u2038]\n}\n",
        ["unexpected `]`", "a name or a number"],
        [],
    ),
    # SOA101 to SOA110: names and declarations.
    (
        "SOA101",
        "layout A {\n    column \u2038flot32 x\n}\n",
        ["unknown dtype `flot32`"],
        ["did you mean `float32`?"],
    ),
    (
        "SOA101",
        "layout A {\n    scalar \u2038double x\n}\n",
        ["unknown dtype `double`"],
        ["float64"],
    ),
    (
        "SOA102",
        "layout Points {\n    column float32 x\n}\nmodel M {\n    input a = \u2038Point{x}\n"
        "    output b = Points{x}\n}\n",
        ["unknown layout `Point`"],
        ["did you mean `Points`?"],
    ),
    (
        "SOA103",
        "layout A {\n    column float32 energy, x\n}\nmodel M {\n    input a = A{\u2038enrgy}\n"
        "    output b = A{x}\n}\n",
        ["`A` has no member `enrgy`"],
        ["did you mean `energy`?"],
    ),
    (
        "SOA104",
        "layout A {\n    column float32 x\n}\nlayout \u2038A {\n    column float32 y\n}\n",
        ["`A` is declared twice"],
        [],
    ),
    (
        "SOA104",
        "layout A {\n    column float32 x\n}\nmodel \u2038A {\n    input a = A{x}\n"
        "    output b = A{x}\n}\n",
        ["`A` is declared twice"],
        [],
    ),
    (
        "SOA105",
        "layout A {\n    column float32 x\n    scalar int32 \u2038x\n}\n",
        ["`A` declares `x` twice"],
        [],
    ),
    (
        "SOA106",
        "layout A {\n    column float32 x\n}\nmodel M {\n    input a = A{x}\n"
        "    output \u2038a = A{x}\n}\n",
        ["`M` declares `a` twice"],
        [],
    ),
    (
        "SOA107",
        "layout \u2038class {\n    column float32 x\n}\n",
        ["`class`", "Python keyword"],
        ["another name"],
    ),
    (
        "SOA107",
        "layout A {\n    column float32 x, \u2038lambda\n}\n",
        ["`lambda`", "Python keyword"],
        [],
    ),
    (
        "SOA107",
        "layout A {\n    column float32 \u2038size\n}\n",
        ["`size`", "reserved"],
        ["another name"],
    ),
    (
        "SOA107",
        "layout A {\n    column float32 \u2038_x\n}\n",
        ["`_x`", "starts with `_`"],
        ["reserved for the generated code"],
    ),
    (
        "SOA107",
        "layout A {\n    column float32 x\n}\nmodel M {\n    input \u2038def = A{x}\n"
        "    output b = A{x}\n}\n",
        ["binding `def`", "Python keyword"],
        [],
    ),
    (
        "SOA107",
        "layout \u2038Énergie {\n    column float32 x\n}\n",
        ["`Énergie`", "not ASCII"],
        ["ASCII"],
    ),
    (
        "SOA108",
        "layout \u2038property {\n    column float32 x\n}\n",
        ["`property`", "generated code"],
        ["another name"],
    ),
    (
        "SOA108",
        "layout \u2038annotations {\n    column float32 x\n}\n",
        ["`annotations`", "generated code"],
        [],
    ),
    (
        "SOA108",
        "layout A {\n    column float32 x, \u2038staticmethod\n}\n",
        ["`staticmethod`", "generated code"],
        [],
    ),
    (
        "SOA108",
        "model \u2038str {\n    input a = A{x}\n    output b = A{x}\n}\nlayout A {\n    column int8 x\n}\n",
        ["`str`"],
        [],
    ),
    (
        "SOA109",
        "layout A {\n    align 64\n    align \u2038128\n    column float32 x\n}\n",
        ["`align` more than once"],
        [],
    ),
    ("SOA110", "layout \u2038A {\n}\n", ["layout `A` has no members"], []),
    (
        "SOA110",
        "layout A {\n    column float32 x\n}\nmodel \u2038M {\n    output b = A{x}\n}\n",
        ["model `M` has no input"],
        [],
    ),
    (
        "SOA110",
        "layout A {\n    column float32 x\n}\nmodel \u2038M {\n    input b = A{x}\n}\n",
        ["model `M` has no output"],
        [],
    ),
    # SOA201 to SOA204: numbers.
    (
        "SOA201",
        "layout A {\n    align \u203896\n    column float32 x\n}\n",
        ["alignment 96", "not a power of two"],
        ["128"],
    ),
    ("SOA201", "layout A {\n    align \u20380\n    column float32 x\n}\n", ["alignment 0"], []),
    (
        "SOA201",
        "layout A {\n    align \u2038-128\n    column float32 x\n}\n",
        ["alignment -128"],
        [],
    ),
    (
        "SOA201",
        "layout A {\n    align \u203899999999999999999999\n    column float32 x\n}\n",
        ["99999999999999999999", "not a power of two"],
        [],
    ),
    (
        "SOA202",
        "layout A {\n    align \u20384\n    column float32 x\n    scalar float64 s\n}\n",
        ["alignment 4", "smaller than `s`", "8 bytes"],
        ["align 8"],
    ),
    (
        "SOA203",
        "layout A {\n    column \u2038float32[3, 0] x\n}\n",
        ["[3, 0]", "zero or negative"],
        ["at least 1"],
    ),
    (
        "SOA203",
        "layout A {\n    column \u2038float32[-2] x\n}\n",
        ["[-2]", "zero or negative"],
        [],
    ),
    (
        "SOA203",
        "layout A {\n    scalar \u2038float32[3] s\n}\n",
        ["scalar `s` has an array shape"],
        ["array column"],
    ),
    (
        "SOA204",
        "layout A {\n    align \u20382097152\n    column float32 x\n}\n",
        ["alignment 2097152 is too large"],
        ["1048576"],
    ),
    (
        "SOA204",
        "layout A {\n    column \u2038float32[4096, 4097] x\n}\n",
        ["16781312 values per element"],
        ["16777216"],
    ),
    (
        "SOA205",
        "layout A {\n    column \u2038uint16 adc packed\n}\n",
        ["packed column `adc` has no array shape"],
        ["column uint16[N] adc packed"],
    ),
    (
        "SOA204",
        "layout A {\n    column float32[\u2038" + "1" + "0" * 30 + "] x\n}\n",
        ["31 digits"],
        ["at most 30 digits"],
    ),
    (
        "SOA204",
        "layout A {\n    align \u2038" + "7" * 5000 + "\n    column float32 x\n}\n",
        ["5000 digits"],
        [],
    ),
    (
        "SOA204",
        "layout A {\n    column float32[3] x\n}\nmodel M {\n    input a = A{x} as [n, \u2038"
        + "3" * 4400
        + "]\n    output b = A{x}\n}\n",
        ["4400 digits"],
        [],
    ),
    # SOA301 to SOA308: blocks.
    (
        "SOA301",
        "layout A {\n    column float32 x\n    column float64 y\n}\nmodel M {\n"
        "    input a = A{x, \u2038y}\n    output b = A{x}\n}\n",
        ["mixes dtypes", "`x` is float32", "`y` is float64"],
        ["separate inputs"],
    ),
    (
        "SOA302",
        "layout A {\n    column float32[2] x\n    column float32[3] y\n}\nmodel M {\n"
        "    input a = A{x, \u2038y}\n    output b = A{x}\n}\n",
        ["mixes shapes", "[2]", "[3]"],
        [],
    ),
    (
        "SOA303",
        "layout Nodes {\n    column float32 x, y\n    column int32 id\n    column float32 z, energy\n}\n"
        "model M {\n    input a = Nodes{\u2038x, y, z, energy}\n    output b = Nodes{x}\n}\n",
        ["not zero-copy", "`id`"],
        ["reorder the columns of Nodes so that x, y, z, energy are adjacent"],
    ),
    (
        "SOA304",
        "layout A {\n    column float32 x, y\n}\nmodel M {\n    input a = A{\u2038y, x}\n"
        "    output b = A{x}\n}\n",
        ["out of declaration order"],
        ["A{x, y}"],
    ),
    (
        "SOA305",
        "layout A {\n    column float32 x, y\n}\nmodel M {\n    input a = A{x, \u2038x}\n"
        "    output b = A{x}\n}\n",
        ["names `x` twice"],
        [],
    ),
    (
        "SOA306",
        "layout A {\n    column float32 x\n    scalar float32 s\n}\nmodel M {\n"
        "    input a = A{x, \u2038s}\n    output b = A{x}\n}\n",
        ["mixes column `x` and scalar `s`"],
        ["bind scalars separately"],
    ),
    (
        "SOA307",
        "layout A {\n    column float32 x\n}\nmodel M {\n    input a = A{x} as [n, \u2038k]\n"
        "    output b = A{x}\n}\n",
        ["unknown axis `k`"],
        ["`n`", "`c`"],
    ),
    (
        "SOA307",
        "layout A {\n    column float32 x, y\n}\nmodel M {\n    input a = A{x, y} as \u2038[n]\n"
        "    output b = A{x}\n}\n",
        ["2 columns", "no `c`"],
        ["as [n, c]"],
    ),
    (
        "SOA307",
        "layout A {\n    column float32 x, y\n}\nmodel M {\n    input a = A{x, y} as \u2038[c]\n"
        "    output b = A{x}\n}\n",
        ["no `n`"],
        [],
    ),
    (
        "SOA307",
        "layout A {\n    column float32 x, y\n}\nmodel M {\n    input a = A{x, y} as [c, n, \u2038n]\n"
        "    output b = A{x}\n}\n",
        ["axis `n`", "twice"],
        [],
    ),
    (
        "SOA307",
        "layout Jets {\n    column float32[20, 100] pf\n}\nmodel M {\n"
        "    input a = Jets{pf} as \u2038[n, 100, 20]\n    output b = Jets{pf}\n}\n",
        ["extents [100, 20]", "shape [20, 100]"],
        ["declared order", "[n, 20, 100]"],
    ),
    (
        "SOA307",
        "layout A {\n    column float32 x\n}\nmodel M {\n    input a = A{x} as \u2038[n, 3]\n"
        "    output b = A{x}\n}\n",
        ["extents [3]", "no array shape"],
        [],
    ),
    (
        "SOA308",
        "layout A {\n    column float32 x, y\n}\nmodel M {\n    input a = A{x, y} as [n, c]\n"
        "    output b = A{x}\n}\nmodel N {\n    input \u2038a = A{x, y} as [c, n]\n"
        "    output b = A{x}\n}\n",
        ["`a` names two different blocks of `A`"],
        ["another name"],
    ),
    # A scalar is one value per collection: its view over n has stride 0, so an output block of
    # scalars would write every element's value to one place.
    (
        "SOA309",
        "layout Params {\n    scalar float32 p, q\n    column float32 v\n}\nmodel M {\n"
        "    input v = Params{v}\n    output pq = Params{\u2038p, q} as [n, c]\n}\n",
        ["output `pq`", "scalar `p`", "one value per collection"],
        ["column"],
    ),
    # `indexes` with its name missing is reported where the name should be, not a line later.
    (
        "SOA001",
        "layout N {\n    column int32 x, y\n}\nmodel M {\n    input nodes = N{x}\n"
        "    input edges = N{y} indexes\n    \u2038output z = N{x}\n}\n",
        ["unexpected `output`", "the name of the input it indexes"],
        [],
    ),
    (
        "SOA001",
        "layout N {\n    column int32 x, y\n}\nmodel M {\n    input nodes = N{x}\n"
        "    input edges = N{y} indexes nodes \u2038as [n]\n    output z = N{x}\n}\n",
        ["unexpected `as`"],
        ["as [...] indexes NAME same n as NAME whole contiguous`, in that order"],
    ),
    # `indexes` names another input of the model, on an integer input.
    (
        "SOA310",
        "layout N {\n    column float32 x\n}\nlayout E {\n    column int64 src, dst\n}\n"
        "model M {\n    input nodes = N{x}\n    input edges = E{src, dst} indexes \u2038node\n"
        "    output y = N{x}\n}\n",
        ["no input `node`", "`edges` to index"],
        ["did you mean `nodes`?"],
    ),
    (
        "SOA310",
        "layout N {\n    column float32 x, w\n}\n"
        "model M {\n    input nodes = N{x}\n    input w = N{w} indexes \u2038nodes\n"
        "    output y = N{x}\n}\n",
        ["input `w` holds float32", "not integers"],
        ["integer columns"],
    ),
    (
        "SOA310",
        "layout N {\n    column int32 x, y\n}\n"
        "model M {\n    input nodes = N{x}\n    output y = N{y} indexes \u2038nodes\n}\n",
        ["output `y` declares `indexes`", "only inputs"],
        ["remove"],
    ),
    (
        "SOA310",
        "layout N {\n    column int32 x, y\n}\n"
        "model M {\n    input nodes = N{x} indexes \u2038nodes\n    output y = N{y}\n}\n",
        ["cannot index itself"],
        ["name the input"],
    ),
    # `contiguous` hands an input over as a row-major copy: outputs are written in place.
    (
        "SOA311",
        "layout N {\n    column float32 x, y\n}\n"
        "model M {\n    input p = N{x, y} contiguous\n    output y = N{y} \u2038contiguous\n}\n",
        ["output `y` declares `contiguous`", "written into their columns"],
        ["remove the clause"],
    ),
    (
        "SOA001",
        "layout N {\n    column float32 x, y\n}\n"
        "model M {\n    input p = N{x, y} contiguous \u2038as [n, c]\n    output y = N{y}\n}\n",
        ["unexpected `as`"],
        ["contiguous`, in that order"],
    ),
    # The clauses after the block stand in one order; misspelt keywords get the nearest one.
    (
        "SOA001",
        "layout N {\n    column float32 x, y\n}\n"
        "model M {\n    input p = N{x} contiguous \u2038whole\n    output y = N{y}\n}\n",
        ["unexpected `whole`"],
        ["indexes NAME same n as NAME whole contiguous`, in that order"],
    ),
    (
        "SOA001",
        "layout N {\n    column float32 x, y\n}\nlayout K {\n    column bool k\n}\n"
        "model M {\n    input p = N{x}\n    input k = K{k} whole \u2038same n as p\n"
        "    output y = N{y}\n}\n",
        ["unexpected `same`"],
        ["in that order"],
    ),
    (
        "SOA001",
        "layout N {\n    column float32 x, y\n}\n"
        "model M {\n    input p = N{x} \u2038contigous\n    output y = N{y}\n}\n",
        ["unexpected `contigous`"],
        ["did you mean `contiguous`?"],
    ),
    (
        "SOA001",
        "layout N {\n    column int32 x, y\n}\n"
        "model M {\n    input p = N{x} as [n] \u2038indexs q\n    input q = N{y}\n"
        "    output o = N{y}\n}\n",
        ["unexpected `indexs`", "`indexes`"],
        ["did you mean `indexes`?"],
    ),
    (
        "SOA001",
        "layout N {\n    column float32 x, y\n}\n"
        "model M {\n    input p = N{x} as [n] \u2038wole\n    output y = N{y}\n}\n",
        ["unexpected `wole`", "`whole`"],
        ["did you mean `whole`?"],
    ),
    (
        "SOA001",
        "layout N {\n    column float32 x, y\n}\nlayout K {\n    column bool k\n}\n"
        "model M {\n    input p = N{x}\n    input k = K{k} same \u2038size as p\n"
        "    output y = N{y}\n}\n",
        ["unexpected `size`", "expected `n`"],
        ["the clause reads `same n as NAME`"],
    ),
    (
        "SOA001",
        "layout N {\n    column float32 x, y\n}\nlayout K {\n    column bool k\n}\n"
        "model M {\n    input p = N{x}\n    input k = K{k} same n \u2038p\n"
        "    output y = N{y}\n}\n",
        ["unexpected `p`", "expected `as`"],
        ["the clause reads `same n as NAME`"],
    ),
    (
        "SOA001",
        "layout N {\n    column float32 x, y\n}\nlayout K {\n    column bool k\n}\n"
        "model M {\n    input p = N{x}\n    input k = K{k} same n as\n    \u2038output y = N{y}\n}\n",
        ["unexpected `output`", "the name of the input whose element count it shares"],
        [],
    ),
    # `same n as` names another input of the model, bound to another layout.
    (
        "SOA312",
        "layout P {\n    column float32 pt, eta\n}\nlayout K {\n    column bool mask\n}\n"
        "model M {\n    input features = P{pt, eta}\n"
        "    input mask = K{mask} as [n] same n as \u2038feature\n    output y = P{pt}\n}\n",
        ["no input `feature`", "`mask` to share its element count with"],
        ["did you mean `features`?"],
    ),
    (
        "SOA312",
        "layout P {\n    column float32 pt, eta\n}\nlayout K {\n    column bool mask\n}\n"
        "model M {\n    input features = P{pt, eta}\n"
        "    input mask = K{mask} same n as \u2038mask\n    output y = P{pt}\n}\n",
        ["`mask` cannot share its element count with itself"],
        ["name the input"],
    ),
    (
        "SOA312",
        "layout P {\n    column float32 pt, eta\n}\nlayout K {\n    column bool mask\n}\n"
        "model M {\n    input features = P{pt, eta}\n"
        "    input mask = K{mask} same n as \u2038y\n    output y = P{pt}\n}\n",
        ["`y` is an output of model `M`", "names an input"],
        [],
    ),
    (
        "SOA312",
        "layout P {\n    column float32 pt, eta\n}\nlayout K {\n    column float32 mask\n}\n"
        "model M {\n    input features = P{pt, eta}\n"
        "    output y = K{mask} same n as \u2038features\n}\n",
        ["output `y` declares `same n as`", "only inputs"],
        ["remove the clause"],
    ),
    (
        "SOA312",
        "layout P {\n    column float32 pt, eta, phi\n}\n"
        "model M {\n    input features = P{pt, eta}\n"
        "    input phi = P{phi} same n as \u2038features\n    output y = P{pt}\n}\n",
        ["`phi` and `features` both bind `P`", "one collection"],
        ["remove the clause"],
    ),
    # `whole`: inputs only, one layout whole or sliced, both ends of `same n as` alike.
    (
        "SOA313",
        "layout N {\n    column float32 x, y\n}\n"
        "model M {\n    input p = N{x} whole\n    output y = N{y} \u2038whole\n}\n",
        ["output `y` declares `whole`", "slices every output"],
        ["remove the clause"],
    ),
    (
        "SOA313",
        "layout N {\n    column float32 x, y, z\n}\n"
        "model M {\n    input p = N{x} whole\n    input \u2038q = N{y}\n    output o = N{z}\n}\n",
        ["`p` is `whole` but `q` is not", "both bind `N`", "either sliced or passed whole"],
        ["write `whole` on every input of `N` in `M`, or on none"],
    ),
    (
        "SOA313",
        "layout N {\n    column float32 x, y, z\n}\n"
        "model M {\n    input p = N{x}\n    input q = N{y} \u2038whole\n    output o = N{z}\n}\n",
        ["`q` is `whole` but `p` is not"],
        ["or on none"],
    ),
    (
        "SOA313",
        "layout N {\n    column float32 x, y\n}\nlayout K {\n    column bool k\n}\n"
        "model M {\n    input p = N{x} whole\n    input k = K{k} same n as \u2038p\n"
        "    output y = N{y}\n}\n",
        ["`k` has the same n as `p`", "`p` is `whole` and `k` is sliced"],
        ["write `whole` on both `k` and `p`, or on neither"],
    ),
    (
        "SOA313",
        "layout N {\n    column float32 x, y\n}\nlayout K {\n    column bool k\n}\n"
        "model M {\n    input p = N{x}\n    input k = K{k} same n as \u2038p whole\n"
        "    output y = N{y}\n}\n",
        ["`k` is `whole` and `p` is sliced", "no longer match"],
        [],
    ),
    # What C++ cannot hold: reported by `--lang cpp` only, at the dtype or the name.
    (
        "SOA501",
        "layout H {\n    column float32 x\n    scalar \u2038bfloat16 w\n}\n",
        ["`w` is bfloat16", "CMSSW column"],
        ["float32"],
    ),
    (
        "SOA502",
        "layout H {\n    column \u2038uint8[2, 3, 4] m packed\n}\n",
        ["packed column `m` has rank 3", "[2, 3, 4]", "at most 2 extents"],
        ["[2, 12]"],
    ),
    (
        "SOA502",
        "layout H {\n    column \u2038float32[2, 2, 2] m\n}\n",
        ["array column `m` has rank 3"],
        ["[2, 4]"],
    ),
    (
        "SOA503",
        "layout H {\n    column float32 x, \u2038bitand\n}\n",
        ["member `bitand` is a C++ keyword"],
        ["another name"],
    ),
    (
        "SOA503",
        "layout H {\n    column float32 \u2038x_\n}\n",
        ["member `x_` gives the C++ identifier `x__`", "double underscore", "reserves"],
        ["trailing `_`"],
    ),
    (
        "SOA503",
        "layout H {\n    column float32 a__b\n}\nmodel M {\n    input \u2038in__x = H{a__b}\n"
        "    output y = H{a__b}\n}\n".replace("a__b", "a"),
        ["binding `in__x` gives the C++ identifier `in__x_binding`"],
        [],
    ),
    (
        "SOA503",
        "layout H {\n    column float32 x\n}\nlayout \u2038HSoA {\n    column float32 y\n}\n",
        ["layout `HSoA` and layout `H` both give the C++ name `HSoA`"],
        ["rename one"],
    ),
    (
        "SOA503",
        "layout A_b {\n    column float32[2] c\n}\nlayout A {\n    column float32[2] \u2038b_c\n}\n",
        ["member `b_c` of `A` and member `c` of `A_b` both give the C++ name `A_b_c_t`"],
        [],
    ),
]


@pytest.mark.parametrize(
    ("code", "text", "message_words", "hint_words"),
    CASES,
    ids=[f"{case[0]}-{number}" for number, case in enumerate(CASES)],
)
def test_diagnostic(
    tmp_path: Path, code: str, text: str, message_words: list[str], hint_words: list[str]
) -> None:
    source, line, column = marked(text)
    diagnostic = only(load_for(tmp_path, source, code))
    assert diagnostic.code == code, diagnostic
    assert (diagnostic.span.line, diagnostic.span.column) == (line, column), diagnostic
    assert diagnostic.severity == "error"
    for word in message_words:
        assert word in diagnostic.message, diagnostic.message
    for word in hint_words:
        assert diagnostic.hint is not None and word in diagnostic.hint, diagnostic.hint
    assert diagnostic.span.path.endswith("schema.soa")


def test_keywords_are_the_grammars_own_words() -> None:
    """Every quoted word of grammar.lark is a keyword the parser's hints know, with its terminal."""
    grammar = (REPO / "soagen" / "dsl" / "grammar.lark").read_text(encoding="utf-8")
    code = "\n".join(line for line in grammar.splitlines() if not line.lstrip().startswith("//"))
    words = set(re.findall(r'"([^\W\d]\w*)"', code))
    assert {"indexes", "contiguous", "same", "whole", "input", "output"} <= words
    assert set(keywords()) == words
    assert keywords()["contiguous"] == "CONTIGUOUS" and keywords()["output"] == "DIRECTION"


def test_every_code_is_covered() -> None:
    # SOA6xx are about C++ headers, not schemas: tests/tools/test_cmssw.py reports each of them
    # (`test_every_cmssw_code_is_reported`).
    cmssw = {code for code, entry in CODES.items() if entry.category == "cmssw"}
    covered = {case[0] for case in CASES} | {"SOA002", "SOA401", "SOA402", "SOA403"} | cmssw
    assert covered == set(CODES)


# --- explanations -------------------------------------------------------------------------------

# Every example of a schema error: (code, whether it should report the code, the schema).
EXAMPLES = [
    (code.id, gives, schema)
    for code in CODES.values()
    for example in code.examples
    for gives, schema in ((True, example.bad), (False, example.fixed))
    if schema is not None and example.language == "soa"  # C++ ones: tests/tools/test_cmssw.py
]


def test_every_code_is_explained() -> None:
    for code, entry in CODES.items():
        text = entry.text()
        assert text == text.strip() and "\n\n\n" not in text, code
        assert max(len(line) for line in text.splitlines()) <= 92, code
        assert len(entry.explanation.splitlines()) <= 12, code


def test_explanation_examples_are_found() -> None:
    """Every code but the multi-file ones has an example (SOA002 needs an unreadable file, SOA402
    and SOA403 several files), and the text `soagen explain` prints shows each of them."""
    with_errors = {code for code, gives, _ in EXAMPLES if gives}
    cpp = {code for code, entry in CODES.items() if entry.category == "cmssw"}
    assert with_errors == set(CODES) - {"SOA002", "SOA402", "SOA403"} - cpp
    for code, entry in CODES.items():
        labels = re.findall(r"^(?:Gives SOA\d{3}|Fixed):$", entry.text(), re.MULTILINE)
        shown = sum(1 for e in entry.examples for text in (e.bad, e.fixed) if text is not None)
        assert len(labels) == shown, code


@pytest.mark.parametrize(
    ("code", "gives", "schema"),
    EXAMPLES,
    ids=[f"{code}-{'gives' if gives else 'fixed'}" for code, gives, _ in EXAMPLES],
)
def test_explanation_examples(tmp_path: Path, code: str, gives: bool, schema: str) -> None:
    """A `Gives` example reports its code and only that one; a `Fixed` one loads and generates."""
    result = load_for(tmp_path, schema, code)
    if gives:
        assert {d.code for d in result.diagnostics} == {code}, result.diagnostics
    else:
        assert result.diagnostics == [], result.diagnostics
        assert generate(result.unwrap())
        if CODES[code].category == "cpp":
            assert cpp_problems(result.unwrap()) == []
            assert generate_cpp(result.unwrap())


# --- several files ------------------------------------------------------------------------------

COMMON = "layout Tracks {\n    column float32 px, py\n}\n"


def test_imported_layouts_are_usable(tmp_path: Path) -> None:
    (tmp_path / "common.soa").write_text(COMMON)
    result = load_text(
        tmp_path,
        'import "common.soa"\nlayout Out {\n    column float32 s\n}\n'
        "model M {\n    input t = Tracks{px, py}\n    output s = Out{s}\n}\n",
    )
    assert result.diagnostics == []
    assert result.schema is not None
    assert [f.module_name for f in result.schema.files] == ["common", "schema"]


def test_missing_import(tmp_path: Path) -> None:
    source, line, column = marked('// shared\nimport \u2038"nowhere/common.soa"\n')
    diagnostic = only(load_text(tmp_path, source))
    assert diagnostic.code == "SOA401"
    assert (diagnostic.span.line, diagnostic.span.column) == (line, column)
    assert "cannot import" in diagnostic.message and "common.soa" in diagnostic.message
    assert "No such file" in diagnostic.message


def test_missing_import_still_reports_the_other_errors(tmp_path: Path) -> None:
    """The layouts of the missing file are unknown, so only *their* absence goes unreported."""
    result = load_text(
        tmp_path,
        'import "gone.soa"\nlayout A {\n    column flot x\n}\n'
        "model M {\n    input t = Tracks{px}\n    output a = A{x}\n}\n",
    )
    assert [(d.code, d.span.line) for d in result.diagnostics] == [("SOA401", 1), ("SOA101", 3)]


def test_import_of_a_directory_or_device(tmp_path: Path) -> None:
    (tmp_path / "folder.soa").mkdir()
    result = load_text(tmp_path, 'import "folder.soa"\n')
    assert only(result).code == "SOA401"
    assert "not a regular file" in only(result).message
    if Path("/dev/null").exists():  # a device would block or never end
        assert only(load_text(tmp_path, 'import "/dev/null"\n')).code == "SOA401"


def test_import_path_with_nul_or_empty(tmp_path: Path) -> None:
    for target in ("a\x00b.soa", ""):
        diagnostic = only(load_text(tmp_path, f'import "{target}"\n'))
        assert diagnostic.code == "SOA401"
        assert (diagnostic.span.line, diagnostic.span.column) == (1, 8)
        assert "\x00" not in diagnostic.message


def test_import_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.soa").write_text('import "b.soa"\nlayout A {\n    column float32 x\n}\n')
    (tmp_path / "b.soa").write_text('// b needs a\n\nimport "a.soa"\n')
    result = load(tmp_path / "a.soa")
    diagnostic = only(result)
    assert diagnostic.code == "SOA402"
    assert diagnostic.span.path.endswith("b.soa")
    assert (diagnostic.span.line, diagnostic.span.column) == (3, 8)
    assert re.search(r"a\.soa -> .*b\.soa -> .*a\.soa", diagnostic.message)
    assert diagnostic.hint is not None and "both import" in diagnostic.hint


def test_a_file_importing_itself(tmp_path: Path) -> None:
    diagnostic = only(load_text(tmp_path, 'import "schema.soa"\n'))
    assert diagnostic.code == "SOA402"


def test_same_name_in_two_files(tmp_path: Path) -> None:
    (tmp_path / "common.soa").write_text(COMMON)
    source, line, column = marked(
        'import "common.soa"\n\nlayout \u2038Tracks {\n    column float32 pt\n}\n'
    )
    diagnostic = only(load_text(tmp_path, source))
    assert diagnostic.code == "SOA403"
    assert (diagnostic.span.line, diagnostic.span.column) == (line, column)
    assert "`Tracks` is also declared in" in diagnostic.message
    assert "common.soa" in diagnostic.message
    assert diagnostic.related and diagnostic.related[0][1].path.endswith("common.soa")


def test_two_files_one_module_name(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "common.soa").write_text(COMMON)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "common.soa").write_text("layout Hits {\n    column float32 e\n}\n")
    result = load_text(tmp_path, 'import "a/common.soa"\nimport "b/common.soa"\n')
    diagnostic = only(result)
    assert diagnostic.code == "SOA403"
    assert "both generate module `common`" in diagnostic.message


@pytest.mark.parametrize("name", ["my-schema.soa", "class.soa", "2fast.soa", "__init__.soa"])
def test_file_names_that_cannot_become_modules(tmp_path: Path, name: str) -> None:
    diagnostic = only(load_text(tmp_path, COMMON, name=name))
    assert diagnostic.code == "SOA108"
    assert (diagnostic.span.line, diagnostic.span.column) == (1, 1)
    assert "module" in diagnostic.message
    assert diagnostic.hint is not None and "rename the file" in diagnostic.hint


def test_unreadable_root(tmp_path: Path) -> None:
    diagnostic = only(load(tmp_path / "missing.soa"))
    assert diagnostic.code == "SOA002"
    assert "cannot read" in diagnostic.message
    (tmp_path / "latin1.soa").write_bytes("// caf\xe9\n".encode("latin-1"))
    diagnostic = only(load(tmp_path / "latin1.soa"))
    assert diagnostic.code == "SOA002" and "UTF-8" in diagnostic.message


def test_long_import_chain_needs_no_recursion(tmp_path: Path) -> None:
    """Deeper than Python's recursion limit: the loader walks imports with its own stack."""
    depth = 1100
    for k in range(depth):
        text = f'import "f{k + 1}.soa"\n' if k < depth - 1 else COMMON
        (tmp_path / f"f{k}.soa").write_text(text)
    result = load(tmp_path / "f0.soa")
    assert result.diagnostics == []
    assert result.schema is not None and len(result.schema.files) == depth
    assert result.schema.files[0].module_name == f"f{depth - 1}"  # dependencies first


# --- many errors, odd text ----------------------------------------------------------------------


def test_all_errors_of_a_file_are_reported_together(tmp_path: Path) -> None:
    text = (
        "layout A {\n"  # 1
        "    align 96\n"  # 2: SOA201
        "    column flot32 x\n"  # 3: SOA101
        "    column float32 def\n"  # 4: SOA107
        "    column float32[0] m\n"  # 5: SOA203
        "}\n"
        "layout A {\n"  # 7: SOA104
        "    column float32 y\n"
        "}\n"
        "model M {\n"
        "    input a = B{x}\n"  # 11: SOA102
        "}\n"  # SOA110: no output (at the model name, line 10)
    )
    result = load_text(tmp_path, text)
    assert [(d.code, d.span.line) for d in result.diagnostics] == [
        ("SOA201", 2),
        ("SOA101", 3),
        ("SOA107", 4),
        ("SOA203", 5),
        ("SOA104", 7),
        ("SOA110", 10),
        ("SOA102", 11),
    ]


def test_errors_of_several_files_are_reported_together(tmp_path: Path) -> None:
    (tmp_path / "common.soa").write_text("layout Tracks {\n    column float32 px, px\n}\n")
    result = load_text(tmp_path, 'import "common.soa"\nlayout B {\n    column float32[-1] q\n}\n')
    assert {(Path(d.span.path).name, d.code) for d in result.diagnostics} == {
        ("common.soa", "SOA105"),
        ("schema.soa", "SOA203"),
    }


def test_empty_file_is_valid(tmp_path: Path) -> None:
    result = load_text(tmp_path, "")
    assert result.diagnostics == [] and result.schema is not None
    assert result.schema.root.layouts == () and result.schema.root.models == ()


def test_file_of_only_comments_is_valid(tmp_path: Path) -> None:
    result = load_text(tmp_path, "# one\n// two\n//// four\n\n   # indented\n//! about\n")
    assert result.diagnostics == [] and result.schema is not None
    assert result.schema.root.layouts == ()
    assert result.schema.root.doc == "about"


def test_module_docs_anywhere_at_top_level(tmp_path: Path) -> None:
    result = load_text(tmp_path, "//! first\n" + COMMON + "//! second\n")
    assert result.schema is not None
    assert result.schema.root.doc == "first\nsecond"


def test_crlf_gives_the_same_schema_and_columns(tmp_path: Path) -> None:
    lf = "/// Tracks.\nlayout Tracks {\n    /// Momentum.\n    column float32 px, py\n}\n"
    a = load_text(tmp_path, lf, "lf.soa").schema
    b = load_text(tmp_path, lf.replace("\n", "\r\n"), "crlf.soa").schema
    assert a is not None and b is not None
    assert a.root.layouts[0].doc == b.root.layouts[0].doc == "Tracks."
    assert [m.doc for m in b.root.layouts[0].members] == ["Momentum.", "Momentum."]
    spans = [[(m.span.line, m.span.column) for m in s.root.layouts[0].members] for s in (a, b)]
    assert spans == [[(4, 20), (4, 24)]] * 2
    result = load_text(tmp_path, "layout A {\r\n    column flot32 x\r\n}\r\n")
    diagnostic = only(result)
    assert (diagnostic.span.line, diagnostic.span.column) == (2, 12)
    rendered = render_text(result.diagnostics, result.sources)
    assert "\r" not in rendered


def test_tabs_count_as_one_column_and_stay_in_the_caret_line(tmp_path: Path) -> None:
    result = load_text(tmp_path, "layout A {\n\tcolumn\tflot32 x\n}\n")
    diagnostic = only(result)
    assert (diagnostic.span.line, diagnostic.span.column) == (2, 9)
    lines = render_text(result.diagnostics, result.sources).splitlines()
    assert lines[1] == "2 | \tcolumn\tflot32 x"
    assert lines[2] == "    \t      \t^^^^^^"


def test_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    result = load_text(tmp_path, "\ufeff" + COMMON)
    assert result.diagnostics == [] and result.schema is not None


def test_unicode_names_are_refused_with_a_reason(tmp_path: Path) -> None:
    result = load_text(
        tmp_path, "layout Spuren {\n    column float32 \u03c0, \u540d\u524d, x\u2081\n}\n"
    )
    assert [(d.code, d.span.column) for d in result.diagnostics] == [
        ("SOA107", 20),
        ("SOA107", 23),
        ("SOA107", 27),
    ]
    assert all("not ASCII" in d.message for d in result.diagnostics)


def test_same_block_written_with_or_without_default_axes(tmp_path: Path) -> None:
    """`as [n, c]` is the default for two columns, `+3` is `3`: neither makes a second block."""
    text = (
        "layout A {\n    column float32 x, y\n    column float32[3] v\n}\n"
        "layout O {\n    column float32 o\n}\n"
        "model M {\n    input a = A{x, y} as [n, c]\n    input v = A{v} as [n, +3]\n"
        "    output o = O{o}\n}\n"
        "model N {\n    input a = A{x, y}\n    input v = A{v} as [n, 03]\n    output o = O{o}\n}\n"
    )
    result = load_text(tmp_path, text)
    assert result.diagnostics == []
    assert result.schema is not None
    axes = [b.axes for b in result.schema.root.models[0].bindings]
    assert axes[1] is not None and [a.text for a in axes[1]] == ["n", "3"]


def test_scalar_blocks_are_inputs_only(tmp_path: Path) -> None:
    """Scalars broadcast as inputs; as outputs they are refused at the block's first member, and a
    block mixing kinds keeps its SOA306 alone."""
    layout = "layout P {\n    scalar float32 p, q\n    column float32 v\n}\n"
    valid = layout + "model M {\n    input pq = P{p, q} as [c, n]\n    output v = P{v}\n}\n"
    assert load_text(tmp_path, valid).schema is not None
    single = layout + "model M {\n    input v = P{v}\n    output q = P{\u2038q}\n}\n"
    source, line, column = marked(single)
    diagnostic = only(load_text(tmp_path, source))
    assert diagnostic.code == "SOA309"
    span = diagnostic.span
    assert (span.line, span.column) == (line, column)
    assert (span.end_line, span.end_column) == (line, column + 1)  # the member `q`
    mixed = layout + "model M {\n    input v = P{v}\n    output qv = P{q, v}\n}\n"
    assert only(load_text(tmp_path, mixed)).code == "SOA306"


def test_unknown_dtype_is_reported_once(tmp_path: Path) -> None:
    text = (
        "layout A {\n    column flot32 x\n    column float32 y\n}\n"
        "model M {\n    input a = A{x, y} as [n, c]\n    output b = A{y}\n}\n"
    )
    diagnostic = only(load_text(tmp_path, text))
    assert (diagnostic.code, diagnostic.span.line, diagnostic.hint) == (
        "SOA101",
        2,
        "did you mean `float32`?",
    )


def test_huge_numbers_never_raise(tmp_path: Path) -> None:
    for text in (
        "layout A {\n    align 99999999999999999999\n    column float32 x\n}\n",
        "layout A {\n    align " + "9" * 10_000 + "\n    column float32 x\n}\n",
        "layout A {\n    column float32[" + str(10**30) + "] x\n}\n",
        "layout A {\n    column float32[" + ", ".join(["1000000"] * 8) + "] x\n}\n",
        "layout A {\n    column float32[" + "-" + "9" * 6000 + "] x\n}\n",
    ):
        result = load_text(tmp_path, text)
        assert result.schema is None
        assert {d.code for d in result.diagnostics} <= {"SOA201", "SOA203", "SOA204"}
        assert len(result.diagnostics) == 1
        render_text(result.diagnostics, result.sources)  # printable too


# --- rendering ----------------------------------------------------------------------------------


def test_rendered_form(tmp_path: Path) -> None:
    result = load_text(
        tmp_path,
        "layout Nodes {\n    column float32 x, y\n    column int32 id\n    column float32 z\n}\n"
        "model M {\n    input a = Nodes{x, y, z}\n    output b = Nodes{x}\n}\n",
    )
    path = result.diagnostics[0].span.path
    assert path.endswith("schema.soa")
    assert render_text(result.diagnostics, result.sources).splitlines() == [
        f"{path}:7:21: error[SOA303]: block `Nodes{{x, y, z}}` is not zero-copy: `id` lies between"
        " its columns",
        "7 |     input a = Nodes{x, y, z}",
        "                        ^",
        "  hint: reorder the columns of Nodes so that x, y, z are adjacent",
    ]


def test_rendered_related_note_and_caret_width(tmp_path: Path) -> None:
    result = load_text(tmp_path, "layout A {\n    column float32 xx\n    column int8 xx\n}\n")
    lines = render_text(result.diagnostics, result.sources).splitlines()
    path = result.diagnostics[0].span.path
    assert lines == [
        f"{path}:3:17: error[SOA105]: `A` declares `xx` twice",
        "3 |     column int8 xx",
        "                    ^^",
        f"  note: first declared at {path}:2:20",
    ]


def test_rendered_lines_follow_the_parser_not_splitlines(tmp_path: Path) -> None:
    """Form feeds and U+2028 do not end a line for the parser, so not for the renderer either."""
    text = "// a\x0cb \u2028 c\nlayout A {\n    column flot32 x\n}\n"
    result = load_text(tmp_path, text)
    diagnostic = only(result)
    assert (diagnostic.span.line, diagnostic.span.column) == (3, 12)
    lines = render_text(result.diagnostics, result.sources).splitlines()
    assert lines[1] == "3 |     column flot32 x"
    assert lines[2] == "               ^^^^^^"


def test_rendered_invisible_characters_are_shown_and_aligned(tmp_path: Path) -> None:
    result = load_text(tmp_path, "layout A {\x00 column float32 x }\n")
    diagnostic = only(result)
    assert diagnostic.code == "SOA001" and "U+0000" in diagnostic.message
    lines = render_text(result.diagnostics, result.sources).splitlines()
    assert "\x00" not in "\n".join(lines)
    assert lines[1] == "1 | layout A {\ufffd column float32 x }"
    assert lines[2].index("^") == lines[1].index("\ufffd")


def test_rendered_caret_under_wide_characters(tmp_path: Path) -> None:
    result = load_text(tmp_path, "layout \u540d\u524d {\n    column float32 x\n}\n")
    lines = render_text(result.diagnostics, result.sources).splitlines()
    assert lines[1] == "1 | layout \u540d\u524d {"
    assert lines[2] == "           ^^^^"  # two characters, four terminal cells


def test_rendered_end_of_file(tmp_path: Path) -> None:
    result = load_text(tmp_path, "layout A {\n    column float32 x\n\n\n")
    diagnostic = only(result)
    assert (diagnostic.span.line, diagnostic.span.column) == (2, 21)
    lines = render_text(result.diagnostics, result.sources).splitlines()
    assert lines[2] == "                        ^"


# --- nothing gets through unchecked ----------------------------------------------------------------

WORDS = [
    "layout", "model", "import", "align", "column", "scalar", "input", "output", "as", "n", "c",
    "x", "y", "A", "B", "M", "float32", "int8", "float64", "flot", "class", "property", "size",
    "_x", "\u00e9", "{", "}", "[", "]", ",", "=", "3", "0", "-1", "+2", "128", "99999999999999999999999999999999",
    '"a.soa"', '"schema.soa"', '"x\\y"', "///", "/// doc", "//!", "#", "\n", "\r\n", "\t", " ", "\x00",
    "\u2028", "\ufeff",
]  # fmt: skip


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(st.sampled_from(WORDS), max_size=40).map(" ".join))
def test_any_text_gives_diagnostics_or_a_clean_schema(tmp_path: Path, text: str) -> None:
    (tmp_path / "a.soa").write_text("layout A {\n    column float32 x, y\n}\n")
    result = load_text(tmp_path, text)
    rendered = render_text(result.diagnostics, result.sources)
    if result.schema is None:
        assert result.diagnostics
        assert all(d.code in CODES for d in result.diagnostics)
        assert rendered.count("error[SOA") == len(result.diagnostics)
        return
    assert result.diagnostics == []
    # Whatever was accepted is safe to print as Python: ASCII identifiers, no keywords.
    for schema_file in result.schema.files:
        names = [layout.name for layout in schema_file.layouts]
        names += [model.name for model in schema_file.models]
        names += [m.name for layout in schema_file.layouts for m in layout.members]
        names += [b.name for model in schema_file.models for b in model.bindings]
        for name in names:
            assert name.isascii() and name.isidentifier() and not keyword.iskeyword(name)
            assert not name.startswith("_")


def test_a_name_declared_twice_in_a_model_is_one_error(tmp_path: Path) -> None:
    """The second `a` names another block, but that is the same mistake, reported once."""
    result = load_text(
        tmp_path,
        "layout A {\n    column float32 x, y\n}\nmodel M {\n    input a = A{x}\n"
        "    output a = A{y}\n}\n",
    )
    assert [(d.code, d.span.line) for d in result.diagnostics] == [("SOA106", 6)]


def test_a_file_that_is_not_utf8_is_refused_where_its_bad_byte_is(tmp_path: Path) -> None:
    schema = tmp_path / "latin.soa"
    schema.write_bytes("layout A {\n    column float32 énergie\n}\n".encode("latin-1"))
    (problem,) = load(schema).diagnostics
    assert (problem.code, problem.span.line, problem.span.column) == ("SOA002", 2, 20)
    assert "byte 0xe9 at line 2, column 20 (save it as UTF-8)" in problem.message
    # After a byte order mark, which the parser never sees, on the first line as well.
    marked = tmp_path / "marked.soa"
    marked.write_bytes(b"\xef\xbb\xbflayout \xe9 {}\n")
    (problem,) = load(marked).diagnostics
    assert (problem.span.line, problem.span.column) == (1, 8)
    assert "byte 0xe9 at line 1, column 8" in problem.message
    # fmt says the same, as a schema error (exit 1), not a usage error.
    from tests.helpers import run_cli

    status, _, err = run_cli("fmt", str(schema), "--color", "never")
    assert status == 1 and ":2:20: error[SOA002]" in err
