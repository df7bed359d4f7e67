"""The compiled model run of call plans (`ModelRun` in `soagen/runtime/_compiled.c`): a call that goes
as it should is run, checked and written without Python frames; any other goes, with what was
read, to the Python function that checks it (`finish`), as it would without the compiled run."""

from __future__ import annotations

import gc
import typing
import weakref
from collections.abc import Sequence

import pytest
import torch

from soagen.runtime import buffers
from soagen.runtime.model import _SIGNATURE

if typing.TYPE_CHECKING:
    from soagen.runtime._compiled import ModelRun

pytestmark = pytest.mark.skipif(
    buffers._ModelRun is None, reason="soagen.runtime._compiled was not built by this install"
)
MODEL_RUN = typing.cast("type[ModelRun]", buffers._ModelRun)


class Recorder:
    """The runner, writers, guard and `finish` of a ModelRun, each noting its calls."""

    def __init__(self, results: object, *, move_version_of: int | None = None) -> None:
        self.results = results
        self.move_version_of = move_version_of
        self.events: list[tuple[object, ...]] = []

    def runner(self, views: list[torch.Tensor]) -> object:
        self.events.append(("run", views))
        if self.move_version_of is not None:
            views[self.move_version_of].add_(0)  # a write, as a model that wrote its input
        return self.results

    def writer(self, position: int) -> typing.Callable[[torch.Tensor], None]:
        def write(result: torch.Tensor) -> None:
            self.events.append(("write", position, result))

        return write

    def finish(
        self, views: Sequence[torch.Tensor], versions: list[int] | None, result: object
    ) -> list[str]:
        self.events.append(("finish", views, versions, result))
        return ["finished"]

    def guard(self, mode: bool) -> Guard:
        return Guard(self, mode)


class Failing(Recorder):
    """A recorder whose runner raises, as a model that fails."""

    def runner(self, views: list[torch.Tensor]) -> object:
        raise KeyError("model")


class Guard:
    def __init__(self, recorder: Recorder, mode: bool) -> None:
        self.recorder, self.mode = recorder, mode

    def __enter__(self) -> None:
        self.recorder.events.append(("enter", self.mode))

    def __exit__(self, *exception: object) -> None:
        self.recorder.events.append(("exit", *exception))


def _run(
    recorder: Recorder,
    blocks: Sequence[torch.Tensor],
    *,
    guarded: bool = True,
    watched: bool = True,
) -> ModelRun:
    return MODEL_RUN(
        recorder.runner,
        recorder.guard if guarded else None,
        _SIGNATURE,
        tuple(_SIGNATURE(block) for block in blocks),
        tuple(recorder.writer(position) for position in range(len(blocks))),
        recorder.finish,
        watched,
    )


def _views(count: int = 2) -> list[torch.Tensor]:
    buffer = torch.zeros(4 * count)
    return [buffer[4 * i : 4 * i + 4].view(2, 2) for i in range(count)]


def test_a_call_that_goes_as_it_should_runs_in_the_guard_and_writes_each_result() -> None:
    first, second = torch.ones(3, 2), torch.ones(3)
    for results, written in (
        (first, [first]),
        ((first, second), [first, second]),
        ([first, second], [first, second]),
    ):
        recorder = Recorder(results)
        run = _run(recorder, written)
        views = _views()
        assert run(views) == written
        assert recorder.events[0] == ("enter", True)
        assert recorder.events[1] == ("run", views)
        assert recorder.events[1][1] is views  # the plan's own list
        assert recorder.events[2] == ("exit", None, None, None)
        assert [event[:2] for event in recorder.events[3:]] == [
            ("write", position) for position in range(len(written))
        ]
        assert all(
            event[2] is result for event, result in zip(recorder.events[3:], written, strict=True)
        )


def test_without_a_guard_the_runner_runs_alone() -> None:
    result = torch.ones(3, 2)
    recorder = Recorder(result)
    _run(recorder, [result], guarded=False, watched=False)(_views())
    assert [event[0] for event in recorder.events] == ["run", "write"]


@pytest.mark.parametrize(
    "results",
    [
        torch.ones(4, 2),  # another shape
        torch.ones(3, 2, dtype=torch.float64),  # another dtype
        torch.ones(3, 2).as_subclass(torch.nn.Parameter),  # a subclass
        {"scores": torch.ones(3, 2)},  # a mapping: `finish` puts it in schema order
        (torch.ones(3, 2), torch.ones(3, 2)),  # more results than outputs
        [7],  # not a tensor
        None,
    ],
    ids=["shape", "dtype", "subclass", "dict", "count", "int", "None"],
)
def test_any_other_result_goes_to_finish_unwritten(results: object) -> None:
    recorder = Recorder(results)
    views = _views()
    assert _run(recorder, [torch.ones(3, 2)])(views) == ["finished"]
    assert [event[0] for event in recorder.events] == ["enter", "run", "exit", "finish"]
    _, seen_views, versions, result = recorder.events[-1]
    assert seen_views is views and result is results
    assert versions == [view._version for view in views]


