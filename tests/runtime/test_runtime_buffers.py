"""Allocation and wrapping: alignment, every kind of memory, read-only memory, and bad input."""

from __future__ import annotations

import ctypes
import mmap
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.dlpack

import soagen.runtime
from generated.gnn import Edges, Nodes
from soagen.runtime import Collection
from soagen.runtime.errors import (
    BufferTooSmallError,
    DeviceError,
    ElementCountError,
    InvalidBufferError,
    MisalignedBufferError,
    NonContiguousBufferError,
    ReadOnlyBufferError,
    ReadOnlyCollectionError,
    SoaRuntimeError,
    UnsupportedBufferError,
)
from tests.helpers import REPO

SMALL = """
layout Small {
    align ALIGN
    column float32 a, b
    column int64 c
    scalar float64 s
}
"""


@pytest.fixture(scope="module")
def small(generated_from_text: Callable[[str], ModuleType]) -> Callable[[int], type[Collection]]:
    def make(align: int) -> type[Collection]:
        return generated_from_text(SMALL.replace("ALIGN", str(align))).Small  # type: ignore[no-any-return]

    return make


def address(buffer: Any) -> int:
    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)


def aligned_view(memory: Any, nbytes: int, align: int) -> memoryview:
    """`nbytes` of `memory` (bytes-like, at least nbytes + align long) starting on an aligned address."""
    skip = -address(memory) % align
    return memoryview(memory)[skip : skip + nbytes]


def aligned_bytes(contents: bytes, align: int) -> memoryview:
    """A `bytes` object holding `contents` at an aligned address, as a view of those bytes."""
    held = []  # keeping every candidate alive makes each next one land somewhere new
    for attempt in range(10_000):
        pad = attempt * 16 % align
        candidate = bytes(pad) + contents
        if (address(candidate) + pad) % align == 0:
            return memoryview(candidate)[pad : pad + len(contents)]
        held.append(candidate)
    raise AssertionError("no aligned bytes object found")


