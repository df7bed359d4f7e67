"""Arrow, Parquet, awkward and uproot: round trips bit for bit, zero-copy columns inside the buffer,
the batch keeping the collection alive, refusals naming the column, and the uproot example."""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path
from types import ModuleType
from typing import Any

import awkward as ak
import numpy as np
import pyarrow as pa
import pytest
import torch

from soagen.runtime import arrow
from soagen.runtime.errors import ColumnError, ElementCountError, MissingPackageError
from tests.runtime.test_files import element_bytes, random_filled

SCHEMA = """
layout AllTypes {
    align 64
    column bool flag
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
    column float32[3] p
    column float64[2, 3] m
    column uint16[10] adc packed
    column int8[2, 2] grid packed
    scalar float32 s
    scalar bfloat16 sb
    scalar int64 count
}
layout Jets {
    column float32 pt, eta
    column float32[2] axis
}
"""

SIZES = [0, 1, 100_000]


@pytest.fixture(scope="module")
def soa(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    from tests.helpers import generate_package, import_generated

    root = tmp_path_factory.mktemp("arrow")
    (root / "arrow.soa").write_text(SCHEMA)
    generate_package(root / "arrow.soa", root, "pkg_arrow")
    return import_generated(root, "pkg_arrow", "arrow")


def _buffer_range(collection: Any) -> tuple[int, int]:
    start = collection.buffer.data_ptr()
    return start, start + collection.nbytes


def _data_buffer(column: pa.Array) -> pa.Buffer:
    """The buffer holding a column's values (a fixed-size list's innermost values)."""
    return column.buffers()[-1]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("arrays", arrow.ARRAY_FORMS)
def test_round_trip_bit_for_bit(soa: ModuleType, n: int, arrays: str) -> None:
    collection = random_filled(soa.AllTypes, n, seed=n)
    batch = collection.to_arrow(arrays=arrays)
    assert batch.num_rows == n
    back = soa.AllTypes.from_arrow(batch)
    assert element_bytes(back) == element_bytes(collection)
    # The same values from a table of several chunks, cut where no chunk is whole.
    cuts = [0, n // 3, n // 3, n] if n else [0, 0]
    table = pa.Table.from_batches(
        [batch.slice(a, b - a) for a, b in zip(cuts, cuts[1:], strict=False)]
    )
    again = soa.AllTypes.from_arrow(table)
    assert element_bytes(again) == element_bytes(collection)


def test_export_forms_and_types(soa: ModuleType) -> None:
    collection = random_filled(soa.AllTypes, 5)
    columns = collection.to_arrow()
    assert columns.schema.names[13:16] == ["p_0", "p_1", "p_2"]
    assert "m_1_2" in columns.schema.names and "m" not in columns.schema.names
    np.testing.assert_array_equal(
        columns.column("m_1_2").to_numpy(), collection.numpy("m")[:, 1, 2]
    )
    assert columns.schema.field("f16").type == pa.float16()
    bf16 = columns.schema.field("bf16")
    assert bf16.type == pa.uint16() and bf16.metadata == {b"soagen.dtype": b"bfloat16"}
    assert columns.schema.field("adc").type == pa.list_(pa.uint16(), 10)
    assert columns.schema.field("grid").type == pa.list_(pa.list_(pa.int8(), 2), 2)
    listed = collection.to_arrow(arrays="list")
    assert listed.schema.field("m").type == pa.list_(pa.list_(pa.float64(), 3), 2)
    assert listed.column("m").to_pylist()[4] == collection.numpy("m")[4].tolist()
    metadata = columns.schema.metadata
    assert metadata[b"soagen.layout"] == b"AllTypes"
    assert metadata[b"soagen.layout_key"] == soa.AllTypes.LAYOUT_KEY.encode()
    assert metadata[b"soagen.alignment"] == b"64"
    with pytest.raises(ValueError, match="arrays must be one of"):
        collection.to_arrow(arrays="rows")


def test_zero_copy_columns_lie_in_the_buffer(soa: ModuleType) -> None:
    collection = random_filled(soa.AllTypes, 1000)
    start, stop = _buffer_range(collection)
    batch = collection.to_arrow()
    copied = {"flag"}  # Arrow booleans are bits
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        address = _data_buffer(column).address
        assert (start <= address < stop) == (name not in copied), name
    # The coefficient-major member as fixed-size lists is a copy; the packed one never is.
    listed = collection.to_arrow(arrays="list")
    assert not start <= _data_buffer(listed.column("p")).address < stop
    assert start <= _data_buffer(listed.column("adc")).address < stop
    # Shared, not equal by chance: a write through the collection shows in the batch.
    collection.f32[7] = 1234.5
    collection.p[9, 2] = -8.25
    assert batch.column("f32")[7].as_py() == 1234.5
    assert batch.column("p_2")[9].as_py() == -8.25


def test_a_slice_exports_its_own_elements(soa: ModuleType) -> None:
    collection = random_filled(soa.AllTypes, 100)
    part = collection[30:47]
    batch = part.to_arrow()
    assert batch.num_rows == 17
    assert element_bytes(soa.AllTypes.from_arrow(batch)) == element_bytes(part)
    f64 = collection.numpy("f64")
    assert _data_buffer(batch.column("f64")).address == f64.ctypes.data + 30 * 8
    adc = collection.numpy("adc")
    assert _data_buffer(batch.column("adc")).address == adc.ctypes.data + 30 * 10 * 2


def test_the_batch_keeps_the_collection_alive(soa: ModuleType) -> None:
    def export() -> tuple[pa.RecordBatch, np.ndarray, weakref.ref[Any]]:
        collection = random_filled(soa.AllTypes, 5000, seed=3)
        return collection.to_arrow(), collection.numpy("f64").copy(), weakref.ref(collection)

    batch, expected, alive = export()
    gc.collect()
    assert alive() is not None
    # Fresh allocations that would reuse freed memory, had the buffer been freed.
    scratch = [torch.full((soa.AllTypes.byte_size(5000),), 0xFF, dtype=torch.uint8)]
    np.testing.assert_array_equal(batch.column("f64").to_numpy(), expected)
    del batch, scratch
    gc.collect()
    assert alive() is None


def test_refusals_name_the_column(soa: ModuleType) -> None:
    batch = random_filled(soa.AllTypes, 4).to_arrow()

    def replaced(name: str, column: pa.Array) -> pa.RecordBatch:
        index = batch.schema.get_field_index(name)
        return batch.set_column(index, name, column)

    with pytest.raises(
        ColumnError, match=r"'f32' of AllTypes must hold float32 .*found Arrow double"
    ):
        soa.AllTypes.from_arrow(replaced("f32", batch.column("f32").cast(pa.float64())))
    wrong_shape = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(44, np.uint16)), 11)
    with pytest.raises(ColumnError, match=r"'adc' .*uint16\[10\].*found Arrow uint16\[11\]"):
        soa.AllTypes.from_arrow(replaced("adc", wrong_shape))
    with pytest.raises(ColumnError, match=r"no column 'i8'"):
        soa.AllTypes.from_arrow(batch.drop_columns(["i8"]))
    with pytest.raises(ColumnError, match=r"coefficients p_0, p_1 .*'p' but not p_2"):
        soa.AllTypes.from_arrow(batch.drop_columns(["p_2"]))
    with pytest.raises(ColumnError, match=r"no column 'p' \(or its coefficients p_0, p_1, p_2\)"):
        soa.AllTypes.from_arrow(batch.drop_columns(["p_0", "p_1", "p_2"]))
    extra = batch.append_column("energy", pa.array(np.zeros(4, np.float32)))
    with pytest.raises(ColumnError, match=r"no member for column 'energy'"):
        soa.AllTypes.from_arrow(extra)
    with pytest.raises(ColumnError, match=r"'i32' of AllTypes holds 1 nulls"):
        soa.AllTypes.from_arrow(replaced("i32", pa.array([1, None, 3, 4], pa.int32())))
    bare = batch.replace_schema_metadata(None)
    with pytest.raises(ColumnError, match=r"scalar 's' of AllTypes is neither"):
        soa.AllTypes.from_arrow(bare)
    given = soa.AllTypes.from_arrow(bare, scalars={"s": 2.5, "sb": -1.0, "count": 9})
    assert (float(given.s), float(given.sb), int(given.count)) == (2.5, -1.0, 9)
    with pytest.raises(ColumnError, match=r"no scalar 'bfield'"):
        soa.AllTypes.from_arrow(batch, scalars={"bfield": 1.0})
    with pytest.raises(TypeError, match="RecordBatch or pyarrow.Table, got dict"):
        soa.AllTypes.from_arrow({"f32": [1.0]})


