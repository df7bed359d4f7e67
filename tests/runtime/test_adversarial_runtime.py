"""Adversarial run-time cases: buffers of every wrong size and alignment, odd devices and dtypes;
models that return the wrong things, raise, write into their inputs, or run from many threads.

Complements test_runtime_buffers.py, test_model.py and test_backends.py (which hold the first cases
of each kind).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest
import torch
from torch import nn

from soagen.runtime.errors import (
    BindingError,
    BufferTooSmallError,
    DeviceError,
    IndexRangeError,
    InputModifiedError,
    MisalignedBufferError,
    NonContiguousBufferError,
    OutputError,
    SoaRuntimeError,
    UnsupportedBufferError,
)
from soagen.runtime.spec import StridedView
from tests.helpers import INDEX_DTYPE_NAMES, INDEX_EDGE_BOUNDS, index_edge_values

SCHEMA = """
layout Points {
    align 64
    column float32 x, y, z
    column int64 label
    scalar float64 scale
}
layout Scores {
    column float32 a, b
}
layout Indexed {
    align 16
    column uint32 u32
    column uint64 u64
    column int16 i16
}
// Scalars can only be inputs: an output block of them is refused (SOA309, test_diagnostics.py).
layout Params {
    scalar float32 p, q
    column float32 v
}
model Mlp {
    input points = Points{x, y, z} as [n, c]
    output scores = Scores{a, b} as [n, c]
}
model Two {
    input points = Points{x, y, z}
    output first = Scores{a}
    output second = Scores{b}
}
model ByIndex {
    input index = Indexed{u64}
    input index32 = Indexed{u32}
    input points = Points{x, y, z}
    output first = Scores{a}
}
"""


@pytest.fixture(scope="module")
def soa(generated_from_text: Callable[[str], ModuleType]) -> ModuleType:
    return generated_from_text(SCHEMA)


def points(soa: ModuleType, n: int, seed: int = 0):  # type: ignore[no-untyped-def]
    collection = soa.Points.allocate(n, zero=True)
    generator = torch.Generator().manual_seed(seed)
    collection.block("points").copy_(torch.randn(n, 3, generator=generator))
    return collection


def aligned(nbytes: int, alignment: int) -> torch.Tensor:
    raw = torch.zeros(nbytes + alignment, dtype=torch.uint8)
    shift = -raw.data_ptr() % alignment
    return raw[shift : shift + nbytes]


class Returns(nn.Module):
    """A model returning whatever `make` builds from its inputs."""

    def __init__(self, make: Callable[..., object]) -> None:
        super().__init__()
        self.make = make

    def forward(self, *inputs: torch.Tensor) -> object:
        return self.make(*inputs)


# --- buffers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["Points", "Scores", "Indexed", "Params"])
@pytest.mark.parametrize("n", [0, 1, 5, 33])
def test_every_short_buffer_is_refused_and_every_long_enough_one_works(
    soa: ModuleType, layout: str, n: int
) -> None:
    cls = getattr(soa, layout)
    needed = cls.byte_size(n)
    buffer = aligned(needed + cls.ALIGNMENT, cls.ALIGNMENT)
    for size in range(needed):
        with pytest.raises(
            BufferTooSmallError, match=f"holds {size} bytes but {layout} with n={n}"
        ):
            cls.wrap(buffer[:size], n)
    for size in (needed, needed + 1, needed + cls.ALIGNMENT):
        wrapped = cls.wrap(buffer[:size], n)
        assert wrapped.nbytes == needed
        assert needed == 0 or wrapped.buffer.data_ptr() == buffer.data_ptr()
        last = cls.MEMBERS[-1].name
        view = wrapped.member(last)
        # The last member's view ends inside the bytes used.
        end = (
            view.data_ptr()
            - buffer.data_ptr()
            + view.element_size()
            * (1 + sum((s - 1) * t for s, t in zip(view.shape, view.stride(), strict=True)))
        )
        assert view.numel() == 0 or end <= needed


@pytest.mark.parametrize("layout", ["Points", "Scores", "Indexed"])
def test_every_misaligned_start_is_refused(soa: ModuleType, layout: str) -> None:
    cls = getattr(soa, layout)
    alignment = cls.ALIGNMENT
    needed = cls.byte_size(7)
    buffer = aligned(needed + alignment, alignment)
    for shift in range(1, alignment):
        with pytest.raises(MisalignedBufferError, match=f"{shift} bytes past a {alignment}-byte"):
            cls.wrap(buffer[shift : shift + needed], 7)
    assert cls.wrap(buffer[alignment:], 7).buffer.data_ptr() % alignment == 0
    # The same through NumPy and a memoryview: the check is on the address, whatever the object.
    array = buffer.numpy()
    for shift in (1, alignment // 2, alignment - 1):
        with pytest.raises(MisalignedBufferError):
            cls.wrap(array[shift : shift + needed], 7)
        with pytest.raises(MisalignedBufferError):
            cls.wrap(memoryview(array)[shift : shift + needed], 7)


def test_meta_buffers_give_meta_views_and_are_refused_elsewhere(soa: ModuleType) -> None:
    meta = torch.empty(soa.Points.byte_size(10), dtype=torch.uint8, device="meta")
    wrapped = soa.Points.wrap(meta, 10)
    assert wrapped.device.type == "meta" and wrapped.x.device.type == "meta"
    assert wrapped.block("points").shape == (10, 3)
    with pytest.raises(DeviceError, match="buffer is on meta but device='cpu'"):
        soa.Points.wrap(meta, 10, device="cpu")
    with pytest.raises(BufferTooSmallError):
        soa.Points.wrap(meta[:-1], 10)
    with pytest.raises(DeviceError, match="needs host memory"):
        wrapped.numpy()
    # A model on meta collections runs on meta tensors and writes nothing anywhere real.
    scores = soa.Scores.allocate(10, device="meta")
    soa.Mlp(Returns(lambda p: p[:, :2] * 2))(wrapped, out=scores)
    assert scores.device.type == "meta"


@pytest.mark.parametrize(
    "make",
    [
        lambda size: torch.zeros(size, dtype=torch.complex128),
        lambda size: torch.zeros(size, dtype=torch.bool),
        lambda size: torch.zeros(size, dtype=torch.bfloat16),
        lambda size: torch.zeros(size, dtype=torch.float64),
        lambda size: np.zeros(size, dtype=np.dtype([("a", "<i4"), ("b", "<f4")])),
        lambda size: np.zeros(size, dtype=np.float16),
    ],
    ids=["complex128", "bool", "bfloat16", "float64", "numpy-structured", "numpy-float16"],
)
def test_buffers_of_any_plain_dtype_are_bytes(
    soa: ModuleType, make: Callable[[int], object]
) -> None:
    """Whatever the buffer's element type, its bytes hold the layout; values round-trip."""
    needed = soa.Points.byte_size(9)
    for extra in range(0, 4096, 8):
        buffer = make(needed + extra)
        data = buffer.data_ptr() if isinstance(buffer, torch.Tensor) else buffer.ctypes.data
        if data % 64 == 0:
            break
    else:
        pytest.skip("no 64-byte aligned allocation found")
    wrapped = soa.Points.wrap(buffer, 9)
    wrapped.x.copy_(torch.arange(9.0))
    wrapped.label.copy_(torch.arange(9) - 4)
    again = soa.Points.wrap(buffer, 9)
    assert torch.equal(again.x, torch.arange(9.0)) and torch.equal(again.label, torch.arange(9) - 4)


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*:UserWarning")
@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (
            lambda: torch.zeros(4096).to_sparse(),
            UnsupportedBufferError,
            "must be a dense strided tensor, .* with layout torch.sparse_coo",
        ),
        (
            lambda: torch.quantize_per_tensor(torch.zeros(4096), 0.1, 0, torch.quint8),
            UnsupportedBufferError,
            "must be a dense strided tensor, got a torch.Tensor of torch.quint8",
        ),
        (
            lambda: np.empty(4096, dtype=object),
            UnsupportedBufferError,
            "numpy.ndarray of object: object arrays hold pointers, not data",
        ),
        (
            lambda: torch.zeros(64, 64)[:, :10],
            NonContiguousBufferError,
            r"must be contiguous, .* of shape \(64, 10\) with strides \(64, 1\)",
        ),
    ],
    ids=["sparse", "quantized", "numpy-object", "non-contiguous"],
)
def test_buffers_that_are_not_plain_bytes_are_refused(
    soa: ModuleType, bad: Callable[[], object], error: type[SoaRuntimeError], message: str
) -> None:
    with pytest.raises(error, match=message):
        soa.Points.wrap(bad(), 1)


