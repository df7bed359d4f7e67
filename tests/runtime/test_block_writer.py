"""The write-back of small results (`buffers.block_writer`): the compiled loop of
`soagen/runtime/_compiled.c` where the install built it, else the block's own copy_. Either way every
bit comes through as copy_ writes it, and what the loop does not copy itself goes to copy_."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import sysconfig
import typing
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from soagen.runtime import buffers

compiled = pytest.mark.skipif(
    buffers._BlockWriter is None, reason="soagen.runtime._compiled was not built by this install"
)


def _random_values(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Arbitrary bit patterns (NaN payloads, negative zeros, denormals), bools 0 or 1."""
    generator = torch.Generator().manual_seed(seed)
    count = 1
    for size in shape:
        count *= size
    raw = torch.randint(0, 256, (count * dtype.itemsize,), dtype=torch.uint8, generator=generator)
    if dtype == torch.bool:
        raw %= 2
    return raw.view(dtype).reshape(shape)


def _block(n: int, columns: int | None, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """An output block as collections have them: columns of n values `pitch` apart, in a buffer
    that holds bytes before and between them; returns (storage, block)."""
    pitch = n + 13
    storage = torch.zeros(3 + (columns or 1) * pitch, dtype=dtype)
    if columns is None:
        return storage, storage[3 : 3 + n]
    return storage, storage[3:].as_strided((n, columns), (1, pitch))


def _sources(n: int, columns: int | None, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """What models return: row-major results, transposed ones, a slice past a storage offset, an
    expanded row (stride 0)."""
    shape = (n,) if columns is None else (n, columns)
    row_major = _random_values(shape, dtype)
    sources = {"row-major": row_major, "offset": _random_values((n + 5, *shape[1:]), dtype)[5:]}
    if columns is not None:
        sources["transposed"] = _random_values((columns, n), dtype, seed=1).t()
        sources["expanded"] = _random_values((1, columns), dtype, seed=2).expand(n, columns)
    else:
        sources["strided"] = _random_values((2 * n,), dtype, seed=3)[::2]
    return sources


def _same_bits(first: torch.Tensor, second: torch.Tensor) -> bool:
    return first.shape == second.shape and torch.equal(
        first.clone(memory_format=torch.contiguous_format).view(torch.uint8),
        second.clone(memory_format=torch.contiguous_format).view(torch.uint8),
    )


def _written_as_copy_writes(
    write: Callable[[torch.Tensor, torch.Tensor], object],
    n: int,
    columns: int | None,
    dtype: torch.dtype,
    source: torch.Tensor,
) -> None:
    """`write(block, source)` leaves the block's buffer, bytes around the block included, exactly
    as `copy_` leaves another such buffer, and moves the buffer's version counter; or raises what
    copy_ raises."""
    expected_storage, expected_block = _block(n, columns, dtype)
    storage, block = _block(n, columns, dtype)
    try:
        expected_block.copy_(source)
    except RuntimeError as refusal:
        with pytest.raises(type(refusal), match=re.escape(str(refusal))):
            write(block, source)
        assert not storage.view(torch.uint8).any()
        return
    version = storage._version
    write(block, source)
    assert _same_bits(storage, expected_storage)
    assert storage._version > version  # a backward pass through the old values is refused


def _written_as_copy_writes_in_place(
    buffer: torch.Tensor, block: torch.Tensor, source: torch.Tensor
) -> None:
    """The block's writer on a source in the same buffer leaves that buffer as copy_ leaves a
    copy of it, or raises what copy_ raises."""
    expected = buffer.clone()
    offset = block.storage_offset()
    expected_block = expected.as_strided(block.shape, block.stride(), offset)
    expected_source = expected.as_strided(source.shape, source.stride(), source.storage_offset())
    try:
        expected_block.copy_(expected_source)
    except RuntimeError as refusal:
        before = buffer.clone()
        with pytest.raises(type(refusal), match=re.escape(str(refusal))):
            buffers.block_writer(block)(source)
        assert _same_bits(buffer, before)
        return
    buffers.block_writer(block)(source)
    assert _same_bits(buffer, expected)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.float16,
        torch.bfloat16,
        torch.int32,
        torch.float32,
        torch.int64,
        torch.float64,
        torch.complex64,
        torch.complex128,
        torch.bool,
    ],
)
# Rows of 2 to 4 values have de-interleaving loops of their own, and 5 the general loop.
@pytest.mark.parametrize(
    "columns", [None, 1, 2, 3, 4, 5], ids=["1-D", "c=1", "c=2", "c=3", "c=4", "c=5"]
)
# 5000 rows of 2 or more values: the general loop's layouts go to `copy_values` there.
@pytest.mark.parametrize("n", [1, 1000, 5000])
def test_every_bit_of_a_result_comes_through_as_copy_writes_it(
    dtype: torch.dtype, columns: int | None, n: int
) -> None:
    for name, source in _sources(n, columns, dtype).items():
        try:
            _written_as_copy_writes(
                lambda block, source: buffers.block_writer(block)(source), n, columns, dtype, source
            )
        except AssertionError as error:
            raise AssertionError(f"source {name}: {error}") from error


