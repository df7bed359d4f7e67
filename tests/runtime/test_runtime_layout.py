"""Runtime views against the CMSSW byte layout, read back with NumPy at independently computed offsets.

The oracle below recomputes every offset from the documented rule (column pitch round_up(n * size, A),
array coefficients column-major, scalars round_up(size, A)), never from generated code, and compares
the bytes the views wrote with the bytes at those offsets.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes
from soagen.dsl.dtypes import DTYPES
from soagen.runtime import BlockSpec, Collection, MemberSpec
from tests.dsl.test_layout_reference import SIZES
from tests.helpers import REPO

# Every dtype, array columns of ranks 1-3, scalars (alone and in blocks) and blocks in several axis
# orders; ALIGN is replaced by each alignment under test.
EVERY = """
layout Every {
    align ALIGN
    column bool b
    column int8 i8
    column int16 i16
    column int32 i32
    column int64 i64
    column uint8 u8
    column uint16 u16
    column uint32 u32
    column uint64 u64
    column float16 f16
    column bfloat16 bf16
    column float32 f32
    column float64 f64
    column float32[2, 3] m
    column float16[2, 2, 2] t
    column int64[5] v
    scalar float64 s1, s2
    scalar int8 flag
    column float32 p, q
}

model M {
    input pq = Every{p, q} as [c, n]
    input qp = Every{p, q} as [n, c]
    input m_t = Every{m} as [2, n, 3]
    input m_n = Every{m}
    input scalars = Every{s1, s2} as [n, c]
    input scalars_t = Every{s1, s2} as [c, n]
    input scalar = Every{s1} as [n]
    output out = Every{f32} as [n]
}
"""
ALIGNMENTS = [16, 32, 64, 128, 256, 4096]


@pytest.fixture(scope="module")
def every_classes(
    generated_from_text: Callable[[str], ModuleType],
) -> dict[int, type[Collection]]:
    return {
        align: generated_from_text(EVERY.replace("ALIGN", str(align))).Every for align in ALIGNMENTS
    }


def round_up(size: int, align: int) -> int:
    return -(-size // align) * align


# The oracle's own facts, taken neither from soagen nor from the generated code: item sizes in
# bytes written out in a test, and the members of each layout read from the schema text.
ITEM_SIZES = SIZES  # tests/dsl/test_layout_reference.py's table, written out there
DEFAULT_ALIGN = 128  # CMSSW's, and the schema language's, when a layout has no `align`


@dataclass(frozen=True)
class Declared:
    name: str
    kind: str  # column or scalar
    dtype: str
    shape: tuple[int, ...]


def declared_layouts(text: str) -> dict[str, tuple[int, list[Declared]]]:
    """Each layout's alignment and members, in the order the schema text declares them."""
    text = re.sub(r"//.*", "", text)
    layouts = {}
    for name, body in re.findall(r"\blayout\s+(\w+)\s*\{(.*?)\}", text, re.DOTALL):
        align, members = DEFAULT_ALIGN, []
        for statement in body.splitlines():
            if found := re.fullmatch(r"\s*align\s+(\d+)\s*", statement):
                align = int(found[1])
            elif found := re.fullmatch(
                r"\s*(column|scalar)\s+(\w+)(?:\[([\d,\s]+)\])?\s+(.+)", statement
            ):
                kind, dtype, dims, names = found.groups()
                shape = tuple(int(d) for d in dims.split(",")) if dims else ()
                members += [Declared(m.strip(), kind, dtype, shape) for m in names.split(",")]
            else:
                assert not statement.strip(), statement
        layouts[name] = (align, members)
    return layouts


GNN_LAYOUTS = declared_layouts((REPO / "schemas" / "gnn.soa").read_text())


def test_item_size_table_agrees_with_numpy() -> None:
    for dtype, size in ITEM_SIZES.items():
        if dtype != "bfloat16":  # NumPy has none; it is 16 bits by definition
            assert np.dtype(dtype).itemsize == size, dtype


def oracle(members: list[Declared], align: int, n: int) -> tuple[dict[str, int], int]:
    """Member byte offsets and total size by CMSSW's rule, walking the members in order."""
    offsets: dict[str, int] = {}
    position = 0
    for member in members:
        offsets[member.name] = position
        size = ITEM_SIZES[member.dtype]
        if member.kind == "scalar":
            position += round_up(size, align)
        else:
            position += round_up(n * size, align) * math.prod(member.shape)
    return offsets, position