def test_a_zero_dimensional_tensor_is_a_buffer_of_its_bytes(soa: ModuleType) -> None:
    with pytest.raises(BufferTooSmallError, match="holds 8 bytes"):
        soa.Points.wrap(torch.tensor(1.0, dtype=torch.float64), 1)


# --- models: outputs ---------------------------------------------------------------------------------


def test_nan_and_infinities_are_written_not_refused(soa: ModuleType) -> None:
    values = torch.tensor(
        [float("nan"), float("inf"), -float("inf"), -0.0, 1.0], dtype=torch.float32
    )
    payload = torch.tensor([0x7FC00123], dtype=torch.int32).view(torch.float32)  # a NaN payload
    values = torch.cat([values, payload])
    n = len(values)
    collection, scores = points(soa, n), soa.Scores.allocate(n, zero=True)
    soa.Mlp(Returns(lambda p: torch.stack([values, values.flip(0)], 1)))(collection, out=scores)
    # Bit for bit: NaN (with its payload) and the sign of zero survive.
    assert torch.equal(scores.a.view(torch.int32), values.view(torch.int32))
    assert torch.equal(scores.b.view(torch.int32), values.flip(0).view(torch.int32))
    assert bool(scores.a.isnan()[0]) and bool(scores.a.isnan()[-1])


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p[:, :2].reshape(2, -1), r"shape \[2, 3\], expected \[3, 2\]"),
        (lambda p: p[:, :1], r"shape \[3, 1\], expected \[3, 2\]"),
        (lambda p: p[:, :2].unsqueeze(0), r"shape \[1, 3, 2\]"),
        (lambda p: p[0, 0], r"shape \[\], expected \[3, 2\]"),
        (lambda p: torch.empty(0, 2), r"returned 0 elements, but its output collection"),
        (lambda p: p[:, :2].half(), "dtype torch.float16, expected torch.float32"),
        (lambda p: p[:, :2].to(torch.int32), "dtype torch.int32"),
        (lambda p: p[:, :2] > 0, "dtype torch.bool"),
        (lambda p: p[:, :2].to(torch.complex64), "dtype torch.complex64"),
        (lambda p: p[:, :2].to("meta"), "device meta, expected cpu"),
    ],
    ids=[
        "transposed",
        "narrow",
        "extra-axis",
        "0-d",
        "empty",
        "f16",
        "i32",
        "bool",
        "complex",
        "meta",
    ],
)
def test_wrong_outputs_are_refused_and_nothing_is_written(
    soa: ModuleType, make: Callable[..., object], message: str
) -> None:
    collection, scores = points(soa, 3), soa.Scores.allocate(3)
    scores.buffer.fill_(0xAB)
    with pytest.raises(OutputError, match=message):
        soa.Mlp(Returns(make))(collection, out=scores)
    assert bool((scores.buffer == 0xAB).all())


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: (p[:, 0],), r"returned 1 output\(s\), the schema declares 2"),
        (lambda p: (p[:, 0], p[:, 1], p[:, 2]), r"returned 3 output\(s\)"),
        (lambda p: (), r"returned 0 output\(s\)"),
        (lambda p: [p[:, 0]] * 5, r"returned 5 output\(s\)"),
        (lambda p: {"first": p[:, 0]}, "dict with keys first"),
        (lambda p: {"first": p[:, 0], "second": p[:, 1], "third": p[:, 2]}, "dict with keys"),
        (lambda p: (p[:, 0], p[:, 1].numpy()), "returned tuple"),
        (lambda p: p.numpy(), "returned ndarray"),
        (lambda p: 1.5, "returned float"),
        (lambda p: "scores", "returned str"),
        (lambda p: (t for t in (p[:, 0], p[:, 1])), "returned generator"),
        (lambda p: [[1.0, 2.0]], "returned list"),
    ],
    ids=["1-tuple", "3-tuple", "empty", "list-5", "dict-missing", "dict-extra", "numpy-in-tuple",
         "numpy", "float", "str", "generator", "nested-list"],
)  # fmt: skip
def test_wrong_output_counts_and_non_tensors_are_refused(
    soa: ModuleType, make: Callable[..., object], message: str
) -> None:
    collection, scores = points(soa, 4), soa.Scores.allocate(4)
    scores.buffer.fill_(0x5A)
    with pytest.raises(OutputError, match=message):
        soa.Two(Returns(make))(collection, out=scores)
    assert bool((scores.buffer == 0x5A).all())


