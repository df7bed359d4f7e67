"""Collection files: save and load round trips, mappings, model bindings and every refusal."""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from soagen.runtime import files
from soagen.runtime.errors import (
    CollectionFileError,
    CorruptFileError,
    DeviceError,
    InconsistentHeaderError,
    MisalignedBufferError,
    NewerFormatError,
    NotACollectionFileError,
    ReadOnlyCollectionError,
    SoaRuntimeError,
    TruncatedFileError,
    WrongLayoutFileError,
)

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
    column float32[2, 3] m
    column uint16[10] adc packed
    scalar float32 s
    scalar int64 count
}
layout Wide {
    align 128
    column float64 e
    column int32[4] hits
    scalar float64 bfield
}
layout PageAligned {
    align 8192
    column float32 x
}
layout Points {
    column float32 x, y, z
}
layout Scores {
    column float32 a, b
}
model Mlp {
    input points = Points{x, y, z} as [n, c]
    output scores = Scores{a, b} as [n, c]
}
"""

# A layout of the same name as above with one member more: another LAYOUT_KEY.
CHANGED_SCHEMA = """
layout AllTypes {
    align 64
    column bool flag
    column float32 extra
}
"""


@pytest.fixture(scope="module")
def soa(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    from tests.helpers import generate_package, import_generated

    root = tmp_path_factory.mktemp("files")
    (root / "files.soa").write_text(SCHEMA)
    generate_package(root / "files.soa", root, "pkg_files")
    return import_generated(root, "pkg_files", "files")


def random_filled(layout: Any, n: int, seed: int = 0) -> Any:
    """n elements whose every byte, padding included, is random, but for valid bools: torch copies
    bool values (as a slice's save does), not their bytes."""
    collection = layout.allocate(n)
    generator = torch.Generator().manual_seed(seed)
    collection.buffer.copy_(
        torch.randint(0, 256, (collection.nbytes,), dtype=torch.uint8, generator=generator)
    )
    for spec in layout.MEMBERS:
        if spec.dtype == "bool":
            collection.member(spec.name).view(torch.uint8).bitwise_and_(1)
    return collection


def element_bytes(collection: Any) -> dict[str, bytes]:
    """Every member's values as raw bytes, in element order: what a slice and its copy share."""
    return {name: np.ascontiguousarray(view).tobytes() for name, view in collection.numpy().items()}


def _raw(collection: Any) -> Any:
    """The whole buffer as NumPy bytes, read-only collections' too (`buffer` is torch)."""
    return collection._memory.numpy_bytes()


def buffer_bytes(collection: Any) -> bytes:
    return bytes(_raw(collection).tobytes())


def rewrite_header(path: Path, **changes: int) -> None:
    """Rewrite fixed header fields by name, with a header CRC that matches them."""
    data = bytearray(path.read_bytes())
    names = (
        "magic",
        "format_version",
        "flags",
        "alignment",
        "metadata_length",
        "n",
        "byte_size",
        "data_offset",
        "data_crc32",
    )
    fields = dict(zip(names, files._FIELDS.unpack_from(data), strict=True))
    fields.update(changes)
    packed = files._FIELDS.pack(*(fields[name] for name in names))
    metadata_end = files.FIXED_HEADER_SIZE + fields["metadata_length"]
    metadata = bytes(data[files.FIXED_HEADER_SIZE : metadata_end])
    data[: files.FIXED_HEADER_SIZE] = files.header_bytes(packed, metadata)[
        : files.FIXED_HEADER_SIZE
    ]
    path.write_bytes(bytes(data))


# Round trips.


@pytest.mark.parametrize("n", [0, 1, 7, 100_000])
@pytest.mark.parametrize("mmap", [True, False])
def test_round_trip_is_bit_for_bit(soa: ModuleType, tmp_path: Path, n: int, mmap: bool) -> None:
    original = random_filled(soa.AllTypes, n, seed=n)
    path = tmp_path / "all.soac"
    original.save(path)
    loaded = soa.AllTypes.load(path, mmap=mmap, verify=True)
    assert (loaded.size, loaded.capacity, loaded.nbytes) == (n, n, original.nbytes)
    assert loaded.read_only == mmap
    assert buffer_bytes(loaded) == buffer_bytes(original)
    header = files.read_header(path)
    assert (header.n, header.byte_size, header.alignment) == (n, original.nbytes, 64)
    assert header.data_offset % 64 == 0
    assert os.path.getsize(path) == header.data_offset + header.byte_size
    assert [member[0] for member in header.members] == [m.name for m in soa.AllTypes.MEMBERS]


def test_a_128_aligned_layout_round_trips_and_loads_aligned(
    soa: ModuleType, tmp_path: Path
) -> None:
    original = random_filled(soa.Wide, 1000, seed=3)
    original.save(tmp_path / "wide.soac")
    for mmap in (True, False):
        loaded = soa.Wide.load(tmp_path / "wide.soac", mmap=mmap)
        assert _raw(loaded).ctypes.data % 128 == 0
        assert buffer_bytes(loaded) == buffer_bytes(original)
    assert files.read_header(tmp_path / "wide.soac").data_offset % 128 == 0


def test_values_of_every_dtype_come_back(soa: ModuleType, tmp_path: Path) -> None:
    n = 5
    original = soa.AllTypes.allocate(n, zero=True)
    original.flag.copy_(torch.tensor([True, False, True, True, False]))
    original.bf16.copy_(torch.linspace(-2, 2, n, dtype=torch.bfloat16))
    original.f16.copy_(torch.linspace(-1, 1, n, dtype=torch.float16))
    original.u64.copy_((torch.arange(n) + (1 << 62)).to(torch.uint64))
    original.m.copy_(torch.arange(n * 6, dtype=torch.float32).reshape(n, 2, 3))
    original.adc.copy_(torch.arange(n * 10).reshape(n, 10).to(torch.uint16))
    original.s.fill_(3.8)
    original.count.fill_(-12)
    original.save(tmp_path / "values.soac")
    loaded = soa.AllTypes.load(tmp_path / "values.soac", mmap=False)
    for spec in soa.AllTypes.MEMBERS:
        assert torch.equal(loaded.member(spec.name), original.member(spec.name)), spec.name


def test_a_slice_saves_as_a_collection_of_its_own_elements(soa: ModuleType, tmp_path: Path) -> None:
    parent = random_filled(soa.AllTypes, 300, seed=1)
    part = parent.slice(37, 201)
    part.save(tmp_path / "part.soac")
    loaded = soa.AllTypes.load(tmp_path / "part.soac")
    assert (loaded.size, loaded.capacity, loaded.element_range) == (164, 164, (0, 164))
    assert loaded.nbytes == soa.AllTypes.byte_size(164)
    assert element_bytes(loaded) == element_bytes(part)


@given(data=st.data())
def test_any_slice_saves_as_its_own_elements(soa: ModuleType, data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 200), label="n")
    start = data.draw(st.integers(0, n), label="start")
    stop = data.draw(st.integers(start, n), label="stop")
    part = random_filled(soa.Wide, n, seed=n)[start:stop]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "part.soac"
        part.save(path)
        for mmap in (True, False):
            loaded = soa.Wide.load(path, mmap=mmap, verify=True)
            assert loaded.size == stop - start
            assert element_bytes(loaded) == element_bytes(part)


