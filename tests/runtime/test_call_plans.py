"""Call plans: a repeated call with the same collections skips the checks that depend on them alone,
and still sees new values, checks index values, version counters and outputs every call."""

from __future__ import annotations

import gc
import io
import sys
import threading
import traceback
import typing
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

from soagen.runtime import buffers
from soagen.runtime.model import IndexRangeError, InputModifiedError, ModelBinding, OutputError
from tests.helpers import generate_package, import_generated
from tests.runtime.test_model import MLP_SCHEMA
from tests.runtime.test_model import Linear32 as Linear


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("plans")
    (root / "plans.soa").write_text(MLP_SCHEMA)
    generate_package(root / "plans.soa", root, "pkg_plans")
    return import_generated(root, "pkg_plans", "plans")


# The generated call's path as the install has it: compiled (`PlannedCall`) where it was built.
CALL_IN_SCHEMA_ORDER = ModelBinding.__dict__["_call_in_schema_order"]
PYTHON_CALL_IN_SCHEMA_ORDER = getattr(CALL_IN_SCHEMA_ORDER, "function", CALL_IN_SCHEMA_ORDER)


@pytest.fixture(autouse=True, params=["compiled run", "python run"])
def model_runs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test with the compiled plan lookup and model run of call plans
    (`soagen/runtime/_compiled.c`, where the install built it) and with the Python functions they
    stand in for."""
    if request.param == "compiled run" and buffers._ModelRun is None:
        pytest.skip("soagen.runtime._compiled was not built by this install")
    if request.param == "python run":
        monkeypatch.setattr(buffers, "_ModelRun", None)
        monkeypatch.setattr(buffers, "_IndexCheckedCall", None)
        monkeypatch.setattr(ModelBinding, "_call_in_schema_order", PYTHON_CALL_IN_SCHEMA_ORDER)
    return typing.cast(str, request.param)


class Gather(nn.Module):
    """Each point's score from its neighbour's coordinates."""

    def forward(self, points: torch.Tensor, neighbour: torch.Tensor) -> torch.Tensor:
        return points[neighbour][:, :2] * 2.0


def _points(module, n: int, seed: int = 0):  # type: ignore[no-untyped-def]
    points = module.Points.allocate(n)
    generator = torch.Generator().manual_seed(seed)
    points.block(module.Mlp.binding("points").block).copy_(torch.randn(n, 3, generator=generator))
    points.label.copy_(torch.arange(n).flip(0))
    return points


def _planned(module, model, n: int):  # type: ignore[no-untyped-def]
    """Collections of n points and scores, called with twice (the second call makes their plan),
    and that plan."""
    points, scores = _points(module, n), module.Scores.allocate(n)
    model(points, out=scores)
    model(points, out=scores)
    (plan,) = model._plans.values()
    return points, scores, plan


def _expected(net: nn.Module, points) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return net(torch.stack([points.x, points.y, points.z], dim=1))


def test_a_repeated_call_runs_its_plan_and_sees_new_values(module) -> None:  # type: ignore[no-untyped-def]
    net = Linear()
    model = module.Mlp(net)
    points, scores = _points(module, 50), module.Scores.allocate(50)
    model(points, out=scores)
    assert not model._plans  # made at the second call with these collections
    model(points, out=scores)
    (plan,) = model._plans.values()
    points.x.mul_(3.0)  # new values in the same buffer
    model(points, out=scores)
    (again,) = model._plans.values()
    assert again is plan and again.views[0].data_ptr() == points.x.data_ptr()
    torch.testing.assert_close(torch.stack([scores.a, scores.b], 1), _expected(net, points))


def test_an_eager_plan_runs_in_one_call_through_the_compiled_run_where_built(
    module, model_runs
) -> None:  # type: ignore[no-untyped-def]
    seen: list[bool] = []

    class Scaled(Linear):
        def forward(self, points: torch.Tensor) -> torch.Tensor:
            seen.append(torch.is_inference_mode_enabled())
            return super().forward(points)

    net = Scaled()
    model = module.Mlp(net)
    points, scores, plan = _planned(module, model, 50)
    assert plan.call is not None  # no index check, views made outside inference mode
    compiled = buffers._ModelRun is not None and isinstance(plan.model_call, buffers._ModelRun)
    assert compiled == (model_runs == "compiled run")
    points.y.add_(2.0)
    model(points, out=scores)
    assert seen == [True, True, True] and not torch.is_inference_mode_enabled()
    torch.testing.assert_close(torch.stack([scores.a, scores.b], 1), _expected(net, points))


def test_a_planned_call_makes_none_of_the_checks_its_plan_holds(module, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Names, layouts, devices, read-only outputs, sizes: `_run_checked` makes them, and a call
    # with a plan's collections goes past it, by the generated call and by `run` alike.
    checked: list[object] = []
    run_checked = ModelBinding._run_checked

    def counted(self, *arguments):  # type: ignore[no-untyped-def]
        checked.append(arguments[2])
        return run_checked(self, *arguments)

    monkeypatch.setattr(ModelBinding, "_run_checked", counted)
    net = Linear()
    model = module.Mlp(net)
    points, scores = _points(module, 50), module.Scores.allocate(50)
    for _ in range(2):
        model(points, out=scores)
    assert len(checked) == 2 and len(model._plans) == 1
    model(points, out=scores)
    model.run({"points": points}, {"scores": scores})
    assert len(checked) == 2
    other = module.Scores.allocate(50)  # another collection: checked, as a first call is
    model(points, out=other)
    assert len(checked) == 3 and checked[-1] == (points, other)
    for out in (scores, other):
        torch.testing.assert_close(torch.stack([out.a, out.b], 1), _expected(net, points))


def test_a_plan_leaves_with_its_collections_and_keeps_no_buffer_alive(module) -> None:  # type: ignore[no-untyped-def]
    model = module.Mlp(Linear())
    points, scores = _points(module, 20), module.Scores.allocate(20)
    model(points, out=scores)
    model(points, out=scores)
    assert model._plans
    collection = weakref.ref(points)
    del points
    gc.collect()
    assert collection() is None  # the plan held it weakly
    assert not model._plans  # and left with it, its views with it


def test_plans_are_bounded_and_every_call_stays_right(module) -> None:  # type: ignore[no-untyped-def]
    net = Linear()
    model = module.Mlp(net)
    events = [(_points(module, 10 + i, seed=i), module.Scores.allocate(10 + i)) for i in range(12)]
    for _ in range(2):
        for points, scores in events:
            scores.block(module.Mlp.binding("scores").block).zero_()
            model(points, out=scores)
            torch.testing.assert_close(torch.stack([scores.a, scores.b], 1), _expected(net, points))
    from soagen.runtime.model import _PLANS_PER_BINDING

    assert len(model._plans) <= _PLANS_PER_BINDING


def test_index_values_are_checked_on_every_planned_call(module, model_runs) -> None:  # type: ignore[no-untyped-def]
    model = module.Neighbours(Gather())
    points, scores = _points(module, 30), module.Scores.allocate(30)
    model(points, out=scores)
    model(points, out=scores)
    (plan,) = model._plans.values()
    # The compiled checks make the plan's call one call; without them `_run_plan` checks.
    assert (plan.call is not None) == (model_runs == "compiled run")
    before = scores.a.clone()
    points.label[7] = 30  # one past the last point
    with pytest.raises(IndexRangeError, match=r"outside \[0, 30\)"):
        model(points, out=scores)
    assert torch.equal(scores.a, before)  # nothing written


class OnCall(nn.Module):
    """Two columns of its points, and at its call number `number`, `change(points)` first."""

    def __init__(self, number: int, change: typing.Callable[[torch.Tensor], object]) -> None:
        super().__init__()
        self.number, self.change, self.calls = number, change, 0

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.number:
            self.change(points)
        return points[:, :2] * 1.0


def _transpose_twice(points: torch.Tensor) -> None:
    points.t_()  # the plan's view, changed in place
    points.t_()


def _fail(points: torch.Tensor) -> None:
    raise ArithmeticError("third call")


def test_a_model_that_writes_its_input_on_a_later_call_is_caught(module) -> None:  # type: ignore[no-untyped-def]
    model = module.Mlp(OnCall(2, lambda points: points.mul_(2.0)))
    points, scores = _points(module, 16), module.Scores.allocate(16)
    model(points, out=scores)
    with pytest.raises(InputModifiedError, match="'points'"):
        model(points, out=scores)
    assert not model._plans  # a failed call drops its plan


def test_a_model_that_reshapes_its_input_in_place_leaves_later_calls_right(module) -> None:  # type: ignore[no-untyped-def]
    model = module.Mlp(OnCall(3, _transpose_twice))
    points, scores, plan = _planned(module, model, 16)
    view = plan.views[0]
    with pytest.raises(InputModifiedError):
        model(points, out=scores)
    model(points, out=scores)
    (again,) = model._plans.values()
    assert again.views[0] is not view  # made anew
    torch.testing.assert_close(scores.a, points.x)


def test_an_output_that_stops_fitting_is_refused_on_a_planned_call(module) -> None:  # type: ignore[no-untyped-def]
    class ShrinksSecondTime(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, points: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return points[: points.shape[0] - (self.calls > 1), :2] + 1.0

    model = module.Mlp(ShrinksSecondTime())
    points, scores = _points(module, 16), module.Scores.allocate(16)
    model(points, out=scores)
    before = scores.a.clone()
    with pytest.raises(OutputError, match="returned 15 elements"):
        model(points, out=scores)
    assert torch.equal(scores.a, before)


def test_a_planned_call_of_a_returning_runner_still_checks_and_writes_its_results(module) -> None:  # type: ignore[no-untyped-def]
    """A backend that runs outside ATen's Python (no autograd, no version counter) and returns
    its results, as a package built without --write-outputs: its plan calls the runner directly,
    and still checks each result against its block and writes it, every call."""
    from soagen.runtime.backends import Backend, Runner

    class Returning(Backend):
        kind = "aot"
        records_autograd = False
        moves_version_counters = False

        def __init__(self) -> None:
            super().__init__("returns its results")
            self.shapes: list[int] = []  # rows to drop, one entry per call to come

        def place(self, device: torch.device) -> Runner:
            def run(tensors: object) -> object:
                (points,) = typing.cast(list[torch.Tensor], tensors)
                drop = self.shapes.pop(0) if self.shapes else 0
                return [points[: points.shape[0] - drop, :2] * 3.0]

            return run

    backend = Returning()
    model = module.Mlp(backend)
    points, scores, plan = _planned(module, model, 16)
    assert plan.call is not None and plan.model_call is not None  # its one call: run, check, write
    points.x.add_(1.0)
    model(points, out=scores)
    torch.testing.assert_close(scores.a, points.x * 3.0)
    torch.testing.assert_close(scores.b, points.y * 3.0)

    before = torch.stack([scores.a, scores.b], 1)
    backend.shapes.append(1)
    with pytest.raises(OutputError, match="returned 15 elements"):
        model(points, out=scores)
    assert torch.equal(torch.stack([scores.a, scores.b], 1), before)
    assert not model._plans  # a failed call drops its plan
    model(points, out=scores)
    model(points, out=scores)
    assert model._plans


def test_names_in_another_order_bind_the_right_collections(module) -> None:  # type: ignore[no-untyped-def]
    model = module.Neighbours(Gather())
    first, second = _points(module, 12, seed=1), _points(module, 12, seed=2)
    second.label.copy_(torch.arange(12).roll(5))
    scores = module.Scores.allocate(12)
    model.run({"points": first, "neighbour": second}, {"scores": scores})
    expected = scores.a.clone()
    # A plan for the same collections in the other roles: a mapping in the other order lists
    # them in the order of its key.
    for _ in range(2):
        model.run({"points": second, "neighbour": first}, {"scores": scores})
    assert model._plans
    assert not torch.equal(scores.a, expected)
    model.run({"neighbour": second, "points": first}, {"scores": scores})
    assert torch.equal(scores.a, expected)


def test_a_plan_made_inside_inference_mode_writes_outside_it(module) -> None:  # type: ignore[no-untyped-def]
    net = Linear()
    model = module.Mlp(net)
    points, scores = _points(module, 8), module.Scores.allocate(8)
    with torch.inference_mode():
        model(points, out=scores)
        model(points, out=scores)
    assert model._plans
    points.y.add_(1.0)
    model(points, out=scores)  # the plan's output views are normal tensors
    torch.testing.assert_close(torch.stack([scores.a, scores.b], 1), _expected(net, points))

    # Views made in inference mode share the buffer's version counter; outside it the model gets
    # views with counters of their own, so a write into another member of the buffer during the
    # call (as another thread could make) is not taken for the model's.
    class WritesLabel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.writes = False

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            if self.writes:
                points.label.add_(1)
            return inputs[:, :2] * 1.0

    net_writing = WritesLabel()
    other = module.Mlp(net_writing)
    with torch.inference_mode():
        other(points, out=scores)
        other(points, out=scores)
    net_writing.writes = True
    other(points, out=scores)


def test_a_plan_made_outside_inference_mode_serves_calls_inside_it(module) -> None:  # type: ignore[no-untyped-def]
    """Its views have version counters of their own: inside inference mode they still take a
    write by the model (refused), and no write into another member of the buffer."""

    class Writes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.target: torch.Tensor | None = None

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            if self.target is not None:
                self.target.add_(1)
            return inputs[:, :2] * 1.0

    net = Writes()
    model = module.Mlp(net)
    points, scores, plan = _planned(module, model, 8)
    assert plan.in_inference_mode is False
    with torch.inference_mode():
        net.target = points.label  # another member of the same buffer, as another thread's write
        model(points, out=scores)
        assert model._plans and next(iter(model._plans.values())) is plan
        torch.testing.assert_close(torch.stack([scores.a, scores.b], 1), _expected(net, points))
        net.target = plan.views[0]  # the model's own input
        with pytest.raises(InputModifiedError):
            model(points, out=scores)
    assert not model._plans  # a failed call drops its plan


def test_close_drops_the_plans_and_a_later_call_places_the_model_again(module) -> None:  # type: ignore[no-untyped-def]
    net = Linear()
    model = module.Mlp(net)
    points, scores = _points(module, 8), module.Scores.allocate(8)
    model(points, out=scores)
    model(points, out=scores)
    assert model._plans
    model.close()
    assert not model._plans and not model._backend.devices
    model(points, out=scores)
    assert model._backend.devices
    torch.testing.assert_close(torch.stack([scores.a, scores.b], 1), _expected(net, points))


def test_threads_share_one_binding_each_with_its_own_collections(module) -> None:  # type: ignore[no-untyped-def]
    net = Linear()
    model = module.Mlp(net)
    failures: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            points, scores = (
                _points(module, 40 + seed, seed=seed),
                module.Scores.allocate(40 + seed),
            )
            for step in range(30):
                points.z.add_(float(step))
                model(points, out=scores)
                torch.testing.assert_close(
                    torch.stack([scores.a, scores.b], 1), _expected(net, points)
                )
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures


def test_an_onnx_plan_reuses_its_input_views_and_sees_new_values(module, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("onnxruntime")
    net = Linear().eval()
    buffer = io.BytesIO()
    torch.onnx.export(
        net,
        (torch.randn(4, 3),),
        buffer,
        input_names=["points"],
        output_names=["scores"],
        dynamic_axes={"points": {0: "n"}, "scores": {0: "n"}},
        dynamo=False,
    )
    path = tmp_path / "linear.onnx"
    path.write_bytes(buffer.getvalue())
    model = module.Mlp.load(path)
    points, scores, plan = _planned(module, model, 24)
    assert plan.in_inference_mode is None  # plain views: ONNX Runtime moves no version counter
    view = plan.views[0]
    points.x.sub_(1.0)
    model(points, out=scores)
    (again,) = model._plans.values()
    assert again.views[0] is view
    torch.testing.assert_close(torch.stack([scores.a, scores.b], 1), _expected(net, points))


def test_new_collections_for_each_event_make_no_plan(module) -> None:  # type: ignore[no-untyped-def]
    """Events that each bring new collection objects (ids freed by the last event are often taken
    by the next one's) run without plans, which they would never use again."""
    net = Linear()
    model = module.Mlp(net)
    for seed in range(20):
        points, scores = _points(module, 16, seed=seed), module.Scores.allocate(16)
        model(points, out=scores)
        torch.testing.assert_close(torch.stack([scores.a, scores.b], 1), _expected(net, points))
        assert not model._plans
        del points, scores


def test_the_inputs_handed_over_as_copies_are_fixed_for_the_bindings_life(module) -> None:  # type: ignore[no-untyped-def]
    """Plans and runs are made with them: a change after the first call would apply to some
    calls and not others."""
    model = module.Mlp(Linear(), contiguous=["points"])
    assert model.contiguous == {"points"}
    with pytest.raises(AttributeError):
        model.contiguous = frozenset()


def test_the_generated_call_looks_its_plan_up_in_c_where_built(module, model_runs) -> None:  # type: ignore[no-untyped-def]
    method = ModelBinding.__dict__["_call_in_schema_order"]
    assert (method is PYTHON_CALL_IN_SCHEMA_ORDER) == (model_runs == "python run")
    net = Linear()
    model = module.Mlp(net)
    points, scores, plan = _planned(module, model, 20)
    bound = model._call_in_schema_order  # a method, bound as Python's are
    assert bound.__self__ is model
    scores.a.zero_()
    bound((points, scores), None, None)
    torch.testing.assert_close(scores.a, _expected(net, points)[:, 0])
    assert ModelBinding._call_in_schema_order is method


def test_calls_without_a_plan_to_run_go_to_the_python_method(  # type: ignore[no-untyped-def]
    module, model_runs, monkeypatch
) -> None:
    """A stream, a batch size, protected inputs, a list, keywords: the Python method takes them.
    Collections without a plan go on to `_call_without_plan` with their plans' key (the compiled
    lookup hands them there itself), which checks them and makes their plan at the second call."""
    taken: list[object] = []
    keys: list[object] = []
    call_without_plan = ModelBinding._call_without_plan

    def recorded(self, *arguments, **options):  # type: ignore[no-untyped-def]
        taken.append((arguments, options))
        return PYTHON_CALL_IN_SCHEMA_ORDER(self, *arguments, **options)

    def without_plan(self, collections, stream, batch_size, key):  # type: ignore[no-untyped-def]
        keys.append(key)
        return call_without_plan(self, collections, stream, batch_size, key)

    method = recorded if model_runs == "python run" else type(CALL_IN_SCHEMA_ORDER)(recorded)
    monkeypatch.setattr(ModelBinding, "_call_in_schema_order", method)
    monkeypatch.setattr(ModelBinding, "_call_without_plan", without_plan)
    net = Linear()
    model = module.Mlp(net)
    points, scores = _points(module, 40), module.Scores.allocate(40)
    key = (id(points), id(scores))
    model(points, out=scores)  # no plan yet
    model(points, out=scores)  # makes it
    assert keys == [key, key] and model._plans
    assert len(taken) == (2 if model_runs == "python run" else 0)
    taken.clear()
    model(points, out=scores, batch_size=16)
    model._call_in_schema_order([points, scores], None, None)  # type: ignore[arg-type]
    model._call_in_schema_order((points, scores), stream=None, batch_size=None)
    model.protect_inputs = True
    model(points, out=scores)
    model.protect_inputs = False
    assert len(taken) == 4 and keys[2:] == [None, None]
    model(points, out=scores)  # the plan's call
    assert len(taken) == 4 + (model_runs == "python run") and len(keys) == 4
    torch.testing.assert_close(torch.stack([scores.a, scores.b], 1), _expected(net, points))


def test_a_failed_planned_call_hands_its_error_to_failed_plan_and_raises_it(  # type: ignore[no-untyped-def]
    module, monkeypatch
) -> None:
    handed: list[BaseException] = []
    failed_plan = ModelBinding._failed_plan

    def recorded(self, plan, error):  # type: ignore[no-untyped-def]
        handed.append(error)
        return failed_plan(self, plan, error)

    monkeypatch.setattr(ModelBinding, "_failed_plan", recorded)
    model = module.Mlp(OnCall(3, _fail))
    points, scores, plan = _planned(module, model, 16)
    with pytest.raises(ArithmeticError, match="third call") as raised:
        model(points, out=scores)
    assert handed == [raised.value] and not model._plans
    assert any(frame.name == "forward" for frame in traceback.extract_tb(raised.tb))
    assert sys.exc_info() == (None, None, None)  # handled only while `_failed_plan` ran
    # Called while the caller handles an exception of its own, which stays the one handled.
    model = module.Mlp(OnCall(3, _fail))
    points, scores, plan = _planned(module, model, 16)
    try:
        raise OSError("the caller's")
    except OSError as outer:
        with pytest.raises(ArithmeticError) as raised:
            model(points, out=scores)
        assert sys.exc_info()[1] is outer
        assert raised.value.__context__ is outer

    # An error of `_failed_plan` (the index range the model refused) is raised instead, with the
    # model's as its context, as in an `except` block.
    def naming(self, plan, error):  # type: ignore[no-untyped-def]
        raise LookupError("named by the check")

    monkeypatch.setattr(ModelBinding, "_failed_plan", naming)
    model = module.Mlp(OnCall(3, _fail))
    points, scores, plan = _planned(module, model, 16)
    with pytest.raises(LookupError, match="named by the check") as raised:
        model(points, out=scores)
    assert isinstance(raised.value.__context__, ArithmeticError)

    # Chained as Python chains them: one it handled itself stays in the chain.
    def handling(self, plan, error):  # type: ignore[no-untyped-def]
        assert sys.exc_info()[1] is error  # the model's error is the one being handled
        try:
            raise KeyError("its own")
        except KeyError:
            raise LookupError("named by the check") from None

    monkeypatch.setattr(ModelBinding, "_failed_plan", handling)
    model = module.Mlp(OnCall(3, _fail))
    points, scores, plan = _planned(module, model, 16)
    with pytest.raises(LookupError) as raised:
        model(points, out=scores)
    own = raised.value.__context__
    assert isinstance(own, KeyError) and isinstance(own.__context__, ArithmeticError)
    assert sys.exc_info() == (None, None, None)


def test_the_compiled_lookup_shows_the_python_methods_name_signature_and_doc() -> None:
    import inspect

    method = ModelBinding.__dict__["_call_in_schema_order"]
    assert method.__name__ == "_call_in_schema_order"
    assert method.__qualname__ == "ModelBinding._call_in_schema_order"
    assert method.__doc__ == PYTHON_CALL_IN_SCHEMA_ORDER.__doc__
    parameters = list(inspect.signature(ModelBinding._call_in_schema_order).parameters)
    assert parameters == ["self", "collections", "stream", "batch_size"]


def test_a_binding_with_an_index_checked_plan_is_freed_without_the_collector(module) -> None:  # type: ignore[no-untyped-def]
    """Its plan holds no reference back to it: dropping the binding frees its model and backend
    at once, as a binding whose plans have no checks."""
    model = module.Neighbours(Gather())
    points, scores = _planned(module, model, 30)[:2]
    gone = weakref.ref(model)
    gc.disable()
    try:
        del model
        assert gone() is None
    finally:
        gc.enable()