def test_strided_and_grad_requiring_outputs_are_written_exactly(soa: ModuleType) -> None:
    collection, scores = points(soa, 6), soa.Scores.allocate(6, zero=True)
    weight = nn.Parameter(torch.ones(6, 2))
    wide = torch.arange(24.0).reshape(6, 4)
    soa.Mlp(Returns(lambda p: wide[:, ::2]))(collection, out=scores)  # a non-contiguous result
    assert torch.equal(scores.block("scores"), wide[:, ::2])
    soa.Mlp(Returns(lambda p: weight * 3))(collection, out=scores)
    assert torch.equal(scores.block("scores"), torch.full((6, 2), 3.0))


class Failure(Exception):
    pass


@pytest.mark.parametrize(
    "error", [ValueError("v"), IndexError("i"), Failure("custom"), KeyError("k")]
)
def test_errors_propagate_unchanged_and_the_model_still_works_after(
    soa: ModuleType, error: Exception
) -> None:
    calls = []

    def make(p: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 1:
            raise error
        return p[:, :2] + 1

    model = soa.Mlp(Returns(make))
    collection, scores = points(soa, 5), soa.Scores.allocate(5)
    scores.buffer.fill_(1)
    with pytest.raises(type(error)) as caught:
        model(collection, out=scores)
    assert caught.value is error
    assert bool((scores.buffer == 1).all())
    model(collection, out=scores)
    assert torch.equal(scores.block("scores"), collection.block("points")[:, :2] + 1)


# --- models: inputs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "write",
    [
        lambda p: p.add_(1),
        lambda p: p.__setitem__((0, 0), 5.0),
        lambda p: torch.add(p, 1, out=p),
        lambda p: p.t().mul_(0),
        lambda p: p[:, 1].zero_(),
        lambda p: p.detach().fill_(3),
        lambda p: p.copy_(torch.zeros_like(p)),
    ],
    ids=["add_", "setitem", "out=", "transposed-view", "column-view", "detach", "copy_"],
)
def test_every_in_place_write_to_an_input_is_caught(
    soa: ModuleType, write: Callable[[torch.Tensor], object]
) -> None:
    def make(p: torch.Tensor) -> torch.Tensor:
        write(p)
        return p[:, :2]

    collection, scores = points(soa, 4), soa.Scores.allocate(4)
    scores.buffer.fill_(9)
    with pytest.raises(InputModifiedError, match="wrote into its input 'points'"):
        soa.Mlp(Returns(make))(collection, out=scores)
    assert bool((scores.buffer == 9).all())
    # With protect_inputs the same model runs on copies and leaves the collection as it was.
    fresh = points(soa, 4)
    before = fresh.buffer.clone()
    soa.Mlp(Returns(make), protect_inputs=True)(fresh, out=scores)
    assert torch.equal(fresh.buffer, before)