@compiled
def test_cpu_blocks_get_the_compiled_writer_and_copy_values_takes_other_large_layouts() -> None:
    _, column = _block(1000, None, torch.float32)
    _, pairs = _block(1000, 2, torch.float64)
    assert isinstance(buffers.block_writer(column), buffers._BlockWriter)
    assert isinstance(buffers.block_writer(pairs), buffers._BlockWriter)
    # copy_ makes a bool's nonzero bytes 1, and three axes are not a block's columns.
    _, flags = _block(1000, 2, torch.bool)
    assert not isinstance(buffers.block_writer(flags), buffers._BlockWriter)
    cube = torch.zeros(10, 3, 4)
    assert not isinstance(buffers.block_writer(cube), buffers._BlockWriter)
    # From `_STRIDED_COPY_MIN` values, the vectorized loops write row-major results of 2-4 values
    # a row (and contiguous columns), and `copy_values` any other layout: below and above
    # `_SPLIT_ROWS_MIN`, where its own row splitting takes over from copy_.
    for rows in (buffers._STRIDED_COPY_MIN // 2, buffers._SPLIT_ROWS_MIN // 2 + 1):
        for columns, loop_writes in ((2, True), (4, True), (5, False)):
            _, large = _block(rows, columns, torch.float32)
            writer = buffers.block_writer(large)
            assert isinstance(writer, buffers._BlockWriter)
            for source in (
                _random_values((rows, columns), torch.float32),
                _random_values((columns, rows), torch.float32).t(),
            ):
                with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU]
                ) as run:
                    writer(source)
                copied = "aten::copy_" in [event.name for event in run.events()]
                assert copied == (not loop_writes and source.is_contiguous()), (rows, columns)
                assert _same_bits(large, source)


@compiled
def test_what_the_loop_cannot_copy_goes_to_copy_with_copys_result() -> None:
    n = 100
    # A negative view (a complex number's conjugated imaginary part) and a conjugate view hold
    # other values than their bits: copy_ resolves them.
    complex_values = _random_values((n, 2), torch.complex64).nan_to_num()
    negative = complex_values.conj().imag
    assert negative.is_neg()
    _written_as_copy_writes(
        lambda block, source: buffers.block_writer(block)(source), n, 2, torch.float32, negative
    )
    conjugate = complex_values.conj()
    assert conjugate.is_conj()
    _written_as_copy_writes(
        lambda block, source: buffers.block_writer(block)(source), n, 2, torch.complex64, conjugate
    )

    # A subclass (a traced or fake tensor) is copy_'s to handle.
    class Marked(torch.Tensor):
        pass

    marked = torch.Tensor._make_subclass(Marked, _random_values((n, 2), torch.float32))
    _written_as_copy_writes(
        lambda block, source: buffers.block_writer(block)(source), n, 2, torch.float32, marked
    )
    # A sparse tensor has no strides: copy_ writes its values.
    sparse = _random_values((n, 2), torch.float32).nan_to_num().to_sparse()
    _written_as_copy_writes(
        lambda block, source: buffers.block_writer(block)(source), n, 2, torch.float32, sparse
    )


def test_a_large_negative_or_conjugate_view_is_written_with_its_values() -> None:
    """Above `_STRIDED_COPY_MIN` values `copy_values` copies through integer views of the same
    bits, which a view with a negation or conjugation bit does not have: copy_ resolves those."""
    n = buffers._STRIDED_COPY_MIN
    complex_values = _random_values((n, 2), torch.complex64).nan_to_num()
    negative = complex_values.conj().imag
    assert negative.is_neg()
    conjugate = complex_values.conj()
    assert conjugate.is_conj()
    for write in (buffers.copy_values, lambda block, source: buffers.block_writer(block)(source)):
        _written_as_copy_writes(write, n, 2, torch.float32, negative)
        _written_as_copy_writes(write, n, 2, torch.complex64, conjugate)


