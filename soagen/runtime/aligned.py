"""Aligned memory for producers that fill a buffer themselves and then `wrap` it.

`wrap` refuses a buffer that does not start on a multiple of the layout's ALIGNMENT (128 bytes by
default, as CMSSW's), and the usual allocators align to less: NumPy to 16 bytes (`np.zeros`,
`np.empty`), PyTorch's CPU allocator to 64. These helpers over-allocate and return the aligned part,
a plain 1-D uint8 array or tensor of exactly `nbytes` bytes (view it as any dtype).

Importing this module imports neither torch nor NumPy: `aligned_numpy` needs only NumPy.
"""

from __future__ import annotations

import operator
import typing

from soagen.runtime.geometry import element_count

if typing.TYPE_CHECKING:
    import torch
    from numpy.typing import NDArray

    from soagen.runtime.buffers import DeviceLike


def _alignment(alignment: object) -> int:
    try:
        value = operator.index(alignment)  # type: ignore[arg-type]
    except TypeError:
        value = 0
    if isinstance(alignment, bool) or value < 1 or value & (value - 1):
        raise ValueError(f"alignment must be a power of two in bytes, got {alignment!r}")
    return value


def aligned_numpy(nbytes: int, alignment: int = 128, *, zero: bool = False) -> NDArray[typing.Any]:
    """A writable NumPy uint8 array of `nbytes` bytes whose first byte's address is a multiple of
    `alignment`; uninitialized (like `np.empty`) unless `zero`.

    For a collection: `aligned_numpy(Nodes.byte_size(n), Nodes.ALIGNMENT)`, filled, then
    `Nodes.wrap(array, n)`.
    """
    import numpy as np

    size = element_count(nbytes, "nbytes")
    align = _alignment(alignment)
    raw = (np.zeros if zero else np.empty)(size + align, dtype=np.uint8)
    shift = -int(raw.ctypes.data) % align
    return raw[shift:][:size]  # not raw[shift:shift], which NumPy starts at raw's address


def aligned_tensor(
    nbytes: int,
    alignment: int = 128,
    *,
    device: DeviceLike = "cpu",
    pin_memory: bool = False,
    zero: bool = False,
) -> torch.Tensor:
    """A torch uint8 tensor of `nbytes` bytes on `device` whose first byte is aligned to
    `alignment`; uninitialized (like `torch.empty`) unless `zero`. `pin_memory=True` gives
    page-locked host memory (device must be 'cpu'). This is the memory `Collection.allocate`
    makes: `aligned_tensor(Nodes.byte_size(n), Nodes.ALIGNMENT)` can be wrapped as n Nodes.
    """
    from soagen.runtime import buffers

    size = element_count(nbytes, "nbytes")
    align = _alignment(alignment)
    return buffers.allocate(size, align, buffers.as_device(device), pin_memory, zero)
