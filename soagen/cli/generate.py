"""`soagen generate` (also `soagen SCHEMA ...`): write a Python module (or, with `--lang cpp`, a
C++ header) for every schema file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from soagen.cli.common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    Output,
    UsageError,
    add_lang_argument,
    add_out_argument,
    add_schemas_argument,
    counted,
    foreign,
    generate_all,
    module_text,
    not_ours,
    schema_paths,
    target_of,
    write_if_changed,
)

HELP = "generate Python modules (or C++ headers) from schemas (the default command)"
EXAMPLE = (
    "soagen schemas/gnn.soa            # writes generated/gnn.py\n"
    "  soagen schemas/*.soa -o src/mypkg/soa\n"
    "  soagen generate --lang cpp schemas/gnn.soa -o include   # writes include/gnn.h"
)
FORMATS: tuple[str, ...] = ("text", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_schemas_argument(parser, required=True)
    add_out_argument(parser, "output folder (default generated)")
    add_lang_argument(parser)


def run(args: argparse.Namespace, output: Output) -> int:
    target = target_of(args)
    modules = generate_all(schema_paths(args.schemas), output, target, args.namespace)
    if output.diagnostics:
        return EXIT_PROBLEMS
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file of that name, or no permission
        raise UsageError(f"-o {args.out}: cannot make that folder ({error.strerror})") from None
    # Generated modules import each other relatively, so the folder must be a package.
    init = out / "__init__.py"
    if target.lang == "python" and not init.exists():
        init.write_text("", encoding="utf-8")
    files = {out / f"{name}{target.suffix}": text for name, (text, _) in sorted(modules.items())}
    # Every file checked before any is written: a refusal leaves the folder as it was.
    for path in files:
        if foreign(module_text(path), target):
            raise UsageError(not_ours(path, target))
    written = [path for path, text in files.items() if write_if_changed(path, text)]
    if output.format == "json":
        print(json.dumps({"written": [p.as_posix() for p in written], "modules": sorted(modules)}))
    else:
        for path in written:
            print(f"wrote {path.as_posix()}")
        if not written:
            print(f"{counted(len(modules), target.noun)} in {out.as_posix()} up to date")
    return EXIT_OK