@compiled
def test_a_source_over_its_block_is_copy_s_to_handle() -> None:
    # Memory shared with the block: a loop would read values it has already overwritten.
    buffer = _random_values((400,), torch.float32)
    block = buffer[:200].as_strided((100, 2), (1, 100))
    shifted = buffer[50:250].as_strided((100, 2), (1, 100))
    before = buffer.clone()
    with pytest.raises(RuntimeError, match="unsupported operation"):
        buffers.block_writer(block)(shifted)  # copy_ refuses partly shared memory
    assert _same_bits(buffer, before)
    buffers.block_writer(block)(block)  # the block itself: copy_ leaves it as it is
    assert _same_bits(buffer, before)
    # Sources over the block in other ways: transposed, below it, a repeated value inside it.
    for over in (
        buffer[100:300].as_strided((100, 2), (2, 1)),
        buffer[:200].as_strided((100, 2), (2, 1)),
        buffer[150:151].as_strided((100, 2), (0, 0)),
    ):
        _written_as_copy_writes_in_place(buffer, block, over)
    # Apart, the last value of one next to the first of the other: the loop's.
    apart = torch.zeros(2 * 100 + 200)
    near_block = apart[:200].as_strided((100, 2), (1, 100))
    near_source = apart[200:].view(100, 2)
    near_source.copy_(_random_values((100, 2), torch.float32))
    buffers.block_writer(near_block)(near_source)
    assert _same_bits(near_block, near_source)


@compiled
def test_a_source_of_another_dtype_or_device_is_copy_s() -> None:
    """`t.data = ...` changes a tensor's dtype in place, after any check a caller made: the loop
    copies only sources of the block's dtype on the CPU."""
    n = 100
    changed = torch.zeros(n, 2)
    changed.data = torch.ones(n, 2, dtype=torch.int8)
    _written_as_copy_writes(
        lambda block, source: buffers.block_writer(block)(source), n, 2, torch.float32, changed
    )
    _written_as_copy_writes(
        lambda block, source: buffers.block_writer(block)(source),
        n,
        2,
        torch.float64,
        torch.ones(n, 2, dtype=torch.float32),
    )
    with pytest.raises(NotImplementedError):
        buffers.block_writer(torch.zeros(n, 2))(torch.ones(n, 2, device="meta"))


@compiled
def test_the_loop_writes_rows_of_columns_and_strided_columns() -> None:
    """Blocks laid out as [c, n] rows (a model block of [c, n] axes) and a column with a stride,
    written by the loop itself: no ATen copy runs."""
    rows_block = torch.zeros(3, 2 * 100).as_strided((3, 100), (200, 1))
    column = torch.zeros(300)[::3]
    for block, source in (
        (rows_block, _random_values((3, 100), torch.float32)),
        (rows_block, _random_values((100, 3), torch.float32).t()),
        (column, _random_values((100,), torch.float32)),
    ):
        writer = buffers.block_writer(block)
        assert isinstance(writer, buffers._BlockWriter)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            writer(source)
        assert "aten::copy_" not in [event.name for event in profile.events()]
        assert _same_bits(block, source)


def test_without_the_compiled_loop_blocks_are_written_by_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(buffers, "_BlockWriter", None)
    _, block = _block(1000, 2, torch.float32)
    writer = buffers.block_writer(block)
    assert getattr(writer, "__self__", None) is block  # the block's own copy_
    for source in _sources(1000, 2, torch.float32).values():
        _written_as_copy_writes(
            lambda block, source: buffers.block_writer(block)(source),
            1000,
            2,
            torch.float32,
            source,
        )


@compiled
def test_a_block_writer_takes_only_blocks_it_can_write() -> None:
    class Marked(torch.Tensor):
        pass

    for block, why in (
        (torch.zeros(4, 3, 2), "three axes"),
        (torch.zeros(0, 2), "no element"),
        (torch.zeros(4).as_strided((4, 2), (1, 0)), "values over each other"),
        (torch.zeros(4, 2, dtype=torch.complex64).conj(), "a conj bit"),
        (torch.Tensor._make_subclass(Marked, torch.zeros(4, 2)), "a subclass"),
    ):
        with pytest.raises(ValueError, match="BlockWriter"):
            buffers._BlockWriter(block)
        assert not isinstance(buffers.block_writer(block), buffers._BlockWriter), why
    writer = buffers._BlockWriter(torch.zeros(4, 2))
    with pytest.raises(TypeError):
        writer(torch.zeros(4, 2), torch.zeros(4, 2))  # type: ignore[call-arg]


@compiled
def test_the_source_is_checked_where_it_is_written() -> None:
    """The loop trusts nothing a caller checked before (Python code may run between): a source of
    another shape, or with no memory behind it, is copy_'s."""
    n = 100
    for source in (
        _random_values((1, 2), torch.float32).nan_to_num(),  # copy_ broadcasts it
        _random_values((n + 1, 2), torch.float32),  # copy_ refuses it
        _random_values((2, n), torch.float32),
        torch._efficientzerotensor(3 * n * 2)[n * 2 :].view(2 * n, 2)[:n],  # no storage, offset
    ):
        _written_as_copy_writes(
            lambda block, source: buffers.block_writer(block)(source), n, 2, torch.float32, source
        )


