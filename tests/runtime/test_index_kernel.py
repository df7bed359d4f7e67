"""The index range check as one GPU kernel (`soagen.runtime.index_kernel`).

On CPU, a double that does what the kernel's contract says (read [rows, columns] from the view's
first element with the strides it is given) checks the geometry soagen hands the kernel for every
kind of view, and stand-ins for Triton's dispatch and compiled kernel check which launches go
past the dispatch; the Triton kernel itself runs on a GPU: exact at every edge of every dtype
(direct launches among them), a bad index stops the stream with a device-side assert, and the
check is that kernel alone.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
import typing

import pytest

torch = pytest.importorskip("torch")

from soagen.runtime import index_kernel  # noqa: E402
from soagen.runtime.index_kernel import indices_inside, queue_index_check  # noqa: E402
from tests.helpers import (  # noqa: E402
    INDEX_DTYPE_NAMES,
    INDEX_EDGE_BOUNDS,
    REPO,
    index_edge_values,
)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


class StridedKernel:
    """The kernel's contract in torch: the values at the given shape and element strides from the
    view's first element, compared with [0, bound); an assert raises at once."""

    def __init__(self) -> None:
        self.launches: list[tuple[tuple[int, int], tuple[int, int], bool]] = []

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
        self.launches.append((shape, strides, assert_inside))
        values = torch.as_strided(indices, shape, strides).to(torch.int64)
        found = (values >= 0) & (values < bound)
        if assert_inside:
            if not bool(found.all()):
                raise RuntimeError(message)
        else:
            inside.copy_(found)


def views_of_a_padded_buffer() -> dict[str, torch.Tensor]:
    """Index views as collections hand them over: columns of a padded buffer at an offset, a
    block of two columns with the buffer's pitch, and the odd ones (transposed, strided, a
    scalar)."""
    buffer = torch.randint(-3, 13, (4 * 80,), generator=torch.Generator().manual_seed(3))
    block = buffer[16:].as_strided((2, 50), (80, 1))  # two columns of 50, padded to 80
    return {
        "column": block[1],
        "block": block,
        "transposed block": block.t(),
        "every third": buffer[5::3],
        "tall": buffer[:60].view(20, 3),
        "scalar": buffer[7],
        "one row": block[:1],
    }


@pytest.mark.parametrize("name", list(views_of_a_padded_buffer()))
def test_the_kernel_sees_each_index_of_any_view_at_its_place(name: str) -> None:
    # indices_inside places what the kernel wrote for each value where that value is, so any wrong
    # stride, offset or transposition would move a True/False away from its value.
    view = views_of_a_padded_buffer()[name]
    kernel = StridedKernel()
    inside = indices_inside(view, 10, kernel)
    assert inside.shape == view.shape
    assert torch.equal(inside, (view >= 0) & (view < 10))
    assert len(kernel.launches) == 1
    (rows, columns), _, assert_inside = kernel.launches[0]
    assert rows <= columns and rows * columns == view.numel() and not assert_inside


def test_the_check_launches_the_kernel_where_it_can_and_reports_where_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel = StridedKernel()
    monkeypatch.setattr(index_kernel, "triton_index_kernel", lambda: kernel)
    block = views_of_a_padded_buffer()["block"].clamp_(0, 9)
    assert queue_index_check(block, 10, "edge_index outside") is True
    assert kernel.launches[-1] == ((2, 50), (80, 1), True)
    block[1, 7] = 10
    with pytest.raises(RuntimeError, match="edge_index outside"):
        queue_index_check(block, 10, "edge_index outside")
    # Past two dimensions, or past the grid's rows both ways (an expanded view holds no memory):
    # not launched, left to torch's ops.
    launched = len(kernel.launches)
    assert queue_index_check(torch.zeros(2, 3, 4, dtype=torch.int64), 10, "m") is False
    huge = torch.zeros(1, dtype=torch.int64).expand(70_000, 70_000)
    assert queue_index_check(huge, 10, "m") is False
    assert len(kernel.launches) == launched
    monkeypatch.setattr(index_kernel, "triton_index_kernel", lambda: None)  # no Triton
    assert queue_index_check(block, 10, "m") is False