def test_parquet_round_trip(soa: ModuleType, tmp_path: Path) -> None:
    collection = random_filled(soa.AllTypes, 3000, seed=5)
    for arrays in arrow.ARRAY_FORMS:
        path = tmp_path / f"all_{arrays}.parquet"
        collection.write_parquet(path, arrays=arrays, row_group_size=1000)
        back = soa.AllTypes.read_parquet(path)
        assert element_bytes(back) == element_bytes(collection), arrays


def test_a_missing_package_names_the_extra(
    soa: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "awkward", None)
    collection = soa.Jets.allocate(2)
    with pytest.raises(MissingPackageError, match=r"pip install 'soagen\[data\]'"):
        collection.to_arrow()
    with pytest.raises(MissingPackageError, match=r"pip install 'soagen\[data\]'"):
        collection.to_awkward([0, 2])


def test_importing_the_runtime_imports_no_data_package() -> None:
    from tests.helpers import modules_imported_by

    found = modules_imported_by(
        "import soagen.runtime, soagen.runtime.arrow, soagen.runtime.awkward",
        ("pyarrow", "awkward", "uproot", "torch", "numpy"),
    )
    assert found == []


@pytest.mark.parametrize("offsets", [[0], [0, 0, 3, 3, 7, 7], [0, 1], "large"])
def test_awkward_round_trip(soa: ModuleType, offsets: Any) -> None:
    if offsets == "large":
        counts = np.random.default_rng(0).integers(0, 8, 20_000)
        offsets = np.concatenate([[0], np.cumsum(counts)])
    n = int(offsets[-1])
    collection = random_filled(soa.AllTypes, n, seed=n)
    events = collection.to_awkward(offsets)
    assert len(events) == len(offsets) - 1
    assert ak.num(events).tolist() == np.diff(offsets).tolist()
    back, found = soa.AllTypes.from_awkward(events)
    assert found.dtype == np.int64 and found.tolist() == list(offsets)
    assert element_bytes(back) == element_bytes(collection)


