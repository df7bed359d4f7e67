"""One served event: a request's input tensors checked against the binding and copied into fresh
collections, ready for the model. Shared by `soagen serve` (`soagen.serving.server.EventRunner`) and
the `model.py` of `soagen triton` repositories (`soagen.serving.python_model.SoagenModel`).

An event's tensors come in the blocks' declared axis order, on the host (each server turns its wire
form into that first). `EventLoader.event` checks each against its block (dtype, fixed extents, one
element count per collection, index inputs in range of their collection) and `EventLoader.load`
allocates one collection per layout on the model's device, with the layout's pitches, so the model
sees exactly the strides a local call gives it, and copies each block in: one copy per block.
Several events load as one concatenation (each event's elements after the previous event's, index
inputs shifted by the offset of the collection they index), for servers that merge events.

Importing this module imports no torch.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from soagen.runtime.model import indices_outside, same_n_groups, shared_members
from soagen.runtime.spec import BindingSpec
from soagen.serving.wire import dims_match

if typing.TYPE_CHECKING:
    import torch

    from soagen.runtime.collection import Collection
    from soagen.runtime.model import ModelBinding


class EventError(ValueError):
    """An event's tensors do not fit the binding's blocks; the model was not run."""


class OutputSizeError(ValueError):
    """Nothing, or something wrong, says how many elements an output's collection gets."""


class RecordedSizeError(OutputSizeError):
    """A size given contradicts the count the model file fixed (`recorded_sizes_problem`)."""


def _count_or_layout(size: Mapping[str, object], layouts: Mapping[str, str]) -> int | str:
    """What an output size (one of `output_sizes`' values) means: a count, or the layout whose
    element count it takes. `layouts`: input name -> its layout."""
    if "count" in size:
        return int(typing.cast(int, size["count"]))
    if "input" in size:
        return layouts[str(size["input"])]
    return str(size["layout"])


def _described(size: Mapping[str, object]) -> str:
    if "count" in size:
        return f"{size['count']} elements"
    if "input" in size:
        return f"as many elements as {size['input']!r}"
    return f"as many elements as its {size['layout']} collection"


def binding_output_sizes(
    binding: type[ModelBinding],
    given: Mapping[str, str],
    recorded: Mapping[str, str],
    suggested: Mapping[str, str] | None = None,
) -> dict[str, dict[str, object]]:
    """`output_sizes` for a binding whose model file may say: `given` (`--output-size`) first,
    then the file's fixed counts (`Backend.output_counts`), then its guesses
    (`Backend.suggested_output_counts`). OutputSizeError where that leaves an output unsized or
    two outputs of a collection apart; RecordedSizeError where a given size contradicts a fixed
    count, which would fail every event."""
    inputs = [(spec.name, spec.block.layout) for spec in binding.INPUTS]
    outputs = [(spec.name, spec.block.layout) for spec in binding.OUTPUTS]
    merged = _with_file_counts(inputs, outputs, given, recorded, suggested or {})
    sizes = output_sizes(binding.NAME, inputs, outputs, merged)
    problem = recorded_sizes_problem(sizes, recorded, inputs, same_n_groups(binding))
    if problem is not None:
        raise RecordedSizeError(problem)
    return sizes


def _with_file_counts(
    inputs: Sequence[tuple[str, str]],
    outputs: Sequence[tuple[str, str]],
    given: Mapping[str, str],
    recorded: Mapping[str, str],
    suggested: Mapping[str, str],
) -> dict[str, str]:
    """`given` over the file's fixed counts over its guesses, for outputs of a layout of their
    own. A size given for one output of a layout outranks the guesses for all of them: they
    share its collection."""
    input_layouts = {layout for _, layout in inputs}
    output_layouts = dict(outputs)
    given_layouts = {output_layouts[name] for name in given if name in output_layouts}
    guesses = {
        name: count
        for name, count in suggested.items()
        if output_layouts[name] not in given_layouts
    }
    from_file = {
        name: count
        for name, count in {**guesses, **recorded}.items()
        if output_layouts[name] not in input_layouts
    }
    return {**from_file, **given}


