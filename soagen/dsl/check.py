"""Semantic checks. Each pass takes IR and returns diagnostics; none raises, so a run reports every problem.

Passes, in order: names (reserved words, duplicates), layouts (dtypes, shapes, alignment), models
(layouts and members exist, blocks are zero-copy, axis lists match, outputs are columns, the clauses
after a block name fitting inputs). The loader adds the import checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from soagen.dsl.diagnostics import Diagnostic, Span, did_you_mean
from soagen.dsl.dtypes import DTYPE_SPELLINGS, DTYPES, INTEGER_DTYPES
from soagen.dsl.ir import (
    AxisKind,
    Binding,
    Direction,
    Layout,
    Member,
    MemberKind,
    Model,
    SchemaFile,
    block_axes,
    default_axes,
)
from soagen.dsl.names import COLLECTION_ATTRIBUTES, is_python_keyword

# Builtins the generated module calls or names in annotations, and the `annotations` that its
# `from __future__ import annotations` binds (mypy refuses a class redefining it). A layout or model
# class of that name would shadow them for the whole module (`class property` breaks every later
# `@property`); a member of that name does the same inside its class body, which uses the two
# decorators.
MODULE_BUILTINS = frozenset(
    {"annotations", "dict", "int", "property", "staticmethod", "str", "tuple"}
)
CLASS_BODY_BUILTINS = frozenset({"property", "staticmethod"})

# Beyond these the generated arithmetic still works, but such a schema is a typo, not a design.
MAX_ALIGN = 1 << 20
MAX_COEFFICIENTS = 1 << 24


def _name_problems(
    name: str,
    span: Span,
    what: str,
    reserved: frozenset[str],
    builtins: frozenset[str] = frozenset(),
) -> list[Diagnostic]:
    if not name.isascii():
        return [
            Diagnostic(
                "SOA107",
                f"{what} `{name}` is not ASCII",
                span,
                "names use ASCII letters, digits and `_`",
            )
        ]
    if name.startswith("_"):
        return [
            Diagnostic(
                "SOA107",
                f"{what} `{name}` starts with `_`",
                span,
                "names starting with `_` are reserved for the generated code",
            )
        ]
    if is_python_keyword(name):
        return [
            Diagnostic(
                "SOA107", f"{what} `{name}` is a Python keyword", span, "choose another name"
            )
        ]
    if name in builtins:
        return [
            Diagnostic(
                "SOA108",
                f"{what} `{name}` would hide Python's `{name}`, which the generated code uses",
                span,
                "choose another name",
            )
        ]
    if name in reserved:
        return [
            Diagnostic(
                "SOA107",
                f"{what} `{name}` is reserved: every generated class has a member `{name}`",
                span,
                "choose another name",
            )
        ]
    return []


def check_names(schema_file: SchemaFile) -> list[Diagnostic]:
    """Reserved names, and duplicates among the layouts and models of one file and inside each."""
    problems: list[Diagnostic] = []
    seen: dict[str, Span] = {}
    declarations: list[Layout | Model] = [*schema_file.layouts, *schema_file.models]
    for declaration in declarations:
        what = "layout" if isinstance(declaration, Layout) else "model"
        problems += _name_problems(
            declaration.name, declaration.span, f"{what} name", frozenset(), MODULE_BUILTINS
        )
        if declaration.name in seen:
            problems.append(
                Diagnostic(
                    "SOA104",
                    f"`{declaration.name}` is declared twice",
                    declaration.span,
                    related=(("first declared", seen[declaration.name]),),
                )
            )
        else:
            seen[declaration.name] = declaration.span
    for layout in schema_file.layouts:
        members: dict[str, Span] = {}
        for member in layout.members:
            problems += _name_problems(
                member.name, member.span, "member", COLLECTION_ATTRIBUTES, CLASS_BODY_BUILTINS
            )
            if member.name in members:
                problems.append(
                    Diagnostic(
                        "SOA105",
                        f"`{layout.name}` declares `{member.name}` twice",
                        member.span,
                        related=(("first declared", members[member.name]),),
                    )
                )
            else:
                members[member.name] = member.span
    for model in schema_file.models:
        bindings: dict[str, Span] = {}
        for binding in model.bindings:
            problems += _name_problems(binding.name, binding.span, "binding", frozenset())
            if binding.name in bindings:
                problems.append(
                    Diagnostic(
                        "SOA106",
                        f"`{model.name}` declares `{binding.name}` twice",
                        binding.span,
                        related=(("first declared", bindings[binding.name]),),
                    )
                )
            else:
                bindings[binding.name] = binding.span
    return problems


def _check_member_type(member: Member) -> list[Diagnostic]:
    problems: list[Diagnostic] = []
    if member.dtype_name not in DTYPES:
        hint = (
            f"write `{DTYPE_SPELLINGS[member.dtype_name]}`"
            if member.dtype_name in DTYPE_SPELLINGS
            else did_you_mean(member.dtype_name, DTYPES)
        )
        known = ", ".join(DTYPES)
        problems.append(
            Diagnostic(
                "SOA101",
                f"unknown dtype `{member.dtype_name}`",
                member.dtype_span,
                hint or f"dtypes are {known}",
            )
        )
    if member.kind is MemberKind.SCALAR and member.shape:
        problems.append(
            Diagnostic(
                "SOA203",
                f"scalar `{member.name}` has an array shape",
                member.dtype_span,
                "scalars hold one value per collection; declare an array column instead",
            )
        )
    elif member.packed and not member.shape:
        problems.append(
            Diagnostic(
                "SOA205",
                f"packed column `{member.name}` has no array shape",
                member.dtype_span,
                f"`packed` stores each element's array values together; write "
                f"`column {member.dtype_name}[N] {member.name} packed`, or drop `packed`",
            )
        )
    elif any(extent <= 0 for extent in member.shape):
        problems.append(
            Diagnostic(
                "SOA203",
                f"array shape {list(member.shape)} of `{member.name}` has a zero or negative extent",
                member.dtype_span,
                "every extent must be at least 1",
            )
        )
    elif member.coefficient_count > MAX_COEFFICIENTS:
        problems.append(
            Diagnostic(
                "SOA204",
                f"array shape {list(member.shape)} of `{member.name}` has "
                f"{member.coefficient_count} values per element",
                member.dtype_span,
                f"at most {MAX_COEFFICIENTS} are allowed",
            )
        )
    return problems


def check_layout(layout: Layout) -> list[Diagnostic]:
    problems: list[Diagnostic] = []
    if not layout.members:
        problems.append(Diagnostic("SOA110", f"layout `{layout.name}` has no members", layout.span))
    for _, span in layout.align_statements[1:]:
        problems.append(
            Diagnostic(
                "SOA109",
                f"layout `{layout.name}` declares `align` more than once",
                span,
                related=(("first declared", layout.align_statements[0][1]),),
            )
        )
    for member in layout.members:
        problems += _check_member_type(member)
    align_span = layout.align_statements[0][1] if layout.align_statements else layout.span
    align = layout.align
    if align <= 0 or align & (align - 1):
        problems.append(
            Diagnostic(
                "SOA201",
                f"alignment {align} of `{layout.name}` is not a power of two",
                align_span,
                "CMSSW aligns columns to powers of two; 128 is its default",
            )
        )
    elif align > MAX_ALIGN:
        problems.append(
            Diagnostic(
                "SOA204", f"alignment {align} is too large", align_span, f"at most {MAX_ALIGN}"
            )
        )
    else:
        typed = [m for m in layout.members if m.dtype_name in DTYPES]
        largest = max(typed, key=lambda m: m.itemsize, default=None)
        if largest is not None and largest.itemsize > align:
            problems.append(
                Diagnostic(
                    "SOA202",
                    f"alignment {align} of `{layout.name}` is smaller than `{largest.name}` "
                    f"({largest.dtype_name}, {largest.itemsize} bytes)",
                    align_span,
                    f"use at least `align {largest.itemsize}`",
                )
            )
    return problems


def _check_block(binding: Binding, layout: Layout) -> list[Diagnostic]:
    """A block is one strided view: members exist, share dtype, shape and kind, adjacent and in order."""
    problems: list[Diagnostic] = []
    members: list[Member] = []
    seen: set[str] = set()
    for name, span in zip(binding.member_names, binding.member_spans, strict=True):
        member = layout.member(name)
        if member is None:
            hint = did_you_mean(name, [m.name for m in layout.members])
            problems.append(
                Diagnostic("SOA103", f"`{layout.name}` has no member `{name}`", span, hint)
            )
        elif name in seen:
            problems.append(Diagnostic("SOA305", f"block names `{name}` twice", span))
        else:
            seen.add(name)
            members.append(member)
    # A member of unknown dtype was reported by the layout check; comparing it would only repeat that.
    if problems or not members or any(m.dtype_name not in DTYPES for m in members):
        return problems
    first = members[0]
    for member, span in zip(members[1:], binding.member_spans[1:], strict=False):
        if member.kind is not first.kind:
            problems.append(
                Diagnostic(
                    "SOA306",
                    f"block mixes {first.kind.noun} `{first.name}` and {member.kind.noun} "
                    f"`{member.name}`",
                    span,
                    "a scalar broadcasts over elements and has its own pitch; bind scalars separately"
                    if MemberKind.SCALAR in (first.kind, member.kind)
                    else "a packed column keeps each element's values together, an array column "
                    "keeps each coefficient apart: one view cannot step over both; bind them "
                    "separately",
                )
            )
        elif member.dtype_name != first.dtype_name:
            problems.append(
                Diagnostic(
                    "SOA301",
                    f"block mixes dtypes: `{first.name}` is {first.dtype_name}, "
                    f"`{member.name}` is {member.dtype_name}",
                    span,
                    "one tensor has one dtype; bind these columns as separate inputs",
                )
            )
        elif member.shape != first.shape:
            problems.append(
                Diagnostic(
                    "SOA302",
                    f"block mixes shapes: `{first.name}` is {list(first.shape)}, "
                    f"`{member.name}` is {list(member.shape)}",
                    span,
                    "bind these columns as separate inputs",
                )
            )
    if problems:
        return problems
    positions = sorted(layout.index(m.name) for m in members)
    block_text = ", ".join(binding.member_names)
    if positions[-1] - positions[0] + 1 != len(positions):
        between = [
            m.name
            for m in layout.members[positions[0] : positions[-1] + 1]
            if m.name not in binding.member_names
        ]
        problems.append(
            Diagnostic(
                "SOA303",
                f"block `{layout.name}{{{block_text}}}` is not zero-copy: "
                f"{', '.join(f'`{n}`' for n in between)} "
                f"{'lies' if len(between) == 1 else 'lie'} between its columns",
                binding.member_spans[0],
                f"reorder the columns of {layout.name} so that {block_text} are adjacent",
            )
        )
    elif [layout.index(m.name) for m in members] != positions:
        in_order = ", ".join(layout.members[p].name for p in positions)
        problems.append(
            Diagnostic(
                "SOA304",
                f"block `{layout.name}{{{block_text}}}` lists its columns out of declaration order",
                binding.member_spans[0],
                f"write `{layout.name}{{{in_order}}}`, or reorder the columns of {layout.name}",
            )
        )
    if not problems:
        problems += _check_axes(binding, first)
    if binding.direction is Direction.OUTPUT and first.kind is MemberKind.SCALAR:
        # A scalar's view over n has stride 0: every element's output would land on one value.
        problems.append(
            Diagnostic(
                "SOA309",
                f"output `{binding.name}` binds scalar `{first.name}`, which holds one value per "
                "collection, not one per element",
                binding.member_spans[0],
                f"declare the outputs as columns (`column {first.dtype_name} {block_text}`); "
                "scalars can only be inputs",
            )
        )
    return problems


def _check_axes(binding: Binding, member: Member) -> list[Diagnostic]:
    if binding.axes is None:
        return []
    span = binding.axes_span or binding.span
    expected = default_axes(len(binding.member_names), member.shape)
    written = [axis.text for axis in binding.axes]
    example = "[" + ", ".join(expected) + "]"
    for axis in binding.axes:
        if axis.kind is AxisKind.UNKNOWN:
            return [
                Diagnostic(
                    "SOA307",
                    f"unknown axis `{axis.text}`",
                    axis.span,
                    f"axes are `n` (elements), `c` (columns of the block) or array extents, e.g. {example}",
                )
            ]
    for letter, meaning in (("n", "elements"), ("c", "columns")):
        hits = [axis for axis in binding.axes if axis.text == letter]
        if len(hits) > 1:
            return [
                Diagnostic("SOA307", f"axis `{letter}` ({meaning}) appears twice", hits[1].span)
            ]
    if "n" not in written:
        return [
            Diagnostic(
                "SOA307", "the axis list has no `n` (elements) axis", span, f"e.g. as {example}"
            )
        ]
    if len(binding.member_names) > 1 and "c" not in written:
        return [
            Diagnostic(
                "SOA307",
                f"the block has {len(binding.member_names)} columns but the axis list has no `c`",
                span,
                f"e.g. as {example}",
            )
        ]
    extents = [int(axis.text) for axis in binding.axes if axis.kind is AxisKind.ARRAY]
    if tuple(extents) != member.shape:
        shape_text = f"shape {list(member.shape)}" if member.shape else "no array shape"
        return [
            Diagnostic(
                "SOA307",
                f"the axis list has extents {extents} but `{member.name}` has {shape_text}",
                span,
                f"write the array extents in declared order, e.g. as {example}",
            )
        ]
    return []


def check_model(model: Model, layouts: dict[str, Layout]) -> list[Diagnostic]:
    problems: list[Diagnostic] = []
    if not model.inputs:
        problems.append(Diagnostic("SOA110", f"model `{model.name}` has no input", model.span))
    if not model.outputs:
        problems.append(Diagnostic("SOA110", f"model `{model.name}` has no output", model.span))
    for binding in model.bindings:
        layout = layouts.get(binding.layout_name)
        if layout is None:
            problems.append(
                Diagnostic(
                    "SOA102",
                    f"unknown layout `{binding.layout_name}`",
                    binding.layout_span,
                    did_you_mean(binding.layout_name, layouts)
                    or "declare it in this file or import the file that does",
                )
            )
            continue
        problems += _check_block(binding, layout)
    problems += _check_indexes(model, layouts)
    problems += _check_same_n(model)
    problems += _check_whole(model)
    problems += [
        Diagnostic(
            "SOA311",
            f"output `{binding.name}` declares `contiguous`: outputs are written into their "
            "columns, never copied in",
            binding.contiguous_span,
            "remove the clause",
        )
        for binding in model.outputs
        if binding.contiguous_span is not None
    ]
    return problems


def _check_indexes(model: Model, layouts: dict[str, Layout]) -> list[Diagnostic]:
    """`indexes NAME` names another input of the model, on an input block of integers."""
    problems: list[Diagnostic] = []
    inputs = [binding.name for binding in model.inputs]
    for binding in model.bindings:
        if binding.indexes is None or binding.indexes_span is None:
            continue
        span, target = binding.indexes_span, binding.indexes
        layout = layouts.get(binding.layout_name)
        member = layout.member(binding.member_names[0]) if layout is not None else None
        problem, hint = None, None
        if binding.direction is Direction.OUTPUT:
            problem = f"output `{binding.name}` declares `indexes`: only inputs are checked"
            hint = "remove the clause"
        elif target == binding.name:
            problem = f"input `{binding.name}` cannot index itself"
            hint = "name the input whose elements its values number"
        elif target not in inputs:
            problem = f"model `{model.name}` has no input `{target}` for `{binding.name}` to index"
            others = [name for name in inputs if name != binding.name]
            hint = did_you_mean(target, others) or f"its inputs are {', '.join(inputs)}"
        elif member is not None and member.dtype_name not in INTEGER_DTYPES:
            problem = (
                f"input `{binding.name}` holds {member.dtype_name}, not integers: it cannot "
                "index elements"
            )
            hint = "bind integer columns, or remove the clause"
        if problem is not None:
            problems.append(Diagnostic("SOA310", problem, span, hint))
    return problems


def _same_n_target(model: Model, binding: Binding) -> Binding | None:
    """The input a `same n as` clause names, where the clause is valid (SOA312 reports the rest)."""
    if binding.direction is Direction.OUTPUT or binding.same_n_as in (None, binding.name):
        return None
    target = next((b for b in model.inputs if b.name == binding.same_n_as), None)
    if target is None or target.layout_name == binding.layout_name:
        return None
    return target


def _check_same_n(model: Model) -> list[Diagnostic]:
    """`same n as NAME` names another input of the model, bound to another layout."""
    problems: list[Diagnostic] = []
    inputs = [binding.name for binding in model.inputs]
    outputs = [binding.name for binding in model.outputs]
    for binding in model.bindings:
        if binding.same_n_as is None or binding.same_n_as_span is None:
            continue
        target = binding.same_n_as
        problem, hint = None, None
        if binding.direction is Direction.OUTPUT:
            problem = (
                f"output `{binding.name}` declares `same n as`: only inputs are checked, an "
                "output's size is its collection's"
            )
            hint = "remove the clause"
        elif target == binding.name:
            problem = f"input `{binding.name}` cannot share its element count with itself"
            hint = "name the input whose collection holds as many elements"
        elif target in outputs:
            problem = f"`{target}` is an output of model `{model.name}`: `same n as` names an input"
            hint = "name the input whose collection holds as many elements"
        elif target not in inputs:
            problem = (
                f"model `{model.name}` has no input `{target}` for `{binding.name}` to share its "
                "element count with"
            )
            others = [name for name in inputs if name != binding.name]
            hint = did_you_mean(target, others) or f"its inputs are {', '.join(inputs)}"
        else:
            other = next(b for b in model.inputs if b.name == target)
            if other.layout_name == binding.layout_name:
                problem = (
                    f"`{binding.name}` and `{target}` both bind `{binding.layout_name}`: one "
                    "collection, which shares its element count already"
                )
                hint = "remove the clause"
        if problem is not None:
            problems.append(Diagnostic("SOA312", problem, binding.same_n_as_span, hint))
    return problems


def _check_whole(model: Model) -> list[Diagnostic]:
    """`whole` on inputs only, on all inputs of one layout or none, and on both ends of a
    `same n as` or neither: a slice of one and the whole of the other differ in size."""
    problems = [
        Diagnostic(
            "SOA313",
            f"output `{binding.name}` declares `whole`: a `batch_size` call slices every output "
            "with its inputs",
            binding.whole_span,
            "remove the clause",
        )
        for binding in model.outputs
        if binding.whole_span is not None
    ]
    first_of_layout: dict[str, Binding] = {}
    for binding in model.inputs:
        first = first_of_layout.setdefault(binding.layout_name, binding)
        if first.whole != binding.whole:
            whole, sliced = (first, binding) if first.whole else (binding, first)
            problems.append(
                Diagnostic(
                    "SOA313",
                    f"`{whole.name}` is `whole` but `{sliced.name}` is not, and both bind "
                    f"`{binding.layout_name}`: one collection is either sliced or passed whole",
                    binding.whole_span or binding.span,
                    f"write `whole` on every input of `{binding.layout_name}` in `{model.name}`, "
                    "or on none",
                    related=(("the other one", first.whole_span or first.span),),
                )
            )
    for binding in model.inputs:
        target = _same_n_target(model, binding)
        if target is None or target.whole == binding.whole or binding.same_n_as_span is None:
            continue
        whole, sliced = (binding, target) if binding.whole else (target, binding)
        problems.append(
            Diagnostic(
                "SOA313",
                f"`{binding.name}` has the same n as `{target.name}`, but `{whole.name}` is "
                f"`whole` and `{sliced.name}` is sliced: a slice would no longer match the whole",
                binding.same_n_as_span,
                f"write `whole` on both `{binding.name}` and `{target.name}`, or on neither",
            )
        )
    return problems


def check_block_names(
    models: Iterable[Model], layouts: dict[str, Layout] | None = None
) -> list[Diagnostic]:
    """Blocks are reachable by binding name from their layout, so one name means one block per layout."""
    problems: list[Diagnostic] = []
    seen: dict[tuple[str, str], Binding] = {}
    layouts = layouts or {}
    for model in models:
        in_model: set[str] = set()
        for binding in model.bindings:
            if binding.name in in_model:
                continue  # the same name twice in one model is SOA106 already
            in_model.add(binding.name)
            key = (binding.layout_name, binding.name)
            earlier = seen.get(key)
            if earlier is None:
                seen[key] = binding
            elif (earlier.member_names, _axes_text(earlier, layouts)) != (
                binding.member_names,
                _axes_text(binding, layouts),
            ):
                problems.append(
                    Diagnostic(
                        "SOA308",
                        f"`{binding.name}` names two different blocks of `{binding.layout_name}`",
                        binding.span,
                        "give one of the bindings another name",
                        related=(("the other one", earlier.span),),
                    )
                )
    return problems


def _axes_text(binding: Binding, layouts: dict[str, Layout]) -> tuple[str, ...] | None:
    """The axes a block really has: `as [n, c]` and no `as` at all are the same block."""
    layout = layouts.get(binding.layout_name)
    first = layout.member(binding.member_names[0]) if layout is not None else None
    if first is not None:
        return block_axes(binding, first)
    return None if binding.axes is None else tuple(axis.text for axis in binding.axes)


def resolve_file(schema_file: SchemaFile, visible_layouts: Mapping[str, Layout]) -> SchemaFile:
    """A valid file (`check_file` found nothing) with every binding resolved: the layout its block
    lies in and its members, looked up here once for every later stage."""
    models = []
    for model in schema_file.models:
        bindings = []
        for binding in model.bindings:
            layout = visible_layouts[binding.layout_name]
            members = tuple(layout.members[layout.index(name)] for name in binding.member_names)
            bindings.append(
                dataclasses.replace(binding, resolved_layout=layout, resolved_members=members)
            )
        models.append(dataclasses.replace(model, bindings=tuple(bindings)))
    return dataclasses.replace(schema_file, models=tuple(models))


def check_file(schema_file: SchemaFile, visible_layouts: dict[str, Layout]) -> list[Diagnostic]:
    """Every pass over one file; `visible_layouts` holds its own layouts and the imported ones."""
    problems = check_names(schema_file)
    for layout in schema_file.layouts:
        problems += check_layout(layout)
    for model in schema_file.models:
        problems += check_model(model, visible_layouts)
    problems += check_block_names(schema_file.models, visible_layouts)
    return problems