def test_a_kernel_that_cannot_be_built_leaves_the_check_to_torch_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unbuildable(*args: object, **kw: object) -> None:
        raise RuntimeError("Failed to find C compiler")

    state = index_kernel._KernelState()
    monkeypatch.setattr(index_kernel, "_STATE", state)
    monkeypatch.setattr(index_kernel, "triton_index_kernel", lambda: unbuildable)
    indices = torch.zeros(2, 5, dtype=torch.int64)
    with pytest.warns(RuntimeWarning, match="could not be built .*C compiler.*torch's ops"):
        assert queue_index_check(indices, 10, "m") is False
    assert queue_index_check(indices, 10, "m") is False  # not tried again
    # Once the kernel has run, a failure is the call's own: it is raised.
    monkeypatch.setattr(index_kernel, "_STATE", index_kernel._KernelState())
    monkeypatch.setattr(index_kernel, "triton_index_kernel", lambda: StridedKernel())
    assert queue_index_check(indices, 10, "m") is True
    monkeypatch.setattr(index_kernel, "triton_index_kernel", lambda: unbuildable)
    with pytest.raises(RuntimeError, match="C compiler"):
        queue_index_check(indices, 10, "m")


class CompiledStandIn:
    """A kernel Triton's dispatch compiled: `run` records a direct launch, or fails as a Triton
    whose launcher takes other arguments would."""

    function = "cu function"
    packed_metadata = "packed metadata"

    def __init__(self, launches: list[tuple[object, ...]], fails: bool) -> None:
        self.launches = launches
        self.fails = fails

    def launch_metadata(self, grid: tuple[int, ...], stream: int, *args: object) -> object:
        return ("metadata", grid, stream)

    def run(self, *args: object) -> None:
        if self.fails:
            raise TypeError("function takes exactly 13 arguments (16 given)")
        self.launches.append(args)


class JitStandIn:
    """Triton's JIT function: `check[grid](...)` dispatches (recorded) and returns what it
    compiled for that kind of call."""

    def __init__(self, direct_fails: bool = False) -> None:
        self.dispatched: list[tuple[object, ...]] = []
        self.direct: list[tuple[object, ...]] = []
        self.direct_fails = direct_fails

    def __getitem__(self, grid: tuple[int, ...]) -> typing.Callable[..., CompiledStandIn]:
        def dispatch(*args: object, **constants: object) -> CompiledStandIn:
            self.dispatched.append((grid, *args, *constants.values()))
            return CompiledStandIn(self.direct, self.direct_fails)

        return dispatch


def triton_stand_in(version: str = "3.6.0") -> types.SimpleNamespace:
    active = types.SimpleNamespace(get_current_device=lambda: -1, get_current_stream=lambda d: 77)
    return types.SimpleNamespace(
        __version__=version,
        runtime=types.SimpleNamespace(driver=types.SimpleNamespace(active=active)),
        knobs=types.SimpleNamespace(
            runtime=types.SimpleNamespace(launch_enter_hook=None, launch_exit_hook="exit hook")
        ),
    )


def launch(
    kernel: index_kernel.IndexKernel, indices: torch.Tensor, bound: int, message: str = "m"
) -> None:
    geometry = index_kernel._rows_and_columns(indices)
    assert geometry is not None
    kernel(indices, *geometry, bound, indices, message=message, assert_inside=True)


def test_each_kind_of_call_is_dispatched_once_and_then_launched_directly() -> None:
    check = JitStandIn()
    kernel = index_kernel._TritonIndexKernel(triton_stand_in(), check)
    buffer = torch.zeros(4, 3_000, dtype=torch.int64)
    indices = buffer[:2]
    launch(kernel, indices, 100)  # compiled by the dispatch
    launch(kernel, indices, 5_000)  # another bound, the same kernel: launched directly
    assert len(check.dispatched) == 1 and kernel.direct_launches == 1
    # Launched as the dispatch launches: grid, stream, the kernel's handles, the metadata, the
    # hooks, then every argument, constants included, the last index for the bound.
    assert check.direct == [
        (
            3,
            2,
            1,
            77,
            "cu function",
            "packed metadata",
            ("metadata", (3, 2, 1), 77),
            None,
            "exit hook",
            indices,
            2,
            3_000,
            3_000,
            1,
            4_999,
            indices,
            "m",
            True,
            1_024,
        )
    ]
    # Whatever Triton compiles another kernel for is another kind, dispatched first: another
    # dtype, a pointer off 16 bytes, an integer past 32 bits, another message.
    others = [
        (indices.to(torch.int32), 100, "m"),
        (buffer[:2, 1:], 100, "m"),
        (indices, 2**40, "m"),
        (torch.zeros(1, dtype=torch.int8).expand(2, 2**31 + 5), 100, "m"),  # no memory
        (indices, 100, "another input"),
    ]
    for view, bound, message in others:
        launch(kernel, view, bound, message)
        launch(kernel, view, bound, message)
    assert len(check.dispatched) == 1 + len(others)
    assert kernel.direct_launches == 1 + len(others)


