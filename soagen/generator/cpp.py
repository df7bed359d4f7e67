"""IR to C++: one CMSSW header per schema file, from `templates/header.h.jinja`.

Each layout becomes `GENERATE_SOA_LAYOUT(<Name>Layout, ...)`, whose byte layout is the one
`soagen.dsl.layout` computes, and an alias with the layout's alignment; each model a struct of
constexpr tables naming its bindings. Everything the template prints is decided here, so the template
holds only loops and lookups, and the output depends on the schema alone: same input, same bytes.

`cpp_problems` is what the C++ target refuses on top of the schema checker (SOA5xx): a schema a Python
user generates may still hold things C++ cannot, and only `--lang cpp` reports them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

import soagen
from soagen.dsl.diagnostics import Diagnostic, Span
from soagen.dsl.dtypes import DTYPES
from soagen.dsl.ir import Layout, Member, MemberKind, Model, Schema, SchemaFile
from soagen.generator.rendering import environment

# The C++ type of each dtype a CMSSW column can hold; fixed-width integers from <cstdint>.
CPP_TYPES: dict[str, str] = {
    name: dtype.cpp_name for name, dtype in DTYPES.items() if dtype.cpp_name is not None
}

# C++20's keywords and alternative tokens: none of them can name a member.
CPP_KEYWORDS: frozenset[str] = frozenset(
    """
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
    char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
    co_return co_yield decltype default delete do double dynamic_cast else enum explicit export
    extern false float for friend goto if inline int long mutable namespace new noexcept not not_eq
    nullptr operator or or_eq private protected public register reinterpret_cast requires return
    short signed sizeof static static_assert static_cast struct switch template this thread_local
    throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t while
    xor xor_eq
    """.split()
)

# What CMSSW's macros declare for each member `NAME` besides NAME itself, in the layout class
# (SoALayout.h): its field `NAME_`, so a member name ending in `_` gives a reserved `NAME__`.
# (Its other fields add a suffix to that `NAME_` too: such a clash needs that trailing `_`.)
_MEMBER_DERIVED = ("{}_",)

SOA_LAYOUT_HEADER = '"DataFormats/SoATemplate/interface/SoALayout.h"'
STD_ARRAY_HEADER = '"DataFormats/Common/interface/StdArray.h"'
INDENT = "  "  # CMSSW's clang-format style


def reserved_reason(identifier: str) -> str | None:
    """Why C++ reserves `identifier` (for the implementation), or None."""
    if "__" in identifier:
        return "holds a double underscore"
    if re.match(r"_[A-Z]", identifier):
        return "starts with an underscore and a capital letter"
    return None


def layout_class(layout: Layout) -> str:
    return f"{layout.name}Layout"


def layout_alias(layout: Layout) -> str:
    """CMSSW's convention: `TestSoA = TestSoALayout<>`, `ParticleSoA = ParticleLayout<>`."""
    return layout.name if layout.name.endswith("SoA") else f"{layout.name}SoA"


def type_alias(layout: Layout, member: Member) -> str:
    """The `using` alias of an array or packed member's type, so no macro argument holds a comma."""
    return f"{layout.name}_{member.name}_t"


def bindings_struct(model: Model) -> str:
    return f"{model.name}Bindings"


def binding_struct(name: str) -> str:
    # A suffix, so no binding struct can take the name of the struct's own `names` table.
    return f"{name}_binding"


def _member_type(member: Member) -> str:
    scalar = CPP_TYPES[member.dtype_name]
    if member.kind is MemberKind.PACKED:
        # Row-major, as soagen stores a packed element's values: the last extent varies fastest.
        inner = scalar
        for extent in reversed(member.shape):
            inner = f"edm::StdArray<{inner}, {extent}>"
        return inner
    rows, columns = (*member.shape, 1)[:2]
    # Eigen's default storage is column-major, as soagen's array columns are.
    return f"Eigen::Matrix<{scalar}, {rows}, {columns}>"


# --- what C++ refuses ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Declared:
    """An identifier a header declares, the schema name it comes from and where that name is."""

    identifier: str
    origin: str
    span: Span


def _global_declarations(schema_file: SchemaFile) -> Iterator[_Declared]:
    for layout in schema_file.layouts:
        yield _Declared(layout_class(layout), f"layout `{layout.name}`", layout.span)
        yield _Declared(layout_alias(layout), f"layout `{layout.name}`", layout.span)
        for member in layout.members:
            if member.shape:
                origin = f"member `{member.name}` of `{layout.name}`"
                yield _Declared(type_alias(layout, member), origin, member.span)
    for model in schema_file.models:
        yield _Declared(bindings_struct(model), f"model `{model.name}`", model.span)


