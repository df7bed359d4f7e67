"""Memory for collections: aligned allocation and zero-copy adoption of foreign buffers.

This module imports torch; `soagen.runtime.collection` imports it only when a collection first needs
memory, so importing generated modules stays free of torch.

Alignment. Allocators align to less than a layout may ask for (PyTorch's CPU allocator to 64 bytes,
CUDA's to 256 or 512), so `allocate` over-allocates by the alignment and starts the buffer at the first
aligned address of that block whenever the allocator does not guarantee the alignment by itself. The
buffer is then a view at a small byte offset into its storage; nothing else changes.

Adoption. `adopt` turns what `wrap` is given into a flat uint8 tensor over the same bytes, without a
copy: torch tensors (viewed as bytes), NumPy arrays (`torch.from_numpy`), `__dlpack__` producers
(CuPy, JAX, ...; asked for no copy, read-only flag honoured) and buffer-protocol objects (`bytearray`,
`mmap`, `memoryview`, `array.array`; `torch.frombuffer`). Read-only memory is refused unless the caller
asks for a read-only collection.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import sys
import typing
import warnings
from collections.abc import Callable
from typing import Any

try:
    import torch
    import torch.utils.dlpack
except ModuleNotFoundError as error:  # generating and linting run without torch; memory needs it
    if error.name != "torch":
        raise
    raise ModuleNotFoundError(
        "soagen's collections need torch for their memory: pip install 'soagen[torch]'",
        name="torch",
    ) from error

from soagen.dsl.dtypes import DTYPES
from soagen.runtime.errors import (
    DeviceError,
    MisalignedBufferError,
    NonContiguousBufferError,
    ReadOnlyBufferError,
    UnsupportedBufferError,
)

if typing.TYPE_CHECKING:
    from soagen.runtime._compiled import BlockWriter, GraphCall, IndexCheckedCall, ModelRun

DeviceLike = str | torch.device

TORCH_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, row.torch_name) for name, row in DTYPES.items()
}

# Alignment the allocator of a device type guarantees by itself (c10's CPU allocator aligns to 64
# bytes; cudaMalloc to 256). Larger alignments are reached by over-allocating.
ALLOCATOR_ALIGNMENT: dict[str, int] = {"cpu": 64, "cuda": 256}

# Device types whose data_ptr() is not an address in a flat space (MPS gives a buffer handle): there
# alignment is the byte offset into the storage, whose start the allocator aligns to a page.
_HANDLE_DEVICES = frozenset({"mps"})

_DLPACK_FLAG_READ_ONLY = 1 << 0
_DLPACK_FLAG_IS_COPIED = 1 << 1
_DLPACK_FLAGS_OFFSET = (
    24  # DLManagedTensorVersioned: version (8), manager_ctx (8), deleter (8), flags
)


def as_device(device: object, name: str = "device", *, must_exist: bool = True) -> torch.device:
    """A torch.device from what a user writes ('cpu', 'cuda:1', torch.device(...)), or DeviceError;
    with `must_exist`, a GPU this machine lacks is a DeviceError too (for memory to be put there)."""
    if isinstance(device, torch.device):
        parsed = device
    else:
        try:
            parsed = torch.device(device)  # type: ignore[call-overload]
        except (RuntimeError, TypeError, ValueError) as error:
            raise DeviceError(f"{name}={device!r} is not a torch device: {error}") from None
    if must_exist:
        _check_available(parsed, name, device)
    return parsed


def _check_available(parsed: torch.device, name: str, given: object) -> None:
    """DeviceError unless torch here has the accelerator `parsed` names (and its index). torch's
    own errors for a missing one are an AssertionError ("Torch not compiled with XPU enabled"),
    NotImplementedError or ModuleNotFoundError, raised only when memory is first put there."""
    if parsed.type in ("cpu", "meta"):
        return
    # torch.cuda, torch.xpu, torch.mps, torch.mtia, and the module an out-of-tree backend registers.
    module = getattr(torch, parsed.type, None)
    is_available = getattr(module, "is_available", None)
    device_count = getattr(module, "device_count", None)
    if not callable(is_available):
        return  # no way to ask ahead: `allocate` turns torch's refusal into a DeviceError
    try:
        available = bool(is_available())
        count = (int(device_count()) if callable(device_count) else 1) if available else 0
    except Exception:  # a backend that cannot even say (a broken driver): none usable
        count = 0
    if not count or (parsed.index is not None and parsed.index >= count):
        built = f" (CUDA {torch.version.cuda or 'not built in'})" if parsed.type == "cuda" else ""
        raise DeviceError(
            f"{name}={given!r}: this machine has {count} {parsed.type.upper()} device(s) for "
            f"torch {torch.__version__}{built}; pass {name}='cpu', or run where that device is"
        )


def device_matches(actual: torch.device, expected: torch.device) -> bool:
    """Whether a buffer on `actual` satisfies `expected`; 'cuda' without an index accepts any GPU."""
    if actual.type != expected.type:
        return False
    return expected.index is None or actual.index == expected.index


def address(tensor: torch.Tensor) -> int:
    """The number whose residue modulo the alignment says whether the tensor's data is aligned."""
    # `is_cpu` and `is_cuda` first: `device` makes a new object at each read.
    if not (tensor.is_cpu or tensor.is_cuda) and tensor.device.type in _HANDLE_DEVICES:
        return int(tensor.storage_offset()) * tensor.element_size()
    return int(tensor.data_ptr())


