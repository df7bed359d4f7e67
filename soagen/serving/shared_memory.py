"""Shared-memory regions for remote model calls, and the pool that reuses them across calls.

- `Region`: a system shared-memory region (POSIX `shm_open`, through `multiprocessing`), and
  `CudaRegion`: device memory of its own on one GPU (through tritonclient's CUDA utilities, which
  `cuda_shared_memory` loads where it can). Each is registered under its name with each Triton
  server it is sent to; a block is copied into it once, in wire order (`write`), and the server's
  outputs are read back as views of it (`read`).
- `RegionPool`: the regions of one remote binding, one per call in flight, grown in whole MiB when
  a call needs more; `destroy_pool` removes them all.
- `copy_into`, `block_nbytes`, `Source` and `ALIGN`: the copy into a region, a block's size in
  bytes, what a block in wire order is, and where each tensor starts in a region.

`soagen.serving.client` decides when a call uses a region and registers it with a server; this
module talks to no server of its own accord (`register` and `unregister` take the client).
Importing it imports neither torch nor NumPy.
"""

from __future__ import annotations

import itertools
import os
import threading
import typing
import uuid

from soagen.dsl.layout import round_up
from soagen.runtime.geometry import ITEMSIZE
from soagen.serving.wire import WireTensor

if typing.TYPE_CHECKING:
    from multiprocessing.shared_memory import SharedMemory

    import torch
    from numpy.typing import NDArray

ALIGN = 64  # bytes: where each tensor starts in a shared-memory region
_REGION_GRANULE = 1 << 20  # regions grow in whole MiB, so slowly growing events reuse them
_region_numbers = itertools.count()

# A block in wire order: a NumPy view of host memory, or a torch view of device memory.
Source: typing.TypeAlias = "NDArray[typing.Any] | torch.Tensor"


class Region:
    """One system shared-memory region, registered with each server under `name`."""

    device: torch.device | None = None  # where the region's memory is: None for host memory

    def __init__(self, prefix: str, size: int) -> None:
        from multiprocessing.shared_memory import SharedMemory

        number = next(_region_numbers)
        self.name = f"{prefix}_{number}"
        self.size = size
        self.memory: SharedMemory = SharedMemory(name=self.name, create=True, size=size)
        self.key = f"/{self.memory.name.lstrip('/')}"
        # The servers it is registered with (their slot in the binding) and each server's
        # generation then (`soagen.serving.balancing.Server.generation`).
        self.registered: dict[int, int] = {}

    def register(self, client: typing.Any, headers: typing.Any, timeout: float) -> None:
        client.register_system_shared_memory(
            self.name, self.key, self.size, headers=headers, client_timeout=timeout
        )

    def unregister(self, client: typing.Any, headers: typing.Any, timeout: float) -> None:
        client.unregister_system_shared_memory(self.name, headers=headers, client_timeout=timeout)

    def write(self, offset: int, source: Source, wire: WireTensor) -> None:
        """The one copy of a block: into the region, in wire order."""
        copy_into(self.memory, offset, source, wire)

    def settle(self) -> None:
        """Wait for the copies queued into or out of the region (host copies are done when they
        return)."""

    def read(self, offset: int, shape: tuple[int, ...], wire: WireTensor) -> torch.Tensor:
        """A tensor in wire order over the bytes the server wrote at `offset`."""
        import numpy as np

        from soagen.runtime.buffers import tensor_of

        array: NDArray[typing.Any] = np.ndarray(
            shape, dtype=np.dtype(wire.numpy_dtype), buffer=self.memory.buf, offset=offset
        )
        return tensor_of(array, wire.dtype)

    def destroy(self) -> None:
        try:
            self.memory.close()
        except BufferError:
            pass  # a NumPy view still holds it: the mapping goes when that view does
        try:
            self.memory.unlink()
        except FileNotFoundError:
            pass


