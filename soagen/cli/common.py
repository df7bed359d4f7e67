"""What every command shares: exit codes, the usage error, argument helpers, schema paths and the
`Output` that collects and prints diagnostics."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from soagen.dsl.diagnostics import Diagnostic, render_github, render_json, render_text
from soagen.dsl.ir import Schema
from soagen.dsl.loader import LoadResult, load

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


DEFAULT_OUT = "generated"


class UsageError(Exception):
    pass


def path_argument(text: str) -> str:
    """argparse `type` of every path argument: `Path("")` is the current folder, so an empty
    argument (an unset shell variable, say) would quietly mean every schema there, or write there.
    """
    if not text:
        raise argparse.ArgumentTypeError('empty path (write "." for the current folder)')
    return text


def add_model_arguments(
    parser: argparse.ArgumentParser,
    *,
    model_help: str,
    source: str = "schema",
    source_help: str = "the .soa file declaring the model",
) -> None:
    """The schema (positional) and `--model NAME` of a command that works on one model."""
    parser.add_argument(source, type=path_argument, metavar="SCHEMA", help=source_help)
    parser.add_argument("--model", required=True, metavar="NAME", help=model_help)


def add_factory_argument(parser: argparse._ActionsContainer, *, required: bool = False) -> None:
    parser.add_argument(
        "--factory",
        required=required,
        metavar="FILE.py:FUNCTION",
        help="a function that takes no arguments and returns the torch.nn.Module",
    )


def add_examples_argument(parser: argparse._ActionsContainer, *, when: str = "") -> None:
    parser.add_argument(
        "--examples",
        metavar="FILE.py:FUNCTION",
        help=f"{when}a function that fills the example collections the model is checked on "
        "(a dict of layout name -> collection, sizes chosen by soagen) in place with realistic "
        "values (default: random normal floats, indices in range, other integers 0)",
    )


def add_columnwise_argument(parser: argparse.ArgumentParser, *, when: str = "") -> None:
    parser.add_argument(
        "--columnwise",
        action="store_true",
        help=f"{when}compute narrow nn.Linear layers (at most 8 inputs or 4 outputs) column by "
        "column across elements, so that they fuse into one vectorized loop (narrow MLPs: ~3x "
        "faster)",
    )


def add_write_outputs_argument(parser: argparse.ArgumentParser, *, when: str = "") -> None:
    parser.add_argument(
        "--write-outputs",
        action="store_true",
        help=f"{when}the package stores its results straight into the output blocks it is given "
        "(no result tensors, no write-back copy); a server allocates them (see --output-size)",
    )


def add_output_size_argument(parser: argparse.ArgumentParser, *, when: str) -> None:
    parser.add_argument(
        "--output-size",
        action="append",
        default=[],
        metavar="OUTPUT=INPUT",
        help=f"{when}output OUTPUT's collection has as many elements as input INPUT's (or a "
        "number) per event; needed where the output has a layout of its own, the inputs more "
        "than one, and the model file says nothing (repeatable)",
    )


def parse_output_sizes(items: Sequence[str]) -> dict[str, str]:
    return parse_pairs(items, "--output-size", "edge_scores=edge_features", counts=True)


def counted(count: int, word: str) -> str:
    """`1 file`, `2 files`."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def unified_diff(before: str, after: str, before_label: str, after_label: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=before_label,
            tofile=after_label,
        )
    )


def add_schemas_argument(
    parser: argparse.ArgumentParser,
    *,
    required: bool = False,
    default: str = "schemas",
    extra: str = "",
) -> None:
    """The `SCHEMA ...` positional: .soa files or folders, `default` when none is named."""
    if required:
        parser.add_argument(
            "schemas", nargs="+", type=path_argument, metavar="SCHEMA", help=".soa files or folders"
        )
        return
    parser.add_argument(
        "schemas",
        nargs="*",
        default=[default],
        type=path_argument,
        metavar="SCHEMA",
        help=f".soa files or folders (default {default}){extra}",
    )


def add_out_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument(
        "-o",
        "--output",
        "--out",  # the first spelling; compile, triton and serve say --output
        dest="out",
        default=DEFAULT_OUT,
        type=path_argument,
        metavar="DIR",
        help=help_text,
    )