def check_alignment(tensor: torch.Tensor, alignment: int, layout: str) -> None:
    if tensor.numel() == 0:
        return  # an empty buffer has no bytes to misplace (and may have no address at all)
    position = address(tensor)
    if position % alignment:
        raise MisalignedBufferError(
            f"buffer starts at address {position:#x}, {position % alignment} bytes past a "
            f"{alignment}-byte boundary, but {layout} needs its buffer aligned to {alignment} bytes "
            f"({layout}.ALIGNMENT), which np.zeros, np.empty and torch.empty do not promise: make it "
            f"with soagen.runtime.aligned_numpy({layout}.byte_size(n), {alignment}) or "
            f"aligned_tensor({layout}.byte_size(n), {alignment}, device=...), let "
            f"{layout}.allocate(n) make it, or copy the data into such a buffer"
        )


def allocate(
    nbytes: int, alignment: int, device: torch.device, pin_memory: bool, zero: bool
) -> torch.Tensor:
    """A uint8 tensor of `nbytes` bytes on `device` whose first byte is aligned to `alignment`."""
    if pin_memory and device.type != "cpu":
        raise DeviceError(
            f"pin_memory=True asks for page-locked host memory, so device must be 'cpu', got "
            f"device={str(device)!r}"
        )

    def empty(size: int) -> torch.Tensor:
        try:
            return torch.empty(size, dtype=torch.uint8, device=device, pin_memory=pin_memory)
        except Exception as error:
            # Out of memory, or a device type torch parses but cannot use here (xla, hpu, ...:
            # NotImplementedError, ModuleNotFoundError, AssertionError): torch's first line.
            detail = (str(error).strip().splitlines() or [""])[0]
            if len(detail) > 200:  # NotImplementedError lists every backend the operator has
                detail = detail.split(". ")[0] + "."
            raise DeviceError(
                f"device={str(device)!r}: cannot allocate {size} bytes there"
                f"{' with pin_memory=True' if pin_memory else ''}: {type(error).__name__}: {detail}"
            ) from error

    buffer: torch.Tensor | None = None
    guaranteed = 1 if pin_memory else ALLOCATOR_ALIGNMENT.get(device.type, 1)
    if nbytes == 0 or alignment <= guaranteed or device.type in _HANDLE_DEVICES:
        buffer = empty(nbytes)
        if address(buffer) % alignment:
            buffer = None  # the allocator gave less than it promised: fall back to padding
    if buffer is None:
        raw = empty(nbytes + alignment)
        # Never 0: then the buffer's storage offset does not depend on where the allocator put it,
        # and neither do its views' (torch.compile specializes a storage offset of 0 or 1, and
        # compiled another graph for each).
        shift = alignment - address(raw) % alignment
        buffer = raw[shift : shift + nbytes]
    if zero:
        buffer.zero_()
    return buffer