class CudaRegion(Region):
    """One CUDA shared-memory region: device memory of its own (`cudaMalloc`, through
    tritonclient's CUDA utilities), which the server maps from its IPC handle. A block is copied
    into it on the GPU, and the server writes the outputs there: nothing goes through host memory
    on the client's side."""

    def __init__(self, prefix: str, size: int, device: torch.device) -> None:
        number = next(_region_numbers)
        self.name = f"{prefix}_cuda_{number}"
        self.size = size
        self.device = device
        self.registered: dict[int, int] = {}
        self.utilities = cuda_shared_memory()
        assert self.utilities is not None, "only made where tritonclient's CUDA utilities load"
        self.index = device.index if device.index is not None else 0
        self.handle: typing.Any = self.utilities.create_shared_memory_region(
            self.name, size, self.index
        )

    def register(self, client: typing.Any, headers: typing.Any, timeout: float) -> None:
        client.register_cuda_shared_memory(
            self.name,
            self.utilities.get_raw_handle(self.handle),
            self.index,
            self.size,
            headers=headers,
            client_timeout=timeout,
        )

    def unregister(self, client: typing.Any, headers: typing.Any, timeout: float) -> None:
        client.unregister_cuda_shared_memory(self.name, headers=headers, client_timeout=timeout)

    def write(self, offset: int, source: Source, wire: WireTensor) -> None:
        import torch

        from soagen.runtime.buffers import tensor_of

        shape = tuple(int(size) for size in source.shape)
        block = source if isinstance(source, torch.Tensor) else tensor_of(source, wire.dtype)
        # Queued on the caller's current stream, after the work that made the block.
        self.read(offset, shape, wire).copy_(block)

    def settle(self) -> None:
        # Queued on the caller's current stream; the server reads and writes the region on its own
        # streams, and the pool hands it to the next call.
        import torch

        torch.cuda.current_stream(self.device).synchronize()

    def read(self, offset: int, shape: tuple[int, ...], wire: WireTensor) -> torch.Tensor:
        import torch

        from soagen.runtime.buffers import typed_view

        nbytes = block_nbytes(shape, wire)
        span = torch.as_tensor(
            _DeviceBytes(int(self.handle._base_addr) + offset, nbytes), device=self.device
        )
        return typed_view(span, wire.dtype).view(shape)

    def destroy(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            self.utilities.destroy_shared_memory_region(handle)  # cudaFree when `handle` goes


class _DeviceBytes:
    """`nbytes` bytes of device memory at `pointer`, for `torch.as_tensor` (no copy)."""

    def __init__(self, pointer: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (pointer, False),
            "strides": None,  # C-contiguous
            "version": 2,
        }


def cuda_shared_memory() -> typing.Any:
    """tritonclient's CUDA shared-memory utilities, or None where they cannot load (they need
    `cuda-python`: `pip install 'tritonclient[cuda]'`)."""
    try:
        import tritonclient.utils.cuda_shared_memory as utilities
    except (ImportError, RuntimeError):
        return None
    return utilities


class RegionPool:
    """Regions free for the next call; a call holds one region for its inputs and outputs."""

    def __init__(self) -> None:
        self.prefix = f"soagen_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self.free: list[Region] = []
        self.all: list[Region] = []
        # GPU regions no call uses that a server may still write into (`keep_until_destroyed`).
        self.unfreed: list[Region] = []
        self.lock = threading.Lock()

    def take(self, size: int, device: torch.device | None) -> tuple[Region, Region | None]:
        """A region of at least `size` bytes in host memory (`device` None) or on a GPU, and a
        free region there too small that it replaces."""
        with self.lock:
            there = [region for region in self.free if region.device == device]
            fitting = [region for region in there if region.size >= size]
            if fitting:
                region = min(fitting, key=lambda r: r.size)
                self.free.remove(region)
                return region, None
            grown = round_up(size, _REGION_GRANULE)
            region = (
                Region(self.prefix, grown)
                if device is None
                else CudaRegion(self.prefix, grown, device)
            )
            self.all.append(region)
            replaced = there[-1] if there else None
            if replaced is not None:
                self.free.remove(replaced)
                self.all.remove(replaced)
            return region, replaced

    def give_back(self, region: Region) -> None:
        with self.lock:
            if region in self.all:
                self.free.append(region)

    def drop(self, region: Region) -> None:
        """Forget a region taken from the pool (its owner destroys it)."""
        with self.lock:
            if region in self.all:
                self.all.remove(region)

    def keep_until_destroyed(self, region: Region) -> None:
        """Free `region` only with the pool: a server may still write into its GPU memory through
        its IPC mapping, and memory freed now could be this process's again by then."""
        with self.lock:
            self.unfreed.append(region)

    def drop_free_on_gpus(self) -> list[Region]:
        """Forget the free CUDA regions and return them (the caller destroys them)."""
        with self.lock:
            dropped = [region for region in self.free if region.device is not None]
            self.free = [region for region in self.free if region.device is None]
            self.all = [region for region in self.all if region not in dropped]
            return dropped


def destroy_pool(pool: RegionPool) -> None:
    with pool.lock:
        regions, pool.all, pool.free, pool.unfreed = [*pool.all, *pool.unfreed], [], [], []
    for region in regions:
        region.destroy()


def block_nbytes(shape: typing.Iterable[int], wire: WireTensor) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count * ITEMSIZE[wire.dtype]


def copy_into(memory: SharedMemory, offset: int, source: Source, wire: WireTensor) -> None:
    """The one copy of a block: into the shared-memory region, in wire order."""
    import numpy as np

    shape = tuple(int(size) for size in source.shape)
    target: NDArray[typing.Any] = np.ndarray(
        shape, dtype=np.dtype(wire.numpy_dtype), buffer=memory.buf, offset=offset
    )
    if isinstance(source, np.ndarray):
        np.copyto(target, source, casting="no")
        return
    from soagen.runtime.buffers import tensor_of

    tensor_of(target, wire.dtype).copy_(source)