def output_sizes(
    model: str,
    inputs: Sequence[tuple[str, str]],
    outputs: Sequence[tuple[str, str]],
    given: Mapping[str, str],
) -> dict[str, dict[str, object]]:
    """How many elements each output's collection gets per event, where the server allocates the
    output collections (the Python backend of `soagen triton`; `soagen serve` with a model that
    stores into its output blocks): the output's own layout if an input binds it (written in
    place), else `given[output]` (`--output-size`), an input name (as many elements as that
    input's collection) or a count, else the one input layout. `inputs`, `outputs`: (binding
    name, layout name) in schema order; the result, per output, as `EventLoader.counts` takes it.
    Outputs into one layout of their own share its collection, so they must agree, and a size
    given for one of them serves the others."""
    input_layouts = {name: layout for name, layout in inputs}
    layouts = list(dict.fromkeys(input_layouts.values()))
    output_layouts = dict(outputs)
    for name in given:
        if name not in output_layouts:
            raise OutputSizeError(
                f"--output-size: {model} has no output {name!r}; its outputs are "
                f"{', '.join(output_layouts)}"
            )
    given_for_layout: dict[str, str] = {}
    for name, text in given.items():
        given_for_layout.setdefault(output_layouts[name], text)
    sizes: dict[str, dict[str, object]] = {}
    for name, layout in outputs:
        source = given.get(name)
        if layout in layouts:
            if source is not None:
                raise OutputSizeError(
                    f"--output-size {name}: output {name!r} writes into {layout}, which an input "
                    f"binds, so it has that collection's element count"
                )
            sizes[name] = {"layout": layout}
            continue
        if source is None:
            source = given_for_layout.get(layout)
        if source is None:
            if len(layouts) != 1:
                raise OutputSizeError(
                    f"output {name!r} ({layout}) has its own collection, and nothing says how "
                    f"many elements it gets per event: give --output-size {name}=INPUT (as many "
                    f"as INPUT's collection, one of {', '.join(input_layouts)}) or {name}=COUNT"
                )
            source = next(binding for binding, bound in inputs if bound == layouts[0])
        source = str(source)
        if source.isascii() and source.isdigit() and int(source) >= 1:
            sizes[name] = {"count": int(source)}
        elif source in input_layouts:
            sizes[name] = {"input": source}
        else:
            raise OutputSizeError(
                f"--output-size {name}={source}: {source!r} is neither an input of {model} "
                f"({', '.join(input_layouts)}) nor a count >= 1"
            )
    shared: dict[str, tuple[str, int | str]] = {}
    for name, layout in outputs:
        resolved = _count_or_layout(sizes[name], input_layouts)
        first = shared.setdefault(layout, (name, resolved))
        if first[1] != resolved:
            raise OutputSizeError(
                f"--output-size: outputs {first[0]!r} and {name!r} share the {layout} collection "
                f"of each event, so they need one element count, and their sizes (given, or "
                f"from the model file) differ"
            )
    return sizes


@dataclass(frozen=True, slots=True)
class EventInput:
    """One input block as a request carries it."""

    tensor: str  # the request's name for it
    spec: BindingSpec
    dims: tuple[int, ...]  # declared axis order, -1 on the element axis (1 for a block of scalars)
    # A block of scalars (one value per collection, stride 0 along n): sent once per event (1
    # along n in `dims`), or once per element (-1 there) as every other block, all alike.
    scalar: bool = False

    @property
    def layout(self) -> str:
        return self.spec.block.layout

    @property
    def element_axis(self) -> int | None:
        return self.spec.block.element_axis


@dataclass(frozen=True, slots=True)
class Event:
    tensors: dict[str, torch.Tensor]  # binding name -> the event's host tensor, declared order
    sizes: dict[str, int]  # input layout name -> element count


