"""The IR printed back as canonical .soa text, with the symbolic layout as trailing comments.

For reading what the checker and layout engine made of a schema (`soagen show --ir`). The text parses
back to the same IR: tests hold it to that.
"""

from __future__ import annotations

from soagen.dsl.ir import Binding, Layout, MemberKind, Model, SchemaFile
from soagen.dsl.layout import (
    block_axes,
    block_view,
    byte_size,
    linear_text,
    member_offsets,
    view_text,
)

INDENT = "    "


def _doc(doc: str | None, indent: str) -> list[str]:
    return (
        [f"{indent}///{' ' + line if line else ''}" for line in (doc or "").split("\n")]
        if doc
        else []
    )


def _layout(layout: Layout) -> list[str]:
    offsets = member_offsets(layout)
    lines = _doc(layout.doc, "")
    lines.append(f"layout {layout.name} {{  // {linear_text(byte_size(layout))} bytes")
    lines.append(f"{INDENT}align {layout.align}")
    for member in layout.members:
        lines += _doc(member.doc, INDENT)
        shape = f"[{', '.join(map(str, member.shape))}]" if member.shape else ""
        keyword = "scalar" if member.kind is MemberKind.SCALAR else "column"
        lines.append(
            f"{INDENT}{keyword} {member.dtype_name}{shape} {member.name}  // at {linear_text(offsets[member.name])}"
        )
    lines.append("}")
    return lines


def _binding(binding: Binding, layouts: dict[str, Layout]) -> list[str]:
    layout = layouts[binding.layout_name]
    first = layout.member(binding.member_names[0])
    assert first is not None
    axes = ", ".join(block_axes(binding, first))
    members = ", ".join(binding.member_names)
    lines = _doc(binding.doc, INDENT)
    lines.append(
        f"{INDENT}{binding.direction.value} {binding.name} = {layout.name}{{{members}}} as [{axes}]"
        f"{binding.trailing_clauses}  // {view_text(block_view(layout, binding))}"
    )
    return lines


def _model(model: Model, layouts: dict[str, Layout]) -> list[str]:
    lines = _doc(model.doc, "")
    lines.append(f"model {model.name} {{")
    for binding in model.bindings:
        lines += _binding(binding, layouts)
    lines.append("}")
    return lines


def pretty(schema_file: SchemaFile, layouts: dict[str, Layout]) -> str:
    """A checked file as canonical text; `layouts` holds every layout its models may name."""
    chunks: list[list[str]] = []
    if schema_file.doc:
        chunks.append([f"//!{' ' + line if line else ''}" for line in schema_file.doc.split("\n")])
    if schema_file.imports:
        chunks.append([f'import "{item.target}"' for item in schema_file.imports])
    chunks += [_layout(layout) for layout in schema_file.layouts]
    chunks += [_model(model, layouts) for model in schema_file.models]
    return "\n\n".join("\n".join(chunk) for chunk in chunks) + "\n"