def test_a_write_into_one_input_is_caught_when_another_is_returned(soa: ModuleType) -> None:
    indexed = soa.Indexed.allocate(4, zero=True)

    def make(index: torch.Tensor, index32: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        p.mul_(2)
        return p[:, 0].clone()

    with pytest.raises(InputModifiedError, match="'points'"):
        soa.ByIndex(Returns(make))(indexed, points(soa, 4), out=soa.Scores.allocate(4))


@pytest.mark.parametrize("write", [lambda p: p.data.mul_(0), lambda p: p.numpy().fill(0)])
def test_untracked_writes_to_inputs_land_on_copies_with_protect_inputs(
    soa: ModuleType, write: Callable[[torch.Tensor], object]
) -> None:
    # Writes through `.data` or `.numpy()` bypass the version counters (a documented limit of the
    # check); protect_inputs=True is the remedy, and must leave the caller's bytes as they were.
    def make(p: torch.Tensor) -> torch.Tensor:
        write(p)
        return p[:, :2].clone()

    collection = points(soa, 4)
    before = collection.buffer.clone()
    soa.Mlp(Returns(make), protect_inputs=True)(collection, out=soa.Scores.allocate(4))
    assert torch.equal(collection.buffer, before)


def test_unsigned_index_inputs_are_range_checked(soa: ModuleType) -> None:
    indexed = soa.Indexed.allocate(4, zero=True)
    model = soa.ByIndex(
        Returns(lambda index, index32, p: p[:, 0].clone()), index_bounds={"index": "points"}
    )
    model(indexed, points(soa, 4), out=soa.Scores.allocate(4))
    indexed.u64[2] = 7
    with pytest.raises(IndexRangeError):
        model(indexed, points(soa, 4), out=soa.Scores.allocate(4))


def test_a_hand_made_scalar_output_block_is_refused_before_any_call(soa: ModuleType) -> None:
    # `soagen check` refuses such schemas (SOA309); the runtime guards specs made by hand, whose
    # stride-0 view would otherwise fail inside torch's copy.
    output = soa.Mlp.OUTPUTS[0]
    broadcast = dataclasses.replace(
        output.block, view=lambda n: StridedView("float32", (n, 2), (0, 1), 0)
    )

    class ScalarOut(soa.Mlp):  # type: ignore[misc,name-defined]
        OUTPUTS = (dataclasses.replace(output, block=broadcast),)

    with pytest.raises(BindingError, match="output 'scores' binds scalars"):
        ScalarOut(Returns(lambda p: p[:, :2].clone()))


# --- one model object, many threads ------------------------------------------------------------------


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.layers = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))

    def forward(self, p: torch.Tensor) -> torch.Tensor:
        return self.layers(p)