def recorded_sizes_problem(
    sizes: Mapping[str, Mapping[str, object]],
    recorded: Mapping[str, str],
    inputs: Sequence[tuple[str, str]],
    groups: Mapping[str, str],
) -> str | None:
    """Why output sizes (as `output_sizes` gives them) contradict the element counts the model
    file recorded for its outputs (`Backend.output_counts`: an input's name or a count), or
    None. Such a model would refuse every event; its server should not start. `groups`: each
    input layout's `same n as` group, as its first layout (`same_n_groups`): the layouts of one
    hold one count, so a size may name any of them."""
    layouts = dict(inputs)

    def meaning(size: Mapping[str, object]) -> int | str:
        resolved = _count_or_layout(size, layouts)
        return groups.get(resolved, resolved) if isinstance(resolved, str) else resolved

    for name, record in recorded.items():
        size = sizes.get(name)
        exported = {"count": int(record)} if record.isdigit() else {"input": record}
        if size is not None and meaning(size) != meaning(exported):
            return (
                f"output {name!r} would get {_described(size)} per event, and the model file "
                f"was exported with {_described(exported)}"
            )
    return None


def writes_over_inputs(binding: type[ModelBinding]) -> str | None:
    """Why a package built with --write-outputs cannot be served with one collection per layout
    per event, inputs and outputs alike, or None: an output binding members of an input would
    be written while the package still reads them."""
    pairs = shared_members(binding)
    if not pairs:
        return None
    i, o = pairs[0]
    return (
        f"output {binding.OUTPUTS[o].name!r} binds members of input {binding.INPUTS[i].name!r}, "
        f"which a package built with --write-outputs would overwrite while reading them in the "
        f"server's one collection per layout"
    )


def _check_one_value(item: EventInput, tensor: torch.Tensor) -> None:
    """A block of scalars sent once per element must hold one value (bit for bit: NaN too)."""
    from soagen.runtime.buffers import same_width_integer

    axis = typing.cast(int, item.element_axis)
    if tensor.shape[axis] < 2:
        return
    bits = same_width_integer(tensor)
    if not bool((bits == bits.narrow(axis, 0, 1)).all()):
        raise EventError(
            f"input {item.tensor!r} is a block of scalars, one value per {item.layout} "
            f"collection, and its elements hold different values"
        )