def fill_values(member: MemberSpec, index: int, n: int) -> torch.Tensor:
    """Distinct small integers (exact in every dtype) for one member, shaped like its view."""
    dtype = getattr(torch, DTYPES[member.dtype].torch_name)
    if member.kind == "scalar":
        return torch.tensor(index + 1).to(dtype)
    count = n * math.prod(member.shape)
    values = (torch.arange(count) * 7 + index * 13 + 1) % 97
    if dtype == torch.bool:
        values = values % 2
    return values.reshape(n, *member.shape).to(dtype)


def write_members(collection: Collection) -> dict[str, torch.Tensor]:
    values = {}
    for index, member in enumerate(type(collection).MEMBERS):
        values[member.name] = fill_values(member, index, collection.size)
        collection.member(member.name).copy_(values[member.name])
    return values


def expected_bytes(member: Declared, value: torch.Tensor) -> np.ndarray:
    """The member's bytes as CMSSW stores them: one row per coefficient (column-major), n per row."""
    size = ITEM_SIZES[member.dtype]
    if member.kind == "scalar":
        return value.reshape(1).view(torch.uint8).numpy()
    n, rows = value.shape[0], math.prod(member.shape)
    # Column-major coefficient order = row-major order of the reversed array axes.
    order = (0, *range(len(member.shape), 0, -1))
    by_row = value.permute(order).reshape(n, rows).T.contiguous()
    return by_row.reshape(-1).view(torch.uint8).reshape(rows, n * size).numpy()


def assert_cmssw_layout(
    collection: Collection,
    values: dict[str, torch.Tensor],
    declared: tuple[int, list[Declared]],
) -> None:
    """The collection's bytes where the oracle puts them, for the layout as the schema declares it
    (`declared`: its alignment and members in order)."""
    cls = type(collection)
    n = collection.size
    align, members = declared
    assert cls.ALIGNMENT == align
    assert [(m.name, m.kind, m.dtype, m.shape) for m in cls.MEMBERS] == [
        (m.name, m.kind, m.dtype, m.shape) for m in members
    ]
    offsets, total = oracle(members, align, n)
    assert cls.byte_size(n) == total == collection.nbytes
    assert cls.offsets(n) == offsets
    raw = collection.buffer.cpu().numpy()
    for member in members:
        size = ITEM_SIZES[member.dtype]
        expected = expected_bytes(member, values[member.name])
        if member.kind == "scalar":
            actual = raw[offsets[member.name] : offsets[member.name] + size]
        else:
            pitch = round_up(n * size, align)
            rows = math.prod(member.shape)
            region = raw[offsets[member.name] : offsets[member.name] + rows * pitch]
            actual = region.reshape(rows, pitch)[:, : n * size]
        np.testing.assert_array_equal(actual, expected, err_msg=f"member {member.name}")


def expected_block(collection: Collection, spec: BlockSpec) -> torch.Tensor:
    """The block built by hand: members stacked on `c`, scalars broadcast, axes permuted as declared."""
    n = collection.size
    parts = []
    for name in spec.members:
        value = collection.member(name)
        parts.append(value.expand(n) if value.dim() == 0 else value)
    has_c = "c" in spec.axes
    canonical = torch.stack(parts, dim=1) if has_c else parts[0]
    # canonical axes: n, c (if any), then the array extents in declared order
    array_axis = 2 if has_c else 1
    permutation = []
    for axis in spec.axes:
        if axis == "n":
            permutation.append(0)
        elif axis == "c":
            permutation.append(1)
        else:
            permutation.append(array_axis)
            array_axis += 1
    return canonical.permute(permutation)


@pytest.mark.parametrize("align", ALIGNMENTS)
@pytest.mark.parametrize("n", [0, 1, 3, 37, 1000])
def test_every_dtype_and_alignment_has_cmssw_bytes(
    every_classes: dict[int, type[Collection]], align: int, n: int
) -> None:
    cls = every_classes[align]
    collection = cls.allocate(n, zero=True)
    assert collection.buffer.data_ptr() % align == 0
    values = write_members(collection)
    assert_cmssw_layout(
        collection, values, declared_layouts(EVERY.replace("ALIGN", str(align)))["Every"]
    )
    for name, value in values.items():
        assert torch.equal(collection.member(name), value), name
    for name, spec in cls.BLOCKS.items():
        block = collection.block(name)
        assert block.dtype == getattr(torch, DTYPES[spec.dtype].torch_name)
        assert torch.equal(block, expected_block(collection, spec)), name