def _member_declarations(layout: Layout) -> Iterator[_Declared]:
    for member in layout.members:
        origin = f"member `{member.name}`"
        yield _Declared(member.name, origin, member.span)
        for form in _MEMBER_DERIVED:
            yield _Declared(form.format(member.name), origin, member.span)


def _binding_declarations(model: Model) -> Iterator[_Declared]:
    for binding in model.bindings:
        yield _Declared(binding_struct(binding.name), f"binding `{binding.name}`", binding.span)


def _name_problems(declared: list[_Declared]) -> list[Diagnostic]:
    """Reserved identifiers, and identifiers declared twice in one scope."""
    problems: list[Diagnostic] = []
    first: dict[str, _Declared] = {}
    for entry in declared:
        reason = reserved_reason(entry.identifier)
        if reason is not None:
            problems.append(
                Diagnostic(
                    "SOA503",
                    f"{entry.origin} gives the C++ identifier `{entry.identifier}`, which {reason}: "
                    "C++ reserves it",
                    entry.span,
                    "rename it: no `__`, no trailing `_`, no leading `_` and capital",
                )
            )
            continue
        earlier = first.setdefault(entry.identifier, entry)
        if earlier is not entry and earlier.origin != entry.origin:
            problems.append(
                Diagnostic(
                    "SOA503",
                    f"{entry.origin} and {earlier.origin} both give the C++ name "
                    f"`{entry.identifier}`",
                    entry.span,
                    "rename one of them",
                    related=(("the other one", earlier.span),),
                )
            )
    return problems


def cpp_problems(schema: Schema) -> list[Diagnostic]:
    """What the C++ header of each file of a checked schema cannot hold (SOA501-SOA503)."""
    problems: list[Diagnostic] = []
    for schema_file in schema.files:
        for layout in schema_file.layouts:
            for member in layout.members:
                if member.dtype_name not in CPP_TYPES:
                    problems.append(
                        Diagnostic(
                            "SOA501",
                            f"`{member.name}` is {member.dtype_name}, which a CMSSW column "
                            "cannot hold in standard C++",
                            member.dtype_span,
                            "use float32, or uint16 holding the raw bits",
                        )
                    )
                if len(member.shape) > 2:
                    what = "packed column" if member.packed else "array column"
                    problems.append(
                        Diagnostic(
                            "SOA502",
                            f"{what} `{member.name}` has rank {len(member.shape)} "
                            f"({list(member.shape)}): C++ columns hold at most 2 extents",
                            member.dtype_span,
                            "flatten the extents after the first, e.g. "
                            f"[{member.shape[0]}, {math.prod(member.shape[1:])}]",
                        )
                    )
                if member.name in CPP_KEYWORDS:
                    problems.append(
                        Diagnostic(
                            "SOA503",
                            f"member `{member.name}` is a C++ keyword",
                            member.span,
                            "choose another name",
                        )
                    )
            problems += _name_problems(list(_member_declarations(layout)))
        for model in schema_file.models:
            problems += _name_problems(list(_binding_declarations(model)))
    # Every header of a schema can end up in one translation unit: one global scope.
    problems += _name_problems([d for f in schema.files for d in _global_declarations(f)])
    return sorted(dict.fromkeys(problems), key=Diagnostic.sort_key)


# --- view models ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LayoutModel:
    doc: tuple[str, ...]
    type_aliases: tuple[str, ...]  # `using ... = ...;` lines
    class_name: str
    members: tuple[str, ...]  # the macro's argument lines, doc lines included, indented
    alias: str


@dataclass(frozen=True, slots=True)
class BindingModel:
    struct: str
    doc: tuple[str, ...]
    lines: tuple[str, ...]  # the struct's body


@dataclass(frozen=True, slots=True)
class ModelModel:
    doc: tuple[str, ...]
    struct: str
    bindings: tuple[BindingModel, ...]
    names: str


def comment_lines(text: str | None) -> tuple[str, ...]:
    """Doc text as the lines of `///` comments: each non-printable character (line breaks and
    other controls, which would end the comment) written as an escape, and a `\\` at a line's end,
    which would splice the next line into the comment, followed by `//`."""
    if not text:
        return ()
    lines = []
    for line in text.split("\n"):
        shown = "".join(c if c.isprintable() or c == "\t" else _escape(c) for c in line)
        lines.append(f"{shown} //" if shown.endswith("\\") else shown)
    return tuple(lines)


def _escape(character: str) -> str:
    code = ord(character)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )


def _doc_comments(text: str | None, indent: str, marker: str = "///") -> list[str]:
    """`///` doc lines (`//!` for the file's own doc, as the schema writes them)."""
    return [
        f"{indent}{marker}{' ' if line else ''}{line}".rstrip(" ") for line in comment_lines(text)
    ]