def aligned_numpy(nbytes: int, align: int, dtype: Any = np.uint8) -> np.ndarray:
    itemsize = np.dtype(dtype).itemsize
    raw = np.zeros((nbytes + align) // itemsize + 1, dtype=dtype)
    skip = (-raw.ctypes.data % align) // itemsize
    return raw[skip : skip + nbytes // itemsize]


def aligned_tensor(nbytes: int, align: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    itemsize = torch.empty(0, dtype=dtype).element_size()
    raw = torch.zeros((nbytes + align) // itemsize + 1, dtype=dtype)
    skip = (-raw.data_ptr() % align) // itemsize
    return raw[skip : skip + nbytes // itemsize]


# Allocation.


@pytest.mark.parametrize("align", [16, 64, 128, 512, 4096])
def test_allocate_aligns_even_beyond_the_allocator(
    small: Callable[[int], type[Collection]], align: int
) -> None:
    cls = small(align)
    for n in (0, 1, 100, 4097, 100_000):
        for _ in range(3):
            collection = cls.allocate(n)
            assert collection.nbytes == collection.buffer.numel() == cls.byte_size(n)
            assert collection.size == n
            if n:
                assert collection.buffer.data_ptr() % align == 0
                assert collection.member("c").data_ptr() % align == 0


def test_padded_allocations_never_start_at_their_storage() -> None:
    # Where the allocator does not align enough (128 bytes on CPU, which gives 64), the buffer sits
    # past the start of a larger storage. The shift is never 0, so views' storage offsets do not
    # flip between 0 and more with the allocator's luck (torch.compile specializes 0 and 1).
    offsets = {Nodes.allocate(n).member("x").storage_offset() for n in range(1, 400)}
    offsets |= {Edges.allocate(n).member("src").storage_offset() for n in range(1, 400)}
    assert min(offsets) >= 2, offsets  # was 0 for about one in eight


def test_allocate_zero_fills_on_request() -> None:
    nodes = Nodes.allocate(1000, zero=True)
    assert not nodes.buffer.any()


def test_allocate_on_each_device(device: str) -> None:
    nodes = Nodes.allocate(100_000, device=device)
    assert nodes.device.type == torch.device(device).type
    assert nodes.x.device == nodes.device and nodes.block("node_features").device == nodes.device
    from soagen.runtime.buffers import address as buffer_address

    assert buffer_address(nodes.buffer) % Nodes.ALIGNMENT == 0
    nodes.x.fill_(1.5)
    assert nodes.block("node_features")[:, 0].sum().item() == 150_000.0


def test_pinned_allocation() -> None:
    if torch.cuda.is_available():
        nodes = Nodes.allocate(1000, pin_memory=True)
        assert nodes.is_pinned and nodes.buffer.data_ptr() % 128 == 0
    else:
        with pytest.raises(DeviceError, match="pin_memory=True"):
            Nodes.allocate(1000, pin_memory=True)
    assert not Nodes.allocate(10).is_pinned
    refusal = "device must be 'cpu'" if torch.cuda.is_available() else "has 0 CUDA device"
    with pytest.raises(DeviceError, match=refusal):
        Nodes.allocate(10, device="cuda:0", pin_memory=True)


def test_bad_device_names_are_named() -> None:
    with pytest.raises(DeviceError, match="device='nonsense'"):
        Nodes.allocate(10, device="nonsense")
    # A GPU that is not there: named, not torch's AssertionError from a CPU build.
    missing = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(DeviceError, match=f"device='{missing}': this machine has"):
        Nodes.allocate(10, device=missing)
    with pytest.raises(DeviceError, match=f"device='{missing}'"):
        Nodes.allocate(10).to(missing)


def _has(kind: str) -> bool:
    module = getattr(torch, kind, None)
    return module is not None and bool(module.is_available())


@pytest.mark.parametrize(
    ("device", "says"),
    [
        pytest.param(
            "cuda",
            "this machine has 0 CUDA device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here"),
        ),
        pytest.param(
            "xpu",
            "this machine has 0 XPU device",
            marks=pytest.mark.skipif(_has("xpu"), reason="an XPU is here"),
        ),
        pytest.param(
            "xpu:0",
            "this machine has 0 XPU device",
            marks=pytest.mark.skipif(_has("xpu"), reason="an XPU is here"),
        ),
        pytest.param(
            "mps",
            "this machine has 0 MPS device",
            marks=pytest.mark.skipif(_has("mps"), reason="an MPS device is here"),
        ),
        ("nonsense", "is not a torch device"),
        # Device types torch parses but has no backend for in this build: caught on allocation.
        ("hpu", "cannot allocate"),
        ("ipu", "cannot allocate"),
    ],
)
def test_devices_torch_cannot_use_are_soagen_errors(device: str, says: str) -> None:
    # Not torch's AssertionError ("Torch not compiled with XPU enabled"), NotImplementedError
    # or ModuleNotFoundError: a DeviceError naming the argument and the device, wherever memory
    # is put on a device.
    named = f"device='{device}'"
    with pytest.raises(DeviceError, match=f"{named}.*{says}") as refused:
        Nodes.allocate(10, device=device)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 400
    with pytest.raises(DeviceError, match=named):
        Nodes.allocate(10).to(device)
    with pytest.raises(DeviceError, match=named):
        Nodes.from_columns(x=torch.zeros(10), device=device, zero_missing=True)


@pytest.mark.parametrize("bad", [-1, -100])
def test_negative_n_is_refused(bad: int) -> None:
    with pytest.raises(ElementCountError, match=f"n must be >= 0, got {bad}"):
        Nodes.allocate(bad)
    with pytest.raises(ElementCountError, match=f"n must be >= 0, got {bad}"):
        Nodes.wrap(Nodes.allocate(10).buffer, bad)


@pytest.mark.parametrize("bad", [2.5, "3", True, None])
def test_non_integer_n_is_refused(bad: object) -> None:
    with pytest.raises(ElementCountError, match="n must be an integer"):
        Nodes.allocate(bad)  # type: ignore[arg-type]


def test_numpy_integers_count_as_n() -> None:
    assert Nodes.allocate(np.int64(7)).size == 7


# Wrapping writable memory without a copy.


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float64, torch.int32, torch.bool])
def test_wrap_tensor_of_any_dtype(dtype: torch.dtype) -> None:
    storage = aligned_tensor(Edges.byte_size(250) + 64, 128, dtype)
    edges = Edges.wrap(storage, n=250)
    assert edges.buffer.data_ptr() == storage.data_ptr()
    assert edges.nbytes == Edges.byte_size(250)  # the first byte_size(n) bytes, not all
    edges.dst.copy_(torch.arange(250))
    raw = storage.view(torch.uint8)
    offset = Edges.offsets(250)["dst"]
    assert torch.equal(raw[offset : offset + 250 * 8].view(torch.int64), torch.arange(250))


def test_wrap_a_multidimensional_tensor_and_another_collections_buffer() -> None:
    storage = aligned_tensor(Nodes.byte_size(64), 128, torch.float32).reshape(-1, 4)
    nodes = Nodes.wrap(storage, 64)
    nodes.y.fill_(2.0)
    again = Nodes.wrap(nodes.buffer, 64)
    assert torch.equal(again.y, torch.full((64,), 2.0))
    assert again.buffer.data_ptr() == storage.data_ptr()


def test_wrap_numpy_array_shares_memory() -> None:
    array = aligned_numpy(Edges.byte_size(10), 128, np.float32)
    edges = Edges.wrap(array, 10)
    edges.delta_r.fill_(4.0)
    offset = Edges.offsets(10)["delta_r"] // 4
    assert (array[offset : offset + 10] == 4.0).all()
    assert edges.numpy("delta_r").ctypes.data == array.ctypes.data + offset * 4


class Producer:
    """A foreign DLPack producer (as CuPy or JAX would be), forwarding to an array it holds."""

    def __init__(self, inner: Any, legacy: bool = False) -> None:
        self.inner = inner
        self.legacy = legacy
        self.calls: list[dict[str, Any]] = []

    def __dlpack__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        if self.legacy:
            if set(kwargs) - {"stream"}:
                raise TypeError("unexpected keyword")
            return torch.utils.dlpack.to_dlpack(self.inner)
        return self.inner.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self.inner.__dlpack_device__()


@pytest.mark.parametrize("legacy", [False, True])
def test_wrap_dlpack_producer_shares_memory(legacy: bool) -> None:
    storage = aligned_tensor(Edges.byte_size(16), 128)
    producer = Producer(storage, legacy=legacy)
    edges = Edges.wrap(producer, 16)
    edges.src.fill_(9)
    assert edges.buffer.data_ptr() == storage.data_ptr()
    assert storage[:8].tolist() == [9, 0, 0, 0, 0, 0, 0, 0]
    assert producer.calls[0].get("copy") is False  # asked for the memory itself, never a copy


def test_wrap_dlpack_numpy_producer() -> None:
    array = aligned_numpy(Edges.byte_size(16), 128)
    edges = Edges.wrap(Producer(array), 16)
    edges.src.fill_(3)
    assert array[:8].tolist() == [3, 0, 0, 0, 0, 0, 0, 0]


def test_wrap_bytearray(small: Callable[[int], type[Collection]]) -> None:
    cls = small(16)  # CPython aligns a bytearray's data to 16 bytes
    memory = bytearray(cls.byte_size(40))
    assert address(memory) % 16 == 0
    collection = cls.wrap(memory, 40)
    collection.member("a").fill_(1.0)
    assert np.frombuffer(memory, dtype=np.float32, count=40).tolist() == [1.0] * 40


def test_wrap_memoryview_of_a_larger_block() -> None:
    memory = bytearray(Nodes.byte_size(30) + 1024)
    view = aligned_view(memory, Nodes.byte_size(30) + 500, 128)
    nodes = Nodes.wrap(view, 30)
    nodes.energy.fill_(5.0)
    start = address(view) - address(memory) + Nodes.offsets(30)["energy"]
    assert np.frombuffer(memory, np.float32, 30, start).tolist() == [5.0] * 30


def test_wrap_writable_mmap(tmp_path: Path) -> None:
    path = tmp_path / "nodes.bin"
    path.write_bytes(bytes(Nodes.byte_size(20)))
    with open(path, "r+b") as file, mmap.mmap(file.fileno(), 0) as mapped:
        nodes = Nodes.wrap(mapped, 20)
        nodes.detector_id.copy_(torch.arange(20, dtype=torch.int32))
        nodes.bfield.fill_(3.8)
        offset = Nodes.offsets(20)["detector_id"]
        assert np.frombuffer(mapped, np.int32, 20, offset).tolist() == list(range(20))
        del nodes  # release the exported buffer so the mapping can close
    data = path.read_bytes()
    assert np.frombuffer(data, np.int32, 20, Nodes.offsets(20)["detector_id"]).tolist() == list(
        range(20)
    )
    assert np.frombuffer(data, np.float32, 1, Nodes.offsets(20)["bfield"])[0] == pytest.approx(3.8)


def test_storage_that_starts_off_alignment_still_gives_typed_views(
    small: Callable[[int], type[Collection]],
) -> None:
    # A storage whose start is 4 bytes off a float64 boundary, sliced to a 16-byte aligned buffer: the
    # view's byte offset into its storage is not a multiple of 8, so Tensor.view(float64) alone fails.
    cls = small(16)
    memory = bytearray(cls.byte_size(10) + 64)
    skip = (4 - address(memory)) % 16
    storage = torch.frombuffer(memoryview(memory)[skip:], dtype=torch.uint8)
    buffer = storage[12 : 12 + cls.byte_size(10)]
    assert buffer.data_ptr() % 16 == 0 and buffer.storage_offset() % 8
    collection = cls.wrap(buffer, 10)
    collection.member("c").copy_(torch.arange(10))
    collection.member("s").fill_(2.5)
    offset = cls.offsets(10)["c"]
    assert collection.member("c").data_ptr() == buffer.data_ptr() + offset
    stored = np.frombuffer(memory, np.int64, 10, skip + 12 + offset)
    assert stored.tolist() == list(range(10))
    assert collection.numpy("s")[()] == 2.5


# Read-only memory: refused, or wrapped read-only with NumPy views only.


class ReadOnlyProducer(Producer):
    """A DLPack >= 1.0 producer that marks its memory read-only (as NumPy 2 does for a read-only
    array), whatever NumPy is installed: a torch tensor's versioned capsule with the flag set."""

    def __dlpack__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        if kwargs.get("max_version") is None:  # an old consumer: refused, as NumPy 2 does
            raise BufferError("cannot export a readonly array without max_version >= (1, 0)")
        capsule = self.inner.__dlpack__(**kwargs)
        get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
            ("PyCapsule_GetPointer", ctypes.pythonapi)
        )
        pointer = get_pointer(capsule, b"dltensor_versioned")
        # DLManagedTensorVersioned: version (2 x uint32), manager_ctx, deleter, then uint64 flags.
        flags = ctypes.c_uint64.from_address(pointer + 8 + 8 + 8)
        flags.value |= 1  # DLPACK_FLAG_BITMASK_READ_ONLY
        return capsule


def _read_only_sources(tmp_path: Path) -> dict[str, Any]:
    nbytes = Nodes.byte_size(12)
    contents = np.arange(nbytes // 4, dtype=np.float32).tobytes()
    path = tmp_path / "ro.bin"
    path.write_bytes(contents)
    file = open(path, "rb")  # noqa: SIM115 - closed with the mapping by the garbage collector
    mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    array = aligned_numpy(nbytes, 128)
    array[:] = np.frombuffer(contents, np.uint8)
    array.flags.writeable = False
    marked = aligned_tensor(nbytes, 128)
    marked.copy_(torch.frombuffer(bytearray(contents), dtype=torch.uint8))
    return {
        "bytes": aligned_bytes(contents, 128),
        "mmap": mapped,
        "numpy": array,
        "dlpack": Producer(array),  # NumPy 2 marks it read-only; NumPy 1 refuses to export it
        "dlpack-marked": ReadOnlyProducer(marked),  # marked read-only under any NumPy
    }


@pytest.mark.parametrize("known", [False, True])
def test_a_read_only_array_is_shared_without_a_warning_whichever_way_numpy_exports_it(
    monkeypatch: pytest.MonkeyPatch, known: bool
) -> None:
    """Read-only NumPy arrays go through DLPack where NumPy exports them, else through
    `from_numpy` with its warning silenced; which one holds is found at the first such array
    (each event of a mapped event file wraps one), and either way the memory is shared."""
    from soagen.runtime import buffers

    monkeypatch.setattr(buffers, "_dlpack_takes_read_only", None)
    array = np.arange(16, dtype=np.uint8)
    array.flags.writeable = False
    exports: list[object] = []
    from_dlpack = torch.utils.dlpack.from_dlpack

    def counted(source: Any) -> torch.Tensor:
        exports.append(source)
        return from_dlpack(source)

    monkeypatch.setattr(torch.utils.dlpack, "from_dlpack", counted)
    if known:
        buffers._numpy_to_tensor(array)
        exports.clear()
    for _ in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tensor = buffers._numpy_to_tensor(array)
        assert tensor.data_ptr() == array.ctypes.data
        assert tensor.tolist() == list(range(16))
    found = buffers._dlpack_takes_read_only
    assert found in (True, False)
    # Asked once where NumPy refuses; every time where it exports (the memory goes that way).
    assert len(exports) == (3 if found else 0 if known else 1)


@pytest.mark.parametrize("kind", ["bytes", "mmap", "numpy", "dlpack", "dlpack-marked"])
def test_read_only_memory_is_refused_by_default(tmp_path: Path, kind: str) -> None:
    source = _read_only_sources(tmp_path)[kind]
    with pytest.raises(ReadOnlyBufferError, match="read_only=True"):
        Nodes.wrap(source, 12)


@pytest.mark.parametrize("kind", ["bytes", "mmap", "numpy", "dlpack", "dlpack-marked"])
def test_read_only_wrap_gives_read_only_numpy_views_and_no_torch_views(
    tmp_path: Path, kind: str
) -> None:
    if kind == "dlpack" and np.lib.NumpyVersion(np.__version__) < "2.0.0":
        pytest.skip("NumPy < 2 exports no read-only array through DLPack")
    source = _read_only_sources(tmp_path)[kind]
    nodes = Nodes.wrap(source, 12, read_only=True)
    assert nodes.read_only
    expected = np.arange(Nodes.byte_size(12) // 4, dtype=np.float32)
    offset = Nodes.offsets(12)["y"] // 4
    y = nodes.numpy("y")
    assert isinstance(y, np.ndarray)
    assert y.tolist() == expected[offset : offset + 12].tolist()
    assert not y.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        y[0] = 1.0
    with pytest.raises(ValueError, match="cannot set WRITEABLE flag to True"):
        y.flags.writeable = True
    for name, view in nodes.numpy().items():
        assert not view.flags.writeable, name
    block = nodes.numpy(Nodes.BLOCKS["node_features"])
    assert block.shape == (12, 4) and not block.flags.writeable
    for refused in (
        lambda: nodes.y,
        lambda: nodes.member("x"),
        lambda: nodes.block("node_features"),
        lambda: nodes.view(Nodes.member_views(12)["x"]),
        lambda: nodes.buffer,
        lambda: nodes[2:4].covariance,
    ):
        with pytest.raises(ReadOnlyCollectionError, match="numpy"):
            refused()
    copy = nodes.clone()  # reading is fine: the copy is new, writable memory
    assert not copy.read_only
    assert copy.y.tolist() == expected[offset : offset + 12].tolist()
    copy.y.fill_(0.0)
    assert nodes.numpy("y").tolist() == expected[offset : offset + 12].tolist()


def test_unsafe_torch_views_of_read_only_memory_are_explicit(tmp_path: Path) -> None:
    source = _read_only_sources(tmp_path)["mmap"]
    nodes = Nodes.wrap(source, 12, read_only=True, unsafe_torch_views=True)
    assert nodes.read_only
    assert nodes.x.tolist() == list(range(12))
    with pytest.raises(ValueError, match="only applies with read_only=True"):
        Nodes.wrap(bytearray(10), 1, unsafe_torch_views=True)


def test_read_only_wrap_of_writable_memory_cannot_be_written_through_numpy() -> None:
    array = aligned_numpy(Edges.byte_size(8), 128)
    edges = Edges.wrap(array, 8, read_only=True)
    src = edges.numpy("src")
    with pytest.raises(ValueError, match="assignment destination is read-only"):
        src[0] = 1
    with pytest.raises(ValueError, match="cannot set WRITEABLE flag to True"):
        src.flags.writeable = True
    with pytest.raises(ReadOnlyCollectionError):
        _ = edges.src


# Bad buffers, each with a message naming the argument and the numbers.


def test_buffer_too_small() -> None:
    buffer = aligned_tensor(1000, 128)
    with pytest.raises(BufferTooSmallError) as caught:
        Nodes.wrap(buffer, 100)
    assert str(caught.value) == (
        f"buffer holds 1000 bytes but Nodes with n=100 needs {Nodes.byte_size(100)} "
        "(Nodes.byte_size(100))"
    )
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, SoaRuntimeError)
    assert isinstance(caught.value, InvalidBufferError)


@pytest.mark.parametrize("shift", [1, 4, 64])
def test_misaligned_buffer(shift: int) -> None:
    buffer = aligned_tensor(Nodes.byte_size(10) + 128, 128)[shift:]
    with pytest.raises(MisalignedBufferError, match=f"{shift} bytes past a 128-byte boundary"):
        Nodes.wrap(buffer, 10)


def test_misaligned_numpy_memory_is_told_of_the_aligned_helpers() -> None:
    # A producer's plain np.zeros starts wherever NumPy's allocator put it (16-byte aligned): the
    # refusal names the helpers that make memory `wrap` takes.
    array = np.zeros(Nodes.byte_size(10) + 128, dtype=np.uint8)
    shift = (16 - array.ctypes.data % 128) % 128 or 16
    with pytest.raises(MisalignedBufferError) as refused:
        Nodes.wrap(array[shift : shift + Nodes.byte_size(10)], 10)
    message = str(refused.value)
    assert "soagen.runtime.aligned_numpy(Nodes.byte_size(n), 128)" in message
    assert "aligned_tensor(Nodes.byte_size(n), 128, device=...)" in message


@pytest.mark.parametrize("alignment", [1, 16, 128, 4096])
@pytest.mark.parametrize("nbytes", [0, 1, 1920, 100_003])
def test_aligned_helpers_give_memory_aligned_as_asked(alignment: int, nbytes: int) -> None:
    for _ in range(4):  # not the allocator's luck
        array = soagen.runtime.aligned_numpy(nbytes, alignment)
        assert isinstance(array, np.ndarray) and array.dtype == np.uint8
        assert array.shape == (nbytes,) and array.flags.writeable and array.flags.c_contiguous
        assert array.ctypes.data % alignment == 0
        tensor = soagen.runtime.aligned_tensor(nbytes, alignment)
        assert tensor.dtype == torch.uint8 and tensor.shape == (nbytes,)
        assert tensor.device == torch.device("cpu") and tensor.is_contiguous()
        assert tensor.data_ptr() % alignment == 0
    assert not soagen.runtime.aligned_numpy(nbytes, alignment, zero=True).any()
    assert not soagen.runtime.aligned_tensor(nbytes, alignment, zero=True).any()


def test_aligned_helpers_memory_wraps_without_a_copy(device: str) -> None:
    n = 1000
    array = soagen.runtime.aligned_numpy(Nodes.byte_size(n), Nodes.ALIGNMENT)
    nodes = Nodes.wrap(array, n, exact=True)
    nodes.x.fill_(2.5)
    assert nodes.buffer.data_ptr() == array.ctypes.data
    assert array.view(np.float32)[:n].tolist() == [2.5] * n  # x is the first column
    tensor = soagen.runtime.aligned_tensor(Edges.byte_size(n), Edges.ALIGNMENT, device=device)
    edges = Edges.wrap(tensor, n, exact=True, device=device)
    assert edges.buffer.data_ptr() == tensor.data_ptr() and edges.device == tensor.device


@pytest.mark.parametrize("alignment", [0, -128, 96, 1.5, True, "128"])
def test_aligned_helpers_refuse_alignments_that_are_not_powers_of_two(alignment: Any) -> None:
    for helper in (soagen.runtime.aligned_numpy, soagen.runtime.aligned_tensor):
        with pytest.raises(ValueError, match=f"alignment must be a power of two.*{alignment!r}"):
            helper(1000, alignment)


def test_aligned_helpers_name_their_bad_arguments() -> None:
    for helper in (soagen.runtime.aligned_numpy, soagen.runtime.aligned_tensor):
        with pytest.raises(ElementCountError, match="nbytes must be >= 0, got -1"):
            helper(-1)
    with pytest.raises(DeviceError, match="device='nonsense'"):
        soagen.runtime.aligned_tensor(10, device="nonsense")


def test_exact_tells_apart_only_counts_of_different_byte_sizes() -> None:
    # What the README says exact=True cannot do: n = 1 .. 32 Nodes all take 1920 bytes (each
    # 4-byte column rounds up to 128), so a buffer for 32 passes as one for 1; 33 is refused.
    buffer = soagen.runtime.aligned_numpy(Nodes.byte_size(32), Nodes.ALIGNMENT)
    for n in (1, 17, 32):
        assert Nodes.wrap(buffer, n, exact=True).size == n
    with pytest.raises(ElementCountError, match="exact=True"):
        Nodes.wrap(buffer, 0, exact=True)  # 128 bytes: the scalar only
    with pytest.raises(BufferTooSmallError):
        Nodes.wrap(buffer, 33, exact=True)


def test_wrong_device() -> None:
    buffer = Nodes.allocate(10).buffer
    for asked in ("cuda:0", "cuda", "meta"):
        with pytest.raises(DeviceError, match=f"buffer is on cpu but device='{asked}'"):
            Nodes.wrap(buffer, 10, device=asked)
    assert Nodes.wrap(buffer, 10, device="cpu").device == torch.device("cpu")


def test_wrap_on_each_device(device: str) -> None:
    edges = Edges.allocate(100, device=device)
    again = Edges.wrap(edges.buffer, 100, device=device)
    edges.src.fill_(4)
    assert again.src.sum().item() == 400
    assert again.buffer.data_ptr() == edges.buffer.data_ptr()


def test_non_contiguous_buffers() -> None:
    tensor = aligned_tensor(2 * Nodes.byte_size(10), 128)
    with pytest.raises(NonContiguousBufferError, match="contiguous.*strides \\(2,\\)"):
        Nodes.wrap(tensor[::2], 10)
    square = aligned_tensor(Nodes.byte_size(10) * 4, 128, torch.float32).reshape(-1, 128).T
    with pytest.raises(NonContiguousBufferError, match="torch.Tensor"):
        Nodes.wrap(square, 10)
    array = aligned_numpy(2 * Nodes.byte_size(10), 128)
    with pytest.raises(NonContiguousBufferError, match="numpy"):
        Nodes.wrap(array[::2], 10)
    view = memoryview(bytearray(2 * Nodes.byte_size(10)))[::2]
    with pytest.raises(NonContiguousBufferError, match="memoryview"):
        Nodes.wrap(view, 10)


@pytest.mark.parametrize("bad", ["text", 12, [1, 2, 3], None])
def test_unsupported_buffer_kinds(bad: object) -> None:
    with pytest.raises(UnsupportedBufferError, match="buffer must be") as caught:
        Nodes.wrap(bad, 1)
    assert isinstance(caught.value, TypeError)


def test_lazy_conjugate_tensor_is_refused() -> None:
    tensor = torch.zeros(Nodes.byte_size(1) // 8, dtype=torch.complex64).conj()
    with pytest.raises(UnsupportedBufferError, match="conjugate"):
        Nodes.wrap(tensor, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float16, torch.bool])
@pytest.mark.parametrize(
    ("n", "columns", "pitch"),
    [
        (5000, 2, 5000),  # unpadded columns: the transpose ATen would copy in tiles
        (5000, 2, 5024),  # padded columns
        (1024, 3, 1024),  # under the tiled-transpose size
        (300, 64, 300),  # many columns
        (4096, 1, 4096),  # one column: already contiguous
    ],
)
def test_contiguous_copy_equals_contiguous_and_owns_its_memory(
    dtype: torch.dtype, n: int, columns: int, pitch: int
) -> None:
    from soagen.runtime.buffers import contiguous_copy

    storage = torch.randint(0, 100, (columns * pitch,)).to(dtype)
    view = storage.as_strided((n, columns), (1, pitch))
    copy = contiguous_copy(view)
    assert copy.is_contiguous() and copy.dtype == dtype and copy.shape == view.shape
    assert torch.equal(copy, view)
    if columns > 1:
        assert copy.data_ptr() != storage.data_ptr()
        copy.zero_()
        assert torch.equal(view, storage.as_strided((n, columns), (1, pitch)))
    # A one-column result seen as [1, n] is contiguous already: no copy.
    single = torch.arange(5000, dtype=torch.float32).reshape(5000, 1).t()
    assert contiguous_copy(single).data_ptr() == single.data_ptr()
    # A row-major [n, c] seen as [c, n] (what `soagen serve` sends) and tensors of other ranks.
    for other in (copy.t(), storage[:n], storage[: 4 * 5 * 6].reshape(4, 5, 6).transpose(0, 2)):
        assert torch.equal(contiguous_copy(other), other.contiguous())
        assert contiguous_copy(other).is_contiguous()


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.int8, torch.bool, torch.bfloat16, torch.complex64],
)
@pytest.mark.parametrize("columns", [1, 2, 4, 9])
# 8193 rows: with 4096-byte chunks of 2-, 4- or 8-byte rows, a last chunk of one row.
@pytest.mark.parametrize("n", [3, 8193, 10_000])
@pytest.mark.parametrize("split", [True, False], ids=["split-rows", "strided"])
def test_copy_values_writes_every_bit_into_column_views(
    dtype: torch.dtype, columns: int, n: int, split: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from soagen.runtime import buffers

    # Small chunks, so that the chunked paths run at test sizes (rows 0..k, k.., a short tail),
    # and rows split by integer conversions (rows of 2, 4 or 8 bytes) at any size, or never.
    monkeypatch.setattr(buffers, "_COPY_CHUNK_BYTES", 4096)
    monkeypatch.setattr(buffers, "_SPLIT_ROWS_MIN", 0 if split else sys.maxsize)
    pitch = n + 29
    source_bytes = torch.randint(0, 256, (n * columns * dtype.itemsize,), dtype=torch.uint8)
    if dtype == torch.bool:
        source_bytes %= 2
    # Arbitrary bit patterns: NaN payloads, negative zeros and denormals must come through as is.
    source = source_bytes.view(dtype).reshape(n, columns)
    storage = torch.zeros(columns * pitch + 7, dtype=dtype)
    target = storage[7:].as_strided((n, columns), (1, pitch))
    version = storage._version
    splits: list[int] = []
    split_rows = buffers._split_rows
    monkeypatch.setattr(buffers, "_split_rows", lambda *args: (splits.append(1), split_rows(*args)))
    buffers.copy_values(target, source)
    row_bytes = columns * dtype.itemsize
    large = n * columns >= buffers._STRIDED_COPY_MIN  # below it, one copy_ of every value
    splits_these = columns > 1 and row_bytes in (2, 4, 8) and dtype != torch.bool
    assert splits == ([1] if split and large and splits_these else [])
    written = torch.empty(n, columns, dtype=dtype).copy_(target)  # same dtype: bits as they are
    assert torch.equal(written.view(torch.uint8), source.view(torch.uint8))
    assert storage._version > version  # the write is seen by autograd's counter
    # The padding between columns and the bytes before the view are untouched.
    untouched = torch.ones(storage.shape, dtype=torch.bool)
    untouched[7:].as_strided((n, columns), (1, pitch)).fill_(False)
    assert not storage[untouched].any()


def test_rows_are_split_by_conversions_only_where_they_keep_the_low_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from soagen.runtime import buffers

    # ATen keeps the low bits when it narrows integers here; C++ leaves that to the build, so
    # the splitting asks once per process, and copies value by value where the answer is no.
    widths = buffers._INTEGER_OF_WIDTH
    for row in (2, 4, 8):
        for width in (1, 2, 4):
            if width < row:
                assert buffers._conversion_truncates(widths[row], widths[width]), (row, width)
    source = torch.randn(100_000, 2)
    target = torch.zeros(2, 100_001)[:, 1:].t()
    assert buffers._splits_rows(target, source)
    assert not buffers._splits_rows(target[:, :1], source[:, :1])  # one column: nothing to split
    assert not buffers._splits_rows(target, source.t().contiguous().t())  # not row-major
    assert not buffers._splits_rows(torch.zeros(100_000, 2), source)  # not columns
    assert not buffers._splits_rows(target.double(), source.double())  # 16-byte rows
    assert not buffers._splits_rows(target, source.clone().requires_grad_())
    # copy_ makes a bool's nonzero bytes 1; its bits would keep them.
    assert not buffers._splits_rows(target.bool(), source.bool())
    # Columns over each other, or over the source: copy_'s to handle, or to refuse.
    assert not buffers._splits_rows(torch.zeros(100_000).as_strided((100_000, 2), (1, 0)), source)
    shared = torch.zeros(400_000)
    assert not buffers._splits_rows(
        shared[1:].as_strided((100_000, 2), (1, 200_000)), shared[:200_000].view(100_000, 2)
    )
    fake = torch.Tensor._make_subclass(type("Traced", (torch.Tensor,), {}), source)
    assert not buffers._splits_rows(target, fake)
    # The check of ATen's narrowing runs on the CPU whatever the default device.
    monkeypatch.setattr(buffers, "_TRUNCATES", {})
    with torch.device("meta"):
        buffers.copy_values(target, source)
    assert buffers._TRUNCATES == {(8, 4): True}
    assert torch.equal(target, source)
    target.zero_()
    # A check that cannot run says no, and is asked again next time.
    monkeypatch.setattr(buffers, "_TRUNCATES", {})
    with monkeypatch.context() as patched:
        patched.setattr(buffers, "_conversion_truncates", lambda wide, narrow: 1 / 0)
        assert not buffers._splits_rows(target, source)
    assert buffers._TRUNCATES == {}
    assert buffers._splits_rows(target, source)
    monkeypatch.setitem(buffers._TRUNCATES, (8, 4), False)
    calls: list[object] = []
    monkeypatch.setattr(buffers, "_split_rows", lambda *args: calls.append(args))
    buffers.copy_values(target, source)
    assert not calls
    assert torch.equal(target, source)


def test_copy_values_keeps_copy_semantics_for_other_pairs() -> None:
    from soagen.runtime.buffers import copy_values

    target = torch.zeros(10_000, 2)
    copy_values(target, torch.tensor([1.5, 2.5]))  # a broadcast source
    assert torch.equal(target, torch.tensor([1.5, 2.5]).expand(10_000, 2))
    copy_values(target, torch.ones(10_000, 2, dtype=torch.float64).t().contiguous().t())
    assert torch.equal(target, torch.ones(10_000, 2))  # another dtype: converted
    with pytest.raises(RuntimeError, match=r"size of tensor a \(10000\) must match .* \(9999\)"):
        copy_values(target, torch.ones(9_999, 2).t().contiguous().t())


def test_memory_without_torch_says_what_to_install() -> None:
    # Generated modules import without torch (generation and linting need none); memory needs it.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from generated.gnn import Nodes\n"
        "Nodes.allocate(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "ModuleNotFoundError: soagen's collections need torch" in done.stderr
    assert "pip install 'soagen[torch]'" in done.stderr


def test_exact_wrapping_catches_a_wrong_element_count() -> None:
    """Member offsets depend on n: 500 elements of a 1000-element buffer read other bytes."""
    full = Nodes.allocate(1000, zero=True)
    full.y.fill_(5.0)
    assert Nodes.wrap(full.buffer, 500).y.max() == 0  # allowed: the first byte_size(500) bytes
    with pytest.raises(ElementCountError, match=r"not the \d+ of Nodes with n=500 \(exact=True\)"):
        Nodes.wrap(full.buffer, 500, exact=True)
    assert Nodes.wrap(full.buffer, 1000, exact=True).y.min() == 5.0