def test_to_awkward_is_zero_copy_but_for_coefficient_major_arrays(soa: ModuleType) -> None:
    collection = random_filled(soa.AllTypes, 7)
    events = collection.to_awkward([0, 3, 3, 7])
    records = events.layout.content
    start, stop = _buffer_range(collection)

    def address(field: str) -> int:
        content = records.content(field)
        while not isinstance(content, ak.contents.NumpyArray):
            content = content.content
        return int(content.data.ctypes.data)

    assert address("f32") == collection.numpy("f32").ctypes.data
    assert start <= address("adc") < stop and start <= address("flag") < stop
    assert not start <= address("p") < stop
    assert events[2].f64.tolist() == collection.numpy("f64")[3:7].tolist()
    assert events[0].m.tolist() == collection.numpy("m")[:3].tolist()
    assert events.attrs["soagen_scalars"]["count"] == int(collection.count)


def _jagged(counts: np.ndarray, values: np.ndarray) -> ak.Array:
    return ak.unflatten(values, counts)


def test_from_awkward_with_a_prefix(soa: ModuleType) -> None:
    counts = np.array([2, 0, 3, 1])
    rng = np.random.default_rng(1)
    pt, eta = rng.random(6, dtype=np.float32), rng.random(6, dtype=np.float32)
    axis = rng.random((6, 2), dtype=np.float32)
    events = ak.zip(
        {
            "nJet": counts,
            "Jet_pt": _jagged(counts, pt),
            "Jet_eta": _jagged(counts, eta),
            "Jet_axis": _jagged(counts, axis),
            "Jet_area": _jagged(counts, pt),  # not a member: left alone
            "MET_pt": rng.random(4),
        },
        depth_limit=1,
    )
    jets, offsets = soa.Jets.from_awkward(events, prefix="Jet_")
    assert offsets.tolist() == [0, 2, 2, 5, 6]
    np.testing.assert_array_equal(jets.numpy("pt"), pt)
    np.testing.assert_array_equal(jets.numpy("eta"), eta)
    np.testing.assert_array_equal(jets.numpy("axis"), axis)
    records = ak.zip({"pt": _jagged(counts, pt), "eta": _jagged(counts, eta)})
    records = ak.with_field(records, _jagged(counts, axis), "axis")
    again, _ = soa.Jets.from_awkward(records)
    assert element_bytes(again) == element_bytes(jets)