@pytest.mark.parametrize("count", [2, 17, 40], ids=["2 views", "17 views", "40 views"])
def test_a_moved_version_counter_goes_to_finish_with_the_counters_before(count: int) -> None:
    result = torch.ones(3, 2)
    views = [torch.zeros(2) for _ in range(count)]
    before = [view._version for view in views]
    recorder = Recorder(result, move_version_of=count - 1)
    assert _run(recorder, [result])(views) == ["finished"]
    assert recorder.events[-1] == ("finish", views, before, result)
    assert views[-1]._version == before[-1] + 1
    # Unwatched (a backend that moves no counters), the same call writes.
    recorder = Recorder(result, move_version_of=count - 1)
    assert _run(recorder, [result], watched=False)(views) == [result]
    assert recorder.events[-1][0] == "write"


def test_the_runners_error_passes_through_the_guard() -> None:
    recorder = Failing(None)
    with pytest.raises(KeyError, match="model") as raised:
        _run(recorder, [torch.ones(1)])(_views())
    kind, value, traceback = recorder.events[-1][1:]
    assert kind is KeyError and value is raised.value and traceback is not None
    assert recorder.events[0] == ("enter", True) and len(recorder.events) == 2


def test_inference_mode_is_on_inside_the_run_and_off_after_it_even_after_an_error() -> None:
    seen: list[bool] = []
    result = torch.ones(2)

    def runner(views: list[torch.Tensor]) -> torch.Tensor:
        seen.append(torch.is_inference_mode_enabled())
        if len(seen) == 2:
            raise RuntimeError("second call")
        return result

    run = MODEL_RUN(
        runner,
        torch._C._InferenceMode,
        _SIGNATURE,
        (_SIGNATURE(result),),
        (lambda source: None,),
        lambda *read: pytest.fail(f"finish called with {read}"),
        True,
    )
    run(_views())
    assert not torch.is_inference_mode_enabled()
    with pytest.raises(RuntimeError, match="second call"):
        run(_views())
    assert seen == [True, True] and not torch.is_inference_mode_enabled()


def test_a_writers_error_is_raised() -> None:
    result = torch.ones(2)

    def refuses(source: torch.Tensor) -> None:
        raise OSError("disk")

    run = MODEL_RUN(
        lambda views: result, None, _SIGNATURE, (_SIGNATURE(result),), (refuses,), print, False
    )
    with pytest.raises(OSError, match="disk"):
        run(_views())


def test_a_model_run_takes_only_what_it_can_run() -> None:
    model_run = MODEL_RUN
    signature = (_SIGNATURE(torch.ones(1)),)
    with pytest.raises(ValueError, match="one signature per writer"):
        model_run(print, None, _SIGNATURE, signature, (print, print), print, True)
    with pytest.raises(ValueError, match="callables"):
        model_run(print, 3, _SIGNATURE, signature, (print,), print, True)
    with pytest.raises(ValueError, match="callables"):
        model_run(print, None, _SIGNATURE, (), (), print, True)
    with pytest.raises(TypeError):
        model_run(print, None, _SIGNATURE, list(signature), (print,), print, True)
    run = model_run(lambda views: None, None, _SIGNATURE, signature, (print,), print, True)
    with pytest.raises(TypeError, match="list of input views"):
        run((torch.ones(1),))
    with pytest.raises(TypeError, match="list of input views"):
        run([], views=[])


def test_a_model_run_in_a_reference_cycle_is_collected() -> None:
    result = torch.ones(1)

    class Holder:
        run: object = None

        def runner(self, views: list[torch.Tensor]) -> object:
            return result

    holder = Holder()
    holder.run = MODEL_RUN(
        holder.runner, None, _SIGNATURE, (_SIGNATURE(result),), (print,), print, True
    )
    gone = weakref.ref(holder)
    del holder
    gc.collect()
    assert gone() is None


def test_a_result_list_changed_while_it_is_checked_is_written_as_the_runner_returned_it() -> None:
    """The signature read may run Python code (a torch function mode) that changes the list the
    runner returned: the results checked and written are those it returned, as `finish` takes
    them (`outputs_in_schema_order` copies the list)."""
    first, second = torch.ones(3), torch.full((3,), 2.0)
    returned = [first, second]
    recorder = Recorder(returned)

    def signature(tensor: torch.Tensor) -> object:
        returned.clear()  # frees the list's storage
        returned.extend([torch.zeros(5)] * 8)
        return _SIGNATURE(tensor)

    run = MODEL_RUN(
        recorder.runner,
        None,
        signature,
        (_SIGNATURE(first), _SIGNATURE(second)),
        (recorder.writer(0), recorder.writer(1)),
        recorder.finish,
        False,
    )
    assert run(_views()) == [first, second]
    assert [event[2] for event in recorder.events[1:]] == [first, second]


