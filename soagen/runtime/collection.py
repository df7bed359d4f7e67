"""Base class of generated layout classes: one buffer, zero-copy typed views, slices, moves and copies.

A collection owns (or wraps) one byte buffer laid out exactly as CMSSW's GENERATE_SOA_LAYOUT places n
elements (see `soagen.dsl.layout`). Every accessor returns a view of that buffer made by one `as_strided`
call; nothing is copied unless a method says so (`to`, `clone`, `from_columns`, `load(mmap=False)`).

Importing this module imports neither torch nor NumPy: they load when a collection is first created.

Caching. Geometry (`member_views(n)`, block views) is computed once per class and n and kept in a small
per-class LRU. Each buffer keeps its typed base tensors (the bytes viewed as float32, int64, ...), and
each collection keeps, per member and block, the base, sizes, strides and storage offset, so an accessor
call after the first is a dictionary lookup and one `as_strided`.

Slices. A slice of an SoA is not an SoA buffer of the smaller size (its columns keep the parent's
pitches), so `slice(start, stop)` returns a collection of the same class over the same buffer that
remembers `element_range`: its views keep the parent's strides, their element axis has `stop - start`
entries and their offsets move by `start` elements. Typed accessors therefore work on slices unchanged.
`capacity` is the element count the buffer's geometry is computed for.

Read-only memory. torch has no read-only tensors: a tensor over `bytes`, a read-only NumPy array or a
read-only mmap can be written, silently corrupting an immutable object or crashing on a protected page.
So `wrap` refuses read-only memory unless given `read_only=True`; a read-only collection then serves
only NumPy views (`numpy()`), which NumPy marks read-only and refuses to write, and refuses every torch
view (`buffer`, typed accessors, `member`, `block`, `view`) with `ReadOnlyCollectionError`. A caller who
needs torch views of such memory (to feed a model, say) passes `unsafe_torch_views=True` as well and
takes on the promise not to write through them. `clone()` and `to()` of a read-only collection read it
and return writable copies.

Files. `save(path)` and `load(path)` write and read self-describing collection files
(`soagen.runtime.files`); `load(path)` maps the file by default, read-only under the rules above.
"""

from __future__ import annotations

import builtins
import importlib
import operator
import os
import sys
import types
import typing
from collections.abc import Mapping

from soagen.runtime.errors import (
    BufferTooSmallError,
    ColumnError,
    DeviceError,
    ElementCountError,
    ReadOnlyCollectionError,
    SliceRangeError,
)
from soagen.runtime.geometry import (
    ITEMSIZE,
    SizedGeometry,
    check_view,
    element_count,
    geometry,
    narrow,
)
from soagen.runtime.spec import BlockSpec, MemberSpec, StridedView

if typing.TYPE_CHECKING:
    import numpy
    import torch
    from numpy.typing import NDArray

    from soagen.runtime.buffers import DeviceLike

_C = typing.TypeVar("_C", bound="Collection")
# A view ready to build: typed base tensor, sizes, strides, storage offset (all in elements).
_Resolved: typing.TypeAlias = tuple["torch.Tensor", tuple[int, ...], tuple[int, ...], int]

# Views made by `view()` kept per collection; arbitrary geometry is not allowed to grow without bound.
_VIEW_CACHE_SIZE = 256


