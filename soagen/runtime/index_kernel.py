"""The index range check on a GPU as one kernel, where Triton is there (CUDA builds of torch bring it).

torch's ops need five kernels for it (min and max, two comparisons, their conjunction, the
assert), whose launches cost more than twice the host time of this one, and more inside a CUDA
graph too (`benchmarks/RESULTS.md`). The kernel reads each index once, in place (any
strides of a one- or two-dimensional view, any integer dtype), and a value outside [0, bound) fails
a device-side assert, as `torch._assert_async` does: the stream stops before the model reads it,
with no host wait. Importing this module imports neither torch nor Triton.
"""

from __future__ import annotations

import functools
import typing
import warnings

if typing.TYPE_CHECKING:
    import torch

# Index values per program; the grid's second dimension, at most 65,535 in CUDA, runs over rows.
_BLOCK = 1024
_MAX_ROWS = 65_535
_INT64_MAX = (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1


class IndexKernel(typing.Protocol):
    """What launches the check over a [rows, columns] view given as its element strides. With
    `assert_inside` it fails a device-side assert naming `message` when any value lies outside
    [0, bound); without, it writes 1 (inside) or 0 into `inside`, a contiguous int8 [rows, columns]."""

    def __call__(
        self,
        indices: torch.Tensor,
        shape: tuple[int, int],
        strides: tuple[int, int],
        bound: int,
        inside: torch.Tensor,
        *,
        message: str,
        assert_inside: bool,
    ) -> None: ...


def queue_index_check(indices: torch.Tensor, bound: int, message: str) -> bool:
    """Queue the check of `indices` (on a GPU, non-empty) on the current stream as one kernel;
    False, with nothing queued, where this cannot: no Triton, or more than two dimensions.

    Triton compiles the kernel once per dtype and message (a constant of the kernel): the message
    should name the input, not the bound, which changes from call to call."""
    kernel = None if _STATE.unavailable else triton_index_kernel()
    geometry = None if kernel is None else _rows_and_columns(indices)
    if kernel is None or geometry is None:
        return False
    shape, strides = geometry
    try:
        kernel(indices, shape, strides, bound, indices, message=message, assert_inside=True)
    except Exception as error:
        if _STATE.launched:
            raise
        # Triton builds the kernel on its first launch, with a C compiler and CUDA's assembler,
        # which a machine may lack: torch's ops check instead, as fast as ever, and the user is told.
        _STATE.unavailable = f"{type(error).__name__}: {error}"
        warnings.warn(
            f"soagen: the one-kernel index range check could not be built "
            f"({_STATE.unavailable}); torch's ops check indices instead",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    _STATE.launched = True
    return True


class _KernelState:
    """Whether the kernel has run in this process, or why it cannot."""

    launched = False
    unavailable = ""


_STATE = _KernelState()


def indices_inside(indices: torch.Tensor, bound: int, kernel: IndexKernel) -> torch.Tensor:
    """A bool tensor shaped as `indices` (at most two dimensions), True where 0 <= value < bound,
    as the kernel sees them: the kernel's comparison, with no assert, for tests and diagnostics."""
    import torch

    geometry = _rows_and_columns(indices)
    if geometry is None:
        raise ValueError(f"indices of {indices.dim()} dimensions: the kernel takes at most two")
    shape, strides = geometry
    inside = torch.empty(shape, dtype=torch.int8, device=indices.device)
    if inside.numel():
        kernel(indices, shape, strides, bound, inside, message="", assert_inside=False)
    transposed = indices.dim() == 2 and shape != tuple(indices.shape)
    return (inside.t() if transposed else inside.view(indices.shape)).bool()


def _rows_and_columns(
    indices: torch.Tensor,
) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The view as [rows, columns] with its strides, rows the shorter side (a block of index
    columns is a few rows of many values); None past two dimensions or 65,535 rows both ways."""
    rank = indices.dim()
    if rank == 0:
        return (1, 1), (0, 0)
    if rank == 1:
        return (1, indices.shape[0]), (0, indices.stride(0))
    if rank > 2:
        return None
    (rows, columns), (row_stride, column_stride) = indices.shape, indices.stride()
    if rows > columns:
        rows, columns, row_stride, column_stride = columns, rows, column_stride, row_stride
    if rows > _MAX_ROWS:
        return None
    return (rows, columns), (row_stride, column_stride)


@functools.cache
def triton_index_kernel() -> IndexKernel | None:
    """The Triton kernel behind `IndexKernel`, compiled on first launch; None without Triton."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    # debug=True keeps `device_assert`, which Triton drops otherwise. Integer arguments are not
    # specialized: a bound or size that changes from event to event compiles nothing new.
    @triton.jit(  # type: ignore[untyped-decorator]
        debug=True, do_not_specialize=["rows", "columns", "row_stride", "column_stride", "last"]
    )
    def check(  # type: ignore[no-untyped-def]
        indices,
        rows,
        columns,
        row_stride,
        column_stride,
        last,
        inside_out,
        MESSAGE: tl.constexpr,
        ASSERT_INSIDE: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(1).to(tl.int64)
        column = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        present = column < columns
        # Every integer dtype compares as int64: sign- or zero-extended by its own signedness, and
        # a uint64 past 2**63 turns negative, outside any bound a buffer can have.
        values = tl.load(
            indices + row * row_stride + column * column_stride, mask=present, other=0
        ).to(tl.int64)
        inside = (values >= 0) & (values <= last)
        if ASSERT_INSIDE:
            tl.device_assert(inside, MESSAGE, mask=present)
        else:
            tl.store(inside_out + row * columns + column, inside.to(tl.int8), mask=present)

    return _TritonIndexKernel(triton, check)


class _TritonIndexKernel:
    """Launches `check`: the first launch of each kind of call through Triton's JIT dispatch,
    which compiles, and later ones straight through the kernel it compiled.

    Triton's dispatch binds and specializes every argument and looks the kernel up on each
    launch, most of the check's host time on an H100 (`benchmarks/RESULTS.md`). Its choice of
    kernel depends only on what `_kind` keys: the dtypes, each pointer's 16-byte alignment,
    whether each integer fits 32 bits (the rest are not specialized), the constants and the
    device. A Triton whose compiled kernels launch otherwise raises on the first direct
    launch; from then on every launch goes through the dispatch, and a warning says so."""

    def __init__(self, triton: typing.Any, check: typing.Any) -> None:
        self._triton = triton
        self._check = check
        self._compiled: dict[tuple[object, ...], typing.Any] = {}
        self.direct_launches = 0
        self.direct_unavailable = "" if _launches_directly(triton) else "not this Triton"
        # Triton's driver (the device and stream its dispatch launches on), read at the first
        # launch, which may fail where no GPU is: the caller falls back to torch's ops then.
        self._driver: typing.Any = None

    def __call__(
        self,
        indices: torch.Tensor,
        shape: tuple[int, int],
        strides: tuple[int, int],
        bound: int,
        inside: torch.Tensor,
        *,
        message: str,
        assert_inside: bool,
    ) -> None:
        rows, columns = shape
        grid = ((columns + _BLOCK - 1) // _BLOCK, rows, 1)
        # The last valid index, not the bound: a bound of 2**63 has no int64.
        integers = (rows, columns, *strides, min(bound - 1, _INT64_MAX))
        if self._driver is None:
            self._driver = self._triton.runtime.driver.active
        device = indices.get_device()
        if device == self._driver.get_current_device():
            self._launch(device, grid, indices, integers, inside, message, assert_inside)
            return
        import torch

        with torch.cuda.device(device):
            self._launch(device, grid, indices, integers, inside, message, assert_inside)

    def _launch(
        self,
        device: int,
        grid: tuple[int, int, int],
        indices: torch.Tensor,
        integers: tuple[int, ...],
        inside: torch.Tensor,
        message: str,
        assert_inside: bool,
    ) -> None:
        kind = None
        if not self.direct_unavailable:
            kind = _kind(device, indices, inside, integers, message, assert_inside)
            compiled = self._compiled.get(kind)
            if compiled is not None and self._launch_directly(
                compiled, device, grid, (indices, *integers, inside, message, assert_inside, _BLOCK)
            ):
                return
        launched = self._check[grid](
            indices, *integers, inside, MESSAGE=message, ASSERT_INSIDE=assert_inside, BLOCK=_BLOCK
        )
        if kind is not None and launched is not None and not self.direct_unavailable:
            self._compiled[kind] = launched

    def _launch_directly(
        self,
        compiled: typing.Any,
        device: int,
        grid: tuple[int, int, int],
        arguments: tuple[object, ...],
    ) -> bool:
        """Launch the compiled kernel on the current stream; False where it cannot (said once)."""
        try:
            runtime = self._triton.knobs.runtime
            stream = self._driver.get_current_stream(device)
            # As Triton's dispatch launches the kernel it looked up, profiler hooks included.
            metadata = compiled.launch_metadata(grid, stream, *arguments)
            compiled.run(
                *grid,
                stream,
                compiled.function,
                compiled.packed_metadata,
                metadata,
                runtime.launch_enter_hook,
                runtime.launch_exit_hook,
                *arguments,
            )
        except Exception as error:
            self.direct_unavailable = f"{type(error).__name__}: {error}"
            self._compiled.clear()
            warnings.warn(
                f"soagen: the index range check's kernel could not be launched directly "
                f"({self.direct_unavailable}); Triton's dispatch launches it instead",
                RuntimeWarning,
                stacklevel=5,
            )
            return False
        self.direct_launches += 1
        return True


def _launches_directly(triton: typing.Any) -> bool:
    """Whether this Triton's compiled kernels take the launch `_launch_directly` makes: the one
    its own dispatch makes from Triton 3.4 (where `triton.knobs` came) on."""
    version = tuple(int(part) for part in triton.__version__.split(".")[:2] if part.isdigit())
    return version >= (3, 4) and hasattr(triton, "knobs")


def _kind(
    device: int,
    indices: torch.Tensor,
    inside: torch.Tensor,
    integers: tuple[int, ...],
    message: str,
    assert_inside: bool,
) -> tuple[object, ...]:
    """What Triton's dispatch chooses the compiled kernel by, for `check`'s arguments."""
    wide = 0  # bit i: integer i is past int32 (none is negative but -1, none past int64)
    for place, value in enumerate(integers):
        wide |= (value > _INT32_MAX) << place
    return (
        device,
        indices.dtype,
        inside.dtype,
        indices.data_ptr() % 16 == 0,
        inside.data_ptr() % 16 == 0,
        wide,
        message,
        assert_inside,
    )