def test_from_awkward_refusals_name_the_field(soa: ModuleType) -> None:
    counts = np.array([2, 1])
    values = np.arange(3, dtype=np.float32)
    axis = _jagged(counts, np.zeros((3, 2), np.float32))
    good = {"Jet_pt": _jagged(counts, values), "Jet_eta": _jagged(counts, values), "Jet_axis": axis}

    def events(**changes: Any) -> ak.Array:
        return ak.zip({**good, **changes}, depth_limit=1)

    with pytest.raises(ColumnError, match=r"'Jet_pt' must hold float32 .*found float64"):
        soa.Jets.from_awkward(
            events(Jet_pt=_jagged(counts, values.astype(np.float64))), prefix="Jet_"
        )
    with pytest.raises(
        ColumnError, match=r"'Jet_axis' must hold float32\[2\] .*found float32\[3\]"
    ):
        wide = _jagged(counts, np.zeros((3, 3), np.float32))
        soa.Jets.from_awkward(events(Jet_axis=wide), prefix="Jet_")
    with pytest.raises(ColumnError, match=r"'Jet_pt' and 'Jet_eta' .*event 0 \(2 and 1\)"):
        soa.Jets.from_awkward(events(Jet_eta=_jagged(np.array([1, 2]), values)), prefix="Jet_")
    with pytest.raises(ColumnError, match=r"no field 'Jet_eta'"):
        soa.Jets.from_awkward(ak.zip({"Jet_pt": good["Jet_pt"]}, depth_limit=1), prefix="Jet_")
    with pytest.raises(ColumnError, match=r"no member for field 'Jet_pt'"):
        soa.Jets.from_awkward(events())
    with pytest.raises(
        ElementCountError,
        match=r"offsets must rise from 0 to the Jets.s size 3, but run from 0 to 3, and falls after entry 1",
    ):
        soa.Jets.allocate(3).to_awkward([0, 2, 1, 3])


def test_uproot_example_end_to_end(tmp_path: Path) -> None:
    import uproot

    from examples.uproot_scores import JetNet, score_file, write_events

    source, target = tmp_path / "jets.root", tmp_path / "scored.root"
    write_events(source, 200, seed=4)
    returned = score_file(source, target)
    with uproot.open(source) as file:
        jets = file["Events"].arrays()
    with uproot.open(target) as file:
        tree = file["Events"]
        assert set(tree.keys()) == {"nJet", "Jet_pt", "Jet_eta", "Jet_phi", "Jet_mass", "Jet_score"}
        scored = tree.arrays()
    assert scored["nJet"].tolist() == jets["nJet"].tolist()
    assert 0 in scored["nJet"].tolist()  # events without jets pass through
    for name in ("Jet_pt", "Jet_eta", "Jet_phi", "Jet_mass"):
        assert scored[name].tolist() == jets[name].tolist(), name
    features = torch.stack(
        [
            torch.from_numpy(ak.to_numpy(ak.flatten(jets[name])))
            for name in ("Jet_pt", "Jet_eta", "Jet_phi", "Jet_mass")
        ],
        dim=1,
    )
    with torch.no_grad():
        expected = JetNet()(features)
    assert float(expected.std()) > 0.01  # the scores vary: agreeing with them means something
    found = torch.from_numpy(ak.to_numpy(ak.flatten(scored["Jet_score"])))
    torch.testing.assert_close(found, expected, rtol=1e-6, atol=1e-6)
    assert ak.num(returned).tolist() == jets["nJet"].tolist()


def test_readme_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's "Collections in the scikit-hep world" snippet, as written, on the example Nodes."""
    from generated.gnn import Nodes
    from tests.helpers import REPO

    section = (
        (REPO / "README.md").read_text().split("### Collections in the scikit-hep world", 1)[1]
    )
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    nodes = random_filled(Nodes, 1000)
    namespace: dict[str, object] = {"Nodes": Nodes, "nodes": nodes}
    exec(compile(snippet, "README.md", "exec"), namespace)
    assert element_bytes(namespace["nodes"]) == element_bytes(nodes)
    assert namespace["offsets"].tolist() == [0, 400, 400, 1000]  # type: ignore[attr-defined]
    assert "covariance_2_1" in namespace["batch"].schema.names  # type: ignore[attr-defined]


def test_a_mapped_read_only_collection_exports_its_mapping(soa: ModuleType, tmp_path: Path) -> None:
    collection = random_filled(soa.AllTypes, 500, seed=9)
    collection.save(tmp_path / "all.soac")
    mapped = soa.AllTypes.load(tmp_path / "all.soac")  # read-only: NumPy views only
    assert mapped.read_only
    batch = mapped.to_arrow()
    f32 = mapped.numpy("f32")
    assert _data_buffer(batch.column("f32")).address == f32.ctypes.data
    assert element_bytes(soa.AllTypes.from_arrow(batch)) == element_bytes(collection)
    events = mapped.to_awkward([0, 200, 500])
    back, _ = soa.AllTypes.from_awkward(events)
    assert element_bytes(back) == element_bytes(collection)