def typed_view(buffer: torch.Tensor, dtype: str) -> torch.Tensor:
    """The uint8 buffer seen as a 1-D tensor of `dtype`, sharing its memory (no copy)."""
    target = TORCH_DTYPES[dtype]
    if target == torch.uint8:
        return buffer
    try:
        return buffer.view(target)
    except RuntimeError:
        # Tensor.view(dtype) needs the byte offset into the storage to be a multiple of the item size,
        # which an aligned buffer inside a storage that starts off-alignment (a memoryview slice, say)
        # breaks. Re-import the same memory through DLPack: the new storage starts at the buffer.
        return torch.utils.dlpack.from_dlpack(buffer).view(target)


# The compiled parts of a planned call (`soagen/runtime/_compiled.c`), where the install built them.
def _load_compiled() -> tuple[
    type[BlockWriter] | None,
    type[ModelRun] | None,
    Callable[[torch.Tensor], tuple[int, int] | None] | None,
    type[IndexCheckedCall] | None,
    type[GraphCall] | None,
]:
    try:
        from soagen.runtime._compiled import (
            BlockWriter,
            GraphCall,
            IndexCheckedCall,
            ModelRun,
            index_extremes,
            set_function_mode_check,
            set_index_dtypes,
            set_torch,
        )
    except ImportError:
        return None, None, None, None, None
    set_torch(torch.Tensor, torch._C._increment_version, _increment_takes_tuple())
    # Under a torch function mode, tensors answer through it: nothing is read by its answers.
    set_function_mode_check(torch._C._is_torch_function_mode_enabled)
    # Each integer dtype this torch has, by the code of its C type in `index_extremes`.
    names = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
    set_index_dtypes(
        {getattr(torch, name): code for code, name in enumerate(names) if hasattr(torch, name)}
    )
    return BlockWriter, ModelRun, index_extremes, IndexCheckedCall, GraphCall


def _increment_takes_tuple() -> bool:
    """Whether `torch._C._increment_version` takes a tuple of tensors (torch >= 2.5, which
    iterates a tensor given alone: one bump per row) or one tensor (before)."""
    probe = torch.zeros(1, device="cpu")
    try:
        torch._C._increment_version((probe,))
    except (TypeError, RuntimeError):  # "increment_version expect a Tensor as input"
        return False
    return True


_BlockWriter, _ModelRun, _index_extremes, _IndexCheckedCall, _GraphCall = _load_compiled()


# ATen copies a CPU matrix whose transpose is contiguous through square tiles once it holds this
# many elements (`copy_transpose_valid`).
_TILED_TRANSPOSE_MIN = 60 * 60

# ATen's CPU copy between differently strided tensors runs at half speed for these element types
# and at full speed for the integer type of the same width (a [1e5, 2] float32 result into two
# columns: 112 against 57 us); the bytes are the same, so `copy_values` copies through that type.
_SAME_WIDTH_INTEGER: dict[torch.dtype, torch.dtype] = {
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.int8: torch.uint8,
}
# Below this many elements the two extra views cost more than the faster kernel saves.
_STRIDED_COPY_MIN = 8192
# ATen walks a row-major [n, c] source once per target column: past the caches every column pass
# streams the whole source from memory again (c = 32, n = 1e6: 234 ms). Rows taken this many
# source bytes at a time stay in cache across the passes (40 ms).
_COPY_CHUNK_BYTES = 4 << 20


# The integer type of each width in bytes: a value's bits, or a whole narrow row's.
_INTEGER_OF_WIDTH: dict[int, torch.dtype] = {
    1: torch.uint8,
    2: torch.int16,
    4: torch.int32,
    8: torch.int64,
}
# Below this many values the splitting's dozen torch calls cost more than it saves: float32 pairs
# into two columns take the same time either way at 65536 values, 1.1x less at 131072, 1.3x less
# at 2e5 and 1.6x less at 2e6.
_SPLIT_ROWS_MIN = 1 << 17
# Whether converting integers of the row's width to the value's keeps the low bits, per (row,
# value) width: checked once per process on this build of ATen before `_split_rows` relies on it.
_TRUNCATES: dict[tuple[int, int], bool] = {}