def add_index_argument(parser: argparse.ArgumentParser, *, checked: str, default: str) -> None:
    """`--index INDEX=BOUND` (repeatable); `checked`: when the indices are checked, if they are."""
    parser.add_argument(
        "--index",
        action="append",
        default=[],
        metavar="INDEX=BOUND",
        help="integer input INDEX holds element numbers of input BOUND's collection"
        + (f"; checked {checked}" if checked else "")
        + f" (repeatable; default: {default})",
    )


INDEX_EXAMPLE = "edge_index=node_features"


def parse_pairs(
    items: Sequence[str], option: str, example: str, *, counts: bool = False
) -> dict[str, str]:
    """`["a=b", ...]` -> `{"a": "b"}`, binding names on both sides (with `counts`, an element
    count >= 1 may stand on the right); a UsageError naming `option` for anything else."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = (part.strip() for part in item.partition("="))
        number = value.removeprefix("-")
        if counts and key.isidentifier() and number.isascii() and number.isdigit():
            if int(value) < 1:
                raise UsageError(f"{option} {item}: an element count must be >= 1")
        elif not sep or not key.isidentifier() or not value.isidentifier():
            form = "NAME=NAME or NAME=COUNT" if counts else "INDEX=BOUND (input names)"
            raise UsageError(f"{option} takes {form}, e.g. {example}; got {item!r}")
        if pairs.get(key, value) != value:
            raise UsageError(f"{option} gives {key!r} twice")
        pairs[key] = value
    return pairs


def command_failed(error: Exception, output: Output, *, usage: bool) -> int:
    """A command's own error: a usage error (exit 2) for a wrong argument, else reported (as JSON
    with --format json) with EXIT_PROBLEMS."""
    if usage:
        raise UsageError(str(error)) from None
    if output.format == "json":
        print(json.dumps({"error": str(error)}))
    else:
        print(f"soagen: error: {error}", file=sys.stderr)
    return EXIT_PROBLEMS


@contextlib.contextmanager
def needs_torch(message: str) -> Iterator[None]:
    """Imports of a command that needs torch: without torch, a usage error `message`."""
    try:  # torch is imported there only: the other commands run without it
        yield
    except ModuleNotFoundError as error:
        if error.name != "torch":
            raise
        raise UsageError(message) from None


def schema_paths(arguments: Sequence[str]) -> list[Path]:
    paths: list[Path] = []
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            found = sorted(path.rglob("*.soa"))
            if not found:
                raise UsageError(f"no .soa files under `{argument}`")
            paths += found
        elif path.exists():
            paths.append(path)
        else:
            default = " (the default when no schema is named)" if argument == "schemas" else ""
            raise UsageError(f"no such file or folder: `{argument}`{default}")
    return paths


class Output:
    def __init__(self, fmt: str, color: str) -> None:
        self.format = fmt
        self.color = color == "always" or (
            color == "auto" and sys.stderr.isatty() and "NO_COLOR" not in os.environ
        )
        self.diagnostics: list[Diagnostic] = []
        self.sources: dict[str, str] = {}

    def add(self, result: LoadResult) -> Schema | None:
        self.sources.update(result.sources)
        known = set(self.diagnostics)
        self.diagnostics += [d for d in result.diagnostics if d not in known]
        return result.schema

    def flush(self) -> None:
        if not self.diagnostics:
            return
        if self.format == "github":
            print(render_github(self.diagnostics, os.environ.get("GITHUB_WORKSPACE")))
        elif self.format == "json":
            print(render_json(self.diagnostics))
        else:
            print(render_text(self.diagnostics, self.sources, self.color), file=sys.stderr)
            print(counted(len(self.diagnostics), "error"), file=sys.stderr)


def print_diagnostics(
    diagnostics: list[Diagnostic], sources: dict[str, str], output: Output
) -> None:
    if output.format == "github":
        if diagnostics:
            print(render_github(diagnostics, os.environ.get("GITHUB_WORKSPACE")))
    elif output.format == "text" and diagnostics:
        print(render_text(diagnostics, sources, output.color))


@dataclass(frozen=True, slots=True)
class Target:
    """One output language of `generate` and `check`: what its files are called and how their
    first line, `<comment> Generated by soagen VERSION from SCHEMA: do not edit.`, starts."""

    lang: str
    suffix: str
    comment: str
    noun: str  # what messages call one file

    @property
    def mark(self) -> str:
        return f"{self.comment} Generated by soagen "


PYTHON = Target("python", ".py", "#", "module")
CPP = Target("cpp", ".h", "//", "header")
TARGETS = {target.lang: target for target in (PYTHON, CPP)}

GENERATED_MARK = PYTHON.mark
# The rest of the first line: `VERSION from SCHEMA: do not edit.`
_GENERATED_FROM = re.compile(r"\S+ from (?P<schema>.+): do not edit\.$")


def add_lang_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lang",
        choices=sorted(TARGETS),
        default=PYTHON.lang,
        help="python modules (the default) or C++ headers of CMSSW layouts",
    )
    parser.add_argument(
        "--namespace",
        metavar="NS",
        help="with --lang cpp: the C++ namespace of the declarations (`a` or `a::b`; default none)",
    )


def target_of(args: argparse.Namespace) -> Target:
    """The `--lang` target; `--namespace` is refused for any but C++, and checked there."""
    target = TARGETS[args.lang]
    if args.namespace is not None:
        from soagen.generator.cpp import valid_namespace

        if target is not CPP:
            raise UsageError("--namespace applies to --lang cpp only")
        if not valid_namespace(args.namespace):
            raise UsageError(
                f"--namespace {args.namespace}: not a C++ namespace (identifiers joined by `::`, "
                "no keyword, no `__`)"
            )
    return target


def generated_from(text: str, target: Target = PYTHON) -> str | None:
    """The schema path a generated file names in its first line, as it was given to soagen."""
    first = text.split("\n", 1)[0]
    if not first.startswith(target.mark):
        return None
    match = _GENERATED_FROM.match(first.removeprefix(target.mark))
    return match.group("schema") if match else None


def generate_all(
    paths: list[Path], output: Output, target: Target = PYTHON, namespace: str | None = None
) -> dict[str, tuple[str, str]]:
    """File stem -> (text, schema path) for every schema and its imports, in `target`'s language;
    stops at schema errors, and for C++ at what C++ cannot hold (SOA5xx)."""
    from soagen.generator.cpp import cpp_problems, generate_cpp
    from soagen.generator.python import generate

    files: dict[str, tuple[str, str]] = {}
    for path in paths:
        schema = output.add(load(path))
        if schema is None:
            continue
        if target is CPP:
            problems = cpp_problems(schema)
            if problems:
                output.add(LoadResult(None, problems))
                continue
            generated = generate_cpp(schema, namespace)
        else:
            generated = generate(schema)
        for name, text in generated.items():
            origin = next(f.path for f in schema.files if f.module_name == name)
            previous = files.get(name)
            if previous is not None and previous[1] != origin:
                raise UsageError(
                    f"`{origin}` and `{previous[1]}` would both generate {target.noun} `{name}`"
                )
            files[name] = (text, origin)
    return files


def module_text(path: Path) -> str | None:
    """The text of a module file in the output folder; None where there is none. A folder of
    that name, or a file that is not UTF-8, is no module soagen wrote: reported as such."""
    if not path.exists():
        return None
    if not path.is_file():
        return ""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return ""


def foreign(current: str | None, target: Target = PYTHON) -> bool:
    """A file stands where a generated one goes, and soagen did not write it."""
    return current is not None and not current.startswith(target.mark)


def not_ours(path: Path, target: Target = PYTHON) -> str:
    """Why a file in the way of a generated one stays: a hand-written file is never replaced."""
    return (
        f"`{path.as_posix()}` exists and was not generated by soagen (its first line is not "
        f"`{target.mark.strip()} ...`): move it away, or generate into another folder (-o)"
    )


def write_if_changed(path: Path, text: str) -> bool:
    if module_text(path) == text:
        return False
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)
    return True


class Command(Protocol):
    """What each command module of this package holds: read by `soagen.cli.main`."""

    HELP: str
    EXAMPLE: str
    FORMATS: tuple[str, ...]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace, output: Output) -> int: ...
