"""Byte layout of a collection, exactly as CMSSW's GENERATE_SOA_LAYOUT places it. Pure functions, no torch.

Every member starts where the previous one ends; with `round_up(s, A) = ceil(s / A) * A`:
- a column of T takes `round_up(n * sizeof(T), A)` bytes (its pitch);
- a scalar of T takes `round_up(sizeof(T), A)` bytes whatever n is;
- an array column of k coefficients takes k column pitches, coefficient-major, in column-major order;
- a packed array column of k values takes one column pitch of k * sizeof(T) bytes per element
  (CMSSW's `SOA_COLUMN(edm::StdArray<T, k>, name)`), each element's values together, row-major.

So every offset, pitch and size is a sum of per-item-size pitches plus a constant. `Linear` keeps that
form symbolic: the generator prints it as closed-form code, `soagen show` evaluates it for one n.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass

from soagen.dsl.ir import AxisKind, Binding, Layout, Member, MemberKind


def round_up(size: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= `size`."""
    return -(-size // multiple) * multiple


def layout_key(layout: Layout) -> str:
    """A digest of everything that places a layout's bytes or names them: the alignment and each
    member's kind, dtype, shape and name, in order. Collections and the blocks models bind carry
    it, so that a collection of another layout with the same name is refused, not misread."""
    text = "\n".join(
        [
            f"align {layout.align}",
            *(
                f"{member.kind.value} {member.dtype_name}{list(member.shape)} {member.name}"
                for member in layout.members
            ),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def column_pitch(n: int, itemsize: int, align: int) -> int:
    """Bytes between consecutive columns of one item size: CMSSW's padded column."""
    return round_up(n * itemsize, align)


@dataclass(frozen=True, slots=True)
class Linear:
    """`sum(coefficient * column_pitch(n, itemsize, align)) + constant` bytes."""

    terms: tuple[tuple[int, int], ...]  # (itemsize, coefficient), ascending itemsize, no zeros
    constant: int

    @staticmethod
    def of(terms: Iterable[tuple[int, int]], constant: int = 0) -> Linear:
        merged: dict[int, int] = {}
        for itemsize, coefficient in terms:
            merged[itemsize] = merged.get(itemsize, 0) + coefficient
        return Linear(tuple(sorted((s, c) for s, c in merged.items() if c)), constant)

    def __add__(self, other: Linear) -> Linear:
        return Linear.of(self.terms + other.terms, self.constant + other.constant)

    def evaluate(self, n: int, align: int) -> int:
        pitches = sum(c * column_pitch(n, s, align) for s, c in self.terms)
        return pitches + self.constant

    @property
    def itemsizes(self) -> tuple[int, ...]:
        return tuple(s for s, _ in self.terms)


ZERO = Linear((), 0)


def linear_text(form: Linear) -> str:
    """The form as an expression over `pitch_<itemsize>` names: `14 * pitch_4 + 128`. The generated
    code defines those names; `soagen show --ir` prints the same text as comments."""
    parts = [f"pitch_{s}" if c == 1 else f"{c} * pitch_{s}" for s, c in form.terms]
    if form.constant or not parts:
        parts.append(str(form.constant))
    return " + ".join(parts)


@dataclass(frozen=True, slots=True)
class Stride:
    """A stride in values: `coefficient * column_pitch(itemsize) / unit + constant`.

    The first part steps between coefficients of an array column or between columns of one block; the
    constant is 1 along elements (k for a packed column of k values), 0 for a broadcast scalar, a
    scalar pitch in values, or a step inside a packed element. `itemsize` is the size of the pitch's
    item, `unit` the size of one value: they differ for packed columns only.
    """

    itemsize: int
    coefficient: int
    constant: int
    unit: int = 0  # 0: the same as itemsize

    @property
    def value_size(self) -> int:
        return self.unit or self.itemsize

    @property
    def name(self) -> str:
        """The generated code's name for one pitch in values: `stride_4`, or `stride_20_2` for a
        pitch of 20-byte items counted in 2-byte values."""
        if self.value_size == self.itemsize:
            return f"stride_{self.itemsize}"
        return f"stride_{self.itemsize}_{self.value_size}"

    def evaluate(self, n: int, align: int) -> int:
        return (
            self.coefficient * column_pitch(n, self.itemsize, align) // self.value_size
            + self.constant
        )


def stride_text(stride: Stride) -> str:
    """The stride as an expression over `stride_<itemsize>` names (a column pitch in values)."""
    parts = []
    if stride.coefficient:
        name = stride.name
        parts.append(name if stride.coefficient == 1 else f"{stride.coefficient} * {name}")
    if stride.constant or not parts:
        parts.append(str(stride.constant))
    return " + ".join(parts)


@dataclass(frozen=True, slots=True)
class ViewForm:
    """A tensor view of the buffer, symbolic in n: the generated code prints it, `show` evaluates it."""

    dtype: str
    shape: tuple[int | None, ...]  # None stands for n
    strides: tuple[Stride, ...]
    offset: Linear

    def evaluate(self, n: int, align: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        shape = tuple(n if extent is None else extent for extent in self.shape)
        strides = tuple(stride.evaluate(n, align) for stride in self.strides)
        return shape, strides, self.offset.evaluate(n, align)


def view_text(form: ViewForm) -> str:
    """`shape [n, 3], strides [1, stride_4], offset pitch_4`: the view in symbolic form."""
    shape = ", ".join("n" if extent is None else str(extent) for extent in form.shape)
    strides = ", ".join(stride_text(stride) for stride in form.strides)
    return f"shape [{shape}], strides [{strides}], offset {linear_text(form.offset)}"


def member_pitch(member: Member, align: int) -> Linear:
    if member.kind is MemberKind.SCALAR:
        return Linear((), round_up(member.itemsize, align))
    if member.packed:
        return Linear.of([(member.itemsize * member.coefficient_count, 1)])
    return Linear.of([(member.itemsize, member.coefficient_count)])


def member_offsets(layout: Layout) -> dict[str, Linear]:
    offsets: dict[str, Linear] = {}
    position = ZERO
    for member in layout.members:
        offsets[member.name] = position
        position = position + member_pitch(member, layout.align)
    return offsets


def byte_size(layout: Layout) -> Linear:
    total = ZERO
    for member in layout.members:
        total = total + member_pitch(member, layout.align)
    return total


def _array_strides(member: Member) -> list[Stride]:
    """Column-major (Eigen's default): extent k steps over the product of the extents before it.
    Packed: row-major inside the element (nested arrays), extent k steps over those after it."""
    if member.packed:
        return [
            Stride(member.itemsize, 0, math.prod(member.shape[axis + 1 :]))
            for axis in range(len(member.shape))
        ]
    return [
        Stride(member.itemsize, math.prod(member.shape[:axis]), 0)
        for axis in range(len(member.shape))
    ]


def _element_stride(member: Member) -> Stride:
    """From one element to the next: one value, or a packed element's k values."""
    return Stride(member.itemsize, 0, member.coefficient_count if member.packed else 1)


def member_view(layout: Layout, member: Member) -> ViewForm:
    """A column as [n], an array column as [n, *shape], a scalar as a 0-d tensor."""
    offset = member_offsets(layout)[member.name]
    if member.kind is MemberKind.SCALAR:
        return ViewForm(member.dtype_name, (), (), offset)
    return ViewForm(
        member.dtype_name,
        (None, *member.shape),
        (_element_stride(member), *_array_strides(member)),
        offset,
    )


def block_view(binding: Binding) -> ViewForm:
    """The one strided view of a resolved block: members adjacent, in order, of one dtype and shape."""
    layout, first = binding.layout, binding.first_member
    is_scalar = first.kind is MemberKind.SCALAR
    element = Stride(first.itemsize, 0, 0) if is_scalar else _element_stride(first)
    if is_scalar:
        between_members = Stride(
            first.itemsize, 0, round_up(first.itemsize, layout.align) // first.itemsize
        )
    elif first.packed:
        between_members = Stride(first.itemsize * first.coefficient_count, 1, 0, first.itemsize)
    else:
        between_members = Stride(first.itemsize, first.coefficient_count, 0)
    array_strides = iter(_array_strides(first))
    array_extents = iter(first.shape)
    shape: list[int | None] = []
    strides: list[Stride] = []
    for axis in binding.axis_names:
        if axis == AxisKind.ELEMENTS.value:
            shape.append(None)
            strides.append(element)
        elif axis == AxisKind.COLUMNS.value:
            shape.append(len(binding.member_names))
            strides.append(between_members)
        else:
            shape.append(next(array_extents))
            strides.append(next(array_strides))
    return ViewForm(
        first.dtype_name, tuple(shape), tuple(strides), member_offsets(layout)[first.name]
    )
