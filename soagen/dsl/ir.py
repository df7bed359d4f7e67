"""The schema IR: frozen dataclasses, built by the parser, checked and resolved by the passes, read
by the generator and the tools.

The parser's bindings name their layout and members; `soagen.dsl.check.resolve_file` hands each
binding of a valid file its `Layout` and `Member`s, so stages after the checker never look a name up
again (`Binding.layout`, `Binding.members`, `Binding.axis_names`). Nothing here computes byte
layouts: that is `soagen.dsl.layout`, pure functions over these classes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

from soagen.dsl.diagnostics import Span
from soagen.dsl.dtypes import DTYPES, DType

# CMSSW's default: the cache line of the largest GPUs.
DEFAULT_ALIGN = 128


class MemberKind(str, Enum):
    COLUMN = "column"  # one padded column per value: an array column stores each coefficient apart
    PACKED = "packed"  # an array column whose element's values lie together in one padded column
    SCALAR = "scalar"

    @property
    def keyword(self) -> str:
        """The statement that declares it: a packed column is a `column` with `packed` after it."""
        return "scalar" if self is MemberKind.SCALAR else "column"

    @property
    def noun(self) -> str:
        """What messages call it."""
        return "packed column" if self is MemberKind.PACKED else self.value


class Direction(str, Enum):
    INPUT = "input"
    OUTPUT = "output"


class AxisKind(str, Enum):
    ELEMENTS = "n"  # one entry per element of the collection
    COLUMNS = "c"  # one entry per member of the block
    ARRAY = "array"  # one extent of an array column, written as its size
    UNKNOWN = "unknown"  # any other word: reported by the checker


class UnresolvedBindingError(RuntimeError):
    """A stage read a binding's layout or members before the checker resolved them: a bug in
    soagen, never a schema error."""


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    kind: MemberKind
    dtype_name: str
    shape: tuple[int, ...]
    doc: str | None
    span: Span
    dtype_span: Span

    @property
    def dtype(self) -> DType:
        return DTYPES[self.dtype_name]

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def coefficient_count(self) -> int:
        """Values per element: 1 for a plain column or scalar, prod(shape) for an array column."""
        return math.prod(self.shape)

    @property
    def packed(self) -> bool:
        return self.kind is MemberKind.PACKED

    @property
    def statement_text(self) -> str:
        """The member as canonical text declares it, alone: `column uint16[10] adc packed`."""
        shape = f"[{', '.join(map(str, self.shape))}]" if self.shape else ""
        packed = " packed" if self.packed else ""
        return f"{self.kind.keyword} {self.dtype_name}{shape} {self.name}{packed}"


@dataclass(frozen=True, slots=True)
class Layout:
    name: str
    # Every `align` statement with its value; the checker reports more than one.
    align_statements: tuple[tuple[int, Span], ...]
    members: tuple[Member, ...]
    doc: str | None
    span: Span
    path: str

    @property
    def align(self) -> int:
        return self.align_statements[0][0] if self.align_statements else DEFAULT_ALIGN

    def member(self, name: str) -> Member | None:
        for member in self.members:
            if member.name == name:
                return member
        return None

    def index(self, name: str) -> int:
        return [member.name for member in self.members].index(name)


@dataclass(frozen=True, slots=True)
class Axis:
    text: str  # as written: `n`, `c` or an array extent
    span: Span

    @property
    def kind(self) -> AxisKind:
        if self.text == "n":
            return AxisKind.ELEMENTS
        if self.text == "c":
            return AxisKind.COLUMNS
        if self.text.lstrip("+-").isdigit():
            return AxisKind.ARRAY
        return AxisKind.UNKNOWN

    @property
    def size(self) -> int | None:
        return int(self.text) if self.kind is AxisKind.ARRAY else None


@dataclass(frozen=True, slots=True)
class Binding:
    direction: Direction
    name: str
    layout_name: str
    member_names: tuple[str, ...]
    # None where the schema left out `as [...]`: the default order is n, c (if several), array extents.
    axes: tuple[Axis, ...] | None
    doc: str | None
    span: Span
    layout_span: Span
    member_spans: tuple[Span, ...]
    axes_span: Span | None
    # `indexes NAME`: the input whose element numbers this integer input holds, and where it is named.
    indexes: str | None = None
    indexes_span: Span | None = None
    # `contiguous`: where the clause stands; None without it.
    contiguous_span: Span | None = None
    # `same n as NAME`: the input whose element count this input's collection shares, and where
    # that name stands.
    same_n_as: str | None = None
    same_n_as_span: Span | None = None
    # `whole`: where the clause stands; None without it. A whole input is passed entire to every
    # slice of a `batch_size` call.
    whole_span: Span | None = None
    # Set by the checker once the file is valid: the layout the block lies in and its members in
    # block order. Derived from the names above, so left out of equality.
    resolved_layout: Layout | None = field(default=None, compare=False, repr=False)
    resolved_members: tuple[Member, ...] = field(default=(), compare=False, repr=False)

    @property
    def layout(self) -> Layout:
        if self.resolved_layout is None:
            raise UnresolvedBindingError(f"binding `{self.name}` was read before it was resolved")
        return self.resolved_layout

    @property
    def members(self) -> tuple[Member, ...]:
        if not self.resolved_members:
            raise UnresolvedBindingError(f"binding `{self.name}` was read before it was resolved")
        return self.resolved_members

    @property
    def first_member(self) -> Member:
        """The block's first member: all of them share its kind, dtype and shape."""
        return self.members[0]

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The block's axes as written, or the default order where `as [...]` is left out."""
        return block_axes(self, self.first_member)

    @property
    def contiguous(self) -> bool:
        return self.contiguous_span is not None

    @property
    def whole(self) -> bool:
        return self.whole_span is not None

    @property
    def trailing_clauses(self) -> str:
        """` indexes NAME`, ` same n as NAME`, ` whole` and ` contiguous`, as canonical text
        writes them after the axes."""
        indexes = "" if self.indexes is None else f" indexes {self.indexes}"
        same_n = "" if self.same_n_as is None else f" same n as {self.same_n_as}"
        return (
            indexes
            + same_n
            + (" whole" if self.whole else "")
            + (" contiguous" if self.contiguous else "")
        )