def _string_array(values: tuple[str, ...]) -> str:
    items = ", ".join(f'"{value}"' for value in values)
    return f"std::array<std::string_view, {len(values)}>{{{items}}}"


def _layout_model(layout: Layout) -> LayoutModel:
    aliases = []
    arguments: list[str] = []
    for member in layout.members:
        arguments += _doc_comments(member.doc, INDENT)
        if member.kind is MemberKind.SCALAR:
            macro = f"SOA_SCALAR({CPP_TYPES[member.dtype_name]}, {member.name})"
        elif not member.shape:
            macro = f"SOA_COLUMN({CPP_TYPES[member.dtype_name]}, {member.name})"
        else:
            alias = type_alias(layout, member)
            aliases.append(f"using {alias} = {_member_type(member)};")
            kind = "SOA_COLUMN" if member.packed else "SOA_EIGEN_COLUMN"
            macro = f"{kind}({alias}, {member.name})"
        arguments.append(f"{INDENT}{macro},")
    arguments[-1] = arguments[-1].removesuffix(",")
    return LayoutModel(
        doc=tuple(_doc_comments(layout.doc, "")),
        type_aliases=tuple(aliases),
        class_name=layout_class(layout),
        members=tuple(arguments),
        alias=f"using {layout_alias(layout)} = {layout_class(layout)}<{layout.align}>;",
    )


def _model_model(model: Model) -> ModelModel:
    bindings = []
    for binding in model.bindings:
        layout = binding.layout
        lines = (
            f'static constexpr std::string_view name = "{binding.name}";',
            f'static constexpr std::string_view direction = "{binding.direction.value}";',
            f'static constexpr std::string_view layout = "{layout.name}";',
            f"using layout_type = {layout_alias(layout)};",
            f"static constexpr auto members = {_string_array(binding.member_names)};",
            f"static constexpr auto axes = {_string_array(binding.axis_names)};",
        )
        bindings.append(
            BindingModel(
                binding_struct(binding.name),
                tuple(_doc_comments(binding.doc, INDENT)),
                tuple(INDENT * 2 + line for line in lines),
            )
        )
    names = tuple(binding.name for binding in model.bindings)
    return ModelModel(
        doc=tuple(_doc_comments(model.doc, "")),
        struct=bindings_struct(model),
        bindings=tuple(bindings),
        names=f"{INDENT}static constexpr auto names = {_string_array(names)};",
    )


def _includes(schema: Schema, schema_file: SchemaFile) -> list[str]:
    members = [m for layout in schema_file.layouts for m in layout.members]
    # Imported headers first: one of them may include <Eigen/Core>, which must come before the
    # SoA headers.
    imported = [
        f'"{next(f for f in schema.files if f.path == resolved).module_name}.h"'
        for source, _, resolved in schema.import_paths
        if source == schema_file.path
    ]
    includes = ["<cstdint>"]
    if schema_file.models:
        includes += ["<array>", "<string_view>"]
    if any(m.shape and not m.packed for m in members):
        includes.append("<Eigen/Core>")
    includes += sorted(dict.fromkeys(imported))
    if any(m.packed for m in members):
        includes.append(STD_ARRAY_HEADER)
    includes.append(SOA_LAYOUT_HEADER)
    return includes


def generate_header(schema: Schema, schema_file: SchemaFile, namespace: str | None = None) -> str:
    """The C++ header for one file of a checked schema that `cpp_problems` accepts."""
    text = (
        environment()
        .get_template("header.h.jinja")
        .render(
            version=soagen.__version__,
            source="".join(comment_lines(schema_file.path)),
            options="" if namespace is None else f" --namespace {namespace}",
            file_doc=_doc_comments(schema_file.doc, "", "//!"),
            includes=_includes(schema, schema_file),
            namespace=namespace,
            layouts=[_layout_model(layout) for layout in schema_file.layouts],
            models=[_model_model(model) for model in schema_file.models],
        )
    )
    return text.rstrip("\n") + "\n"


def valid_namespace(namespace: str) -> bool:
    """`a` or `a::b`: identifiers, no keyword, none reserved."""
    parts = namespace.split("::")
    return all(
        re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part)
        and part not in CPP_KEYWORDS
        and reserved_reason(part) is None
        for part in parts
    )


def generate_cpp(schema: Schema, namespace: str | None = None) -> dict[str, str]:
    """Header stem to text, for the root file and every file it imports. The schema must be one
    `cpp_problems` accepts, and `namespace` (if any) one `valid_namespace` accepts."""
    if namespace is not None and not valid_namespace(namespace):
        raise ValueError(f"not a C++ namespace: {namespace!r}")
    return {f.module_name: generate_header(schema, f, namespace) for f in schema.files}
