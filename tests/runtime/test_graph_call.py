"""The compiled replay of a graph plan (`GraphCall` in `soagen/runtime/_compiled.c`): where the
buffers lie where the plan found them and the module does not train, the caller's stream's graph
is replayed and moved to the LRU's end; any other call goes to the plan's Python function."""

from __future__ import annotations

import gc
import typing
import weakref
from collections import OrderedDict

import pytest
import torch
from torch import nn

from soagen.runtime import buffers

if typing.TYPE_CHECKING:
    from soagen.runtime._compiled import GraphCall

pytestmark = pytest.mark.skipif(
    buffers._GraphCall is None, reason="soagen.runtime._compiled was not built by this install"
)
GRAPH_CALL = typing.cast("type[GraphCall]", buffers._GraphCall)


class Graph:
    def __init__(self, events: list[str], name: str) -> None:
        self.events, self.name = events, name

    def replay(self) -> None:
        self.events.append(f"replay {self.name}")


class Setting:
    """A plan's GraphCall over two buffers, and what its calls did."""

    def __init__(
        self, graphs: OrderedDict[object, object] | None = None, module: object = "a module"
    ) -> None:
        self.events: list[str] = []
        self.stream = 1
        self.buffers = (torch.zeros(8), torch.zeros(4))
        self.placements = (("nodes", 0), ("scores", 1))
        self.graphs = OrderedDict() if graphs is None else graphs
        for stream in (1, 2):
            self.graphs[(stream, *self.placements)] = Graph(self.events, f"on {stream}")
        self.module = nn.Linear(1, 1).eval() if module == "a module" else module
        self.call = GRAPH_CALL(
            self.buffers,
            tuple(buffer.data_ptr() for buffer in self.buffers),
            self.stream_of,
            torch.device("cpu"),
            self.placements,
            self.graphs,
            self.module,
            lambda: self.events.append("python"),
        )

    def stream_of(self, device: torch.device) -> object:
        return self.stream


def test_the_graph_of_the_callers_stream_is_replayed_and_used_last() -> None:
    setting = Setting()
    setting.call()
    assert setting.events == ["replay on 1"]
    assert list(setting.graphs)[-1] == (1, *setting.placements)
    setting.stream = 2
    setting.call()
    assert setting.events == ["replay on 1", "replay on 2"]
    assert list(setting.graphs)[-1] == (2, *setting.placements)


def test_any_other_call_goes_to_the_python_function() -> None:
    setting = Setting()
    setting.stream = 3  # no graph captured for it yet
    setting.call()
    setting.stream = 1
    module = typing.cast(nn.Module, setting.module)
    module.train()
    setting.call()
    module.eval()
    setting.buffers[1].resize_(1000)  # a storage that moved
    setting.call()
    assert setting.events == ["python", "python", "python"]


def test_without_a_module_the_graph_is_replayed() -> None:
    setting = Setting(module=None)
    setting.stream = 2
    setting.call()
    assert setting.events == ["replay on 2"]
    assert list(setting.graphs)[-1] == (2, *setting.placements)


def test_errors_of_the_training_flag_and_the_lookup_are_raised_before_any_replay() -> None:
    class Unsure:
        @property
        def training(self) -> bool:
            raise LookupError("training")

    setting = Setting(module=Unsure())
    with pytest.raises(LookupError, match="training"):
        setting.call()
    setting = Setting()
    setting.stream = [1]  # type: ignore[assignment]  # unhashable: the lookup raises
    with pytest.raises(TypeError):
        setting.call()
    assert setting.events == []


def test_a_graph_dropped_before_it_is_moved_is_replayed_and_other_errors_are_raised() -> None:
    class Dropping(OrderedDict):  # type: ignore[type-arg]
        error: type[Exception] = KeyError

        def move_to_end(self, key: object, last: bool = True) -> None:
            raise self.error(key)

    graphs = Dropping()
    setting = Setting(graphs)
    setting.call()  # another thread's capture dropped it meanwhile: still replayed
    Dropping.error = OSError
    with pytest.raises(OSError):
        setting.call()
    assert setting.events == ["replay on 1"]


def test_errors_of_the_stream_lookup_and_the_replay_are_raised() -> None:
    setting = Setting()

    def no_stream(device: torch.device) -> int:
        raise RuntimeError("no stream")

    class Failing(Graph):
        def replay(self) -> None:
            raise ValueError("replay")

    setting.graphs[(1, *setting.placements)] = Failing(setting.events, "failing")
    with pytest.raises(ValueError, match="replay"):
        setting.call()
    broken = GRAPH_CALL(
        setting.buffers,
        tuple(buffer.data_ptr() for buffer in setting.buffers),
        no_stream,
        torch.device("cpu"),
        setting.placements,
        setting.graphs,
        None,
        lambda: None,
    )
    with pytest.raises(RuntimeError, match="no stream"):
        broken()


def test_a_graph_call_takes_only_what_it_can_run() -> None:
    setting = Setting()
    arguments: list[typing.Any] = [
        setting.buffers,
        (1,),  # one address for two buffers
        setting.stream_of,
        torch.device("cpu"),
        setting.placements,
        setting.graphs,
        None,
        print,
    ]
    with pytest.raises(ValueError, match="one address per buffer"):
        GRAPH_CALL(*arguments)
    arguments[1] = (1, 2)
    arguments[5] = list(setting.graphs)
    with pytest.raises(TypeError):
        GRAPH_CALL(*arguments)
    with pytest.raises(TypeError, match="no argument"):
        setting.call(1)  # type: ignore[call-arg]


def test_a_graph_call_in_a_reference_cycle_is_collected() -> None:
    """A cycle through each object it holds that may hold it back: its Python call, a graph,
    the module."""

    class Holder(nn.Module):
        graph_call: object = None

        def forward(self) -> None:  # as the Python call
            pass

    for through in ("its python call", "a graph", "the module"):
        holder = Holder().eval()
        buffer = torch.zeros(2)
        graphs: OrderedDict[object, object] = OrderedDict()
        if through == "a graph":
            graphs[(1,)] = holder
        holder.graph_call = GRAPH_CALL(
            (buffer,),
            (buffer.data_ptr(),),
            lambda device: 1,
            torch.device("cpu"),
            (),
            graphs,
            holder if through == "the module" else None,
            holder if through == "its python call" else (lambda: None),
        )
        gone = weakref.ref(holder)
        del holder, graphs
        gc.collect()
        assert gone() is None, through