class EventLoader:
    """Checks events against a binding's input blocks and loads them into collections.

    `layouts`: the collection class of every layout an event fills. `index_bounds`: index inputs
    checked per event (and shifted when events merge); a server that lets the binding check them
    leaves it empty.
    """

    def __init__(
        self,
        inputs: Sequence[EventInput],
        layouts: Mapping[str, type[Collection]],
        index_bounds: Mapping[str, str] | None = None,
    ) -> None:
        self.inputs = tuple(inputs)
        self.layouts = dict(layouts)
        self.index_bounds = dict(index_bounds or {})
        self.layout_of = {item.spec.name: item.layout for item in self.inputs}
        self._tensor_names = {item.spec.name: item.tensor for item in self.inputs}

    def tensor_name(self, binding: str) -> str:
        return self._tensor_names.get(binding, binding)

    def counts(
        self, event: Event, outputs: Sequence[tuple[str, Mapping[str, object]]]
    ) -> tuple[dict[str, int], list[int]]:
        """The element count of every layout `event` fills (its inputs', then each output's own
        layout), and each output's. `outputs`: (layout, size) per output, the size as
        `output_sizes` gives it."""
        counts = []
        for _, size in outputs:
            meaning = _count_or_layout(size, self.layout_of)
            counts.append(meaning if isinstance(meaning, int) else event.sizes[meaning])
        layouts = dict(event.sizes)
        for (layout, _), n in zip(outputs, counts, strict=True):
            layouts.setdefault(layout, n)
        return layouts, counts

    def event(self, tensors: Mapping[str, torch.Tensor]) -> Event:
        """The event of `tensors` (binding name -> tensor in declared order), checked."""
        from soagen.runtime.buffers import TORCH_DTYPES

        sizes: dict[str, int] = {}
        sources: dict[str, str] = {}
        for item in self.inputs:
            tensor = tensors[item.spec.name]
            expected = TORCH_DTYPES[item.spec.block.dtype]
            if tensor.dtype != expected:
                raise EventError(f"input {item.tensor!r} holds {tensor.dtype}, expected {expected}")
            shape = tuple(tensor.shape)
            if not dims_match(shape, item.dims):
                raise EventError(
                    f"input {item.tensor!r} has shape {list(shape)}, expected {list(item.dims)} "
                    f"(-1: any element count)"
                )
            axis = item.element_axis
            if item.scalar:
                if item.dims[typing.cast(int, axis)] != -1:
                    continue  # sent once per event: the other inputs give the element count
                _check_one_value(item, tensor)  # sent once per element (`soagen serve`)
            n = shape[axis] if axis is not None else 0
            if item.layout in sizes and sizes[item.layout] != n:
                raise EventError(
                    f"inputs {self.tensor_name(sources[item.layout])!r} and {item.tensor!r} "
                    f"disagree on the element count of {item.layout} ({sizes[item.layout]} and {n})"
                )
            sizes[item.layout] = n
            sources[item.layout] = item.spec.name
        for item in self.inputs:
            if item.scalar and item.layout not in sizes:
                raise EventError(f"no input gives the element count of {item.layout}")
        for item in self.inputs:
            other = item.spec.same_n_as
            if other is not None and sizes.get(item.layout) != sizes.get(self.layout_of[other]):
                raise EventError(
                    f"input {item.tensor!r} holds {sizes.get(item.layout)} elements and "
                    f"{self.tensor_name(other)!r} {sizes.get(self.layout_of[other])}: the schema "
                    f"declares `same n as {other}`"
                )
        for index_name, bound_name in self.index_bounds.items():
            bound = sizes[self.layout_of[bound_name]]
            found = indices_outside(tensors[index_name], bound)
            if found is not None:
                raise EventError(
                    f"input {self.tensor_name(index_name)!r} holds indices {found[0]}..{found[1]}, "
                    f"outside [0, {bound}), the elements of {self.tensor_name(bound_name)!r}"
                )
        return Event(dict(tensors), sizes)

    def load(
        self,
        events: Sequence[Event],
        device: torch.device,
        counts: Sequence[Mapping[str, int]] | None = None,
    ) -> tuple[dict[str, Collection], list[dict[str, int]]]:
        """One collection per layout on `device` holding `events` one after the other, with every
        input block copied in; and each event's element offset in each collection. `counts`: per
        event, the element count of each layout (default: its inputs' `sizes`; more layouts, the
        outputs' own collections, get allocated too)."""
        totals: dict[str, int] = {}
        offsets: list[dict[str, int]] = []
        for sizes in counts if counts is not None else [event.sizes for event in events]:
            placed = {}
            for layout, n in sizes.items():
                placed[layout] = totals.get(layout, 0)
                totals[layout] = placed[layout] + n
            offsets.append(placed)
        from soagen.runtime.buffers import copy_values

        collections = {
            layout: self.layouts[layout].allocate(total, device) for layout, total in totals.items()
        }
        for event, placed in zip(events, offsets, strict=True):
            for item in self.inputs:
                start, whole = placed[item.layout], collections[item.layout]
                n = event.sizes[item.layout]
                part = whole if (start, n) == (0, whole.size) else whole.slice(start, start + n)
                target = part.block(item.spec.block)
                source = event.tensors[item.spec.name]
                if item.scalar:  # stride 0 along n: write the one value, even for n = 0
                    axis = typing.cast(int, item.element_axis)
                    if source.shape[axis] == 0:
                        continue  # sent once per element, and the event has none
                    one = [*target.shape[:axis], 1, *target.shape[axis + 1 :]]
                    target = target.as_strided(one, target.stride()).select(axis, 0)
                    source = source.select(axis, 0)
                copy_values(target, source)
                bound = self.index_bounds.get(item.spec.name)
                if bound is not None and placed[self.layout_of[bound]]:
                    target.add_(placed[self.layout_of[bound]])
        return collections, offsets


__all__ = [
    "Event",
    "EventError",
    "EventInput",
    "EventLoader",
    "OutputSizeError",
    "output_sizes",
    "writes_over_inputs",
]