def test_eight_threads_of_a_thousand_calls_match_one_thread_bit_for_bit(soa: ModuleType) -> None:
    model = soa.Mlp(Small())
    sizes = [1, 2, 7, 16, 33]
    inputs = [points(soa, n, seed=n) for n in sizes]
    expected = []
    for collection in inputs:
        scores = soa.Scores.allocate(collection.size, zero=True)
        model(collection, out=scores)
        expected.append(scores.buffer.clone())
    mismatches: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(thread: int) -> None:
        try:
            outputs = [soa.Scores.allocate(c.size) for c in inputs]
            start.wait()
            for call in range(1000):
                which = (thread + call) % len(sizes)
                outputs[which].buffer.fill_(0)
                model(inputs[which], out=outputs[which])
                if not torch.equal(outputs[which].buffer, expected[which]):
                    mismatches.append((thread, call))
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and mismatches == []
    # The inputs were shared by every thread and never written.
    for collection, n in zip(inputs, sizes, strict=True):
        assert torch.equal(collection.buffer, points(soa, n, seed=n).buffer)


@pytest.mark.parametrize(
    "dtype", [torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64]
)
def test_the_queued_index_check_refuses_exactly_the_out_of_range_values(dtype: torch.dtype) -> None:
    # The CUDA path queues its check with torch._assert_async; on CPU the same function raises at
    # once, which lets CI check its logic for every dtype (bound 10: valid are 0..9).
    from soagen.runtime.model import _queue_index_check

    base = torch.tensor([[0, 9], [3, 4]], dtype=torch.int64)
    _queue_index_check(base.to(dtype), 10, "in range")
    _queue_index_check(base.to(dtype)[:, :0], 10, "empty")
    with pytest.raises(RuntimeError, match="too high"):
        _queue_index_check(base.add(1).to(dtype), 10, "too high")
    wrapped = torch.tensor([[0, -1]], dtype=torch.int64).to(dtype)  # unsigned: the largest value
    with pytest.raises(RuntimeError, match="out of range"):
        _queue_index_check(wrapped, 10, "out of range")


_INDEX_DTYPES = [getattr(torch, name) for name in INDEX_DTYPE_NAMES]


