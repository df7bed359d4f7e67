"""`soagen import-cmssw`: `.soa` schemas from CMSSW headers' `GENERATE_SOA_LAYOUT` definitions."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from soagen.cli.common import EXIT_OK, EXIT_PROBLEMS, Output, UsageError, path_argument
from soagen.dsl.diagnostics import render_text, to_json_object

HELP = "write .soa schemas from the GENERATE_SOA_LAYOUT definitions of CMSSW C++ headers"
EXAMPLE = (
    "soagen import-cmssw DataFormats/X/interface/FooSoA.h -I $CMSSW_BASE/src -o schemas/\n"
    "  soagen import-cmssw FooSoA.h --type 'Opaque=uint8[24]' --define NSAMPLES=10  # to stdout"
)
FORMATS: tuple[str, ...] = ("text", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "headers",
        nargs="+",
        type=path_argument,
        metavar="HEADER",
        help="C++ headers declaring layouts; every layout of one header goes into one schema",
    )
    parser.add_argument(
        "-o",
        "--output",
        dest="out",
        type=path_argument,
        metavar="DIR",
        help="write DIR/<header stem>.soa per header (FooSoA.h -> FooSoA.soa); without it, the "
        "schema of the one header named is printed",
    )
    parser.add_argument(
        "-I",
        dest="include_dirs",
        action="append",
        default=[],
        type=path_argument,
        metavar="DIR",
        help='where `#include "..."` finds headers, as for the compiler (repeatable); a header\'s '
        "own folder is searched first",
    )
    parser.add_argument(
        "--type",
        dest="types",
        action="append",
        default=[],
        metavar="NAME=DTYPE",
        help="map a C++ type soagen cannot resolve: NAME=int32, or NAME=uint8[24] for an opaque "
        "struct of 24 bytes (a packed column of its bytes, same byte layout) (repeatable)",
    )
    parser.add_argument(
        "--define",
        dest="defines",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="give an integer constant soagen cannot resolve its value (repeatable)",
    )
    parser.add_argument(
        "--layout",
        dest="layouts",
        action="append",
        default=[],
        metavar="NAME",
        help="import only this layout (its C++ class name or schema name; repeatable)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="overwrite existing .soa files that differ (without it they are refused, as they may "
        "hold edits)",
    )


def run(args: argparse.Namespace, output: Output) -> int:
    from soagen.dsl.loader import load
    from soagen.tools.cmssw import (
        TypeMapping,
        import_header,
        parse_define,
        parse_type_mapping,
        schema_stem,
    )
    from soagen.tools.fmt import schema_text

    types: dict[str, TypeMapping] = {}
    defines: dict[str, int] = {}
    try:
        for text in args.types:
            name, mapping = parse_type_mapping(text)
            types[name] = mapping
        for text in args.defines:
            name, value = parse_define(text)
            defines[name] = value
    except ValueError as error:
        raise UsageError(str(error)) from None
    headers = [Path(h) for h in args.headers]
    for header in headers:
        if not header.is_file():
            raise UsageError(f"no such file: `{header.as_posix()}`")
    for folder in args.include_dirs:
        if not Path(folder).is_dir():
            raise UsageError(f"no such folder: `{folder}` (-I)")
    if args.out is None and len(headers) > 1:
        raise UsageError("several headers need -o DIR: each becomes a schema file of its own")
    stems: dict[str, Path] = {}
    for header in headers:
        stem = schema_stem(header)
        if stem in stems:
            raise UsageError(
                f"`{stems[stem].as_posix()}` and `{header.as_posix()}` would both write {stem}.soa"
            )
        stems[stem] = header
    out = Path(args.out) if args.out is not None else None
    results: list[dict[str, object]] = []
    texts: list[tuple[Path | None, str]] = []
    for header in headers:
        stem = schema_stem(header)
        target = out / f"{stem}.soa" if out is not None else None
        shown_target = target.as_posix() if target is not None else f"{stem}.soa"
        imported = import_header(
            header,
            shown=header.as_posix(),
            schema_path=shown_target,
            include_dirs=[Path(d) for d in args.include_dirs],
            types=types,
            defines=defines,
            layouts=args.layouts,
        )
        result: dict[str, object] = {"header": header.as_posix(), "schema": shown_target}
        results.append(result)
        if imported.schema_file is None:
            output.sources.update(imported.sources)
            output.diagnostics += imported.diagnostics
            result["error"] = True
            continue
        text = schema_text(imported.schema_file)
        # An emitted schema its own checker refuses is a bug of the importer, never of the header.
        with tempfile.TemporaryDirectory() as scratch:
            check_path = Path(scratch) / f"{stem}.soa"
            check_path.write_text(text, encoding="utf-8")
            problems = load(check_path).diagnostics
        if problems:
            raise RuntimeError(
                f"internal error: the schema imported from {header.as_posix()} fails soagen's "
                f"checks; please report this:\n{render_text(problems, {})}\n{text}"
            )
        result["layouts"] = [layout.name for layout in imported.schema_file.layouts]
        result["error"] = False
        texts.append((target, text))
    if out is not None:
        for target, text in texts:
            assert target is not None
            if target.exists() and not args.force and target.read_text(encoding="utf-8") != text:
                raise UsageError(
                    f"`{target.as_posix()}` exists and differs (--force overwrites it)"
                )
        out.mkdir(parents=True, exist_ok=True)
        for target, text in texts:
            assert target is not None
            target.write_text(text, encoding="utf-8")
    status = EXIT_PROBLEMS if output.diagnostics else EXIT_OK
    if output.format == "json":
        for result, (_, text) in zip([r for r in results if not r["error"]], texts, strict=True):
            result["text"] = text
        diagnostics = [to_json_object(d) for d in output.diagnostics]
        print(json.dumps({"files": results, "diagnostics": diagnostics}, indent=2))
        output.diagnostics.clear()
        return status
    if out is None:
        sys.stdout.write("".join(text for _, text in texts))
    else:
        for target, _ in texts:
            print(f"wrote {target.as_posix() if target else ''}", file=sys.stderr)
    return status