def _splits_rows(target: torch.Tensor, source: torch.Tensor) -> bool:
    """Whether `_split_rows` can copy `source` (row-major [n, c]) into `target`'s columns as
    `target.copy_(source)` would: plain tensors (not traced, not a subclass such as a fake
    tensor), columns apart from each other and from the source, and values whose copy is their
    bits (a bool's copy makes any nonzero byte 1)."""
    if (
        target.numel() < _SPLIT_ROWS_MIN
        or target.dim() != 2
        or target.stride(0) != 1
        or target.stride(1) < target.size(0)
        or not source.is_contiguous()
        or type(source) is not torch.Tensor
        or type(target) is not torch.Tensor
        or source.dtype == torch.bool
        or source.requires_grad
        or target.requires_grad
        or source.is_neg()
        or sys.byteorder != "little"
    ):
        return False
    width = source.element_size()
    row = width * source.size(1)
    if row not in _INTEGER_OF_WIDTH or width == row or torch.compiler.is_compiling():
        return False
    start, end = target.data_ptr(), target.data_ptr() + target.stride(1) * target.size(1) * width
    if start < source.data_ptr() + source.nbytes and source.data_ptr() < end:
        return False  # overlapping memory is copy_'s to handle, or to refuse
    truncates = _TRUNCATES.get((row, width))
    if truncates is None:
        try:
            truncates = _conversion_truncates(_INTEGER_OF_WIDTH[row], _INTEGER_OF_WIDTH[width])
        except Exception:
            return False  # not remembered: a mode active now (a dispatch mode, say) may pass
        _TRUNCATES[(row, width)] = truncates
    return truncates


def _conversion_truncates(wide: torch.dtype, narrow: torch.dtype) -> bool:
    """Whether ATen's conversion from `wide` to `narrow` integers keeps the low bits, on the
    vectorized path and its scalar tail alike (C++ leaves narrowing to the implementation). On
    the CPU, whatever the default device."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    rows = torch.randint(
        0, 256, (1027 * wide.itemsize,), dtype=torch.uint8, generator=generator, device="cpu"
    )
    values = rows.view(wide)
    low = values.view(narrow).view(values.numel(), -1)[:, 0]  # little-endian: the first lane
    return torch.equal(values.to(narrow), low)


def _split_rows(target: torch.Tensor, source: torch.Tensor) -> None:
    """Copy a row-major [n, c] `source` whose rows fit an integer type (c values of w bytes,
    c * w in 2, 4, 8) into `target`'s contiguous columns. ATen and NumPy de-interleave value by
    value; here each column is one vectorized conversion of whole rows read as that type from the
    column's byte offset, whose low bits (little-endian) are the column's value."""
    rows, columns = source.shape
    width = source.element_size()
    row_bytes = width * columns
    whole = _INTEGER_OF_WIDTH[row_bytes]
    lane = _INTEGER_OF_WIDTH[width]
    # NumPy's buffer lets frombuffer start at any byte; Tensor.view needs the row type's alignment.
    host = source.view(lane).numpy()
    written = target.view(lane).unbind(1)
    step = _COPY_CHUNK_BYTES // row_bytes
    for start in range(0, rows, step):
        count = min(step, rows - start)
        offset = start * row_bytes
        written[0][start : start + count].copy_(
            torch.frombuffer(host, dtype=whole, count=count, offset=offset)
        )
        # A row read from inside the source's last row would run past its end: that row's
        # values other than the first are copied alone, below.
        inside = count - 1 if start + count == rows else count
        for column in range(1, columns if inside else 1):
            shifted = torch.frombuffer(
                host, dtype=whole, count=inside, offset=offset + column * width
            )
            written[column][start : start + inside].copy_(shifted)
    # Through NumPy, the same memory: a few values, where torch's indexing costs microseconds.
    target.view(lane).numpy()[rows - 1, 1:] = host[rows - 1, 1:]


def same_width_integer(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s bits as integers of the same width, a view (itself if it holds integers or
    bools): values compare equal where their bits do, NaN included."""
    if not tensor.dtype.is_floating_point:
        return tensor
    return tensor.view(_INTEGER_OF_WIDTH[tensor.element_size()])