@pytest.mark.parametrize("dtype", _INDEX_DTYPES)
def test_the_queued_index_check_is_exact_at_every_edge_of_every_dtype(dtype: torch.dtype) -> None:
    # One value at a time in a transposed (strided) view among zeros, against every bound: it
    # passes exactly when 0 <= value < bound. Bounds past a dtype's range included: int16 indices
    # into 40k nodes are all valid, and were refused once the bound wrapped around in the dtype.
    from soagen.runtime.model import _queue_index_check

    values, as_dtype = index_edge_values(dtype)
    for value, stored in zip(values, as_dtype, strict=True):
        indices = torch.zeros(3, 2, dtype=dtype)
        indices[1, 0] = stored
        for bound in INDEX_EDGE_BOUNDS:
            valid = 0 <= value < bound
            try:
                _queue_index_check(indices.t(), bound, "out of range")
            except RuntimeError as error:
                assert "out of range" in str(error)
                assert not valid, (value, bound)
            else:
                assert valid or (dtype == torch.uint64 and bound > 2**63), (value, bound)


@pytest.mark.parametrize(
    ("dtype", "bound", "budget"),
    [
        (torch.int64, 1_000, 5),
        (torch.int32, 1_000, 5),
        (torch.uint16, 1_000, 5),
        (torch.uint32, 1_000, 5),
        (torch.uint64, 1_000, 5),
        (torch.int16, 40_000, 3),
        (torch.int8, 100, 3),
        (torch.uint8, 100, 3),
        (torch.uint8, 300, 0),
    ],
)
def test_the_queued_index_check_runs_few_ops_and_copies_nothing(
    dtype: torch.dtype, bound: int, budget: int
) -> None:
    # Each op is a kernel on a GPU (a node in a CUDA graph). The code is the same on CPU, where a
    # dispatch mode lists the ops the call dispatches (as torch.profiler does, whose first use
    # costs seconds); views launch nothing and are not counted. No dtype converts the indices (a
    # copy of all of them) unless its bound needs it.
    from torch.utils._python_dispatch import TorchDispatchMode

    from soagen.runtime.model import _queue_index_check

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if not func.is_view:
                self.names.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    indices = torch.zeros(2, 1_000, dtype=dtype)
    with Ops() as ops:
        _queue_index_check(indices, bound, "out of range")
    assert len(ops.names) == budget, ops.names
    assert not [name for name in ops.names if name in ("aten._to_copy", "aten.copy_")], ops.names


@pytest.mark.parametrize(("dtype", "bound"), [(torch.int8, 300), (torch.int16, 70_000)])
def test_negative_indices_are_found_when_the_bound_exceeds_the_dtype(
    dtype: torch.dtype, bound: int
) -> None:
    # Seen as unsigned, -1 of an int8 is 255: below a bound of 300. Both passes run there.
    from soagen.runtime.model import _check_index_range

    class Binding:
        NAME = "Check"

    for count in (10, 100, 40_000):  # through Python lists, torch.aminmax, and NumPy
        indices = (torch.arange(count) % 100).to(dtype)
        _check_index_range(Binding, "index", indices, "points", bound)  # type: ignore[arg-type]
        indices[7] = -1
        with pytest.raises(IndexRangeError, match=r"\(values -1\.\."):
            _check_index_range(Binding, "index", indices, "points", bound)  # type: ignore[arg-type]