class _Memory:
    """One buffer and what is derived from it, shared by a collection and all its slices."""

    __slots__ = ("buffer", "host", "numpy_cache", "read_only", "torch_views", "typed")

    def __init__(
        self, buffer: torch.Tensor, read_only: bool, torch_views: bool, host: object = None
    ):
        self.buffer = buffer  # 1-D uint8, exactly byte_size(capacity) bytes
        self.read_only = read_only
        self.torch_views = torch_views
        self.host = host  # NumPy array or memoryview over the same bytes, for read-only NumPy views
        self.typed: dict[str, tuple[torch.Tensor, int]] = {}
        self.numpy_cache: NDArray[typing.Any] | None = None

    def base(self, dtype: str) -> tuple[torch.Tensor, int]:
        """The buffer seen as `dtype` and that view's storage offset, made once per buffer."""
        found = self.typed.get(dtype)
        if found is None:
            torch = _torch_module or _torch()
            typed_view = (_buffers_module or _buffers()).typed_view
            # Made outside inference mode even when first asked inside it: every later view derives
            # from this one, and views of an inference-mode view refuse writes outside that mode.
            # (Entered only then: a new event's collections make theirs at its first call.)
            if torch.is_inference_mode_enabled():
                with torch.inference_mode(False):
                    typed = typed_view(self.buffer, dtype)
            else:
                typed = typed_view(self.buffer, dtype)
            found = (typed, int(typed.storage_offset()))
            self.typed[dtype] = found
        return found

    def numpy_bytes(self) -> NDArray[typing.Any]:
        """The buffer as a NumPy uint8 array (read-only when the collection is), made once."""
        if self.numpy_cache is None:
            import numpy as np

            nbytes = self.buffer.numel()
            host = self.host
            if isinstance(host, np.ndarray):
                data = host[:nbytes]
            elif host is not None and nbytes:
                data = np.frombuffer(typing.cast(memoryview, host), dtype=np.uint8, count=nbytes)
            elif host is not None:
                data = np.empty(0, dtype=np.uint8)
            else:
                # Not Tensor.numpy(), which passes through aten::to: DLPack shares with no aten op.
                try:
                    data = np.from_dlpack(self.buffer)
                except (BufferError, RuntimeError, TypeError, ValueError):
                    data = self.buffer.numpy()  # a producer NumPy does not take (pinned memory?)
                if not data.flags.writeable and not self.read_only:
                    # NumPy < 2 marks every DLPack import read-only; Tensor.numpy() would record
                    # an aten::to. The array interface shares the memory and keeps the tensor alive.
                    data = np.asarray(_HostBytes(self.buffer))
            if self.read_only and nbytes:
                # NumPy lets anyone set `writeable = True` again on a view whose memory is writable at
                # its root; rooting the views in a read-only memoryview stops that.
                data = np.frombuffer(
                    memoryview(typing.cast(typing.Any, data)).toreadonly(), dtype=np.uint8
                )
            elif self.read_only:
                data = data.view()
                data.flags.writeable = False
            self.numpy_cache = data
        return self.numpy_cache


