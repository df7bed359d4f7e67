"""`soagen explain`: what a schema error code, a lint rule or a breaking-change rule means, read from
the one registry of codes (`soagen.dsl.codes`)."""

from __future__ import annotations

import argparse
import json

from soagen.cli.common import EXIT_OK, Output, UsageError
from soagen.dsl.codes import CATEGORIES, ERROR, KINDS, REGISTRY, lookup, of_kind
from soagen.dsl.diagnostics import did_you_mean

HELP = "say what a diagnostic code means"
EXAMPLE = "soagen explain SOA303\n  soagen explain LAYOUT_PASCAL_CASE\n  soagen explain --list"
FORMATS: tuple[str, ...] = ("text", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "code",
        nargs="?",
        metavar="CODE",
        help="a schema error code (SOA303), a lint rule or a breaking-change rule ID",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="list every code with its kind, category and purpose, and exit",
    )


def _where_codes_are() -> str:
    errors = of_kind(ERROR)
    return (
        f"codes are the schema errors {errors[0].id} to {errors[-1].id}, the rule IDs of "
        "`soagen lint --list-rules` and the breaking-change rules; `soagen explain --list` "
        "lists them all"
    )


def _list(output: Output) -> None:
    codes = [code for kind in KINDS for code in of_kind(kind)]
    if output.format == "json":
        listed = [
            {"id": c.id, "kind": c.kind, "category": c.category, "purpose": c.purpose}
            for c in codes
        ]
        print(json.dumps({"codes": listed}, indent=2))
        return
    width = max(len(code.id) for code in codes)
    category_width = max(len(c) for kind in KINDS for c in CATEGORIES[kind])
    for code in codes:
        print(
            f"{code.id.ljust(width)}  {code.kind.ljust(8)}  "
            f"{code.category.ljust(category_width)}  {code.purpose}"
        )


def run(args: argparse.Namespace, output: Output) -> int:
    if args.list:
        _list(output)
        return EXIT_OK
    if args.code is None:
        raise UsageError(f"name a code, e.g. `soagen explain SOA303`; {_where_codes_are()}")
    code = lookup(args.code)
    if code is None:
        hint = did_you_mean(args.code.strip().upper(), REGISTRY)
        raise UsageError(
            f"unknown code `{args.code}`"
            + (f" ({hint})" if hint else "")
            + f"; {_where_codes_are()}"
        )
    if output.format == "json":
        # `code` and `summary`: the fields of earlier versions, kept for the tools that read them.
        print(json.dumps({**code.to_json(), "code": code.id, "summary": code.purpose}))
    else:
        print(f"{code.heading}\n\n{code.text()}")
    return EXIT_OK