@pytest.fixture(params=["compiled pass", "reductions"])
def host_extremes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host index check with the compiled pass of `soagen/runtime/_compiled.c` (where the
    install built it) under `_COMPILED_EXTREMES_MAX` values, and with the reductions alone."""
    from soagen.runtime import buffers

    if request.param == "compiled pass" and buffers._index_extremes is None:
        pytest.skip("soagen.runtime._compiled was not built by this install")
    if request.param == "reductions":
        monkeypatch.setattr(buffers, "_index_extremes", None)


@pytest.mark.usefixtures("host_extremes")
@pytest.mark.parametrize(
    "dtype",
    [torch.int8, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64],
)
@pytest.mark.parametrize(
    "shape, strides",
    [
        ((), ()),
        ((64,), (1,)),
        ((65,), (1,)),
        ((2, 32), (40, 1)),
        ((2, 33), (40, 1)),
        ((33, 2), (1, 40)),
        ((2, 2, 17), (80, 40, 1)),
        ((2, 16_400), (16_408, 1)),
    ],
)
def test_the_host_index_check_finds_the_one_bad_value_in_any_view(
    dtype: torch.dtype, shape: tuple[int, ...], strides: tuple[int, ...]
) -> None:
    # Up to 64 values go through Python lists, up to 2**15 signed ones through torch.aminmax, the
    # rest through NumPy; ranks 0 to 3, strided views with padding between rows (never read),
    # every integer dtype (bound 100: valid 0..99).
    from soagen.runtime.model import _check_index_range

    class Binding:
        NAME = "Check"

    # The padding holds out-of-range values.
    storage = torch.full((2 * 16_408,), 120, dtype=torch.int64)
    view = storage.as_strided(shape, strides)
    view.copy_(torch.arange(view.numel()).reshape(shape) % 100)
    indices = storage.to(dtype).as_strided(shape, strides)
    _check_index_range(Binding, "index", indices, "points", 100)  # type: ignore[arg-type]
    for bad in (100, -1):
        if bad < 0 and not dtype.is_signed:
            bad_value = torch.tensor(bad, dtype=torch.int64).to(dtype)  # the dtype's largest value
        else:
            bad_value = torch.tensor(bad, dtype=dtype)
        broken = storage.to(dtype).as_strided(shape, strides)
        broken[tuple(size - 1 for size in shape)] = bad_value  # the last element read
        with pytest.raises(
            IndexRangeError, match=r"'index' holds indices outside \[0, 100\)"
        ) as raised:
            _check_index_range(Binding, "index", broken, "points", 100)  # type: ignore[arg-type]
        values = broken.flatten().tolist()  # the values the view reads, padding not included
        assert f"(values {min(values)}..{max(values)})" in str(raised.value)


@pytest.mark.usefixtures("host_extremes")
@pytest.mark.parametrize(
    "dtype", [torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.int16, torch.int64]
)
@pytest.mark.parametrize("count", [10, 2_000, 100_000])
def test_the_host_index_check_reads_every_integer_dtype(dtype: torch.dtype, count: int) -> None:
    """Served events are checked on the host whatever their dtype (torch has no min of uint32),
    in the transposed [c, n] views the wire gives."""
    from soagen.runtime.model import indices_outside

    values = torch.arange(2 * count).remainder(50).reshape(count, 2)
    assert indices_outside(values.to(dtype).t(), 50) is None
    values[count // 2, 1] = 50
    assert indices_outside(values.to(dtype).t(), 50) == (0, 50)
    assert indices_outside(values.to(dtype).t()[:, :0], 50) is None


# Every integer dtype an index input may hold.
INTEGER_DTYPES = [
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.uint16,
    torch.int32,
    torch.uint32,
    torch.int64,
    torch.uint64,
]


@pytest.mark.parametrize("dtype", INTEGER_DTYPES)
def test_the_compiled_pass_reads_each_integer_dtypes_extremes_in_every_layout(
    dtype: torch.dtype,
) -> None:
    """`index_extremes` against Python's min and max of the values the view holds: the dtype's
    own extremes, one and two axes, rows or columns of a padded buffer, a storage offset, a
    stride 0; None for what it does not read, which the reductions take."""
    from soagen.runtime import buffers

    extremes = buffers._index_extremes
    if extremes is None:
        pytest.skip("soagen.runtime._compiled was not built by this install")
    info = torch.iinfo(dtype)
    generator = torch.Generator().manual_seed(3)
    raw = torch.randint(0, 256, (8 * 400,), dtype=torch.uint8, generator=generator)
    storage = raw.view(dtype)
    # The dtype's extremes: all bits clear (unsigned) or the sign bit alone, and their negation.
    storage.view(torch.uint8).view(-1, dtype.itemsize)[17] = 0
    storage.view(torch.uint8).view(-1, dtype.itemsize)[101] = 255
    if dtype.is_signed:
        storage[17], storage[101] = info.min, info.max
    views = [
        storage[:1],
        storage[5:300],
        storage[::3],
        storage.as_strided((100, 2), (1, 150)),
        storage.as_strided((2, 100), (150, 1), 7),
        storage.as_strided((40, 3), (3, 1)),
        storage[:4].as_strided((50, 4), (0, 1)),
        storage.as_strided((1, 90), (1, 2)),
        storage.as_strided((90, 1), (2, 5)),
    ]
    for view in views:
        if dtype == torch.uint64:  # tolist() refuses values past 2**63: the same bits, as int64
            values = [value % (1 << 64) for value in view.view(torch.int64).flatten().tolist()]
        else:
            values = view.flatten().tolist()
        assert extremes(view) == (min(values), max(values)), (view.shape, view.stride())
    assert extremes(storage[:0]) is None  # no element: the caller answers
    assert extremes(storage.as_strided((2, 2, 2), (4, 2, 1))) is None  # three axes
    assert extremes(storage.float()[:10]) is None  # not an integer dtype
    assert extremes(torch.zeros(10, dtype=torch.bool)) is None
    assert extremes(torch.zeros(10, dtype=dtype, device="meta")) is None
    assert extremes(storage[:10].tolist()) is None  # type: ignore[arg-type]

    class Marked(torch.Tensor):
        pass

    assert extremes(storage[:10].as_subclass(Marked)) is None


class _LyingStrides(torch.overrides.TorchFunctionMode):
    """A torch function mode that answers `stride()` with a stride far past any tensor's memory,
    and `data_ptr()` with another tensor's address."""

    def __init__(self, elsewhere: torch.Tensor) -> None:
        super().__init__()
        self.elsewhere = elsewhere

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = getattr(func, "__name__", "")
        if name == "stride" and not kwargs and len(args) == 1:
            return tuple(1 << 40 for _ in range(args[0].dim()))
        if name == "data_ptr":
            return self.elsewhere.data_ptr()
        return func(*args, **(kwargs or {}))


