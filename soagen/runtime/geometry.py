"""Where views of a collection lie, in pure Python (no torch, no NumPy).

Generated classes compute member and block geometry in closed form for any n. This module caches that
geometry per class and per n (a small LRU, so a collection of a new size costs one `member_views(n)`
call and every later collection of that size none), checks views against a buffer's size, and narrows
a view to a slice of elements: the parent's strides and pitches stay, the element axis shrinks and the
offset moves by `start` elements.
"""

from __future__ import annotations

import operator
import typing
from collections import OrderedDict

from soagen.dsl.dtypes import DTYPES
from soagen.runtime.errors import ElementCountError, GeometryError, UnknownNameError
from soagen.runtime.spec import BlockSpec, StridedView

if typing.TYPE_CHECKING:
    from soagen.runtime.collection import Collection

ITEMSIZE: dict[str, int] = {name: row.itemsize for name, row in DTYPES.items()}

# Sizes kept per class: a pipeline touches a handful of sizes at once (batches, a remainder, a total).
GEOMETRY_CACHE_SIZE = 32

# shape and strides in elements, offset in elements of the view's dtype from the buffer's start
Placement = tuple[tuple[int, ...], tuple[int, ...], int]


def element_count(n: object, name: str = "n") -> int:
    """`n` as a non-negative int, or an error naming the argument."""
    if isinstance(n, bool):
        raise ElementCountError(f"{name} must be an integer >= 0, got {n!r}")
    try:
        value = operator.index(n)  # type: ignore[arg-type]
    except TypeError:
        raise ElementCountError(
            f"{name} must be an integer >= 0, got {type(n).__name__} {n!r}"
        ) from None
    if value < 0:
        raise ElementCountError(f"{name} must be >= 0, got {value}")
    return value


def span_bytes(view: StridedView, itemsize: int) -> int:
    """Bytes from the view's first element to just past its last (0 for an empty view)."""
    if any(extent == 0 for extent in view.shape):
        return 0
    last = sum(
        (extent - 1) * stride for extent, stride in zip(view.shape, view.strides, strict=True)
    )
    return (last + 1) * itemsize


def check_view(view: StridedView, nbytes: int, owner: str) -> int:
    """Check that `view` is well formed and lies within `nbytes` bytes; return its item size."""
    if not isinstance(view, StridedView):
        raise TypeError(f"view must be a soagen.runtime.StridedView, got {type(view).__name__}")
    itemsize = ITEMSIZE.get(view.dtype)
    if itemsize is None:
        raise GeometryError(
            f"view has dtype {view.dtype!r}, which is not one of {', '.join(ITEMSIZE)}"
        )
    if len(view.shape) != len(view.strides):
        raise GeometryError(
            f"view has shape {view.shape} but strides {view.strides}: one stride per dimension"
        )
    if any(extent < 0 for extent in view.shape) or any(stride < 0 for stride in view.strides):
        raise GeometryError(
            f"view has shape {view.shape} and strides {view.strides}: both must be >= 0"
        )
    if view.offset < 0 or view.offset % itemsize:
        raise GeometryError(
            f"view offset {view.offset} must be >= 0 and a multiple of {itemsize} "
            f"(the size of {view.dtype})"
        )
    end = view.offset + span_bytes(view, itemsize)
    if end > nbytes:
        raise GeometryError(
            f"view {view.dtype}{list(view.shape)} with strides {view.strides} at byte offset "
            f"{view.offset} reaches byte {end}, but the buffer of {owner} holds "
            f"{nbytes} bytes"
        )
    return itemsize


