"""The collection API: slices, view(), NumPy views, moves and copies, from_columns, import hygiene."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from generated.gnn import EdgeClassifier, Edges, EdgeScores, Nodes
from soagen.dsl.names import COLLECTION_ATTRIBUTES
from soagen.runtime import BlockSpec, Collection, StridedView, aligned_numpy, aligned_tensor
from soagen.runtime.errors import (
    ColumnError,
    DeviceError,
    GeometryError,
    SliceRangeError,
    UnknownNameError,
)
from tests.helpers import modules_imported_by


def filled_nodes(n: int, device: str = "cpu") -> Nodes:
    nodes = Nodes.allocate(n, device=device, zero=True)
    for index, name in enumerate(("x", "y", "z", "energy")):
        nodes.member(name).copy_(torch.arange(n, dtype=torch.float32) + 1000 * index)
    nodes.detector_id.copy_(torch.arange(n, dtype=torch.int32) * 3)
    nodes.covariance.copy_(torch.arange(n * 9, dtype=torch.float32).reshape(n, 3, 3))
    nodes.bfield.fill_(3.8)
    return nodes


# Import hygiene and reserved names.


def test_importing_generated_code_imports_neither_torch_nor_numpy() -> None:
    script = (
        "import generated.gnn as g; import soagen.runtime.errors, soagen.runtime.geometry;"
        "g.Nodes.member_views(10); g.Nodes.byte_size(10)"
    )
    assert modules_imported_by(script) == []


def test_public_names_of_collection_are_reserved_for_schemas() -> None:
    public = {name for name in dir(Collection) if not name.startswith("_")}
    class_attributes = {name for name in Collection.__annotations__ if not name.startswith("_")}
    assert public | class_attributes == COLLECTION_ATTRIBUTES
    # A generated class adds exactly its members.
    generated = {name for name in dir(Nodes) if not name.startswith("_")}
    assert generated - {m.name for m in Nodes.MEMBERS} == COLLECTION_ATTRIBUTES


def test_the_constructor_points_to_the_factories() -> None:
    with pytest.raises(TypeError, match=r"Nodes.allocate\(n\), Nodes.wrap\(buffer, n\)"):
        Nodes()


def test_describes_itself() -> None:
    nodes = Nodes.allocate(100)
    assert (nodes.size, nodes.capacity, nodes.element_range, len(nodes)) == (
        100,
        100,
        (0, 100),
        100,
    )
    assert nodes.nbytes == Nodes.byte_size(100) == nodes.buffer.numel()
    assert nodes.buffer.dtype == torch.uint8 and nodes.buffer.dim() == 1
    assert nodes.device == torch.device("cpu") and not nodes.read_only
    assert repr(nodes) == f"Nodes(n=100, device=cpu, nbytes={Nodes.byte_size(100)})"
    assert repr(nodes[5:10]).startswith("Nodes(n=5, elements [5, 10) of 100,")


def test_typed_accessors_have_the_declared_shapes() -> None:
    nodes = Nodes.allocate(7)
    assert nodes.x.shape == (7,) and nodes.x.dtype == torch.float32
    assert nodes.detector_id.dtype == torch.int32
    assert nodes.covariance.shape == (7, 3, 3)
    assert nodes.bfield.shape == () and nodes.bfield.dtype == torch.float32
    assert nodes.block("node_features").shape == (7, 4)
    edges = Edges.allocate(9)
    assert (
        edges.block("edge_index").shape == (2, 9) and edges.block("edge_index").dtype == torch.int64
    )
    assert edges.block("edge_features").shape == (9, 2)
    assert EdgeScores.allocate(4).block("edge_scores").shape == (4,)


def test_unknown_names() -> None:
    nodes = Nodes.allocate(3)
    with pytest.raises(UnknownNameError, match="Nodes has no member 'w'; its members are x, y"):
        nodes.member("w")
    with pytest.raises(UnknownNameError, match="Nodes declares no block 'edges'"):
        nodes.block("edges")
    with pytest.raises(GeometryError, match="block 'edge_index' is a block of Edges, not of Nodes"):
        nodes.block(Edges.BLOCKS["edge_index"])
    with pytest.raises(UnknownNameError):
        nodes.numpy("w")


# Model blocks declared on model classes, and view().


def test_block_accepts_a_blockspec_declared_elsewhere() -> None:
    # As a model binding declares a block of an imported layout: a BlockSpec not in Nodes.BLOCKS.
    spec = BlockSpec(
        "xy_t", "Nodes", ("x", "y"), "float32", ("c", "n"),
        lambda n: StridedView("float32", (2, n), ((n * 4 + 127) // 128 * 32, 1), 0),
    )  # fmt: skip
    nodes = filled_nodes(10)
    assert torch.equal(nodes.block(spec), torch.stack([nodes.x, nodes.y]))
    assert torch.equal(nodes[2:6].block(spec), torch.stack([nodes.x[2:6], nodes.y[2:6]]))
    for binding in EdgeClassifier.INPUTS:
        if binding.block.layout == "Nodes":
            assert torch.equal(nodes.block(binding.block), nodes.block(binding.name))


def test_view_materializes_any_geometry() -> None:
    nodes = filled_nodes(10)
    diagonal = nodes.view(
        StridedView("float32", (10, 3), (1, 4 * 32), Nodes.offsets(10)["covariance"])
    )
    assert torch.equal(diagonal, torch.diagonal(nodes.covariance, dim1=1, dim2=2))
    with pytest.raises(GeometryError, match="reaches byte"):
        nodes.view(StridedView("float32", (10_000,), (1,), 0))
    with pytest.raises(GeometryError, match="multiple of 4"):
        nodes.view(StridedView("float32", (1,), (1,), 2))
    with pytest.raises(GeometryError, match="not one of"):
        nodes.view(StridedView("complex64", (1,), (1,), 0))
    with pytest.raises(GeometryError, match="one stride per dimension"):
        nodes.view(StridedView("float32", (1, 2), (1,), 0))


def test_view_on_a_slice_needs_the_element_axis() -> None:
    nodes = filled_nodes(20)
    features = Nodes.BLOCKS["node_features"].view(20)
    part = nodes[5:9]
    assert torch.equal(part.view(features, element_axis=0), nodes.block("node_features")[5:9])
    assert torch.equal(part.view(features, element_axis=-2), nodes.block("node_features")[5:9])
    with pytest.raises(SliceRangeError, match="element_axis="):
        part.view(features)
    with pytest.raises(GeometryError, match="extent 4"):
        part.view(features, element_axis=1)
    assert part.view(Nodes.member_views(20)["bfield"]).item() == pytest.approx(3.8)  # 0-d: no axis


# Slices.


def test_slices_are_views_with_the_parents_pitches() -> None:
    nodes = filled_nodes(100)
    batch = nodes.slice(10, 42)
    assert (batch.size, batch.capacity, batch.element_range) == (32, 100, (10, 42))
    assert batch.nbytes == nodes.nbytes and batch.buffer.data_ptr() == nodes.buffer.data_ptr()
    assert torch.equal(batch.covariance, nodes.covariance[10:42])
    assert batch.block("node_features").stride() == nodes.block("node_features").stride()
    assert torch.equal(batch.block("node_features"), nodes.block("node_features")[10:42])
    assert batch.bfield.data_ptr() == nodes.bfield.data_ptr()
    assert torch.equal(nodes[-10:].x, nodes.x[90:]) and torch.equal(nodes[:3].y, nodes.y[:3])
    assert nodes[50:50].size == 0 and nodes[50:50].x.shape == (0,)
    edges = Edges.allocate(10)
    edges.block("edge_index").copy_(torch.arange(20).reshape(2, 10))
    assert edges[3:5].block("edge_index").tolist() == [[3, 4], [13, 14]]


@pytest.mark.parametrize(
    ("start", "stop", "message"),
    [(5, 101, r"slice \[5, 101\) is out of range for Nodes of size 100"), (60, 50, r"\[60, 50\)")],
)
def test_slice_out_of_range(start: int, stop: int, message: str) -> None:
    with pytest.raises(SliceRangeError, match=message) as caught:
        Nodes.allocate(100).slice(start, stop)
    assert isinstance(caught.value, IndexError)


def test_slice_bad_bounds() -> None:
    nodes = Nodes.allocate(100)
    with pytest.raises(SliceRangeError, match=r"need 0 <= start"):
        nodes[20:10:1]
    with pytest.raises(SliceRangeError, match="step must be 1"):
        nodes[::2]
    with pytest.raises(SliceRangeError, match=r"need 0 <= start"):
        nodes.slice(-1, 5)
    with pytest.raises(SliceRangeError, match=r"need 0 <= start"):
        nodes[-200:]
    with pytest.raises(TypeError, match="with a slice"):
        nodes[3]  # type: ignore[call-overload]
    part = nodes[10:20]
    with pytest.raises(SliceRangeError, match="size 10"):
        part.slice(0, 11)


# NumPy views.


def test_numpy_views_share_the_buffer() -> None:
    nodes = filled_nodes(12)
    views = nodes.numpy()
    assert isinstance(views, dict) and list(views) == [m.name for m in Nodes.MEMBERS]
    assert views["covariance"].shape == (12, 3, 3)
    np.testing.assert_array_equal(views["covariance"], nodes.covariance.numpy())
    assert views["bfield"].shape == () and views["bfield"][()] == pytest.approx(3.8)
    assert views["x"].ctypes.data == nodes.x.data_ptr()
    block = nodes.numpy(Nodes.BLOCKS["node_features"])
    np.testing.assert_array_equal(block, nodes.block("node_features").numpy())
    block[0, 1] = -5.0
    assert nodes.y[0].item() == -5.0
    part = nodes[4:8].numpy("detector_id")
    assert part.tolist() == [12, 15, 18, 21]
    with pytest.raises(TypeError, match="member name"):
        nodes.numpy(3)  # type: ignore[arg-type]


def test_bfloat16_reads_as_raw_bits_through_numpy(
    generated_from_text: Callable[[str], ModuleType],
) -> None:
    cls = generated_from_text("layout Half {\n  column bfloat16 w\n  column float16 h\n}\n").Half
    collection = cls.allocate(5)
    collection.w.copy_(torch.tensor([1.0, -2.0, 0.5, 3.0, 0.0], dtype=torch.bfloat16))
    raw = collection.numpy("w")
    assert raw.dtype == np.uint16
    np.testing.assert_array_equal(raw, collection.w.view(torch.int16).numpy().view(np.uint16))
    assert collection.numpy("h").dtype == np.float16


def test_numpy_needs_host_memory() -> None:
    nodes = Nodes.allocate(4, device="meta")
    with pytest.raises(DeviceError, match=r"numpy\(\) needs host memory.*meta"):
        nodes.numpy("x")


# Moves and copies.


def test_clone_is_one_buffer_copy() -> None:
    nodes = filled_nodes(50)
    copy = nodes.clone()
    assert copy.buffer.data_ptr() != nodes.buffer.data_ptr()
    assert copy.buffer.data_ptr() % 128 == 0
    assert torch.equal(copy.buffer, nodes.buffer)
    copy.x.fill_(0.0)
    assert nodes.x[1].item() == 1.0


def test_a_slice_copies_into_its_own_collection() -> None:
    nodes = filled_nodes(100)
    part = nodes[30:45].clone()
    assert (part.size, part.capacity, part.element_range, part.nbytes) == (
        15, 15, (0, 15), Nodes.byte_size(15),
    )  # fmt: skip
    for member in Nodes.MEMBERS:
        expected = nodes.member(member.name)
        if member.kind == "column":
            expected = expected[30:45]
        assert torch.equal(part.member(member.name), expected), member.name
    assert torch.equal(part.block("node_features"), nodes.block("node_features")[30:45])


def test_to_the_same_device_is_a_no_op() -> None:
    nodes = Nodes.allocate(10)
    assert nodes.to("cpu") is nodes and nodes.to(torch.device("cpu")) is nodes
    part = nodes[2:4]
    assert part.to("cpu") is part


def test_round_trip_through_each_device(device: str) -> None:
    nodes = filled_nodes(1000)
    there = nodes.to(device, non_blocking=True)
    assert there.device.type == torch.device(device).type
    assert torch.equal(there.block("node_features").cpu(), nodes.block("node_features"))
    back = there.to("cpu")
    assert torch.equal(back.buffer, nodes.buffer)
    part = there[100:200].to("cpu")
    assert torch.equal(part.covariance, nodes.covariance[100:200])


def test_to_meta_moves_the_whole_buffer() -> None:
    moved = Nodes.allocate(10).to("meta")
    assert moved.device.type == "meta" and moved.x.device.type == "meta"
    assert moved.nbytes == Nodes.byte_size(10)


# from_columns.


def test_from_columns_copies_and_lays_out() -> None:
    n = 6
    columns = {
        "x": torch.arange(n, dtype=torch.float32),
        "y": np.arange(n, dtype=np.float32) * 2,
        "z": [0.5] * n,
        "energy": torch.ones(n),
        "detector_id": np.arange(n, dtype=np.int32),
        "covariance": torch.eye(3).expand(n, 3, 3),
        "bfield": 3.8,
    }
    nodes = Nodes.from_columns(**columns)
    assert nodes.size == n and nodes.x.data_ptr() != columns["x"].data_ptr()  # type: ignore[union-attr]
    assert nodes.y.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert nodes.z.tolist() == [0.5] * n
    assert torch.equal(nodes.covariance, torch.eye(3).expand(n, 3, 3))
    assert nodes.bfield.item() == pytest.approx(3.8)
    columns["x"][0] = 99.0  # type: ignore[index]
    assert nodes.x[0].item() == 0.0  # a copy
    again = Nodes.from_columns(columns)  # the positional mapping form
    assert again.x[0].item() == 99.0


def test_from_columns_zero_fills_on_request() -> None:
    edges = Edges.from_columns(src=torch.arange(4), zero_missing=True)
    assert edges.dst.tolist() == [0, 0, 0, 0] and edges.delta_r.tolist() == [0.0] * 4
    assert edges.src.tolist() == [0, 1, 2, 3]


def test_from_columns_goes_to_the_device_asked(device: str) -> None:
    edges = Edges.from_columns(
        src=torch.arange(3), dst=torch.arange(3), delta_r=torch.ones(3), delta_eta=torch.ones(3),
        device=device,
    )  # fmt: skip
    assert edges.device.type == torch.device(device).type
    assert edges.block("edge_index").cpu().tolist() == [[0, 1, 2], [0, 1, 2]]
    follows = Edges.from_columns(src=torch.arange(3, device=device), zero_missing=True)
    assert follows.device.type == torch.device(device).type


def _edges(**overrides: object) -> dict[str, object]:
    columns: dict[str, object] = {
        "src": torch.arange(4),
        "dst": torch.arange(4),
        "delta_r": torch.zeros(4),
        "delta_eta": torch.zeros(4),
    }
    columns.update(overrides)
    return columns


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"src": torch.arange(4)}, "missing 'dst', 'delta_r', 'delta_eta' of Edges"),
        (_edges(weight=torch.ones(4)), "Edges has no member 'weight'; its members are src"),
        (_edges(src=torch.arange(4, dtype=torch.int32)), "'src' of Edges is int64 but got a tensor of torch.int32"),
        (_edges(delta_r=np.zeros(4)), "'delta_r' of Edges is float32 but got a NumPy array of float64"),
        (_edges(dst=torch.arange(5)), r"column 'dst' must have shape \[4\] \(n=4, from column 'src'\), got \[5\]"),
        (_edges(dst=torch.arange(8).reshape(4, 2)), r"'dst' must have shape \[4\].*got \[4, 2\]"),
        (_edges(src=torch.tensor(3)), "column 'src' must have shape"),
        (_edges(delta_eta=["a"] * 4), "cannot read a list as float32"),
        ({}, "missing"),
    ],
)  # fmt: skip
def test_from_columns_names_what_is_wrong(columns: dict[str, object], message: str) -> None:
    with pytest.raises(ColumnError, match=message):
        Edges.from_columns(**columns)


def test_from_columns_checks_array_and_scalar_shapes() -> None:
    good = {name: torch.zeros(5) for name in ("x", "y", "z", "energy")}
    good["detector_id"] = torch.zeros(5, dtype=torch.int32)
    with pytest.raises(
        ColumnError, match=r"'covariance' must have shape \[5, 3, 3\].*got \[5, 3\]"
    ):
        Nodes.from_columns(**good, covariance=torch.zeros(5, 3), bfield=1.0)
    with pytest.raises(ColumnError, match=r"scalar 'bfield' must be 0-d, got shape \[1\]"):
        Nodes.from_columns(**good, covariance=torch.zeros(5, 3, 3), bfield=torch.ones(1))
    with pytest.raises(ColumnError, match="at least one column"):
        Nodes.from_columns(bfield=1.0, zero_missing=True)
    with pytest.raises(ColumnError, match="given twice"):
        Nodes.from_columns({"x": torch.zeros(5)}, x=torch.zeros(5), zero_missing=True)


def test_from_columns_refuses_numpy_for_bfloat16(
    generated_from_text: Callable[[str], ModuleType],
) -> None:
    cls = generated_from_text("layout Half {\n  column bfloat16 w\n  column float16 h\n}\n").Half
    with pytest.raises(ColumnError, match="bfloat16, which NumPy lacks"):
        cls.from_columns(w=np.zeros(3, np.uint16), h=np.zeros(3, np.float16))
    made = cls.from_columns(w=torch.ones(3, dtype=torch.bfloat16), h=np.ones(3, np.float16))
    assert made.w.tolist() == [1.0] * 3


def test_views_first_made_in_inference_mode_stay_writable() -> None:
    """The typed base views are cached: the first one made must not be an inference-mode view."""
    from generated.gnn import Nodes

    nodes = Nodes.allocate(10, zero=True)
    with torch.inference_mode():
        assert float(nodes.x.sum()) == 0.0  # the first views are made in here
    nodes.x.fill_(2.0)  # raised "Inplace update to inference tensor outside InferenceMode"
    nodes.block("node_features").add_(1.0)
    assert float(nodes.x[0]) == 3.0


@pytest.mark.parametrize("kind", ["uint8", "float32", "int64", "numpy"])
def test_a_buffer_wrapped_in_inference_mode_stays_writable_outside_it(kind: str) -> None:
    """Memory made outside inference mode and wrapped inside it: the collection's bytes must not
    be an inference tensor, which refuses in-place writes outside the mode."""
    n = 10
    nbytes = Nodes.byte_size(n)
    if kind == "numpy":
        array = aligned_numpy(nbytes, Nodes.ALIGNMENT)
        array[:] = 0
        memory: object = array
    else:
        memory = aligned_tensor(nbytes, Nodes.ALIGNMENT, zero=True).view(getattr(torch, kind))
    with torch.inference_mode():
        nodes = Nodes.wrap(memory, n)
    assert not nodes._memory.buffer.is_inference()
    nodes.buffer.fill_(0)
    nodes.x.fill_(2.0)
    nodes.block("node_features").add_(1.0)
    assert float(nodes.x[0]) == 3.0
    assert np.asarray(memory).view(np.uint8).any()  # the caller's memory took the writes


def test_a_subclass_wrap_runs_once_inside_inference_mode_too() -> None:
    """A layout subclass whose `wrap` takes the buffer past a header: wrapping outside inference
    mode inside it must not run the subclass's `wrap` again on what it passed on."""
    seen: list[int] = []

    class Headed(Nodes):
        @classmethod
        def wrap(cls, buffer: Any, n: int, **options: Any) -> Headed:  # type: ignore[override]
            seen.append(buffer.numel())
            return super().wrap(buffer[128:], n, **options)

    memory = aligned_tensor(128 + Nodes.byte_size(10), 128, zero=True)
    for inference in (False, True):
        seen.clear()
        with torch.inference_mode(inference):
            headed = Headed.wrap(memory, 10, exact=True)
        assert seen == [memory.numel()]
        assert headed.buffer.data_ptr() == memory.data_ptr() + 128
