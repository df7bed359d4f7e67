"""Reads a schema file and everything it imports, runs every check, and returns a `Schema`.

Import targets are paths relative to the importing file. Files are parsed once each; the result lists
dependencies before the files that import them, so generated modules can import each other in order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from soagen.diagnostics import Diagnostic, SchemaError, Span
from soagen.dsl.check import check_file
from soagen.dsl.ir import Layout, Schema, SchemaFile
from soagen.dsl.parser import parse


def display_path(path: Path) -> str:
    """Paths in diagnostics and headers: relative to the working directory when below it, with `/`."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path.as_posix()
    return Path(relative).as_posix() if not relative.startswith("..") else path.as_posix()


@dataclass
class LoadResult:
    schema: Schema | None
    diagnostics: list[Diagnostic]
    sources: dict[str, str] = field(default_factory=dict)  # display path -> text, for rendering

    def unwrap(self) -> Schema:
        if self.schema is None or self.diagnostics:
            raise SchemaError(self.diagnostics, self.sources)
        return self.schema


class _Loader:
    def __init__(self) -> None:
        self.files: dict[Path, SchemaFile | None] = {}
        self.order: list[Path] = []
        self.sources: dict[str, str] = {}
        self.diagnostics: list[Diagnostic] = []
        self.import_paths: list[tuple[str, str, str]] = []
        self.dependencies: dict[Path, list[Path]] = {}

    def read(self, path: Path, stack: list[Path], import_span: Span | None) -> None:
        if path in stack:
            cycle = " -> ".join(display_path(p) for p in [*stack[stack.index(path) :], path])
            assert import_span is not None
            self.diagnostics.append(
                Diagnostic("SOA402", f"imports form a cycle: {cycle}", import_span, "move the shared layouts into a file both import")
            )
            return
        if path in self.files:
            return
        shown = display_path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            self.files[path] = None
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            if import_span is not None:
                self.diagnostics.append(
                    Diagnostic("SOA401", f"cannot import `{shown}`: {reason}", import_span)
                )
            else:
                self.diagnostics.append(
                    Diagnostic("SOA002", f"cannot read `{shown}`: {reason}", Span(shown, 1, 1, 1, 1))
                )
            return
        self.sources[shown] = text
        schema_file, problems = parse(text, shown)
        self.diagnostics += problems
        self.files[path] = schema_file
        self.dependencies[path] = []
        if schema_file is not None:
            for item in schema_file.imports:
                target = (path.parent / item.target).resolve()
                self.import_paths.append((shown, item.target, display_path(target)))
                self.dependencies[path].append(target)
                self.read(target, [*stack, path], item.span)
        self.order.append(path)


def load(path: str | os.PathLike[str]) -> LoadResult:
    """Parse and check a schema and its imports. Never raises for problems in the schema."""
    loader = _Loader()
    root = Path(path).resolve()
    loader.read(root, [], None)
    diagnostics = loader.diagnostics
    files = [loader.files[p] for p in loader.order]
    parsed = [f for f in files if f is not None]
    if len(parsed) != len(files) or loader.files.get(root) is None:
        return LoadResult(None, _sorted(diagnostics), loader.sources)
    # Names are global across files: one generated class each, imported by name.
    owners: dict[str, tuple[SchemaFile, Span]] = {}
    module_names: dict[str, SchemaFile] = {}
    for schema_file in parsed:
        other = module_names.get(schema_file.module_name)
        if other is not None:
            diagnostics.append(
                Diagnostic(
                    "SOA403",
                    f"`{schema_file.path}` and `{other.path}` would both generate module "
                    f"`{schema_file.module_name}`",
                    Span(schema_file.path, 1, 1, 1, 1),
                    "rename one of the files",
                )
            )
        module_names[schema_file.module_name] = schema_file
        for declaration in (*schema_file.layouts, *schema_file.models):
            owner = owners.get(declaration.name)
            if owner is not None and owner[0] is not schema_file:
                diagnostics.append(
                    Diagnostic(
                        "SOA403",
                        f"`{declaration.name}` is also declared in `{owner[0].path}`",
                        declaration.span,
                        related=(("declared", owner[1]),),
                    )
                )
            owners.setdefault(declaration.name, (schema_file, declaration.span))
    by_path = {p: loader.files[p] for p in loader.order}
    for file_path in loader.order:
        schema_file = by_path[file_path]
        assert schema_file is not None
        visible: dict[str, Layout] = {}
        for dependency in _closure(file_path, loader.dependencies):
            dependency_file = by_path.get(dependency)
            if dependency_file is not None:
                visible.update({layout.name: layout for layout in dependency_file.layouts})
        visible.update({layout.name: layout for layout in schema_file.layouts})
        diagnostics += check_file(schema_file, visible)
    root_file = by_path[root]
    assert root_file is not None
    if diagnostics:
        return LoadResult(None, _sorted(diagnostics), loader.sources)
    schema = Schema(root_file, tuple(parsed), tuple(loader.import_paths))
    return LoadResult(schema, [], loader.sources)


def _closure(start: Path, dependencies: dict[Path, list[Path]]) -> list[Path]:
    """Files whose layouts `start` can use: the ones it imports, directly or through others."""
    seen: list[Path] = []
    pending = list(dependencies.get(start, []))
    while pending:
        current = pending.pop()
        if current not in seen and current != start:
            seen.append(current)
            pending += dependencies.get(current, [])
    return seen


def _sorted(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    unique = {(d.code, d.message, d.span): d for d in diagnostics}
    return sorted(unique.values(), key=Diagnostic.sort_key)