def narrow(view: StridedView, axis: int | None, start: int, size: int, capacity: int) -> Placement:
    """Place `view` (geometry for `capacity` elements) for elements [start, start + size).

    `axis` is the dimension that runs over elements (None for a 0-d scalar view, which no slice
    changes). A broadcast scalar's element axis has stride 0, so moving along it moves nothing.
    """
    itemsize = ITEMSIZE[view.dtype]
    offset = view.offset // itemsize
    if axis is None:
        return view.shape, view.strides, offset
    if not -len(view.shape) <= axis < len(view.shape):
        raise GeometryError(f"element_axis={axis} is out of range for a view of shape {view.shape}")
    if view.shape[axis] != capacity:
        raise GeometryError(
            f"element_axis={axis} of the view has extent {view.shape[axis]}, but the view must be "
            f"geometry for the buffer's {capacity} elements"
        )
    if start == 0 and size == capacity:
        return view.shape, view.strides, offset
    shape = list(view.shape)
    shape[axis] = size
    return tuple(shape), view.strides, offset + start * view.strides[axis]


class SizedGeometry:
    """Member and block geometry of one layout class for one n."""

    __slots__ = ("byte_size", "layout", "member_axes", "members", "n", "blocks")

    def __init__(self, layout: LayoutGeometry, n: int) -> None:
        self.layout = layout
        self.n = n
        self.byte_size: int = layout.cls.byte_size(n)
        self.members: dict[str, StridedView] = layout.cls.member_views(n)
        self.member_axes = layout.member_axes
        self.blocks: dict[str | BlockSpec, tuple[StridedView, int | None]] = {}
        for view in self.members.values():  # generated code is trusted, but checked once per n
            check_view(view, self.byte_size, layout.cls.NAME)

    def member(self, name: str) -> StridedView:
        view = self.members.get(name)
        if view is None:
            raise UnknownNameError(
                f"{self.layout.cls.NAME} has no member {name!r}; its members are "
                f"{', '.join(self.members)}"
            )
        return view

    def block(self, block: str | BlockSpec) -> tuple[StridedView, int | None]:
        """The geometry of a block, by name (from BLOCKS) or as a BlockSpec of this layout."""
        found = self.blocks.get(block)
        if found is not None:
            return found
        cls = self.layout.cls
        if isinstance(block, str):
            spec = cls.BLOCKS.get(block)
            if spec is None:
                known = ", ".join(cls.BLOCKS) or "none"
                raise UnknownNameError(
                    f"{cls.NAME} declares no block {block!r}; its blocks are {known} "
                    f"(pass a BlockSpec for a block declared on a model class)"
                )
        elif isinstance(block, BlockSpec):
            spec = block
            if spec.layout != cls.NAME:
                raise GeometryError(
                    f"block {spec.name!r} is a block of {spec.layout}, not of {cls.NAME}"
                )
        else:
            raise TypeError(
                f"block must be a block name or a BlockSpec, got {type(block).__name__}"
            )
        view = spec.view(self.n)
        check_view(view, self.byte_size, cls.NAME)
        found = (view, spec.element_axis)
        self.blocks[block] = found
        return found


class LayoutGeometry:
    """Per-class facts and the LRU of `SizedGeometry` by n."""

    __slots__ = ("cls", "member_axes", "sizes")

    def __init__(self, cls: type[Collection]) -> None:
        self.cls = cls
        # Columns run over elements along their first dimension; scalars are 0-d.
        self.member_axes: dict[str, int | None] = {
            m.name: (0 if m.per_element else None) for m in cls.MEMBERS
        }
        self.sizes: OrderedDict[int, SizedGeometry] = OrderedDict()

    def at(self, n: int) -> SizedGeometry:
        sized = self.sizes.get(n)
        if sized is None:
            sized = SizedGeometry(self, n)
            self.sizes[n] = sized
            if len(self.sizes) > GEOMETRY_CACHE_SIZE:
                self.sizes.popitem(last=False)
        else:
            self.sizes.move_to_end(n)
        return sized


_CACHE_ATTRIBUTE = "_soagen_geometry"


def geometry(cls: type[Collection], n: int) -> SizedGeometry:
    """The cached geometry of `cls` for n elements.

    The cache lives in the class's own `__dict__` (a subclass gets its own), so it goes with the class.
    """
    layout = cls.__dict__.get(_CACHE_ATTRIBUTE)
    if not isinstance(layout, LayoutGeometry):
        layout = LayoutGeometry(cls)
        setattr(cls, _CACHE_ATTRIBUTE, layout)
    return layout.at(n)