def test_gnn_collections_have_cmssw_bytes(device: str) -> None:
    for cls, n in ((Nodes, 100), (Edges, 250), (EdgeScores, 33)):
        collection = cls.allocate(n, device=device)
        values = write_members(collection)
        assert_cmssw_layout(collection, values, GNN_LAYOUTS[cls.__name__])


def test_array_coefficient_formula_from_the_issue() -> None:
    # coefficient (r, c) of element i at offset + ((r + c * rows) * stride + i) * sizeof(T)
    nodes = Nodes.allocate(50, zero=True)
    nodes.covariance.copy_(torch.arange(50 * 9, dtype=torch.float32).reshape(50, 3, 3))
    raw = nodes.buffer.numpy()
    offset = Nodes.offsets(50)["covariance"]
    stride = round_up(50 * 4, 128) // 4
    for i in (0, 17, 49):
        for r in range(3):
            for c in range(3):
                address = offset + ((r + c * 3) * stride + i) * 4
                stored = np.frombuffer(raw, dtype=np.float32, count=1, offset=address)[0]
                assert stored == i * 9 + r * 3 + c


def test_block_scalars_broadcast_with_stride_zero(
    every_classes: dict[int, type[Collection]],
) -> None:
    collection = every_classes[128].allocate(6)
    collection.member("s1").fill_(2.5)
    collection.member("s2").fill_(-1.0)
    scalars = collection.block("scalars")
    assert scalars.shape == (6, 2) and scalars.stride()[0] == 0
    assert scalars.tolist() == [[2.5, -1.0]] * 6
    assert collection.block("scalars_t").tolist() == [[2.5] * 6, [-1.0] * 6]
    assert collection.block("scalar").stride() == (0,)


def test_writes_through_any_view_are_visible_through_every_other() -> None:
    nodes = Nodes.allocate(20, zero=True)
    features = nodes.block("node_features")
    features[:, 2] = 7.0  # column z through the block
    assert torch.equal(nodes.z, torch.full((20,), 7.0))
    assert (nodes.numpy("z") == 7.0).all()
    nodes.numpy("x")[3] = 11.0  # through NumPy
    assert nodes.x[3].item() == 11.0 and features[3, 0].item() == 11.0
    nodes.member("energy")[5] = -2.0  # through member()
    assert features[5, 3].item() == -2.0
    part = nodes[4:9]
    part.y[:] = 3.0  # through a slice
    assert nodes.y[4:9].tolist() == [3.0] * 5 and nodes.y[3].item() == 0.0
    nodes.bfield.fill_(3.8)  # a 0-d scalar view
    assert nodes.numpy("bfield")[()] == pytest.approx(3.8)
    view = nodes.view(Nodes.BLOCKS["node_features"].view(20))
    assert view.data_ptr() == features.data_ptr() and view.stride() == features.stride()


def test_every_view_points_into_the_buffer_at_its_offset(
    every_classes: dict[int, type[Collection]], device: str
) -> None:
    for cls, n in ((Nodes, 1000), (Edges, 777), (every_classes[4096], 333)):
        collection = cls.allocate(n, device=device)
        base = collection.buffer.data_ptr()
        offsets = cls.offsets(n)
        for member in cls.MEMBERS:
            assert collection.member(member.name).data_ptr() == base + offsets[member.name]
        for name, spec in cls.BLOCKS.items():
            block = collection.block(name)
            assert block.data_ptr() == base + offsets[spec.members[0]]
            assert (
                block.untyped_storage().data_ptr() == collection.buffer.untyped_storage().data_ptr()
            )
        start = 5
        part = collection.slice(start, n - 3)
        for member in cls.MEMBERS:
            size = DTYPES[member.dtype].itemsize
            shift = start * size if member.kind == "column" else 0
            assert part.member(member.name).data_ptr() == base + offsets[member.name] + shift


NO_COPY_OPS = {"aten::copy_", "aten::clone", "aten::contiguous", "aten::to", "aten::_to_copy"}


def _profiled_ops(action: Callable[[], object]) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        action()
    return [event.name for event in prof.events()]