def test_a_runner_that_changes_the_list_of_views_goes_to_finish() -> None:
    result = torch.ones(3)
    for change in ("replace", "clear"):
        recorder = Recorder(result)
        views = _views()
        before = [view._version for view in views]

        def runner(given: list[torch.Tensor], change: str = change) -> object:
            if change == "replace":
                given[0] = torch.zeros(2, 2).add_(1)  # another tensor, another counter
            else:
                given.clear()
            return result

        recorder.runner = runner  # type: ignore[method-assign]
        run = _run(recorder, [result])
        assert run(views) == ["finished"]
        assert recorder.events[-1] == ("finish", views, before, result)


def test_a_guard_that_swallows_the_runners_error_leaves_finish_no_result() -> None:
    class Swallows(Guard):
        def __exit__(self, *exception: object) -> bool:
            super().__exit__(*exception)
            return True

    recorder = Failing(torch.ones(1))
    recorder.guard = lambda mode: Swallows(recorder, mode)  # type: ignore[method-assign]
    views = _views()
    assert _run(recorder, [torch.ones(1)])(views) == ["finished"]
    assert recorder.events[-1] == ("finish", views, [0, 0], None)  # as after a `with` statement


def test_an_error_of_the_guard_has_the_runners_error_as_its_context() -> None:
    class ExitFailing(Guard):
        def __exit__(self, *exception: object) -> None:
            raise ValueError("guard")

    recorder = Failing(None)
    recorder.guard = lambda mode: ExitFailing(recorder, mode)  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="guard") as raised:
        _run(recorder, [torch.ones(1)])(_views())
    assert isinstance(raised.value.__context__, KeyError)


def _written_run(result: object, block: torch.Tensor, recorder: Recorder) -> ModelRun:
    """A run whose single output is written by the block's compiled writer, which checks the
    result's signature itself (the run reads it once)."""
    writer = buffers._BlockWriter(block)  # type: ignore[misc]
    return MODEL_RUN(
        lambda views: result,
        None,
        _SIGNATURE,
        (_SIGNATURE(block),),
        (writer,),
        recorder.finish,
        False,
    )


def _output_block() -> tuple[torch.Tensor, torch.Tensor]:
    """(storage, block): a [3, 2] block of two columns 5 apart, bytes around them."""
    storage = torch.full((12,), -1.0)
    return storage, storage[1:].as_strided((3, 2), (1, 5))


def test_a_single_block_writer_checks_and_writes_a_fitting_result_without_finish() -> None:
    for result in (
        torch.arange(6.0).view(3, 2),
        torch.arange(6.0).view(2, 3).t(),
        torch.arange(6.0).view(2, 3).t().clone().conj_physical()._neg_view(),  # copy_'s
    ):
        storage, block = _output_block()
        expected = storage.clone()
        expected[1:].as_strided((3, 2), (1, 5)).copy_(result)
        recorder = Recorder(None)
        version = storage._version
        assert _written_run(result, block, recorder)(_views()) == [result]
        assert recorder.events == []  # no finish
        assert torch.equal(storage, expected) and storage._version > version


@pytest.mark.parametrize(
    "result",
    [
        torch.ones(4, 2),
        torch.ones(3, 2, dtype=torch.float64),
        torch.ones(3, 2, device="meta"),
        torch.ones(3, 2).as_subclass(torch.nn.Parameter),
    ],
    ids=["shape", "dtype", "device", "subclass"],
)
def test_a_single_block_writer_leaves_a_result_that_does_not_fit_to_finish(result: object) -> None:
    storage, block = _output_block()
    before = storage.clone()
    recorder = Recorder(None)
    views = _views()
    assert _written_run(result, block, recorder)(views) == ["finished"]
    assert recorder.events == [("finish", views, None, result)]
    assert torch.equal(storage, before)  # nothing written before finish says what is wrong


def test_under_a_torch_function_mode_a_single_block_writer_leaves_the_result_to_finish() -> None:
    """Under a mode, a tensor's metadata is the mode's answer: the run reads none of it and
    `finish` checks and writes the result through Python (the mode's answers there are torch's
    business)."""

    class Lying(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if getattr(func, "__name__", "") == "stride":
                return (1, 1)
            return func(*args, **(kwargs or {}))

    storage, block = _output_block()
    before = storage.clone()
    result = torch.arange(6.0).view(3, 2)
    recorder = Recorder(None)
    run = _written_run(result, block, recorder)
    with Lying():
        assert run(_views()) == ["finished"]
    assert [event[0] for event in recorder.events] == ["finish"]
    assert torch.equal(storage, before)


def test_the_guards_exit_sees_the_runners_error_as_the_one_being_handled() -> None:
    import sys

    seen: list[object] = []

    class Watching(Guard):
        def __exit__(self, *exception: object) -> None:
            seen.append(sys.exc_info()[1])
            try:
                raise OSError("its own")
            except OSError:
                raise ValueError("guard") from None

    recorder = Failing(None)
    recorder.guard = lambda mode: Watching(recorder, mode)  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="guard") as raised:
        _run(recorder, [torch.ones(1)])(_views())
    own = raised.value.__context__
    assert isinstance(seen[0], KeyError) and own is not None and own.__context__ is seen[0]
    assert sys.exc_info() == (None, None, None)
