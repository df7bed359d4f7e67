"""The compiled index range checks of a planned call (`IndexCheckedCall` in
`soagen/runtime/_compiled.c`): each index view it reads is checked against [0, bound) before the
call; a view it does not read, or finds a value outside in, goes to the plan's Python check, which
raises IndexRangeError naming the values."""

from __future__ import annotations

import gc
import typing
import weakref

import pytest
import torch

from soagen.runtime import buffers
from tests.runtime.test_adversarial_runtime import INTEGER_DTYPES

if typing.TYPE_CHECKING:
    from soagen.runtime._compiled import IndexCheckedCall

pytestmark = pytest.mark.skipif(
    buffers._IndexCheckedCall is None,
    reason="soagen.runtime._compiled was not built by this install",
)
INDEX_CHECKED_CALL = typing.cast("type[IndexCheckedCall]", buffers._IndexCheckedCall)


class Recorder:
    """The call and the Python check of an IndexCheckedCall, noting theirs; the check raises for
    the numbers in `refused`."""

    def __init__(self, refused: tuple[int, ...] = ()) -> None:
        self.refused = refused
        self.events: list[tuple[str, int]] = []

    def call(self) -> str:
        self.events.append(("call", -1))
        return "ran"

    def check(self, number: int) -> None:
        self.events.append(("check", number))
        if number in self.refused:
            raise LookupError(f"index view {number} refused")


def _checked(views: list[tuple[torch.Tensor, int]], recorder: Recorder, most: int = 1 << 13):
    return INDEX_CHECKED_CALL(tuple(views), recorder.call, recorder.check, most)


def _index_block(values: list[list[int]], dtype: torch.dtype) -> torch.Tensor:
    """An [c, n] index block with rows 7 values apart, as a collection's padded columns are."""
    rows, n = len(values), len(values[0])
    storage = torch.zeros(rows * (n + 7), dtype=dtype)
    block = storage.as_strided((rows, n), (n + 7, 1))
    block.copy_(torch.tensor(values, dtype=dtype))
    return block


@pytest.mark.parametrize("dtype", INTEGER_DTYPES)
def test_indices_in_range_make_the_call_without_the_python_check(dtype: torch.dtype) -> None:
    recorder = Recorder()
    block = _index_block([[0, 9, 3], [4, 5, 9]], dtype)
    assert _checked([(block, 10), (block[1], 10)], recorder)() == "ran"
    assert recorder.events == [("call", -1)]


@pytest.mark.parametrize(
    ("values", "dtype", "bound"),
    [
        ([[0, 10, 3]], torch.int64, 10),  # one past the last
        ([[0, -1, 3]], torch.int32, 10),  # negative
        ([[0, 2**63 + 5, 3]], torch.uint64, 10),  # above any int64
        ([[200, 2, 3]], torch.uint8, 100),
    ],
    ids=["past", "negative", "uint64", "uint8"],
)
def test_an_index_outside_goes_to_the_python_check_and_nothing_is_called(
    values: list[list[int]], dtype: torch.dtype, bound: int
) -> None:
    inside = _index_block([[0, 1]], torch.int64)
    recorder = Recorder(refused=(1,))
    block = _index_block(values, dtype)
    with pytest.raises(LookupError, match="index view 1 refused"):
        _checked([(inside, 5), (block, bound)], recorder)()
    assert recorder.events == [("check", 1)]


def test_an_index_outside_that_the_python_check_passes_is_refused_loudly() -> None:
    recorder = Recorder()  # a check that lets everything through
    with pytest.raises(RuntimeError, match="passed the Python check"):
        _checked([(_index_block([[3, 12]], torch.int64), 10)], recorder)()
    assert recorder.events == [("check", 0)]


def test_views_it_does_not_read_go_to_the_python_check_every_call() -> None:
    large = torch.zeros(2, 64, dtype=torch.int64)
    for view, most, why in (
        (large, 128, "as many values as `most`"),
        (torch.zeros(3, dtype=torch.float32), 1 << 13, "not an integer dtype"),
        (torch.zeros(0, dtype=torch.int64), 1 << 13, "empty"),
        (torch.zeros(3, dtype=torch.int64)._neg_view(), 1 << 13, "a neg bit"),
        (torch.zeros(2, 2, 2, dtype=torch.int64), 1 << 13, "three axes"),
    ):
        recorder = Recorder()
        call = _checked([(view, 10)], recorder, most=most)
        assert call() == "ran" and call() == "ran"
        assert recorder.events == [("check", 0), ("call", -1)] * 2, why


def test_under_a_torch_function_mode_every_view_goes_to_the_python_check() -> None:
    """The mode answers the reads: here it aims `data_ptr` at values in range while the view
    holds one outside. Nothing is read by its answers; the Python check takes the view."""
    decoy = _index_block([[1, 2]], torch.int64)
    view = _index_block([[1, 99]], torch.int64)

    class Aiming(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if getattr(func, "__name__", "") == "data_ptr":
                return decoy.data_ptr()
            return func(*args, **(kwargs or {}))

    recorder = Recorder(refused=(0,))
    with Aiming(), pytest.raises(LookupError, match="index view 0 refused"):
        _checked([(view, 10)], recorder)()
    assert recorder.events == [("check", 0)]


def test_an_index_checked_call_takes_only_what_it_can_check() -> None:
    recorder = Recorder()
    view = torch.zeros(3, dtype=torch.int64)
    for checks in (((view, 1.5),), ((view,),), [(view, 3)], (view,)):
        with pytest.raises((ValueError, TypeError)):
            INDEX_CHECKED_CALL(checks, recorder.call, recorder.check, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="callables"):
        INDEX_CHECKED_CALL(((view, 3),), None, recorder.check, 10)
    for bound in (-1, 2**63, 2**70):  # as long long, -1 would let every uint64 value through
        with pytest.raises(ValueError, match="from 0 to 2"):
            INDEX_CHECKED_CALL(((view, bound),), recorder.call, recorder.check, 10)
    call = INDEX_CHECKED_CALL(((view, 3),), recorder.call, recorder.check, 10)
    with pytest.raises(TypeError, match="no argument"):
        call(1)  # type: ignore[call-arg]


def test_an_index_checked_call_in_a_reference_cycle_is_collected() -> None:
    class Holder:
        call: object = None

        def run(self) -> None:
            pass

        def check(self, number: int) -> None:
            pass

    holder = Holder()
    holder.call = INDEX_CHECKED_CALL(
        ((torch.zeros(2, dtype=torch.int64), 3),), holder.run, holder.check, 10
    )
    gone = weakref.ref(holder)
    del holder
    gc.collect()
    assert gone() is None