def test_a_triton_whose_kernels_launch_otherwise_is_dispatched_and_says_so() -> None:
    check = JitStandIn(direct_fails=True)
    kernel = index_kernel._TritonIndexKernel(triton_stand_in(), check)
    indices = torch.zeros(2, 10, dtype=torch.int64)
    launch(kernel, indices, 100)
    with pytest.warns(RuntimeWarning, match="could not be launched directly .*13 arguments"):
        launch(kernel, indices, 100)  # the direct launch fails: dispatched after all
    for _ in range(3):
        launch(kernel, indices, 100)
    assert len(check.dispatched) == 5 and kernel.direct_launches == 0
    # A Triton older than the launch this makes is never launched directly.
    old = JitStandIn()
    kernel = index_kernel._TritonIndexKernel(triton_stand_in("3.3.1"), old)
    for _ in range(3):
        launch(kernel, indices, 100)
    assert len(old.dispatched) == 3 and kernel.direct_unavailable == "not this Triton"


def test_the_device_message_names_the_input_and_not_the_bound() -> None:
    # The fused kernel is compiled once per message: a bound in it would compile one per event.
    from soagen.runtime.model import index_message

    class Binding:
        NAME = "EdgeClassifier"

    message = index_message(Binding, "edge_index", "nodes", None)  # type: ignore[arg-type]
    assert message == (
        "EdgeClassifier: input 'edge_index' holds indices outside [0, n), n the elements of "
        "'nodes'; the model was not run"
    )
    assert "[0, 30), the elements of 'nodes'" in index_message(Binding, "e", "nodes", 30)  # type: ignore[arg-type]


@cuda
@pytest.mark.parametrize("name", INDEX_DTYPE_NAMES)
def test_cuda_the_triton_kernel_is_exact_at_every_edge_of_every_dtype(name: str) -> None:
    kernel = index_kernel.triton_index_kernel()
    assert kernel is not None, "CUDA torch without Triton"
    dtype = getattr(torch, name)
    values, tensor = index_edge_values(dtype)
    # In a transposed [values, 2] view (rows and columns swapped, strided), each value twice.
    indices = tensor.cuda().repeat(2).view(2, -1).t()
    for bound in INDEX_EDGE_BOUNDS:
        expected = torch.tensor([0 <= v < bound for v in values]).repeat(2).view(2, -1).t()
        assert torch.equal(indices_inside(indices, bound, kernel).cpu(), expected), bound
    # Past each kind's first launch, which compiles, the kernel launches directly.
    assert kernel.direct_launches > 0 and not kernel.direct_unavailable  # type: ignore[attr-defined]


BAD_INDEX = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, sys.argv[1])
    from soagen.runtime.index_kernel import triton_index_kernel
    from soagen.runtime.model import _queue_index_check
    message = "Binding: input 'edge_index' holds indices outside [0, n)"
    indices = torch.arange(2 * 1000, device="cuda").view(2, 1000).remainder(30)
    indices = indices.to(getattr(torch, sys.argv[2]))
    # The first launch compiles; the one that meets the bad index is a direct launch.
    _queue_index_check(indices, 30, message)
    torch.cuda.synchronize()
    indices[1, 537] = int(sys.argv[3])
    _queue_index_check(indices, 30, message)
    print("direct launches", triton_index_kernel().direct_launches, flush=True)
    torch.cuda.synchronize()
    print("ran")
    """
)


@cuda
@pytest.mark.parametrize(("dtype", "bad"), [("int64", 30), ("int32", -1), ("uint8", 255)])
def test_cuda_a_bad_index_stops_the_stream(dtype: str, bad: int) -> None:
    # A device-side assert ends the CUDA context: each case runs in a process of its own.
    def run(value: int) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-c", BAD_INDEX, str(REPO), dtype, str(value)]
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    done = run(bad)
    assert done.returncode != 0 and "ran" not in done.stdout
    assert "holds indices outside [0, n)" in done.stderr or "device-side assert" in done.stderr
    good = run(29)
    assert good.returncode == 0 and "ran" in good.stdout, good.stderr
    assert "direct launches 1" in done.stdout and "direct launches 1" in good.stdout


@cuda
def test_cuda_the_check_is_the_one_kernel_and_no_torch_op(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    from soagen.runtime.model import _queue_index_check

    kernel = index_kernel.triton_index_kernel()
    assert kernel is not None, "CUDA torch without Triton"
    launches: list[tuple[int, int]] = []

    def counted(indices: torch.Tensor, shape: tuple[int, int], *args: object, **kw: object) -> None:
        launches.append(shape)
        kernel(indices, shape, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(index_kernel, "triton_index_kernel", lambda: counted)

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.names.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    for name in ("int64", "int32", "int16", "uint32"):
        indices = torch.zeros(2, 1_000, dtype=getattr(torch, name), device="cuda")
        with Ops() as ops:
            _queue_index_check(indices, 1_000, "out of range")
        assert ops.names == [], (name, ops.names)
    assert launches == [(2, 1_000)] * 4
    torch.cuda.synchronize()