@compiled
def test_the_writer_reads_the_tensor_itself_not_python_attributes_of_its_names() -> None:
    """torch's own C functions read a source's address and strides: an attribute of the same name
    on the tensor (a tensor takes any) changes nothing of what is copied from where."""
    n = 50
    source = _random_values((n, 2), torch.float32).t().contiguous().t()  # column-major
    source.stride = lambda *axis: (2, 1)  # type: ignore[method-assign]
    source.storage_offset = lambda: 0  # type: ignore[method-assign]
    _written_as_copy_writes(
        lambda block, source: buffers.block_writer(block)(source), n, 2, torch.float32, source
    )


@compiled
def test_a_block_writer_is_not_made_under_a_torch_function_mode() -> None:
    """Its geometry would be the mode's answers (a lying stride() would aim later writes past
    the block): `block_writer` gives copy_ there."""

    class Lying(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if getattr(func, "__name__", "") == "stride":
                return (1, 3)
            return func(*args, **(kwargs or {}))

    storage, block = _block(6, 2, torch.float32)
    with Lying():
        with pytest.raises(ValueError, match="torch function mode"):
            buffers._BlockWriter(block)
        writer = buffers.block_writer(block)
    assert not isinstance(writer, buffers._BlockWriter)
    expected_storage, expected_block = _block(6, 2, torch.float32)
    source = _random_values((6, 2), torch.float32)
    expected_block.copy_(source)
    writer(source)
    assert _same_bits(storage, expected_storage)


@compiled
def test_where_torch_tensor_has_a_python_function_of_a_name_the_writer_calls_it() -> None:
    """`set_torch` takes torch's C functions only where torch.Tensor's names are torch's C
    descriptors; a name defined in Python is looked up and called on each read."""
    from soagen.runtime import _compiled

    calls: list[int] = []

    class Counted(torch.Tensor):
        def stride(self, *axis: int) -> typing.Any:  # type: ignore[override]
            calls.append(1)
            return super().stride(*axis)

    _compiled.set_torch(Counted, torch._C._increment_version, buffers._increment_takes_tuple())
    try:
        block = torch.zeros(8).as_strided((4, 2), (1, 4)).as_subclass(Counted)
        writer = _compiled.BlockWriter(block)
        source = torch.arange(8.0).view(4, 2).as_subclass(Counted)
        writer(source)
    finally:
        _compiled.set_torch(
            torch.Tensor, torch._C._increment_version, buffers._increment_takes_tuple()
        )
    assert len(calls) == 2  # the block's, once, and the source's
    assert torch.equal(block.as_subclass(torch.Tensor), torch.arange(8.0).view(4, 2))


@compiled
def test_a_block_writer_moves_the_counter_through_a_tensor_argument(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch before 2.5 takes one tensor in `_increment_version`, later ones a tuple; one write
    moves the counter once."""
    from soagen.runtime import _compiled

    taken: list[object] = []

    def increment_version(tensor: object) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError("increment_version expect a Tensor as input")
        taken.append(tensor)
        torch._C._increment_version(tensor)

    _compiled.set_torch(torch.Tensor, increment_version, False)
    try:
        _, block = _block(10, 2, torch.float32)
        buffers.block_writer(block)(torch.ones(10, 2))
    finally:
        _compiled.set_torch(
            torch.Tensor, torch._C._increment_version, buffers._increment_takes_tuple()
        )
    assert len(taken) == 1 and taken[0] is block and bool((block == 1).all())
    # Given one tensor, torch >= 2.5 walks its rows, a bump each: the probe picks the tuple there.
    storage, block = _block(1000, 2, torch.float32)
    version = storage._version
    buffers.block_writer(block)(torch.ones(1000, 2))
    assert storage._version == version + 1


@compiled
def test_a_block_writer_in_a_reference_cycle_is_collected() -> None:
    import gc
    import weakref

    block = torch.zeros(10, 2)
    block.writer = buffers.block_writer(block)  # type: ignore[attr-defined]
    assert isinstance(block.writer, buffers._BlockWriter)  # type: ignore[attr-defined]
    gone = weakref.ref(block)
    del block
    gc.collect()
    assert gone() is None


def test_the_compiled_loop_is_built_where_the_install_can_compile() -> None:
    """An optional extension that fails to build leaves no error behind, only the slower path:
    where a C compiler and CPython's headers are here, it must have been built."""
    try:
        importlib.metadata.distribution("soagen")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("soagen runs from its source tree, not installed: no install built anything")
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    compiler = sysconfig.get_config_var("CC") or "cc"
    if not headers.is_file() or shutil.which(compiler.split()[0]) is None:
        pytest.skip(f"no {headers} or no C compiler ({compiler}): the extension cannot build")
    assert buffers._BlockWriter is not None, (
        "soagen.runtime._compiled did not build: run `pip install -e .` and read its build_ext output"
    )