class _HostBytes:
    """A CPU uint8 tensor's memory through NumPy's array interface; NumPy holds it as the base."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer
        self.__array_interface__ = {
            "version": 3,
            "shape": (buffer.numel(),),
            "typestr": "|u1",
            "data": (buffer.data_ptr(), False),
        }


# torch and `soagen.runtime.buffers` (which imports torch), bound at the first collection made
# (this module imports neither): `_torch_module or _torch()` on paths each new event's
# collections take, where an import statement or a call costs a frame.
_torch_module: types.ModuleType | None = None
_buffers_module: types.ModuleType | None = None


def _torch() -> types.ModuleType:
    global _torch_module
    _torch_module = importlib.import_module("torch")
    return _torch_module


def _buffers() -> types.ModuleType:
    global _buffers_module
    _buffers_module = importlib.import_module("soagen.runtime.buffers")
    return _buffers_module


def _numpy_dtype(dtype: str) -> numpy.dtype[typing.Any]:
    import numpy as np

    from soagen.dsl.dtypes import DTYPES

    return np.dtype(getattr(np, DTYPES[dtype].numpy_name))


class Collection:
    """A layout's n elements in one buffer, with zero-copy typed views.

    Create one with `allocate(n)`, `wrap(buffer, n)`, `from_columns(...)` or `load(path)`; the constructor is not
    public. Generated subclasses add the class attributes below and one property per member.
    """

    NAME: typing.ClassVar[str]
    SCHEMA: typing.ClassVar[str]
    # A digest of the alignment and members (`soagen.dsl.layout.layout_key`): models refuse a
    # collection whose key differs from their block's, although its NAME matches.
    LAYOUT_KEY: typing.ClassVar[str] = ""
    ALIGNMENT: typing.ClassVar[int]
    MEMBERS: typing.ClassVar[tuple[MemberSpec, ...]]
    BLOCKS: typing.ClassVar[dict[str, BlockSpec]]

    _memory: _Memory
    _device: torch.device  # the buffer's, fixed for the collection's life; read on every model call
    _geometry: SizedGeometry
    _capacity: int
    _start: int
    _size: int
    _sliced: bool
    _members: dict[str, _Resolved]
    _blocks: dict[str | BlockSpec, _Resolved]
    _views: dict[tuple[StridedView, int | None], _Resolved]

    def __init__(self) -> None:
        name = type(self).__name__
        raise TypeError(
            f"create a {name} with {name}.allocate(n), {name}.wrap(buffer, n) or "
            f"{name}.from_columns(...)"
        )

    # Geometry: generated subclasses implement these in closed form.

    @staticmethod
    def offsets(n: int) -> dict[str, int]:
        """Byte offset of every member from the start of the buffer, for n elements."""
        raise NotImplementedError

    @staticmethod
    def byte_size(n: int) -> int:
        """Bytes of one buffer holding n elements."""
        raise NotImplementedError

    @staticmethod
    def member_views(n: int) -> dict[str, StridedView]:
        """Geometry of every member's tensor view, for n elements."""
        raise NotImplementedError

    # Construction.

    @classmethod
    def _create(
        cls: type[_C],
        memory: _Memory,
        capacity: int,
        start: int,
        size: int,
        sliced: bool = False,
        sized: SizedGeometry | None = None,
    ) -> _C:
        self = cls.__new__(cls)
        self._memory = memory
        self._device = memory.buffer.device
        self._geometry = sized if sized is not None else geometry(cls, capacity)
        self._capacity = capacity
        self._start = start
        self._size = size
        self._sliced = sliced
        self._members = {}
        self._blocks = {}
        self._views = {}
        return self

    @classmethod
    def allocate(
        cls: type[_C],
        n: int,
        device: DeviceLike = "cpu",
        *,
        pin_memory: bool = False,
        zero: bool = False,
    ) -> _C:
        """A new buffer for n elements on `device`, aligned to ALIGNMENT, uninitialized unless `zero`.

        `pin_memory=True` allocates page-locked host memory (device must be 'cpu'), from which copies to
        an accelerator can run asynchronously.
        """
        from soagen.runtime import buffers

        count = element_count(n)
        target = buffers.as_device(device)
        memory = buffers.allocate(cls.byte_size(count), cls.ALIGNMENT, target, pin_memory, zero)
        return cls._create(_Memory(memory, False, True), count, 0, count)

    @classmethod
    def wrap(
        cls: type[_C],
        buffer: object,
        n: int,
        *,
        device: DeviceLike | None = None,
        read_only: bool = False,
        unsafe_torch_views: bool = False,
        exact: bool = False,
    ) -> _C:
        """View existing memory as n elements, without copying it.

        `buffer` is a contiguous torch tensor of any dtype (seen as bytes), a NumPy array, an object
        with `__dlpack__` (CuPy, JAX, ...) or a buffer-protocol object (`bytearray`, `mmap`,
        `memoryview`). Its first `byte_size(n)` bytes are used; it must hold at least that many, start
        on a multiple of ALIGNMENT and, if `device` is given, live there. Every member's offset
        depends on n, so a wrong n on a larger buffer reads other members' bytes: `exact=True`
        requires exactly `byte_size(n)` bytes, as a CMSSW producer's buffer for n elements holds.

        Read-only memory is refused unless `read_only=True`; a read-only collection gives NumPy views
        only, or torch views too with `unsafe_torch_views=True` (see the module documentation).
        """
        torch = _torch_module or _torch()
        if torch.is_inference_mode_enabled():
            # Adopted outside inference mode even when wrapped inside it: tensors made in it (an
            # array's, a dtype view of a tensor) refuse in-place writes outside it.
            with torch.inference_mode(False):
                return cls._wrap(buffer, n, device, read_only, unsafe_torch_views, exact)
        return cls._wrap(buffer, n, device, read_only, unsafe_torch_views, exact)

    @classmethod
    def _wrap(
        cls: type[_C],
        buffer: object,
        n: int,
        device: DeviceLike | None,
        read_only: bool,
        unsafe_torch_views: bool,
        exact: bool,
    ) -> _C:
        """`wrap`, outside inference mode (a subclass's own `wrap` runs once around it)."""
        buffers = _buffers_module or _buffers()
        count = element_count(n)
        if unsafe_torch_views and not read_only:
            raise ValueError("unsafe_torch_views=True only applies with read_only=True")
        adopted = buffers.adopt(buffer, read_only)
        tensor = adopted.tensor
        if device is not None:
            expected = buffers.as_device(device, must_exist=False)
            if not buffers.device_matches(tensor.device, expected):
                raise DeviceError(
                    f"buffer is on {tensor.device} but device={str(expected)!r} was asked for: wrap "
                    f"it where it is, or move it first"
                )
        needed = cls.byte_size(count)
        if tensor.numel() < needed:
            raise BufferTooSmallError(
                f"buffer holds {tensor.numel()} bytes but {cls.NAME} with n={count} needs {needed} "
                f"({cls.NAME}.byte_size({count}))"
            )
        if exact and tensor.numel() != needed:
            raise ElementCountError(
                f"buffer holds {tensor.numel()} bytes, not the {needed} of {cls.NAME} with n={count} "
                f"(exact=True): is n the producer's element count?"
            )
        buffers.check_alignment(tensor, cls.ALIGNMENT, cls.NAME)
        # `adopt` made `tensor` (a new tensor object over the memory): ours to keep whole.
        memory = _Memory(
            tensor if tensor.numel() == needed else tensor[:needed],
            read_only,
            unsafe_torch_views or not read_only,
            adopted.host,
        )
        return cls._create(memory, count, 0, count)

    @classmethod
    def from_columns(
        cls: type[_C],
        columns: Mapping[str, object] | None = None,
        /,
        *,
        device: DeviceLike | None = None,
        pin_memory: bool = False,
        zero_missing: bool = False,
        **named: object,
    ) -> _C:
        """A new collection holding copies of separate columns, given by member name.

        Each column is a torch tensor, NumPy array or DLPack object of exactly the member's dtype and
        shape `[n, *shape]` (scalars: 0-d), or Python numbers, read as the member's dtype. Every member
        is required unless `zero_missing=True`, which zero-fills the ones not given. The buffer goes to
        `device`, by default that of the first tensor given, else the CPU; padding bytes are zero.
        Members whose names clash with these keyword options go in the positional mapping.
        """
        from soagen.runtime import buffers

        given: dict[str, object] = dict(columns or {})
        for name, value in named.items():
            if name in given:
                raise ColumnError(f"member {name!r} is given twice (in the mapping and by keyword)")
            given[name] = value
        specs = {spec.name: spec for spec in cls.MEMBERS}
        unknown = [name for name in given if name not in specs]
        if unknown:
            raise ColumnError(
                f"{cls.NAME} has no member {', '.join(map(repr, unknown))}; its members are "
                f"{', '.join(specs)}"
            )
        tensors: dict[str, torch.Tensor] = {}
        n: int | None = None
        n_from = ""
        for spec in cls.MEMBERS:
            if spec.name not in given:
                continue
            tensor = _column_tensor(cls.NAME, spec, given[spec.name])
            if spec.per_element:
                if tensor.dim() == 0:
                    raise ColumnError(
                        f"column {spec.name!r} must have shape {['n', *spec.shape]}, got a 0-d value"
                    )
                if n is None:
                    n, n_from = int(tensor.shape[0]), spec.name
                expected = (n, *spec.shape)
                if tuple(tensor.shape) != expected:
                    raise ColumnError(
                        f"column {spec.name!r} must have shape {list(expected)} (n={n}, from column "
                        f"{n_from!r}), got {list(tensor.shape)}"
                    )
            elif tensor.dim() != 0:
                raise ColumnError(
                    f"scalar {spec.name!r} must be 0-d, got shape {list(tensor.shape)}"
                )
            tensors[spec.name] = tensor
        missing = [name for name in specs if name not in given]
        if missing and not zero_missing:
            raise ColumnError(
                f"from_columns is missing {', '.join(map(repr, missing))} of {cls.NAME}: give every "
                f"member, or pass zero_missing=True to zero-fill the missing ones"
            )
        if n is None:
            raise ColumnError(
                f"from_columns needs at least one column of {cls.NAME} to know n, got only "
                f"{', '.join(map(repr, given)) or 'nothing'}"
            )
        if device is not None:
            target = buffers.as_device(device)
        else:
            target = next(iter(tensors.values())).device
        out = cls.allocate(n, target, pin_memory=pin_memory, zero=True)
        for name, tensor in tensors.items():
            view, axis = out._geometry.member(name), out._geometry.member_axes[name]
            out._build(view, axis).copy_(tensor)
        return out

    # What the collection is.

    @property
    def size(self) -> int:
        """The number of elements (of this slice, for a slice)."""
        return self._size

    @property
    def capacity(self) -> int:
        """The number of elements the buffer's layout is computed for (`size` unless sliced)."""
        return self._capacity

    @property
    def element_range(self) -> tuple[int, int]:
        """`(start, stop)` of these elements among the buffer's `capacity`; `(0, n)` unless sliced."""
        return self._start, self._start + self._size

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer: `byte_size(capacity)`."""
        return self._geometry.byte_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def is_pinned(self) -> bool:
        """Whether the buffer is page-locked host memory."""
        from soagen.runtime.buffers import is_pinned

        return is_pinned(self._memory.buffer)

    @property
    def read_only(self) -> bool:
        """Whether this collection wraps memory read-only (see the module documentation)."""
        return self._memory.read_only

    @property
    def buffer(self) -> torch.Tensor:
        """The whole buffer as a 1-D uint8 tensor of `nbytes` bytes (the parent's, for a slice)."""
        self._check_torch_views()
        return self._memory.buffer.view(self._memory.buffer.shape)

    # Views.

    # The accessors look their views up with `get`: a new event's collections miss at every first
    # call, where a caught KeyError costs more than the lookup.

    def _member(self, name: str) -> torch.Tensor:
        base, shape, strides, offset = self._members.get(name) or self._resolve_member(name)
        return base.as_strided(shape, strides, offset)

    def member(self, name: str) -> torch.Tensor:
        """A member by name: a column as [n], an array column as [n, *shape], a scalar as 0-d."""
        return self._member(name)

    def block(self, block: str | BlockSpec) -> torch.Tensor:
        """A model block as one strided view: a name from BLOCKS, or a BlockSpec of this layout
        (such as one declared on a model class). Scalars in a block broadcast with stride 0."""
        base, shape, strides, offset = self._blocks.get(block) or self._resolve_block(block)
        return base.as_strided(shape, strides, offset)

    def _block_with_own_version(self, block: str | BlockSpec) -> torch.Tensor:
        """`block(block)` as a tensor that torch does not count as a view of the buffer: it has a
        version counter of its own, which in-place writes through it or its views move, and writes
        through any other view of the buffer (which all share the buffer's counter) do not. Model
        bindings hand these to models, so that a write is pinned on the input that took it even
        while other threads fill other members. Inside `torch.inference_mode()`, where new tensors
        keep no version counter, it is `block(block)`."""
        base, shape, strides, offset = self._blocks.get(block) or self._resolve_block(block)
        if (_torch_module or _torch()).is_inference_mode_enabled():
            return base.as_strided(shape, strides, offset)
        # The typed base's own storage: its offsets count from there, and it is not always the
        # buffer's (`typed_view` re-imports memory whose storage starts off the item size).
        return base.new_empty(0).set_(base.untyped_storage(), offset, shape, strides)

    def view(self, view: StridedView, *, element_axis: int | None = None) -> torch.Tensor:
        """Materialize any geometry of this buffer, computed for `capacity` elements.

        `element_axis` names the dimension that runs over elements; a slice narrows it to its own
        elements, so on a slice it is required for any view that is not 0-d.
        """
        key = (view, element_axis)
        resolved = self._views.get(key)
        if resolved is None:
            resolved = self._resolve_view(view, element_axis)
            if len(self._views) >= _VIEW_CACHE_SIZE:
                self._views.clear()
            self._views[key] = resolved
        base, shape, strides, offset = resolved
        return base.as_strided(shape, strides, offset)

    @typing.overload
    def numpy(self, what: None = None) -> dict[str, NDArray[typing.Any]]: ...

    @typing.overload
    def numpy(self, what: str | BlockSpec) -> NDArray[typing.Any]: ...

    def numpy(
        self, what: str | BlockSpec | None = None
    ) -> NDArray[typing.Any] | dict[str, NDArray[typing.Any]]:
        """NumPy views sharing the buffer (host memory only): one member by name, a block by its
        BlockSpec, or, with no argument, a dict of every member. bfloat16 members come back as their
        raw uint16 bit patterns, NumPy having no bfloat16. Read-only for a read-only collection."""
        if self.device.type != "cpu":
            raise DeviceError(
                f"numpy() needs host memory, but this {type(self).NAME} is on {self.device}: "
                f"copy it with .to('cpu') first"
            )
        sized = self._geometry
        if what is None:
            return {
                name: self._numpy_view(view, sized.member_axes[name])
                for name, view in sized.members.items()
            }
        if isinstance(what, str):
            return self._numpy_view(sized.member(what), sized.member_axes[what])
        if isinstance(what, BlockSpec):
            return self._numpy_view(*sized.block(what))
        raise TypeError(
            f"numpy() takes a member name, a BlockSpec or nothing, got {type(what).__name__}"
        )

    # Slices.

    def slice(self: _C, start: int, stop: int) -> _C:
        """Elements [start, stop) as a collection of views into the same buffer (no copy)."""
        first, last = operator.index(start), operator.index(stop)
        if not 0 <= first <= last <= self._size:
            raise SliceRangeError(
                f"slice [{first}, {last}) is out of range for {type(self).NAME} of size "
                f"{self._size}: need 0 <= start <= stop <= {self._size}"
            )
        return type(self)._create(
            self._memory,
            self._capacity,
            self._start + first,
            last - first,
            sliced=True,
            sized=self._geometry,
        )

    def __getitem__(self: _C, key: builtins.slice) -> _C:
        """`collection[start:stop]`: `slice(start, stop)`, negative bounds counting from the end."""
        if not isinstance(key, builtins.slice):
            raise TypeError(
                f"index a {type(self).NAME} with a slice, as in [start:stop], not "
                f"{type(key).__name__}; index a member's view for single values"
            )
        if key.step not in (None, 1):
            raise SliceRangeError(
                f"slice step must be 1, got {key.step}: an SoA slice is a range of elements"
            )
        bounds = []
        for bound, default in ((key.start, 0), (key.stop, self._size)):
            value = default if bound is None else operator.index(bound)
            bounds.append(value + self._size if value < 0 else value)
        return self.slice(bounds[0], bounds[1])

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        flags = ", read_only=True" if self._memory.read_only else ""
        start, stop = self.element_range
        sliced = f", elements [{start}, {stop}) of {self._capacity}" if self._sliced else ""
        return f"{type(self).NAME}(n={self._size}{sliced}, device={self.device}, nbytes={self.nbytes}{flags})"

    # Copies.

    def to(
        self: _C, device: DeviceLike, *, non_blocking: bool = False, pin_memory: bool = False
    ) -> _C:
        """This collection on `device`: itself if already there (and pinned, if asked), else a copy.

        A whole collection moves with one buffer copy; a slice becomes a new collection of its own
        size, one copy per member. `non_blocking` is passed to the copy (effective from pinned host
        memory, or to pinned host memory with `pin_memory=True`).
        """
        from soagen.runtime import buffers

        target = buffers.as_device(device)
        if buffers.device_matches(self.device, target) and (not pin_memory or self.is_pinned):
            return self
        return self._copy(target, non_blocking, pin_memory)

    def clone(self: _C) -> _C:
        """A copy in a new buffer on the same device (pinned if this one is); always writable."""
        return self._copy(self.device, False, self.is_pinned)

    def _copy(self: _C, device: torch.device, non_blocking: bool, pin_memory: bool) -> _C:
        cls = type(self)
        if not self._sliced or (self._start, self._size) == (0, self._capacity):
            out = cls.allocate(self._capacity, device, pin_memory=pin_memory)
            out._memory.buffer.copy_(self._memory.buffer, non_blocking=non_blocking)
            return out
        out = cls.allocate(self._size, device, pin_memory=pin_memory, zero=True)
        for name, view in self._geometry.members.items():
            axis = self._geometry.member_axes[name]
            target = out._build(out._geometry.members[name], axis)
            target.copy_(self._build(view, axis), non_blocking=non_blocking)
        return out

    # Files.

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write these elements to `path` as a self-describing collection file (`soagen.runtime.files`).

        A whole host collection is written straight from its buffer; a slice is first laid out
        anew for its own size (one copy per member), and a collection on an accelerator is first
        copied to the host. The file replaces `path` whole, by a rename.
        """
        from soagen.runtime import files

        files.save(type(self), self._size, host_bytes(self), path)

    @classmethod
    def load(
        cls: type[_C],
        path: str | os.PathLike[str],
        *,
        mmap: bool = True,
        device: DeviceLike = "cpu",
        writable: bool = False,
        verify: bool = False,
        unsafe_torch_views: bool = False,
    ) -> _C:
        """The collection saved at `path`, refused with a `CollectionFileError` naming the file
        unless the file holds this layout (same NAME and LAYOUT_KEY), whole and self-consistent.

        `mmap=True`: the buffer is the file's mapping, no copy. It is read-only, as `wrap(...,
        read_only=True)` makes it: NumPy views only, or torch views too (to feed it to a model as
        an input) with `unsafe_torch_views=True`, through which nothing may be written: the pages
        are mapped read-only, and a write kills the process. `writable=True` maps the file for
        writing instead: writes through the collection reach the file. `mmap=False`: a new
        buffer on `device`, read from the file (and copied there from the host if not the CPU).
        `verify=True` checks the buffer's CRC32 against the header's first (reading every byte).
        """
        from soagen.runtime import files

        return files.load(
            cls,
            path,
            mmap=mmap,
            device=device,
            writable=writable,
            verify=verify,
            unsafe_torch_views=unsafe_torch_views,
        )

    # Arrow, Parquet and awkward: the `data` extra (soagen.runtime.arrow, soagen.runtime.awkward),
    # which these methods import when called.

    def to_arrow(self, *, arrays: str = "columns") -> typing.Any:
        """These elements as a `pyarrow.RecordBatch` over the buffer, which the batch keeps alive.

        Columns and packed array members are zero-copy; bool columns are copied (Arrow packs them
        into bits). A coefficient-major array member `p` is one column per coefficient (`p_0`,
        `p_1`, ...: zero-copy) with `arrays="columns"`, or one fixed-size-list column `p` (one
        copy) with `arrays="list"`. Scalars, NAME, LAYOUT_KEY and ALIGNMENT go to the schema
        metadata. See `soagen.runtime.arrow`.
        """
        from soagen.runtime import arrow

        return arrow.to_arrow(self, arrays=arrays)

    @classmethod
    def from_arrow(
        cls: type[_C], data: object, *, scalars: Mapping[str, object] | None = None
    ) -> _C:
        """A new collection holding a copy of a `pyarrow.RecordBatch` or `Table` (any chunks),
        refused with a ColumnError naming a missing, unknown, mis-typed or mis-shaped column.
        Scalars come from `scalars` or the metadata `to_arrow` writes."""
        from soagen.runtime import arrow

        return arrow.from_arrow(cls, data, scalars=scalars)

    def write_parquet(
        self, path: str | os.PathLike[str], *, arrays: str = "columns", **options: typing.Any
    ) -> None:
        """Write `to_arrow(arrays=arrays)` to a Parquet file (`options`: pyarrow.parquet.write_table's)."""
        from soagen.runtime import arrow

        arrow.write_parquet(self, path, arrays=arrays, **options)

    @classmethod
    def read_parquet(
        cls: type[_C],
        path: str | os.PathLike[str],
        *,
        scalars: Mapping[str, object] | None = None,
    ) -> _C:
        """A new collection read from a Parquet file, checked as `from_arrow` checks a table."""
        from soagen.runtime import arrow

        return arrow.read_parquet(cls, path, scalars=scalars)

    def to_awkward(self, offsets: object) -> typing.Any:
        """These elements as an `awkward.Array` of one list of records per event, event i owning
        elements `offsets[i]:offsets[i + 1]`; zero-copy but for coefficient-major array members.
        See `soagen.runtime.awkward`."""
        from soagen.runtime import awkward

        return awkward.to_awkward(self, offsets)

    @classmethod
    def from_awkward(
        cls: type[_C],
        array: object,
        *,
        prefix: str | None = None,
        scalars: Mapping[str, object] | None = None,
    ) -> tuple[_C, NDArray[typing.Any]]:
        """Every event's elements of a jagged awkward array in one new collection, and the event
        offsets (NumPy int64). Takes jagged records (`ak.zip({"pt": ..., "eta": ...})`) or records
        of jagged fields named `prefix + member` (uproot's `Jet_pt` with `prefix="Jet_"`)."""
        from soagen.runtime import awkward

        return awkward.from_awkward(cls, array, prefix=prefix, scalars=scalars)

    # Internals.

    def _check_torch_views(self) -> None:
        if not self._memory.torch_views:
            raise ReadOnlyCollectionError(
                f"this {type(self).NAME} wraps memory read-only and torch has no read-only tensors, "
                f"so it gives no torch views: read it through .numpy(...) (read-only NumPy views), "
                f"copy it with .clone(), or wrap it with read_only=True, unsafe_torch_views=True for "
                f"torch views you must not write through"
            )

    def _resolve(self, view: StridedView, axis: int | None) -> _Resolved:
        shape, strides, offset = narrow(view, axis, self._start, self._size, self._capacity)
        base, base_offset = self._memory.base(view.dtype)
        return base, shape, strides, base_offset + offset

    def _build(self, view: StridedView, axis: int | None) -> torch.Tensor:
        """A torch view whatever `read_only` says: for copies made by this class only."""
        base, shape, strides, offset = self._resolve(view, axis)
        return base.as_strided(shape, strides, offset)

    def _resolve_view(self, view: StridedView, element_axis: int | None) -> _Resolved:
        self._check_torch_views()
        check_view(view, self.nbytes, type(self).NAME)
        if element_axis is None and view.shape and self._sliced:
            raise SliceRangeError(
                f"view() on a slice of {type(self).NAME} needs element_axis=: the axis of the "
                f"view that runs over elements, which the slice narrows to its own"
            )
        return self._resolve(view, element_axis)

    def _resolve_member(self, name: str) -> _Resolved:
        self._check_torch_views()
        sized = self._geometry
        resolved = self._resolve(sized.member(name), sized.member_axes[name])
        self._members[name] = resolved
        return resolved

    def _resolve_block(self, block: str | BlockSpec) -> _Resolved:
        self._check_torch_views()
        resolved = self._resolve(*self._geometry.block(block))
        self._blocks[block] = resolved
        return resolved

    def _numpy_view(self, view: StridedView, axis: int | None) -> NDArray[typing.Any]:
        import numpy as np

        shape, strides, offset = narrow(view, axis, self._start, self._size, self._capacity)
        itemsize = ITEMSIZE[view.dtype]
        return np.ndarray(
            shape,
            dtype=_numpy_dtype(view.dtype),
            buffer=self._memory.numpy_bytes(),
            offset=offset * itemsize,
            strides=tuple(stride * itemsize for stride in strides),
        )


def host_bytes(collection: Collection) -> NDArray[typing.Any]:
    """The collection's elements as `byte_size(size)` bytes laid out for `size` elements, in host
    memory: its buffer itself for a whole host collection; else a copy (per member for a slice).
    A function, not a method, since generated classes' attributes are names schemas cannot use."""
    import torch

    whole = (collection._start, collection._size) == (0, collection._capacity)
    host = collection
    if not whole or collection.device.type != "cpu":
        host = collection._copy(torch.device("cpu"), False, False)
    return host._memory.numpy_bytes()


def _column_tensor(layout: str, spec: MemberSpec, value: object) -> torch.Tensor:
    """A member's value as a tensor of exactly its dtype, or a ColumnError naming the member."""
    import torch
    import torch.utils.dlpack

    from soagen.runtime.buffers import TORCH_DTYPES

    what = f"{spec.kind} {spec.name!r} of {layout}"
    expected = TORCH_DTYPES[spec.dtype]
    np = sys.modules.get("numpy")
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
    elif np is not None and isinstance(value, np.ndarray):
        if spec.dtype == "bfloat16":
            raise ColumnError(
                f"{what} is bfloat16, which NumPy lacks: pass a torch tensor of torch.bfloat16"
            )
        if value.dtype != _numpy_dtype(spec.dtype):
            raise ColumnError(
                f"{what} is {spec.dtype} but got a NumPy array of {value.dtype}: convert it "
                f"explicitly, e.g. array.astype({spec.dtype!r})"
            )
        tensor = torch.from_numpy(value if value.flags.writeable else value.copy())
    elif hasattr(value, "__dlpack__"):
        tensor = torch.utils.dlpack.from_dlpack(value)
    else:
        try:
            tensor = torch.as_tensor(value, dtype=expected)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ColumnError(
                f"{what}: cannot read a {type(value).__name__} as {spec.dtype}: {error}"
            ) from None
    if tensor.dtype != expected:
        raise ColumnError(
            f"{what} is {spec.dtype} but got a tensor of {tensor.dtype}: convert it explicitly, "
            f"e.g. tensor.to({expected})"
        )
    return tensor