def test_under_a_torch_function_mode_nothing_is_read_or_written_by_its_answers() -> None:
    """Tensors answer their strides and addresses through an active mode, which may say anything:
    the compiled index pass and block writer then leave the tensor to torch."""
    from soagen.runtime import buffers
    from soagen.runtime.model import indices_outside

    indices = torch.arange(4000).remainder(100)
    indices[1234] = 100
    block = torch.zeros(2, 200).t()  # a [200, 2] block of two columns
    result = torch.randn(200, 2)
    elsewhere = torch.zeros(400)
    writer = buffers.block_writer(block)
    with _LyingStrides(elsewhere):
        if buffers._index_extremes is not None:
            assert buffers._index_extremes(indices) is None
        assert indices_outside(indices, 100) == (0, 100)
        writer(result)
    assert torch.equal(block, result) and not elsewhere.any()


def test_the_host_index_check_runs_under_torch_func_transforms() -> None:
    """Under `torch.func.grad` an index tensor made inside is a wrapper without storage that still
    looks like a plain tensor: the reductions read it."""
    from soagen.runtime.model import indices_outside

    def loss(x: torch.Tensor) -> torch.Tensor:
        assert indices_outside(x.long(), 100) is None
        assert indices_outside(x.long(), 2) == (0, 3)
        return x.sum()

    assert torch.equal(torch.func.grad(loss)(torch.arange(4.0)), torch.ones(4))


def test_an_axis_of_one_value_may_have_any_stride() -> None:
    """Its stride is never stepped: a huge one reads and writes as any other."""
    from soagen.runtime import buffers

    values = torch.arange(5)
    wide = values.as_strided((1, 5), (1 << 62, 1))
    if buffers._index_extremes is not None:
        assert buffers._index_extremes(wide) == (0, 4)
    block = torch.zeros(5).as_strided((1, 5), (1 << 62, 1))
    buffers.block_writer(block)(values.float().as_strided((1, 5), (1 << 61, 1)))
    assert block.tolist() == [[0.0, 1.0, 2.0, 3.0, 4.0]]


def test_the_compiled_pass_takes_only_dtype_codes_it_reads() -> None:
    """`set_index_dtypes` refuses codes outside its eight C types and keeps the table it had."""
    from soagen.runtime import buffers

    if buffers._index_extremes is None:
        pytest.skip("soagen.runtime._compiled was not built by this install")
    from soagen.runtime import _compiled

    for table in ({torch.int64: 8}, {torch.int64: -1}, {torch.int64: "6"}, [(torch.int64, 6)]):
        with pytest.raises(TypeError, match="code from 0 to 7"):
            _compiled.set_index_dtypes(table)  # type: ignore[arg-type]
    assert buffers._index_extremes(torch.arange(5)) == (0, 4)