def test_a_read_only_collection_saves(soa: ModuleType, tmp_path: Path) -> None:
    original = random_filled(soa.Wide, 50, seed=4)
    original.save(tmp_path / "a.soac")
    mapped = soa.Wide.load(tmp_path / "a.soac")
    mapped.save(tmp_path / "b.soac")
    assert (tmp_path / "a.soac").read_bytes() == (tmp_path / "b.soac").read_bytes()


def test_saving_over_a_mapped_file_leaves_the_mapping_intact(
    soa: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "wide.soac"
    first = random_filled(soa.Wide, 64, seed=5)
    first.save(path)
    mapped = soa.Wide.load(path)
    random_filled(soa.Wide, 10_000, seed=6).save(path)
    assert buffer_bytes(mapped) == buffer_bytes(first)  # the old file's pages, not the new file's
    assert soa.Wide.load(path).size == 10_000
    assert [entry.name for entry in tmp_path.iterdir()] == ["wide.soac"]


def test_load_on_a_device(soa: ModuleType, tmp_path: Path, device: str) -> None:
    original = random_filled(soa.Wide, 100, seed=7)
    original.save(tmp_path / "wide.soac")
    loaded = soa.Wide.load(tmp_path / "wide.soac", mmap=False, device=device)
    assert loaded.device.type == torch.device(device).type
    assert torch.equal(loaded.buffer.cpu(), original.buffer)


# Mappings.


def _mapping_of(address: int) -> str:
    """The path of the file mapped at `address` in this process, or "" (Linux /proc)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        low, high = (int(bound, 16) for bound in fields[0].split("-"))
        if low <= address < high:
            return fields[5] if len(fields) == 6 else ""
    return ""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_a_mapped_collection_is_the_files_pages(soa: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "all.soac"
    random_filled(soa.AllTypes, 2000).save(path)
    data_offset = files.read_header(path).data_offset
    for writable in (False, True):
        mapped = soa.AllTypes.load(path, writable=writable)
        address = _raw(mapped).ctypes.data
        assert _mapping_of(address) == str(path.resolve())
        assert (address - data_offset) % os.sysconf("SC_PAGE_SIZE") == 0
        assert _mapping_of(mapped.numpy("adc").ctypes.data) == str(path.resolve())
    copied = soa.AllTypes.load(path, mmap=False)
    assert _mapping_of(_raw(copied).ctypes.data) != str(path.resolve())


def test_writes_through_a_writable_mapping_reach_the_file(soa: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "wide.soac"
    random_filled(soa.Wide, 100, seed=8).save(path)
    mapped = soa.Wide.load(path, writable=True)
    assert not mapped.read_only
    mapped.e[3] = 1.25
    mapped.bfield.fill_(-4.0)
    del mapped
    header = files.read_header(path)
    raw = path.read_bytes()
    offsets = soa.Wide.offsets(100)
    assert struct.unpack_from("<d", raw, header.data_offset + offsets["e"] + 3 * 8) == (1.25,)
    assert struct.unpack_from("<d", raw, header.data_offset + offsets["bfield"]) == (-4.0,)
    assert soa.Wide.load(path, mmap=False).e[3].item() == 1.25


def test_a_file_mapped_writable_no_longer_claims_its_checksum(
    soa: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "wide.soac"
    random_filled(soa.Wide, 100, seed=9).save(path)
    soa.Wide.load(path, writable=True).e[0] = 7.0
    assert not files.read_header(path).checksum_current
    with pytest.raises(CollectionFileError, match=f"{path} was mapped writable"):
        soa.Wide.load(path, verify=True)
    soa.Wide.load(path).save(path)
    assert soa.Wide.load(path, verify=True).numpy("e")[0] == 7.0


def test_a_read_only_mapping_gives_read_only_numpy_views_only(
    soa: ModuleType, tmp_path: Path
) -> None:
    random_filled(soa.Wide, 10).save(tmp_path / "wide.soac")
    mapped = soa.Wide.load(tmp_path / "wide.soac")
    assert mapped.read_only
    view = mapped.numpy("e")
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 1.0
    with pytest.raises(ValueError):
        view.flags.writeable = True
    for torch_view in (lambda: mapped.buffer, lambda: mapped.e, lambda: mapped.member("hits")):
        with pytest.raises(ReadOnlyCollectionError):
            torch_view()
    copy = mapped.clone()
    assert not copy.read_only and torch.equal(
        copy.buffer, soa.Wide.load(tmp_path / "wide.soac", mmap=False).buffer
    )


class Linear32(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(3, 2)

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        return self.layer(points)


def test_a_read_only_mapping_is_an_input_with_unsafe_torch_views_and_never_an_output(
    soa: ModuleType, tmp_path: Path
) -> None:
    n = 100
    points = soa.Points.allocate(n)
    points.buffer.copy_(torch.randn(points.nbytes // 4).view(torch.uint8))
    points.save(tmp_path / "points.soac")
    soa.Scores.allocate(n, zero=True).save(tmp_path / "scores.soac")
    model = soa.Mlp(Linear32())
    expected = soa.Scores.allocate(n)
    model(points, out=expected)

    mapped = soa.Points.load(tmp_path / "points.soac", unsafe_torch_views=True)
    assert mapped.read_only
    scores = soa.Scores.allocate(n)
    model(mapped, out=scores)
    assert element_bytes(scores) == element_bytes(expected)

    # Without the promise, a read-only mapping gives no torch views, as wrapped memory does.
    with pytest.raises(ReadOnlyCollectionError):
        model(soa.Points.load(tmp_path / "points.soac"), out=scores)
    for unsafe_torch_views in (False, True):
        out = soa.Scores.load(tmp_path / "scores.soac", unsafe_torch_views=unsafe_torch_views)
        with pytest.raises(ReadOnlyCollectionError, match="output 'scores' is a Scores"):
            model(points, out=out)
        assert not out.numpy("a").any()
    writable = soa.Scores.load(tmp_path / "scores.soac", writable=True)
    model(points, out=writable)
    del writable
    assert element_bytes(soa.Scores.load(tmp_path / "scores.soac")) == element_bytes(expected)


def test_options_that_do_not_apply_are_refused(soa: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "wide.soac"
    random_filled(soa.Wide, 10).save(path)
    with pytest.raises(ValueError, match="apply to mmap=True"):
        soa.Wide.load(path, mmap=False, writable=True)
    with pytest.raises(ValueError, match="apply to mmap=True"):
        soa.Wide.load(path, mmap=False, unsafe_torch_views=True)
    with pytest.raises(ValueError, match="applies to read-only mappings"):
        soa.Wide.load(path, writable=True, unsafe_torch_views=True)
    with pytest.raises(DeviceError, match=f"{path}: mmap=True maps the file into host memory"):
        soa.Wide.load(path, device="meta")


def test_alignment_beyond_the_page_loads_only_by_copy(soa: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "page.soac"
    original = random_filled(soa.PageAligned, 3000)
    original.save(path)
    assert files.read_header(path).data_offset % 8192 == 0
    with pytest.raises(MisalignedBufferError, match=f"{path}: PageAligned needs .* 8192 bytes"):
        soa.PageAligned.load(path)
    loaded = soa.PageAligned.load(path, mmap=False, verify=True)
    assert _raw(loaded).ctypes.data % 8192 == 0
    assert buffer_bytes(loaded) == buffer_bytes(original)


# Refusals: each names the file and what differs, for both ways of loading.

BOTH = pytest.mark.parametrize("mmap", [True, False])


@pytest.fixture
def saved(soa: ModuleType, tmp_path: Path) -> Path:
    path = tmp_path / "all.soac"
    random_filled(soa.AllTypes, 500, seed=11).save(path)
    return path


@BOTH
def test_a_file_without_the_magic_is_refused(soa: ModuleType, tmp_path: Path, mmap: bool) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(b"PK\x03\x04 a zip file, say" + bytes(200))
    with pytest.raises(NotACollectionFileError, match=f"{path} is not a soagen collection file"):
        soa.AllTypes.load(path, mmap=mmap)


@BOTH
def test_another_layouts_file_is_refused_naming_both(
    soa: ModuleType,
    tmp_path: Path,
    generated_from_text: Callable[[str], ModuleType],
    mmap: bool,
) -> None:
    path = tmp_path / "wide.soac"
    random_filled(soa.Wide, 10).save(path)
    with pytest.raises(
        WrongLayoutFileError,
        match=f"{path} holds a Wide \\(layout key {soa.Wide.LAYOUT_KEY}\\), not a AllTypes "
        f"\\(layout key {soa.AllTypes.LAYOUT_KEY}\\)",
    ):
        soa.AllTypes.load(path, mmap=mmap)
    changed = generated_from_text(CHANGED_SCHEMA).AllTypes
    assert changed.LAYOUT_KEY != soa.AllTypes.LAYOUT_KEY
    changed.allocate(10, zero=True).save(path)
    with pytest.raises(WrongLayoutFileError, match="the layout changed since the file was saved"):
        soa.AllTypes.load(path, mmap=mmap)


@BOTH
def test_a_truncated_file_is_refused_at_any_length(
    soa: ModuleType, saved: Path, mmap: bool
) -> None:
    header = files.read_header(saved)
    full = saved.read_bytes()
    lengths = [
        0,
        5,
        len(files.MAGIC) + 2,
        30,
        files.FIXED_HEADER_SIZE,
        files.FIXED_HEADER_SIZE + 10,
        header.data_offset - 1,
        header.data_offset,
        header.data_offset + header.byte_size // 2,
        len(full) - 1,
    ]
    for length in lengths:
        saved.write_bytes(full[:length])
        with pytest.raises(
            TruncatedFileError, match=f"{saved} is truncated: it holds {length} bytes"
        ):
            soa.AllTypes.load(saved, mmap=mmap)


@BOTH
def test_a_corrupt_buffer_is_refused_with_verify(soa: ModuleType, saved: Path, mmap: bool) -> None:
    header = files.read_header(saved)
    data = bytearray(saved.read_bytes())
    data[header.data_offset + header.byte_size // 3] ^= 0x10
    saved.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=f"{saved} is corrupt: its buffer's CRC32"):
        soa.AllTypes.load(saved, mmap=mmap, verify=True)
    # Without verify the bytes are not read: the flipped bit comes back as it is.
    loaded = soa.AllTypes.load(saved, mmap=mmap)
    assert buffer_bytes(loaded) == bytes(data[header.data_offset :])


@BOTH
def test_a_corrupt_header_is_refused_always(soa: ModuleType, saved: Path, mmap: bool) -> None:
    data = bytearray(saved.read_bytes())
    for position in (24, 50, files.FIXED_HEADER_SIZE + 3):  # n, data_crc32, the metadata
        changed = bytearray(data)
        changed[position] ^= 0x01
        saved.write_bytes(bytes(changed))
        with pytest.raises(CorruptFileError, match=f"{saved} is corrupt: its header's CRC32"):
            soa.AllTypes.load(saved, mmap=mmap)


@BOTH
def test_a_newer_format_is_refused_naming_both_versions(
    soa: ModuleType, saved: Path, mmap: bool
) -> None:
    rewrite_header(saved, format_version=files.FORMAT_VERSION + 1)
    with pytest.raises(
        NewerFormatError,
        match=f"{saved} was written in collection file format version {files.FORMAT_VERSION + 1}"
        f", and this soagen reads versions up to {files.FORMAT_VERSION}",
    ):
        soa.AllTypes.load(saved, mmap=mmap)
    # The version is read before anything else it might change: a short file says the same.
    saved.write_bytes(saved.read_bytes()[:20])
    with pytest.raises(NewerFormatError):
        soa.AllTypes.load(saved, mmap=mmap)


@BOTH
def test_a_header_that_disagrees_with_itself_is_refused(
    soa: ModuleType, saved: Path, mmap: bool
) -> None:
    header = files.read_header(saved)
    original = saved.read_bytes()
    # A byte size that is not byte_size(n), the file's length agreeing with it.
    saved.write_bytes(original + bytes(64))
    rewrite_header(saved, byte_size=header.byte_size + 64)
    with pytest.raises(
        InconsistentHeaderError,
        match=f"{saved}: its header says {header.byte_size + 64} bytes for AllTypes with n=500, "
        f"but AllTypes.byte_size\\(500\\) is {header.byte_size}",
    ):
        soa.AllTypes.load(saved, mmap=mmap)
    # An n whose byte size is not the header's, the header's CRC made to match.
    saved.write_bytes(original)
    rewrite_header(saved, n=100)
    with pytest.raises(InconsistentHeaderError, match=r"AllTypes.byte_size\(100\)"):
        soa.AllTypes.load(saved, mmap=mmap)
    cases: list[tuple[dict[str, int], bytes, str]] = [
        ({"alignment": 32}, original, "its header says alignment 32"),
        ({"alignment": 48}, original, "alignment 48 is not a power of two"),
        ({"data_offset": header.data_offset + 8}, original + bytes(8), "multiple of its alignment"),
        ({"flags": 6}, original, "sets flags 0x6"),
        ({}, original + bytes(3), "3 more than its header"),
    ]
    for changes, content, message in cases:
        saved.write_bytes(content)
        rewrite_header(saved, **changes)
        with pytest.raises(InconsistentHeaderError, match=f"{saved}.*{message}"):
            soa.AllTypes.load(saved, mmap=mmap)


def test_refusals_are_soagen_errors_and_value_errors() -> None:
    for error in (
        NotACollectionFileError,
        WrongLayoutFileError,
        TruncatedFileError,
        CorruptFileError,
        NewerFormatError,
        InconsistentHeaderError,
    ):
        assert issubclass(error, CollectionFileError)
        assert issubclass(error, SoaRuntimeError) and issubclass(error, ValueError)


def test_the_readme_snippet_runs_and_its_header_table_is_the_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    from generated.gnn import Nodes
    from tests.helpers import REPO

    section = (REPO / "README.md").read_text().split("### Collections on disk", 1)[1]
    section = section.split("\n### ", 1)[0].split("\n#### Event files", 1)[0]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    nodes = Nodes.allocate(1000, zero=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    namespace: dict[str, object] = {"Nodes": Nodes, "nodes": nodes}
    exec(compile(snippet.replace('"cuda"', repr(device)), "README.md", "exec"), namespace)
    assert namespace["nodes"].device.type == device  # type: ignore[attr-defined]

    rows = re.findall(r"^\| (\d+) \| (\d*) ?\| (\w+) \|", section, re.M)
    codes = files._FIELDS.format[1:] + "I"  # the fixed fields, then header_crc32
    offset, expected = 0, []
    for code in re.findall(r"\d*\w", codes):
        size = struct.calcsize("<" + code)
        expected.append((str(offset), str(size)))
        offset += size
    assert [(start, size) for start, size, _ in rows[:-1]] == expected
    assert rows[-1][:2] == (str(files.FIXED_HEADER_SIZE), "")
    assert rows[0][2] == "magic" and rows[-1][2] == "metadata"
