"""`soagen.dsl.layout` against a reference written here from the byte-layout rules alone.

The reference never calls `soagen.dsl.layout` (nor `soagen.dsl.dtypes`): it walks the members in declaration
order with CMSSW's rules and computes the byte address of every value it is asked about, one at a
time. The symbolic forms of `soagen.dsl.layout` (offsets, sizes, member and block views) are evaluated at
many n and alignments and must give the same addresses: a view's address is
`offset + sum(index * stride) * itemsize`.

Rules (CMSSW GENERATE_SOA_LAYOUT), with round_up(s, A) = ceil(s / A) * A:
- a column of T: pitch round_up(n * sizeof(T), A);
- a scalar of T: pitch round_up(sizeof(T), A) whatever n;
- an array column of shape S: prod(S) coefficient columns, each round_up(n * sizeof(T), A) bytes
  apart, column-major: coefficient (r, c) of element i at offset + ((r + c * rows) * stride + i) *
  sizeof(T), stride = round_up(n * sizeof(T), A) / sizeof(T);
- a packed array column of shape S (CMSSW's `SOA_COLUMN(edm::StdArray<T, k>)`): one column of
  prod(S)-value structs, pitch round_up(n * prod(S) * sizeof(T), A); value (r, c) of element i at
  offset + (i * prod(S) + r * cols + c) * sizeof(T) (nested arrays, row-major);
- members follow each other from the buffer start; the size is the sum of the pitches.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soagen.dsl.check import check_file, resolve_file
from soagen.dsl.ir import Binding, Layout, SchemaFile
from soagen.dsl.layout import block_view, byte_size, member_offsets, member_view
from soagen.dsl.parser import parse

# sizeof(T) of every dtype, from the language reference, not from soagen.dsl.dtypes.
SIZES = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
}
ALIGNMENTS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 4096]
SIZES_N = [0, 1, 10, 31, 32, 33, 1000, 10**7]


# --- the reference ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RefMember:
    name: str
    kind: str  # "column", "packed" or "scalar"
    dtype: str
    shape: tuple[int, ...] = ()


def ceil_to(size: int, align: int) -> int:
    return (size + align - 1) // align * align


def ref_pitch(member: RefMember, n: int, align: int) -> int:
    size = SIZES[member.dtype]
    if member.kind == "scalar":
        return ceil_to(size, align)
    if member.kind == "packed":
        return ceil_to(n * math.prod(member.shape) * size, align)
    return math.prod(member.shape) * ceil_to(n * size, align)


def ref_offsets(members: list[RefMember], n: int, align: int) -> tuple[dict[str, int], int]:
    offsets: dict[str, int] = {}
    position = 0
    for member in members:
        offsets[member.name] = position
        position += ref_pitch(member, n, align)
    return offsets, position


def ref_address(
    member: RefMember, offset: int, n: int, align: int, element: int, coefficient: tuple[int, ...]
) -> int:
    """Byte address of one value of a member starting at `offset`: element `element`, array
    coefficient `coefficient` (column-major; row-major inside a packed element)."""
    size = SIZES[member.dtype]
    if member.kind == "scalar":
        return offset  # one value, whatever the element
    assert 0 <= element < n
    if member.kind == "packed":
        inside = 0
        for index, extent in zip(coefficient, member.shape, strict=True):
            assert 0 <= index < extent
            inside = inside * extent + index
        return offset + (element * math.prod(member.shape) + inside) * size
    linear, step = 0, 1
    for index, extent in zip(coefficient, member.shape, strict=True):
        assert 0 <= index < extent
        linear += index * step
        step *= extent
    stride = ceil_to(n * size, align) // size
    return offset + (linear * stride + element) * size


class Reference:
    """The layout of one list of members for one n and A."""

    def __init__(self, members: list[RefMember], n: int, align: int) -> None:
        self.members = {m.name: m for m in members}
        self.n, self.align = n, align
        self.offsets, self.total = ref_offsets(members, n, align)

    def address(self, name: str, element: int, coefficient: tuple[int, ...]) -> int:
        member, offset = self.members[name], self.offsets[name]
        return ref_address(member, offset, self.n, self.align, element, coefficient)

    def block_address(self, names: list[str], axes: list[str], index: tuple[int, ...]) -> int:
        """One entry of a block view: `n` picks the element, `c` the member of the block, the array
        axes (in declared order) the coefficient."""
        element, column, coefficient = 0, 0, []
        for axis, i in zip(axes, index, strict=True):
            if axis == "n":
                element = i
            elif axis == "c":
                column = i
            else:
                coefficient.append(i)
        return self.address(names[column], element, tuple(coefficient))


# --- helpers ------------------------------------------------------------------------------------


def schema_text(
    members: list[RefMember], align: int, blocks: list[tuple[list[str], list[str]]]
) -> str:
    lines = ["layout L {", f"    align {align}"]
    for m in members:
        shape = f"[{', '.join(map(str, m.shape))}]" if m.shape else ""
        if m.kind == "packed":
            lines.append(f"    column {m.dtype}{shape} {m.name} packed")
        else:
            lines.append(f"    {m.kind} {m.dtype}{shape} {m.name}")
    lines.append("}")
    if blocks:
        lines.append("layout Out {\n    column float32 out\n}")
        lines.append("model M {")
        for number, (names, axes) in enumerate(blocks):
            lines.append(f"    input b{number} = L{{{', '.join(names)}}} as [{', '.join(axes)}]")
        lines.append("    output out = Out{out}")
        lines.append("}")
    return "\n".join(lines) + "\n"


Blocks = list[tuple[list[str], list[str]]]  # (member names, axes) of each block


def parsed(
    members: list[RefMember], align: int, blocks: Blocks | None = None
) -> tuple[Layout, list[Binding]]:
    """The IR of the schema, which the checker must accept."""
    text = schema_text(members, align, blocks or [])
    schema_file, problems = parse(text, "reference.soa")
    assert schema_file is not None and not problems, problems
    assert isinstance(schema_file, SchemaFile)
    layouts = {layout.name: layout for layout in schema_file.layouts}
    problems = check_file(schema_file, layouts)
    assert not problems, (text, problems)
    schema_file = resolve_file(schema_file, layouts)
    bindings = list(schema_file.models[0].inputs) if schema_file.models else []
    return layouts["L"], bindings


def sample_indices(shape: tuple[int, ...], limit: int, rng: random.Random) -> list[tuple[int, ...]]:
    """Every index when there are few, else the corners and a random sample."""
    if any(extent == 0 for extent in shape):
        return []
    if math.prod(shape) <= limit:
        return list(itertools.product(*(range(extent) for extent in shape)))
    corners = list(itertools.product(*({0, extent - 1} for extent in shape)))
    return corners + [tuple(rng.randrange(extent) for extent in shape) for _ in range(limit)]


def view_address(
    strides: tuple[int, ...], offset: int, itemsize: int, index: tuple[int, ...]
) -> int:
    return offset + sum(i * s for i, s in zip(index, strides, strict=True)) * itemsize


def assert_layout_matches(
    members: list[RefMember],
    align: int,
    sizes: list[int],
    blocks: Blocks | None = None,
    seed: int = 0,
    samples: int = 100,
) -> None:
    """Offsets, size, every member view and every block view, at each n in `sizes`."""
    blocks = blocks or []
    layout, bindings = parsed(members, align, blocks)
    rng = random.Random(seed)
    for n in sizes:
        ref = Reference(members, n, align)
        got = {name: form.evaluate(n, align) for name, form in member_offsets(layout).items()}
        assert got == ref.offsets, (n, align)
        assert byte_size(layout).evaluate(n, align) == ref.total, (n, align)
        for member in members:
            size = SIZES[member.dtype]
            ir_member = layout.member(member.name)
            assert ir_member is not None
            form = member_view(layout, ir_member)
            assert form.dtype == member.dtype
            shape, strides, offset = form.evaluate(n, align)
            if member.kind == "scalar":
                assert (shape, strides, offset) == ((), (), ref.offsets[member.name])
                continue
            assert shape == (n, *member.shape)
            for index in sample_indices(shape, samples, rng):
                expected = ref.address(member.name, index[0], index[1:])
                assert view_address(strides, offset, size, index) == expected, (member, n, index)
            if n:  # the last value ends inside the buffer
                last = tuple(extent - 1 for extent in member.shape)
                assert ref.address(member.name, n - 1, last) + size <= ref.total
        for binding, (names, axes) in zip(bindings, blocks, strict=True):
            first = ref.members[names[0]]
            form = block_view(binding)
            shape, strides, offset = form.evaluate(n, align)
            extents = iter(first.shape)
            expected_shape = tuple(
                n if axis == "n" else len(names) if axis == "c" else next(extents) for axis in axes
            )
            assert shape == expected_shape, (names, axes)
            assert form.dtype == first.dtype
            for index in sample_indices(shape, samples, rng):
                expected = ref.block_address(names, axes, index)
                got_address = view_address(strides, offset, SIZES[first.dtype], index)
                assert got_address == expected, (names, axes, n, index)


# --- the worked example ----------------------------------------------------------------------------

EXAMPLE = [
    RefMember("x", "column", "float32"),
    RefMember("y", "column", "float32"),
    RefMember("z", "column", "float32"),
    RefMember("id", "column", "int32"),
    RefMember("bfield", "scalar", "float64"),
    RefMember("v", "column", "float32", (3,)),
]


@pytest.mark.parametrize(
    ("align", "offsets", "total", "v_stride"),
    [
        (128, {"x": 0, "y": 128, "z": 256, "id": 384, "bfield": 512, "v": 640}, 1024, 32),
        (64, {"x": 0, "y": 64, "z": 128, "id": 192, "bfield": 256, "v": 320}, 512, 16),
    ],
)
def test_worked_example_matches_cmssw(
    align: int, offsets: dict[str, int], total: int, v_stride: int
) -> None:
    layout, _ = parsed(EXAMPLE, align)
    assert {k: f.evaluate(10, align) for k, f in member_offsets(layout).items()} == offsets
    assert byte_size(layout).evaluate(10, align) == total
    v = layout.member("v")
    assert v is not None
    assert member_view(layout, v).evaluate(10, align) == ((10, 3), (1, v_stride), offsets["v"])
    # The reference agrees with CMSSW's numbers too.
    assert ref_offsets(EXAMPLE, 10, align) == (offsets, total)


@pytest.mark.parametrize("n", SIZES_N)
@pytest.mark.parametrize("align", [8, 16, 32, 64, 128, 256, 4096])
def test_worked_example_at_every_size(n: int, align: int) -> None:
    blocks = [(["x", "y", "z"], ["n", "c"]), (["x", "y", "z"], ["c", "n"]), (["v"], ["3", "n"])]
    assert_layout_matches(EXAMPLE, align, [n], blocks)


def test_empty_collection_keeps_scalars() -> None:
    """n = 0: columns take no bytes, a scalar still takes A."""
    layout, _ = parsed(EXAMPLE, 128)
    assert byte_size(layout).evaluate(0, 128) == 128
    assert member_offsets(layout)["v"].evaluate(0, 128) == 128


# --- every dtype, every alignment, every n ----------------------------------------------------------


@pytest.mark.parametrize("dtype", sorted(SIZES))
def test_every_dtype(dtype: str) -> None:
    members = [
        RefMember("head", "column", "uint8"),
        RefMember("a", "column", dtype),
        RefMember("b", "column", dtype),
        RefMember("s", "scalar", dtype),
        RefMember("t", "scalar", dtype),
        RefMember("m", "column", dtype, (2, 3)),
        RefMember("w", "column", dtype, (2, 3)),
        RefMember("tail", "column", "float64"),
    ]
    blocks = [
        (["a", "b"], ["n", "c"]),
        (["a", "b"], ["c", "n"]),
        (["s", "t"], ["n", "c"]),
        (["s", "t"], ["c", "n"]),
        (["s"], ["n"]),
        (["m", "w"], ["n", "c", "2", "3"]),
        (["m", "w"], ["2", "n", "c", "3"]),
    ]
    for align in ALIGNMENTS:
        if align < 8:  # `tail` is float64: the checker wants A >= 8
            continue
        assert_layout_matches(members, align, SIZES_N, blocks, seed=align)


@pytest.mark.parametrize("dtype", sorted(SIZES))
def test_small_alignments_down_to_the_item_size(dtype: str) -> None:
    """A may be as small as the largest item: 1 for bytes, 2 for halves, ..."""
    members = [
        RefMember("a", "column", dtype),
        RefMember("s", "scalar", dtype),
        RefMember("m", "column", dtype, (3,)),
    ]
    for align in ALIGNMENTS:
        if align < SIZES[dtype]:
            continue
        assert_layout_matches(members, align, SIZES_N, [(["m"], ["n", "3"])])


# --- arrays of rank 1-3 and block views in every axis order the language allows ------------------


def axis_orders(shape: tuple[int, ...], with_c: bool) -> list[list[str]]:
    """Every order of n, c and the array extents in which the extents keep their declared order."""
    tokens = ["n", *(["c"] if with_c else []), *(f"#{k}" for k in range(len(shape)))]
    orders = []
    for order in itertools.permutations(tokens):
        positions = [order.index(f"#{k}") for k in range(len(shape))]
        if positions == sorted(positions):
            orders.append([t if not t.startswith("#") else str(shape[int(t[1:])]) for t in order])
    return orders


@pytest.mark.parametrize("shape", [(3,), (3, 3), (2, 3), (2, 3, 4), (4, 1, 2)], ids=str)
def test_array_blocks_in_every_axis_order(shape: tuple[int, ...]) -> None:
    members = [
        RefMember("pad", "column", "int16"),
        RefMember("p", "column", "float32", shape),
        RefMember("q", "column", "float32", shape),
        RefMember("r", "column", "float32", shape),
    ]
    blocks = [(["p", "q", "r"], order) for order in axis_orders(shape, with_c=True)]
    blocks += [(["q"], order) for order in axis_orders(shape, with_c=False)]
    blocks += [(["q"], order) for order in axis_orders(shape, with_c=True)]  # c of one column
    assert len(blocks) == 2 * math.factorial(len(shape) + 2) // math.factorial(len(shape)) + (
        math.factorial(len(shape) + 1) // math.factorial(len(shape))
    )
    for align in (16, 64, 128, 4096):
        sizes = [0, 1, 7, 33, 1000]
        assert_layout_matches(members, align, sizes, blocks, seed=align, samples=30)


def test_axis_orders_include_the_documented_examples() -> None:
    orders = axis_orders((3, 3), with_c=True)
    for example in (
        ["n", "c", "3", "3"],
        ["3", "n", "c", "3"],
        ["c", "n", "3", "3"],
        ["3", "3", "c", "n"],
    ):
        assert example in orders


def test_default_axes_are_n_c_then_extents() -> None:
    members = [
        RefMember("p", "column", "float64", (2, 5)),
        RefMember("q", "column", "float64", (2, 5)),
    ]
    text = schema_text(members, 64, []) + (
        "layout Out {\n    column float32 out\n}\n"
        "model M {\n    input both = L{p, q}\n    input one = L{p}\n    output out = Out{out}\n}\n"
    )
    parsed_file, problems = parse(text, "defaults.soa")
    assert parsed_file is not None and not problems
    schema_file = resolve_file(parsed_file, {item.name: item for item in parsed_file.layouts})
    both, one = schema_file.models[0].inputs
    n = 19
    stride = ceil_to(n * 8, 64) // 8
    assert block_view(both).evaluate(n, 64) == (
        (n, 2, 2, 5),
        (1, 10 * stride, stride, 2 * stride),
        0,
    )
    assert block_view(one).evaluate(n, 64) == ((n, 2, 5), (1, stride, 2 * stride), 0)


def test_scalars_broadcast_over_elements() -> None:
    members = [
        RefMember("x", "column", "float32"),
        RefMember("s1", "scalar", "float64"),
        RefMember("s2", "scalar", "float64"),
        RefMember("s3", "scalar", "float64"),
    ]
    layout, (both, alone) = parsed(members, 64, [(["s1", "s2", "s3"], ["c", "n"]), (["s2"], ["n"])])
    n = 10
    # x takes 64 bytes; each scalar 64 bytes = 8 float64 apart; stride 0 along n.
    assert block_view(both).evaluate(n, 64) == ((3, n), (8, 0), 64)
    assert block_view(alone).evaluate(n, 64) == ((n,), (0,), 128)


# --- random layouts ---------------------------------------------------------------------------------


def adjacent_alike_run(
    draw: st.DrawFn,
    members: Sequence[RefMember],
    kinds: Sequence[str] = ("column", "packed", "scalar"),
) -> list[RefMember]:
    """A random run of adjacent members of one kind, dtype and shape: what a block may bind; its
    kind is one of `kinds` (outputs bind only columns), which some member must have."""
    start = draw(st.sampled_from([i for i, member in enumerate(members) if member.kind in kinds]))
    first = members[start]
    end = start + 1
    while (
        end < len(members)
        and (members[end].kind, members[end].dtype, members[end].shape)
        == (first.kind, first.dtype, first.shape)
        and draw(st.booleans())
    ):
        end += 1
    return list(members[start:end])


@st.composite
def random_layouts(
    draw: st.DrawFn,
) -> tuple[list[RefMember], int, int, list[tuple[list[str], list[str]]]]:
    count = draw(st.integers(1, 8))
    members: list[RefMember] = []
    for k in range(count):
        kind = draw(st.sampled_from(["column", "column", "packed", "scalar"]))
        dtype = draw(st.sampled_from(sorted(SIZES)))
        shape: tuple[int, ...] = ()
        if kind == "column":
            shape = tuple(draw(st.lists(st.integers(1, 4), max_size=3)))
        elif kind == "packed":
            shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
        repeat = draw(st.integers(1, 3))  # runs of alike members, to make blocks of
        members += [RefMember(f"m{k}_{j}", kind, dtype, shape) for j in range(repeat)]
    largest = max(SIZES[m.dtype] for m in members)
    align = draw(st.sampled_from([a for a in ALIGNMENTS if a >= largest]))
    n = draw(st.one_of(st.integers(0, 70), st.sampled_from([1000, 4097, 10**7])))
    blocks = []
    for _ in range(draw(st.integers(0, 3))):
        run = adjacent_alike_run(draw, members)
        names = [m.name for m in run]
        with_c = len(names) > 1 or draw(st.booleans())
        orders = axis_orders(run[0].shape, with_c)
        blocks.append((names, draw(st.sampled_from(orders))))
    return members, align, n, blocks


@settings(max_examples=200, deadline=None)
@given(random_layouts())
def test_random_layouts_match_the_reference(
    case: tuple[list[RefMember], int, int, list[tuple[list[str], list[str]]]],
) -> None:
    members, align, n, blocks = case
    assert_layout_matches(members, align, [n], blocks)


# --- packed array columns (CMSSW's edm::StdArray columns) -------------------------------------------

DIGIS = [
    RefMember("id", "column", "uint32"),
    RefMember("adc", "packed", "uint16", (10,)),
    RefMember("gain", "packed", "uint16", (10,)),
    RefMember("s", "scalar", "float32"),
    RefMember("m", "column", "float32", (3, 3)),
    RefMember("cov", "packed", "float64", (2, 3)),
]


@pytest.mark.parametrize(
    ("align", "n", "offsets", "total"),
    [
        # Measured with CMSSW's own GENERATE_SOA_LAYOUT: adc and gain as edm::StdArray<uint16_t, 10>,
        # m as Eigen::Matrix<float, 3, 3>, cov as edm::StdArray<edm::StdArray<double, 3>, 2>.
        (64, 10, {"id": 0, "adc": 64, "gain": 320, "s": 576, "m": 640, "cov": 1216}, 1728),
        (128, 33, {"id": 0, "adc": 256, "gain": 1024, "s": 1792, "m": 1920, "cov": 4224}, 5888),
    ],
)
def test_packed_columns_match_cmssw(
    align: int, n: int, offsets: dict[str, int], total: int
) -> None:
    layout, _ = parsed(DIGIS, align)
    got = {k: f.evaluate(n, align) for k, f in member_offsets(layout).items()}
    assert got == offsets
    assert byte_size(layout).evaluate(n, align) == total
    adc = layout.member("adc")
    assert adc is not None
    # [n, 10] with strides (10, 1): each element's ten values together.
    assert member_view(layout, adc).evaluate(n, align) == ((n, 10), (10, 1), offsets["adc"])


@pytest.mark.parametrize("align", [8, 64, 128, 4096])
def test_packed_blocks_in_every_axis_order(align: int) -> None:
    blocks = [(["adc", "gain"], order) for order in axis_orders((10,), with_c=True)]
    blocks += [(["cov"], order) for order in axis_orders((2, 3), with_c=True)]
    blocks += [(["cov"], order) for order in axis_orders((2, 3), with_c=False)]
    assert_layout_matches(DIGIS, align, [0, 1, 7, 33, 1000], blocks, seed=align, samples=30)


def test_packed_bytes_equal_a_c_struct_array() -> None:
    """The values written through soagen's view sit where a C array of `struct { T v[k]; }` puts
    them: numpy's structured dtype is that C layout."""
    numpy = pytest.importorskip("numpy")
    n, align = 13, 64
    layout, _ = parsed(DIGIS, align)
    adc = layout.member("adc")
    assert adc is not None
    shape, strides, offset = member_view(layout, adc).evaluate(n, align)
    buffer = numpy.zeros(byte_size(layout).evaluate(n, align), dtype=numpy.uint8)
    values = numpy.arange(n * 10, dtype=numpy.uint16).reshape(n, 10) * 7 + 3
    view = numpy.lib.stride_tricks.as_strided(
        buffer[offset:].view(numpy.uint16), shape, tuple(s * 2 for s in strides)
    )
    view[...] = values
    struct = numpy.dtype([("v", numpy.uint16, (10,))])
    assert struct.itemsize == 20
    as_structs = buffer[offset : offset + n * 20].view(struct)
    assert (as_structs["v"] == values).all()
    # and nothing was written outside the column's own bytes
    pitch = ceil_to(n * 20, align)
    assert not buffer[:offset].any() and not buffer[offset + pitch :].any()
