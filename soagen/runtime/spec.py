"""The metadata generated classes carry: plain frozen dataclasses, importable without torch or numpy."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class StridedView:
    """One tensor view into a collection's buffer.

    `shape` and `strides` count elements of `dtype`; `offset` counts bytes from the buffer's start and is
    a multiple of the item size, so it is also the `as_strided` storage offset times the item size.
    """

    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """A column (one value, or one fixed-shape array, per element) or a scalar (one per collection)."""

    name: str
    kind: str  # "column", "packed" (an array column stored element by element) or "scalar"
    dtype: str
    shape: tuple[int, ...]  # () for plain columns and scalars
    doc: str

    @property
    def per_element(self) -> bool:
        """Columns, packed or not, hold values per element; a scalar one per collection."""
        return self.kind != "scalar"


@dataclass(frozen=True, slots=True)
class BlockSpec:
    """Adjacent members of one layout seen as one tensor, as a model binding declares it."""

    name: str
    layout: str
    members: tuple[str, ...]
    dtype: str
    axes: tuple[str, ...]  # `n`, `c` or an array extent, in tensor order
    # closed-form geometry for n elements (a generated function: its repr says nothing)
    view: Callable[[int], StridedView] = field(repr=False)
    # The `LAYOUT_KEY` of the layout class generated with it; "" (hand-made specs) checks nothing.
    layout_key: str = ""
    # Collections look views up by block on every model call: hash the fields once.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = (
            self.name,
            self.layout,
            self.members,
            self.dtype,
            self.axes,
            self.view,
            self.layout_key,
        )
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash

    @property
    def element_axis(self) -> int | None:
        """The dimension that runs over elements; None for a block of scalars only."""
        return self.axes.index("n") if "n" in self.axes else None


@dataclass(frozen=True, slots=True)
class BindingSpec:
    """One input or output of a model: a block of one layout, in declaration order."""

    name: str
    direction: str  # "input" or "output"
    block: BlockSpec
    # The input whose element numbers this integer input holds (`indexes` in the schema): each
    # value is checked to lie in [0, its element count) before every call.
    indexes: str | None = None
    # `contiguous` in the schema: the model gets one row-major copy of this input per call.
    contiguous: bool = False
    # `same n as NAME` in the schema: the input whose collection must hold as many elements as
    # this one's (checked before every call; `soagen compile` exports one size for both).
    same_n_as: str | None = None
    # `whole` in the schema: a `batch_size` call passes this input entire to every slice.
    whole: bool = False


def declared_index_bounds(inputs: Iterable[BindingSpec]) -> dict[str, str]:
    """The schema's `indexes` clauses: index input name -> the input whose elements it numbers."""
    return {spec.name: spec.indexes for spec in inputs if spec.indexes is not None}


def following_input(candidates: Sequence[BindingSpec], output: BindingSpec) -> BindingSpec:
    """Of inputs whose element count an output's equals (`candidates`, in schema order), the one
    to name as its size: one of the output's own layout, whose collection an input then binds
    (layouts a `same n as` ties hold equal counts, so any of them would be true), else the
    first."""
    return next(
        (spec for spec in candidates if spec.block.layout == output.block.layout), candidates[0]
    )