def test_building_views_records_no_copy(every_classes: dict[int, type[Collection]]) -> None:
    cls = every_classes[128]
    # Any dtype, seen as bytes; start it on a 128-byte boundary whatever the allocator returned.
    raw = torch.empty(cls.byte_size(64) // 8 + 16, dtype=torch.float64)
    assert raw.data_ptr() % 8 == 0
    shift = (-raw.data_ptr() % 128) // 8
    storage = raw[shift : shift + cls.byte_size(64) // 8]
    assert storage.data_ptr() % 128 == 0

    def build() -> None:
        collection = cls.wrap(storage, 64)
        for member in cls.MEMBERS:
            collection.member(member.name)
        for name, spec in cls.BLOCKS.items():
            collection.block(name)
            collection.block(spec)
            collection.view(spec.view(64), element_axis=spec.axes.index("n"))
        part = collection[10:20]
        for member in cls.MEMBERS:
            part.member(member.name)
        for name in cls.BLOCKS:
            part.block(name)
        collection.numpy()
        part.numpy()
        nodes = Nodes.allocate(100)
        nodes.x, nodes.covariance, nodes.bfield, nodes.block("node_features")

    ops = _profiled_ops(build)
    assert "aten::as_strided" in ops  # the profiler saw the views being made
    assert not NO_COPY_OPS & set(ops), sorted(NO_COPY_OPS & set(ops))


def test_profiler_sees_the_copy_of_a_clone() -> None:
    # The control for the test above: a copy is recorded, and a whole collection is one copy.
    nodes = Nodes.allocate(100)
    ops = _profiled_ops(nodes.clone)
    assert ops.count("aten::copy_") == 1


def test_each_accessor_call_is_one_as_strided() -> None:
    nodes = Nodes.allocate(100)
    _ = nodes.x  # makes the float32 base of this buffer
    edges = Edges.allocate(10)
    _ = edges.src
    spec = EdgeClassifier.INPUTS[0].block
    # First use of other float32 members and blocks reuses the cached base: one op each.
    assert _profiled_ops(lambda: nodes.y) == ["aten::as_strided"]
    assert _profiled_ops(lambda: nodes.block("node_features")) == ["aten::as_strided"]
    assert _profiled_ops(lambda: nodes.block(spec)) == ["aten::as_strided"]
    assert _profiled_ops(lambda: edges.block("edge_index")) == ["aten::as_strided"]
    assert _profiled_ops(lambda: nodes[3:9].energy) == ["aten::as_strided"]


def test_geometry_is_computed_once_per_class_and_n() -> None:
    calls: list[int] = []

    class Counted(Nodes):
        @staticmethod
        def member_views(n: int) -> dict[str, object]:  # type: ignore[override]
            calls.append(n)
            return Nodes.member_views(n)

    block_calls: list[int] = []

    def counted_view(n: int) -> object:
        block_calls.append(n)
        return Nodes.BLOCKS["node_features"].view(n)

    spec = BlockSpec(
        "features", "Nodes", ("x", "y", "z", "energy"), "float32", ("n", "c"), counted_view
    )  # type: ignore[arg-type]
    first, second = Counted.allocate(10), Counted.allocate(10)
    for collection in (first, second, first[2:5], second[1:]):
        for _ in range(3):
            collection.x, collection.covariance, collection.block(spec)
    assert calls == [10]
    assert block_calls == [10]
    _ = Counted.allocate(11).x
    assert calls == [10, 11]


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 300),
    align=st.sampled_from(ALIGNMENTS),
    bounds=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_slices_see_the_parents_elements(
    every_classes: dict[int, type[Collection]],
    n: int,
    align: int,
    bounds: tuple[float, float],
) -> None:
    cls = every_classes[align]
    collection = cls.allocate(n, zero=True)
    values = write_members(collection)
    start, stop = sorted(int(b * n) for b in bounds)
    part = collection.slice(start, stop)
    assert (part.size, part.capacity, part.element_range) == (stop - start, n, (start, stop))
    numpy_views = part.numpy()
    for member in cls.MEMBERS:
        expected = values[member.name]
        if member.kind == "column":
            expected = expected[start:stop]
        assert torch.equal(part.member(member.name), expected), member.name
        if member.dtype != "bfloat16":
            np.testing.assert_array_equal(numpy_views[member.name], expected.numpy())
    for name, spec in cls.BLOCKS.items():
        assert torch.equal(part.block(name), expected_block(part, spec)), name
    inner = part.slice(0, (stop - start) // 2)  # a slice of a slice
    assert inner.element_range == (start, start + (stop - start) // 2)
    assert torch.equal(inner.member("f64"), values["f64"][start : start + (stop - start) // 2])