def default_axes(member_count: int, shape: tuple[int, ...]) -> tuple[str, ...]:
    """The order used where a binding has no `as [...]`: n, then c (several members), then array extents."""
    columns = ("c",) if member_count > 1 else ()
    return ("n", *columns, *(str(extent) for extent in shape))


def block_axes(binding: Binding, member: Member) -> tuple[str, ...]:
    """A binding's axis names given its first member (the checker's view, before resolution)."""
    if binding.axes is not None:
        return tuple(axis.text for axis in binding.axes)
    return default_axes(len(binding.member_names), member.shape)


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    bindings: tuple[Binding, ...]
    doc: str | None
    span: Span
    path: str

    @property
    def inputs(self) -> tuple[Binding, ...]:
        return tuple(b for b in self.bindings if b.direction is Direction.INPUT)

    @property
    def outputs(self) -> tuple[Binding, ...]:
        return tuple(b for b in self.bindings if b.direction is Direction.OUTPUT)


@dataclass(frozen=True, slots=True)
class Import:
    target: str  # as written, relative to the importing file
    span: Span


@dataclass(frozen=True, slots=True)
class SchemaFile:
    path: str  # as given to soagen, used in diagnostics and the generated header
    doc: str | None
    imports: tuple[Import, ...]
    layouts: tuple[Layout, ...]
    models: tuple[Model, ...]

    @property
    def module_name(self) -> str:
        stem = self.path.replace("\\", "/").rsplit("/", 1)[-1]
        return stem[: -len(".soa")] if stem.endswith(".soa") else stem


@dataclass(frozen=True, slots=True)
class Schema:
    """A checked schema file together with every file it imports, in dependency order."""

    root: SchemaFile
    files: tuple[SchemaFile, ...]  # dependencies first, root last
    # Resolved path of each import target, keyed by (importing file, target as written).
    import_paths: tuple[tuple[str, str, str], ...]
    # Every layout and model of every file by name, built once (read-only views).
    layouts: Mapping[str, Layout] = field(init=False, compare=False, repr=False)
    models: Mapping[str, Model] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        layouts = {layout.name: layout for f in self.files for layout in f.layouts}
        models = {model.name: model for f in self.files for model in f.models}
        object.__setattr__(self, "layouts", MappingProxyType(layouts))
        object.__setattr__(self, "models", MappingProxyType(models))

    def unknown_model(self, name: str, shown_path: str) -> str:
        """The error text for a `--model` this schema does not declare."""
        known = ", ".join(sorted(self.models))
        return f"{shown_path} has no model {name!r}; " + (
            f"its models are {known}" if known else "it declares no models"
        )
