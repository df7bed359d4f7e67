"""`soagen show`: a schema's byte layout for n elements, or its checked IR as canonical text."""

from __future__ import annotations

import argparse
import json

import soagen
from soagen.cli.common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    Output,
    UsageError,
    path_argument,
    schema_paths,
)
from soagen.dsl.ir import Schema
from soagen.dsl.layout import block_view, byte_size, member_offsets, member_pitch, member_view
from soagen.dsl.loader import load

HELP = "print the byte layout of every collection for n elements"
EXAMPLE = (
    "soagen show schemas/gnn.soa --size 1000\n  soagen show schemas/gnn.soa --size 1000 --format json\n"
    "  soagen show schemas/gnn.soa --ir"
)
FORMATS: tuple[str, ...] = ("text", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("schema", type=path_argument, metavar="SCHEMA", help="a .soa file")
    parser.add_argument("--size", "-n", type=int, metavar="N", help="number of elements")
    parser.add_argument(
        "--ir",
        action="store_true",
        help="print the checked IR as canonical text with symbolic offsets",
    )


def layout_report(schema: Schema, n: int) -> dict[str, object]:
    """Every collection's offsets, pitches, strides and size for n elements, and every block's view."""
    collections = []
    blocks_by_layout: dict[str, list[dict[str, object]]] = {}
    for schema_file in schema.files:
        for model in schema_file.models:
            for binding in model.bindings:
                layout = binding.layout
                shape, strides, offset = block_view(binding).evaluate(n, layout.align)
                blocks_by_layout.setdefault(layout.name, []).append(
                    {
                        "model": model.name,
                        "binding": binding.name,
                        "direction": binding.direction.value,
                        "members": list(binding.member_names),
                        "shape": list(shape),
                        "strides": list(strides),
                        "offset": offset,
                    }
                )
    for schema_file in schema.files:
        for layout in schema_file.layouts:
            offsets = member_offsets(layout)
            members = []
            for member in layout.members:
                shape, strides, offset = member_view(layout, member).evaluate(n, layout.align)
                members.append(
                    {
                        "name": member.name,
                        "kind": member.kind.value,
                        "dtype": member.dtype_name,
                        "array_shape": list(member.shape),
                        "offset": offsets[member.name].evaluate(n, layout.align),
                        "pitch": member_pitch(member, layout.align).evaluate(n, layout.align),
                        "shape": list(shape),
                        "strides": list(strides),
                    }
                )
            collections.append(
                {
                    "layout": layout.name,
                    "schema": schema_file.path,
                    "align": layout.align,
                    "size": n,
                    "byte_size": byte_size(layout).evaluate(n, layout.align),
                    "members": members,
                    "blocks": blocks_by_layout.get(layout.name, []),
                }
            )
    return {"generator": f"soagen {soagen.__version__}", "size": n, "collections": collections}


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace, output: Output) -> int:
    if args.size is None and not args.ir:
        raise UsageError("show needs --size N (or --ir)")
    if args.size is not None and args.size < 0:
        raise UsageError(f"--size must be at least 0, got {args.size}")
    paths = schema_paths([args.schema])
    if len(paths) != 1:
        raise UsageError("show takes one .soa file")
    schema = output.add(load(paths[0]))
    if schema is None:
        return EXIT_PROBLEMS
    if args.ir:
        from soagen.tools.fmt import schema_text, with_defaults

        texts = {f.path: schema_text(with_defaults(f), symbolic=True) for f in schema.files}
        if output.format == "json":
            print(json.dumps(texts, indent=2))
        else:
            print("\n".join(f"// {path}\n{text}" for path, text in texts.items()), end="")
        return EXIT_OK
    report = layout_report(schema, args.size)
    if output.format == "json":
        print(json.dumps(report, indent=2))
        return EXIT_OK
    chunks = []
    for collection in report["collections"]:  # type: ignore[attr-defined]
        title = (
            f"{collection['layout']} ({collection['schema']}): n = {collection['size']}, "
            f"align {collection['align']}, {collection['byte_size']} bytes"
        )
        rows = [
            [
                m["name"],
                m["kind"],
                m["dtype"] + (str(m["array_shape"]) if m["array_shape"] else ""),
                str(m["offset"]),
                str(m["pitch"]),
                str(tuple(m["shape"])),
                str(tuple(m["strides"])),
            ]
            for m in collection["members"]
        ]
        text = (
            title
            + "\n"
            + _table(["member", "kind", "dtype", "offset", "pitch", "shape", "strides"], rows)
        )
        if collection["blocks"]:
            block_rows = [
                [
                    f"{b['model']}.{b['binding']}",
                    "{" + ", ".join(b["members"]) + "}",
                    str(tuple(b["shape"])),
                    str(tuple(b["strides"])),
                    str(b["offset"]),
                ]
                for b in collection["blocks"]
            ]
            text += "\n\n" + _table(["block", "members", "shape", "strides", "offset"], block_rows)
        chunks.append(text)
    print("\n\n".join(chunks))
    print("\noffsets and pitches in bytes; shapes and strides in elements")
    return EXIT_OK