def copy_values(target: torch.Tensor, source: torch.Tensor) -> None:
    """`target.copy_(source)`, faster between CPU tensors of one dtype and shape whose strides
    differ, as a model's row-major result and the columns of its output block do: narrow rows
    split into their columns by vectorized integer conversions (`_split_rows`), others through
    an integer view of the same width where ATen's kernel for the type is slow, and in chunks of
    rows (the first dimension) where the source outgrows the caches. Bit-exact, as copy_ is."""
    if (
        target.numel() < _STRIDED_COPY_MIN
        or target.stride() == source.stride()
        or source.is_neg()  # bits that are not its values: copy_ resolves them
        or source.is_conj()
        or target.device.type != "cpu"
        or source.device.type != "cpu"
        or target.dtype != source.dtype
        or target.shape != source.shape
    ):
        target.copy_(source)
        return
    if _splits_rows(target, source):
        _split_rows(target, source)
        return
    integer = _SAME_WIDTH_INTEGER.get(target.dtype)
    if integer is not None:
        target, source = target.view(integer), source.view(integer)
    rows = target.size(0)
    row_bytes = source.nbytes // rows
    step = max(1, _COPY_CHUNK_BYTES // row_bytes)
    if target.dim() < 2 or step >= rows:
        target.copy_(source)
        return
    for start in range(0, rows, step):
        target[start : start + step].copy_(source[start : start + step])


def block_writer(target: torch.Tensor) -> Callable[[torch.Tensor], object]:
    """`copy_values(target, source)` as a function of the source, made once for an output block
    that takes many results, each of the block's shape, dtype and device (the caller checks them).
    A CPU block of one or two axes is written by the compiled loops of `soagen.runtime._compiled`
    where they were built: a row-major result of 2-4 values a row, or contiguous columns, by
    vectorized loops at any size (a [1e4, 2] float32 result: 4 against 18 us; [1e5, 2]: 21-26
    against 54-70 us for `copy_values`, one thread, as soagen runs), any other layout by a general
    loop under `_STRIDED_COPY_MIN` values (1-2 us less than copy_ at a thousand rows, once a model
    has run) and by `copy_values` above. Where they were not built, small blocks are written by
    their own `copy_` (no Python frame)."""
    count, on_cpu = target.numel(), target.device.type == "cpu"
    small = count < _STRIDED_COPY_MIN
    if (
        _BlockWriter is not None
        and on_cpu
        and target.dtype != torch.bool  # copy_ makes any nonzero byte 1
        and not target.is_quantized
    ):
        # It reads the block's geometry, and refuses what it cannot write (three axes, a
        # subclass, an empty block).
        with contextlib.suppress(ValueError):
            return _BlockWriter(target, None if small else functools.partial(copy_values, target))
    if small or not on_cpu:
        return target.copy_
    return functools.partial(copy_values, target)


def contiguous_copy(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor.contiguous()`, without ATen's tiled transpose for the 2-D tensors SoA data makes.

    An `[n, c]` block of unpadded columns (pitch == n), or a row-major `[n, c]` result permuted to
    `[c, n]`, is a CPU matrix whose transpose is contiguous: ATen copies it in 60x60 tiles, 2.5-4.6x
    slower than a plain strided copy when c is 2-3 (n = 1e5..1e6; still 1.15x at c = 64). Copying
    between the transposed views takes the plain path.
    """
    if (
        tensor.dim() == 2
        and not tensor.is_contiguous()  # a [1, n] is both: nothing to copy
        and tensor.stride(0) == 1
        and tensor.stride(1) == tensor.size(0)
        and tensor.size(1) > 1
        and tensor.numel() >= _TILED_TRANSPOSE_MIN
        and tensor.device.type == "cpu"
    ):
        result = torch.empty(tensor.shape, dtype=tensor.dtype)
        result.t().copy_(tensor.t())
        return result
    return tensor.contiguous()


class Adopted(typing.NamedTuple):
    """Foreign memory seen as one flat uint8 tensor (a tuple: every `wrap` makes one, and a
    frozen dataclass costs several times as much to make)."""

    tensor: torch.Tensor  # 1-D, uint8, contiguous, every byte of the object
    read_only: bool  # whether the memory itself refuses writes
    kind: str  # what the object was, for messages
    host: Any = (
        None  # a NumPy array or memoryview of the same bytes, kept for read-only NumPy views
    )


def _numpy() -> Any:
    return sys.modules.get("numpy")


def _from_tensor(tensor: torch.Tensor, kind: str | None = None) -> torch.Tensor:
    """`tensor`'s bytes as a flat uint8 tensor of our own; `kind`: what it came as, for
    messages (by default, a torch tensor of its dtype)."""
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise UnsupportedBufferError(
            f"buffer must be a dense strided tensor, got a {_tensor_kind(tensor, kind)} with "
            f"layout {tensor.layout}"
        )
    if tensor.is_conj() or tensor.is_neg():
        raise UnsupportedBufferError(
            f"buffer is a {_tensor_kind(tensor, kind)} with a lazy conjugate or negation bit: its "
            f"bytes are not its values; pass .resolve_conj().resolve_neg() (a copy) instead"
        )
    if not tensor.is_contiguous():
        raise NonContiguousBufferError(
            f"buffer must be contiguous, got a {_tensor_kind(tensor, kind)} of shape "
            f"{tuple(tensor.shape)} with strides "
            f"{tensor.stride()}: pass the tensor it is a view of, or .contiguous() (a copy)"
        )
    # A tensor of our own (`detach`), which the caller's later metadata changes do not reach.
    flat = tensor.detach()
    if flat.dim() != 1:
        flat = flat.reshape(-1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def _tensor_kind(tensor: torch.Tensor, kind: str | None) -> str:
    return kind or f"torch.Tensor of {tensor.dtype}"


# Whether this NumPy exports read-only arrays through DLPack (None: not tried yet). Older ones
# refuse; asking again at every read-only wrap (each event of a mapped event file) costs an
# exception each time.
_dlpack_takes_read_only: bool | None = None


def _numpy_to_tensor(array: Any) -> torch.Tensor:
    """A tensor sharing a NumPy array's memory, read-only or not, without warnings."""
    global _dlpack_takes_read_only
    if array.flags.writeable:
        return torch.from_numpy(array)
    if _dlpack_takes_read_only is not False:
        try:
            # DLPack carries NumPy's read-only flag, which torch ignores: the import shares memory
            # quietly.
            tensor = torch.utils.dlpack.from_dlpack(array)
        except (BufferError, TypeError, RuntimeError):
            _dlpack_takes_read_only = False  # from_numpy shares the memory too, with a warning
        else:
            _dlpack_takes_read_only = True
            return tensor
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def tensor_of(array: Any, dtype: str) -> torch.Tensor:
    """The torch view of a NumPy array holding `dtype` values (read-only arrays too, such as a
    request's or a response's): bfloat16 arrives as its raw 16-bit patterns, NumPy having none."""
    tensor = _numpy_to_tensor(array)
    return tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor


def numpy_of(tensor: torch.Tensor) -> Any:
    """The NumPy view of a host tensor: bfloat16 as its raw 16-bit patterns (uint16)."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(_numpy().uint16)
    return tensor.numpy()


def _from_numpy(array: Any, read_only: bool) -> Adopted:
    np = _numpy()
    kind = f"numpy.ndarray of {array.dtype}"
    if array.dtype.hasobject:
        raise UnsupportedBufferError(f"buffer is a {kind}: object arrays hold pointers, not data")
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        raise NonContiguousBufferError(
            f"buffer must be contiguous, got a {kind} of shape {array.shape} with strides "
            f"{array.strides} bytes: pass the array it is a view of, or np.ascontiguousarray (a copy)"
        )
    flat = array.ravel(order="K").view(np.uint8)
    is_read_only = not array.flags.writeable
    if is_read_only and not read_only:
        raise ReadOnlyBufferError(
            f"buffer is a read-only {kind}: pass read_only=True to wrap it read-only, or a writable "
            f"array (array.copy())"
        )
    return Adopted(_numpy_to_tensor(flat), is_read_only, kind, flat)


def _capsule_pointer(capsule: object, name: bytes) -> int | None:
    is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_IsValid", ctypes.pythonapi)
    )
    if not is_valid(capsule, name):
        return None
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi)
    )
    pointer = get_pointer(capsule, name)
    return int(pointer) if pointer else None


def _from_dlpack(obj: Any, read_only: bool) -> Adopted:
    kind = f"{type(obj).__module__}.{type(obj).__qualname__} (DLPack)"
    device_type, device_id = obj.__dlpack_device__()
    kwargs: dict[str, Any] = {}
    if int(device_type) in (2, 10):  # kDLCUDA, kDLROCM: order the producer's work before ours
        stream = torch.cuda.current_stream(f"cuda:{int(device_id)}")
        legacy = device_type == 2 and stream.cuda_stream == 0
        kwargs["stream"] = 1 if legacy else stream.cuda_stream
    capsule = None
    for extra in ({"max_version": (1, 0), "copy": False}, {"max_version": (1, 0)}, {}):
        try:
            capsule = obj.__dlpack__(**kwargs, **extra)
            break
        except TypeError:
            continue
        except BufferError as error:  # NumPy < 2 refuses to export read-only arrays at all
            if "readonly" not in str(error).lower().replace("-", ""):
                raise UnsupportedBufferError(
                    f"buffer is a {kind} that refused export: {error}"
                ) from None
            raise ReadOnlyBufferError(
                f"buffer is a {kind} holding read-only memory, which its producer does not export "
                f"({error}); wrap it with read_only=True through the buffer protocol (NumPy's "
                f"array itself), or from a producer that marks it read-only (DLPack >= 1.0)"
            ) from None
    if capsule is None:
        raise UnsupportedBufferError(
            f"buffer is a {kind} whose __dlpack__ accepts no known arguments"
        )
    flags = 0
    pointer = _capsule_pointer(capsule, b"dltensor_versioned")
    if pointer is not None:  # DLPack >= 1.0 says whether the memory is read-only or a copy
        flags = ctypes.c_uint64.from_address(pointer + _DLPACK_FLAGS_OFFSET).value
    if flags & _DLPACK_FLAG_IS_COPIED:
        raise UnsupportedBufferError(
            f"buffer is a {kind} whose producer copied it on export: a wrapped buffer must share memory"
        )
    is_read_only = bool(flags & _DLPACK_FLAG_READ_ONLY)
    if is_read_only and not read_only:
        raise ReadOnlyBufferError(
            f"buffer is a {kind} that DLPack marks read-only: pass read_only=True to wrap it read-only"
        )
    tensor = torch.utils.dlpack.from_dlpack(capsule)
    return Adopted(_from_tensor(tensor, kind), is_read_only, kind)


def _from_buffer_protocol(obj: Any, read_only: bool) -> Adopted:
    kind = type(obj).__qualname__
    try:
        view = memoryview(obj)
    except TypeError:
        raise UnsupportedBufferError(
            f"buffer must be a torch.Tensor, a NumPy array, an object with __dlpack__ (CuPy, JAX, ...) "
            f"or a buffer-protocol object (bytearray, mmap, memoryview), got {kind}"
        ) from None
    if not view.c_contiguous:
        raise NonContiguousBufferError(
            f"buffer must be contiguous, got a {kind} of shape {view.shape} with strides {view.strides}"
        )
    data = view.cast("B") if (view.format, view.ndim) != ("B", 1) else view
    if view.readonly and not read_only:
        raise ReadOnlyBufferError(
            f"buffer is read-only memory ({kind}): pass read_only=True to wrap it read-only, or "
            f"writable memory (bytearray, an mmap opened for writing)"
        )
    if data.nbytes == 0:
        tensor = torch.empty(0, dtype=torch.uint8)
    elif not view.readonly:
        tensor = torch.frombuffer(data, dtype=torch.uint8)
    else:
        np = _numpy()
        if np is None:
            import numpy as np
        tensor = _numpy_to_tensor(np.frombuffer(data, dtype=np.uint8))
    return Adopted(tensor, view.readonly, kind, data)


def adopt(obj: object, read_only: bool) -> Adopted:
    """See `obj`'s memory as a flat uint8 tensor without copying it, or raise a buffer error."""
    if isinstance(obj, torch.Tensor):
        return Adopted(_from_tensor(obj), False, "torch.Tensor")
    np = _numpy()
    if np is not None and isinstance(obj, np.ndarray):
        return _from_numpy(obj, read_only)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, read_only)
    return _from_buffer_protocol(obj, read_only)


def is_pinned(tensor: torch.Tensor) -> bool:
    if tensor.device.type != "cpu":
        return False
    try:
        return bool(tensor.is_pinned())
    except RuntimeError:  # no accelerator backend to ask
        return False
