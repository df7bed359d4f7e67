"""IR to Python: one module per schema file, from `templates/module.py.jinja`.

Everything the template prints is decided here, as plain strings and lists, so the template holds only
loops and lookups. Output depends on the schema alone: same input, same bytes.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass

import soagen
from soagen.dsl.ir import Binding, Layout, MemberKind, Model, Schema, SchemaFile
from soagen.dsl.layout import (
    Linear,
    Stride,
    ViewForm,
    block_view,
    byte_size,
    layout_key,
    linear_text,
    member_offsets,
    member_view,
    stride_text,
)
from soagen.dsl.names import to_snake_case
from soagen.generator.pyformat import (
    INDENT,
    Call,
    Expression,
    Parenthesized,
    Subscript,
    assignment,
    class_header,
    comment_text,
    docstring,
    function_header,
    import_from,
    render,
    string_literal,
    tuple_literal,
)
from soagen.generator.rendering import environment

RUNTIME = "_soagen"  # how generated modules name `soagen.runtime`


@dataclass(frozen=True, slots=True)
class Function:
    """A generated static method: its pitch and stride definitions, then its result."""

    name: str
    returns: str
    doc: str
    definitions: tuple[str, ...]
    body: tuple[str, ...]  # lines of the return statement, indented

    @property
    def header(self) -> str:
        return function_header(self.name, ["n: int"], self.returns, INDENT)


@dataclass(frozen=True, slots=True)
class Accessor:
    name: str
    doc: str

    @property
    def header(self) -> str:
        return function_header(self.name, ["self"], "_torch.Tensor", INDENT)

    @property
    def body(self) -> str:
        return render(Call("self._member", (string_literal(self.name),)), INDENT * 2, "return ")


@dataclass(frozen=True, slots=True)
class LayoutModel:
    name: str
    doc: str
    class_attributes: tuple[str, ...]
    functions: tuple[Function, ...]
    blocks: tuple[str, ...]
    accessors: tuple[Accessor, ...]

    @property
    def header(self) -> str:
        return class_header(self.name, f"{RUNTIME}.Collection")

    @property
    def blocks_lines(self) -> tuple[str, ...]:
        """The `BLOCKS` attribute, as ruff formats it: `{}` alone when the file binds none."""
        annotation = f"{INDENT}BLOCKS: _typing.ClassVar[dict[str, {RUNTIME}.BlockSpec]] = "
        if not self.blocks:
            return (annotation + "{}",)
        return (annotation + "{", *self.blocks, INDENT + "}")


@dataclass(frozen=True, slots=True)
class ModelModel:
    name: str
    doc: str
    class_attributes: tuple[str, ...]
    functions: tuple[Function, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    call: tuple[str, ...]  # the typed `__call__` method, line by line

    @property
    def header(self) -> str:
        return class_header(self.name, f"{RUNTIME}.ModelBinding")


class _Symbols:
    """Collects the pitch and stride names an expression uses, to define exactly those."""

    def __init__(self, align: int) -> None:
        self.align = align
        self.pitches: set[int] = set()
        # (pitch item size, value size) of each stride name used.
        self.strides: set[tuple[int, int]] = set()

    def linear(self, form: Linear) -> str:
        self.pitches.update(form.itemsizes)
        return linear_text(form)

    def stride(self, stride: Stride) -> str:
        if stride.coefficient:
            self.pitches.add(stride.itemsize)
            self.strides.add((stride.itemsize, stride.value_size))
        return stride_text(stride)

    def view(self, form: ViewForm) -> Call:
        shape = tuple_literal(["n" if extent is None else str(extent) for extent in form.shape])
        strides = tuple_literal([self.stride(stride) for stride in form.strides])
        return Call(
            f"{RUNTIME}.StridedView",
            (
                string_literal(form.dtype),
                shape if form.shape else "()",
                strides if form.strides else "()",
                self.linear(form.offset),
            ),
        )

    def definitions(self) -> tuple[str, ...]:
        # Pitches are CMSSW's padded column sizes in bytes; strides the same in elements.
        lines = [
            f"pitch_{size} = (n * {size} + {self.align - 1}) // {self.align} * {self.align}"
            for size in sorted(self.pitches)
        ]
        lines += [
            f"{Stride(size, 1, 0, unit).name} = pitch_{size} // {unit}"
            for size, unit in sorted(self.strides)
        ]
        return tuple(lines)


_BODY = INDENT * 2  # statements inside a generated static method


def _dict_body(entries: list[tuple[str, str | Call]]) -> tuple[str, ...]:
    """`return {key: value, ...}`, one entry per line."""
    lines = [f"{_BODY}return {{"]
    for key, value in entries:
        # A sum (`2 * pitch_4 + 128`) after a long key breaks inside parentheses.
        shown = Parenthesized(value) if isinstance(value, str) and " " in value else value
        lines.append(render(shown, _BODY + INDENT, prefix=f"{string_literal(key)}: ", suffix=","))
    lines.append(f"{_BODY}}}")
    return tuple(lines)


def _view_function(name: str, doc: str, align: int, form: ViewForm) -> Function:
    symbols = _Symbols(align)
    body = render(symbols.view(form), _BODY, prefix="return ")
    return Function(
        name, f"{RUNTIME}.StridedView", doc, symbols.definitions(), tuple(body.split("\n"))
    )


def _member_doc(layout: Layout, name: str) -> str:
    member = layout.member(name)
    assert member is not None
    shape = "[n" + "".join(f", {extent}" for extent in member.shape) + "]"
    what = {
        MemberKind.SCALAR: "Scalar",
        MemberKind.PACKED: "Packed array column",
        MemberKind.COLUMN: "Array column" if member.shape else "Column",
    }[member.kind]
    view = "0-d view" if member.kind is MemberKind.SCALAR else f"{shape} view"
    summary = f"{what} `{member.name}`: {member.dtype_name}, a {view} of the buffer."
    return summary + (f"\n\n{member.doc}" if member.doc else "")


def _layout_doc(layout: Layout) -> str:
    rows = []
    for member in layout.members:
        shape = f"[{', '.join(map(str, member.shape))}]" if member.shape else ""
        packed = " packed" if member.packed else ""
        rows.append(f"    {member.name}: {member.kind.keyword} {member.dtype_name}{shape}{packed}")
    header = layout.doc or f"The {layout.name} collection."
    return (
        f"{header}\n\nMembers, in CMSSW GENERATE_SOA_LAYOUT order (align {layout.align}):\n"
        + "\n".join(rows)
    )


def _block_spec(binding: Binding, view: str) -> Call:
    layout = binding.layout
    return Call(
        f"{RUNTIME}.BlockSpec",
        (
            string_literal(binding.name),
            string_literal(layout.name),
            tuple_literal([string_literal(name) for name in binding.member_names]),
            string_literal(binding.first_member.dtype_name),
            tuple_literal([string_literal(axis) for axis in binding.axis_names]),
            view,
            string_literal(layout_key(layout)),
        ),
    )


def _layout_model(layout: Layout, schema_file: SchemaFile) -> LayoutModel:
    align = layout.align
    offsets_symbols = _Symbols(align)
    offsets = member_offsets(layout)
    offsets_entries: list[tuple[str, str | Call]] = [
        (name, offsets_symbols.linear(offset)) for name, offset in offsets.items()
    ]
    size_symbols = _Symbols(align)
    size_expression = size_symbols.linear(byte_size(layout))
    views_symbols = _Symbols(align)
    view_entries: list[tuple[str, str | Call]] = [
        (member.name, views_symbols.view(member_view(layout, member))) for member in layout.members
    ]
    functions = [
        Function(
            "offsets",
            "dict[str, int]",
            "Byte offset of every member from the start of the buffer, for n elements.",
            offsets_symbols.definitions(),
            _dict_body(offsets_entries),
        ),
        Function(
            "byte_size",
            "int",
            "Bytes of one buffer holding n elements: the sum of every member's pitch.",
            size_symbols.definitions(),
            (f"{_BODY}return {size_expression}",),
        ),
        Function(
            "member_views",
            f"dict[str, {RUNTIME}.StridedView]",
            "Geometry of every member's tensor view, for n elements.",
            views_symbols.definitions(),
            _dict_body(view_entries),
        ),
    ]
    blocks = []
    for binding in _blocks_of(layout, schema_file):
        function_name = f"_view_{binding.name}"
        functions.append(
            _view_function(
                function_name,
                f"Geometry of block `{binding.name}` for n elements.",
                align,
                block_view(binding),
            )
        )
        spec = _block_spec(binding, function_name)
        blocks.append(
            render(spec, INDENT * 2, prefix=f"{string_literal(binding.name)}: ", suffix=",")
        )
    members = [
        render(
            Call(
                f"{RUNTIME}.MemberSpec",
                (
                    string_literal(member.name),
                    string_literal(member.kind.value),
                    string_literal(member.dtype_name),
                    tuple_literal([str(extent) for extent in member.shape])
                    if member.shape
                    else "()",
                    string_literal(member.doc or ""),
                ),
            ),
            INDENT * 2,
            suffix=",",
        )
        for member in layout.members
    ]
    class_attributes = (
        *_name_and_schema(layout.name, schema_file),
        f"LAYOUT_KEY: _typing.ClassVar[str] = {string_literal(layout_key(layout))}",
        f"ALIGNMENT: _typing.ClassVar[int] = {align}",
        f"MEMBERS: _typing.ClassVar[tuple[{RUNTIME}.MemberSpec, ...]] = (\n"
        + "\n".join(members)
        + f"\n{INDENT})",
    )
    accessors = tuple(
        Accessor(member.name, _member_doc(layout, member.name)) for member in layout.members
    )
    return LayoutModel(
        layout.name,
        docstring(_layout_doc(layout), INDENT),
        class_attributes,
        tuple(functions),
        tuple(blocks),
        tuple(Accessor(a.name, docstring(a.doc, INDENT * 2)) for a in accessors),
    )


def _name_and_schema(name: str, schema_file: SchemaFile) -> tuple[str, str]:
    """The NAME and SCHEMA class attributes (printed after one indent by the template)."""
    name_line, schema_line = (
        # The template indents the first line; the rest carry their own indentation.
        assignment(f"{attribute}: _typing.ClassVar[str]", string_literal(value), INDENT)[
            len(INDENT) :
        ]
        for attribute, value in (("NAME", name), ("SCHEMA", schema_file.path))
    )
    return name_line, schema_line


def _blocks_of(layout: Layout, schema_file: SchemaFile) -> list[Binding]:
    """Blocks of `layout` declared in its own file, once per name (the checker made duplicates equal)."""
    seen: dict[str, Binding] = {}
    for model in schema_file.models:
        for binding in model.bindings:
            if binding.layout_name == layout.name and binding.name not in seen:
                seen[binding.name] = binding
    return list(seen.values())


def _model_model(model: Model, schema: Schema, schema_file: SchemaFile) -> ModelModel:
    functions = []
    specs: dict[str, list[str]] = {"input": [], "output": []}
    local_layouts = {layout.name for layout in schema_file.layouts}
    for binding in model.bindings:
        layout = binding.layout
        if binding.layout_name in local_layouts:
            block: Expression = Subscript(
                f"{binding.layout_name}.BLOCKS", (string_literal(binding.name),)
            )
        else:
            # A layout from another file: its class knows only the blocks of its own file.
            function_name = f"_view_{binding.name}"
            functions.append(
                _view_function(
                    function_name,
                    f"Geometry of block `{binding.name}` of {layout.name} for n elements.",
                    layout.align,
                    block_view(binding),
                )
            )
            block = _block_spec(binding, function_name)
        indexes = () if binding.indexes is None else (f"indexes={string_literal(binding.indexes)}",)
        same_n_as = (
            () if binding.same_n_as is None else (f"same_n_as={string_literal(binding.same_n_as)}",)
        )
        whole = ("whole=True",) if binding.whole else ()
        contiguous = ("contiguous=True",) if binding.contiguous else ()
        spec = Call(
            f"{RUNTIME}.BindingSpec",
            (
                string_literal(binding.name),
                string_literal(binding.direction.value),
                block,
                *indexes,
                *same_n_as,
                *whole,
                *contiguous,
            ),
        )
        specs[binding.direction.value].append(render(spec, INDENT * 2, suffix=","))
    class_attributes = _name_and_schema(model.name, schema_file)
    doc = model.doc or f"Binds the inputs and outputs of model {model.name} to SoA blocks."
    return ModelModel(
        model.name,
        docstring(doc, INDENT),
        class_attributes,
        tuple(functions),
        tuple(specs["input"]),
        tuple(specs["output"]),
        _call_method(model, schema),
    )


# Names the typed `__call__` uses itself, or that its annotations read from the module.
_CALL_NAMES = frozenset({"self", "out", "stream", "batch_size", "object", "int", "None"})


def _parameter_name(layout_name: str, taken: set[str]) -> str:
    """`EdgeScores` -> `edge_scores`, made unique and never a keyword or a name the call needs."""
    name = to_snake_case(layout_name)
    while keyword.iskeyword(name) or name in _CALL_NAMES or name in taken:
        name += "_"
    taken.add(name)
    return name


def _call_method(model: Model, schema: Schema) -> tuple[str, ...]:
    """`__call__` with one typed parameter per input layout (schema order) and `out=` typed by the
    output layouts, so a type checker catches a collection passed in the wrong place."""
    body = INDENT * 2
    # Class names the module defines or imports must stay visible in the annotations.
    taken = set(schema.layouts) | set(schema.models)
    inputs = list(
        dict.fromkeys(b.layout_name for b in model.bindings if b.direction.value == "input")
    )
    outputs = list(
        dict.fromkeys(b.layout_name for b in model.bindings if b.direction.value == "output")
    )
    parameters = {layout: _parameter_name(layout, taken) for layout in inputs}
    out_type: Expression
    out_of: dict[str, Expression]
    unpack: list[str] = []
    if len(outputs) == 1:
        out_type = outputs[0]
        out_of = {outputs[0]: "out"}
    else:
        out_type = Subscript("tuple", tuple(outputs))
        # Checked by the runtime: a lone collection or a tuple of another length gets a
        # BindingError naming the layouts, not an IndexError.
        unpack = [
            render(
                Call(
                    "self._unpack_out",
                    ("out", tuple_literal([string_literal(layout) for layout in outputs])),
                ),
                body,
                "_outputs = ",  # `_`: no parameter (a layout's name in snake case) can clash
            )
        ]
        out_of = {
            layout: Subscript("_outputs", (str(position),))
            for position, layout in enumerate(outputs)
        }
    lines = [
        f"{INDENT}def __call__(",
        f"{body}self,",
        *(f"{body}{parameters[layout]}: {layout}," for layout in inputs),
        f"{body}*,",
        render(out_type, body, "out: ", ","),
        f"{body}stream: object | None = None,",
        f"{body}batch_size: int | None = None,",
        f"{INDENT}) -> None:",
    ]
    bound = []
    for b in model.bindings:
        axes = ", ".join(b.axis_names)
        members = ", ".join(b.member_names)
        bound.append(
            f"{b.direction.value} {b.name}: {b.layout_name}{{{members}}} as [{axes}]"
            + b.trailing_clauses
        )
        # The binding's `///` doc, indented under its line as a member's doc follows its summary.
        bound += [f"{INDENT}{line}" for line in (b.doc.split("\n") if b.doc else [])]
    doc = (
        f"Run {model.name} on zero-copy views of the inputs; write its outputs into `out`.\n\n"
        + "\n".join(bound)
        + "\n\n`stream`: a CUDA stream instead of the current one.\n"
        + _batching_doc(model)
    )
    lines.append(docstring(doc, body))
    lines += unpack
    # One collection per binding, inputs then outputs in schema order (`_call_in_schema_order`),
    # the order the docstring lists them in.
    lines += [f"{body}self._call_in_schema_order(", f"{body}{INDENT}("]
    for direction, collections in (("input", parameters), ("output", out_of)):
        for b in model.bindings:
            if b.direction.value == direction:
                lines.append(render(collections[b.layout_name], body + INDENT * 2, "", ","))
    lines += [
        f"{body}{INDENT}),",
        f"{body}{INDENT}stream,",
        f"{body}{INDENT}batch_size,",
        f"{body})",
    ]
    return tuple(lines)


def _batching_doc(model: Model) -> str:
    """What `batch_size` does for this model: it slices every input not declared `whole` and
    every output, and is refused where an index input indexes a sliced input, since its values
    count elements of the whole collection."""
    whole = [b.name for b in model.inputs if b.whole]
    refused = [b.name for b in model.inputs if b.indexes is not None and b.indexes not in whole]
    if refused:
        return (
            f"`batch_size`: refused: the index input(s) {', '.join(refused)} number\n"
            "elements of inputs a slice would cut; declare those inputs `whole`."
        )
    if whole:
        return (
            "`batch_size`: run in aligned slices of at most this many elements; the whole\n"
            f"input(s) {', '.join(whole)} go entire to every slice (every other collection\n"
            "of the call must then have the same size)."
        )
    return (
        "`batch_size`: run in aligned slices of at most this many elements (every\n"
        "collection of the call must then have the same size)."
    )


def generate_module(schema: Schema, schema_file: SchemaFile) -> str:
    """The Python module for one file of a checked schema."""
    # Layouts of imported files are imported, not copied (one class per layout), and re-exported.
    imports: dict[str, list[str]] = {}
    for source, _, resolved in schema.import_paths:
        if source != schema_file.path:
            continue
        imported = next(f for f in schema.files if f.path == resolved)
        names = sorted(layout.name for layout in imported.layouts)
        if names:
            imports[imported.module_name] = names
    import_lines = [import_from(f".{module}", names) for module, names in sorted(imports.items())]
    module_doc = (
        schema_file.doc or f"Collections and model bindings generated from {schema_file.path}."
    )
    declared = [layout.name for layout in schema_file.layouts] + [
        model.name for model in schema_file.models
    ]
    exported = sorted(declared + [name for names in imports.values() for name in names])
    text = (
        environment()
        .get_template("module.py.jinja")
        .render(
            version=soagen.__version__,
            source=comment_text(schema_file.path),
            module_doc=docstring(module_doc, ""),
            # A blank line before the imports of other generated modules, where there are any.
            imports=["", *import_lines] if import_lines else [],
            exported=_list_lines("__all__", [string_literal(name) for name in exported]),
            layouts=[_layout_model(layout, schema_file) for layout in schema_file.layouts],
            models=[_model_model(model, schema, schema_file) for model in schema_file.models],
            runtime=RUNTIME,
        )
    )
    return text.rstrip("\n") + "\n"


def _list_lines(name: str, items: list[str]) -> list[str]:
    """`name = [...]`, one item a line, as ruff formats it (`[]` alone when empty)."""
    if not items:
        return [f"{name} = []"]
    return [f"{name} = [", *(f"{INDENT}{item}," for item in items), "]"]


def generate(schema: Schema) -> dict[str, str]:
    """Module name to source, for the root file and every file it imports."""
    return {f.module_name: generate_module(schema, f) for f in schema.files}
