"""`soagen check`: exit 1, with a diff, where generated modules differ from what the schemas give."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from soagen.cli.common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    Output,
    add_lang_argument,
    add_out_argument,
    add_schemas_argument,
    counted,
    foreign,
    generate_all,
    generated_from,
    module_text,
    not_ours,
    schema_paths,
    target_of,
    unified_diff,
)

HELP = "exit 1, with a diff, if generated modules are stale"
EXAMPLE = "soagen check schemas/              # exit 1 with a diff if generated/ is stale"
FORMATS: tuple[str, ...] = ("text", "json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_schemas_argument(parser)
    add_out_argument(parser, "folder of generated modules (default generated)")
    add_lang_argument(parser)


def run(args: argparse.Namespace, output: Output) -> int:
    target = target_of(args)
    modules = generate_all(schema_paths(args.schemas), output, target, args.namespace)
    if output.diagnostics:
        return EXIT_PROBLEMS
    out = Path(args.out)
    stale: list[dict[str, str]] = []
    diffs: list[str] = []
    for name, (text, origin) in sorted(modules.items()):
        path = out / f"{name}{target.suffix}"
        current = module_text(path)
        if current == text:
            continue
        reason = "missing" if current is None else "stale"
        if foreign(current, target):
            reason = "not generated"  # regenerating would be refused: the file must go first
        stale.append({"module": path.as_posix(), "schema": origin, "reason": reason})
        if current is None:
            diffs.append(f"{path.as_posix()}: missing (generated from {origin})\n")
            continue
        if reason == "not generated":
            diffs.append(f"{not_ours(path, target)}\n")
            continue
        shown = path.as_posix()
        diffs.append(unified_diff(current, text, f"{shown} (on disk)", f"{shown} (from {origin})"))
    orphans: list[str] = []
    # Modules of schemas that exist but were not named: not checked, and never called orphans.
    unchecked: list[str] = []
    if out.is_dir():
        for orphan in sorted(out.glob(f"*{target.suffix}")):
            if orphan.stem in modules or orphan.name == "__init__.py":
                continue
            text = module_text(orphan) or ""
            if foreign(text, target):
                continue
            source = generated_from(text, target)
            if source is not None and Path(source).is_file():
                unchecked.append(f"{orphan.as_posix()} (from {source})")
                continue
            stale.append({"module": orphan.as_posix(), "schema": "", "reason": "orphaned"})
            orphans.append(orphan.as_posix())
            diffs.append(f"{orphan.as_posix()}: generated from a schema that no longer exists\n")
    if output.format == "json":
        report = {"stale": stale, "checked": len(modules), "not_checked": unchecked}
        print(json.dumps(report, indent=2))
    else:
        for diff in diffs:
            sys.stdout.write(diff)
        count = sum(entry["reason"] in ("stale", "missing") for entry in stale)
        generate_args = "" if target.lang == "python" else f"generate --lang {target.lang} "
        if args.namespace is not None:
            generate_args += f"--namespace {args.namespace} "
        if count:
            print(
                f"{count} generated {target.noun}{'s are' if count != 1 else ' is'} out of date: "
                f"run `soagen {generate_args}{' '.join(args.schemas)} -o {out.as_posix()}`",
                file=sys.stderr,
            )
        if orphans:
            # Generating never deletes a module, so only removing it makes the check pass.
            print(f"delete what no schema generates: `rm {' '.join(orphans)}`", file=sys.stderr)
        if unchecked:
            print(
                f"not checked: {', '.join(unchecked)}; name those schemas too to check them",
                file=sys.stderr,
            )
        if not stale:
            print(f"{counted(len(modules), 'generated ' + target.noun)} up to date")
    return EXIT_PROBLEMS if stale else EXIT_OK
