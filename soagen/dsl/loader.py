"""Reads a schema file and everything it imports, runs every check, and returns a `Schema`.

Import targets are paths relative to the importing file. Files are parsed once each; the result lists
dependencies before the files that import them, so generated modules can import each other in order.
"""

from __future__ import annotations

import keyword
import os
from dataclasses import dataclass, field
from pathlib import Path

from soagen.dsl.check import check_file, resolve_file
from soagen.dsl.diagnostics import Diagnostic, SchemaError, Span
from soagen.dsl.ir import Import, Layout, Model, Schema, SchemaFile
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

    def read_all(self, root: Path) -> None:
        """Depth first through the imports, with an explicit stack: a chain of thousands of files
        must not exhaust Python's recursion limit. Each file is finished after its imports."""
        frames: list[tuple[Path, list[Import]]] = []
        self.enter(root, None, frames)
        while frames:
            path, pending = frames[-1]
            if not pending:
                frames.pop()
                self.order.append(path)
                continue
            item = pending.pop(0)
            target = _resolve(path, item.target)
            if target is None:
                self.diagnostics.append(
                    Diagnostic(
                        "SOA401", "cannot import: the path is empty or holds a NUL", item.span
                    )
                )
                continue
            self.import_paths.append((display_path(path), item.target, display_path(target)))
            self.dependencies[path].append(target)
            stack = [frame_path for frame_path, _ in frames]
            if target in stack:
                cycle = " -> ".join(
                    display_path(p) for p in [*stack[stack.index(target) :], target]
                )
                self.diagnostics.append(
                    Diagnostic(
                        "SOA402",
                        f"imports form a cycle: {cycle}",
                        item.span,
                        "move the shared layouts into a file both import",
                    )
                )
            elif target not in self.files:
                self.enter(target, item.span, frames)

    def enter(
        self, path: Path, import_span: Span | None, frames: list[tuple[Path, list[Import]]]
    ) -> None:
        """Read and parse one file; a parsed file goes on the stack to have its imports read."""
        shown = display_path(path)
        text = self.text(path, shown, import_span)
        if text is None:
            self.files[path] = None
            return
        self.sources[shown] = text
        schema_file, problems = parse(text, shown)
        self.diagnostics += problems
        self.files[path] = schema_file
        self.dependencies[path] = []
        frames.append((path, list(schema_file.imports) if schema_file is not None else []))

    def text(self, path: Path, shown: str, import_span: Span | None) -> str | None:
        read = read_schema(path, shown)
        if isinstance(read, str):
            return read
        reason, where = read
        if import_span is not None:
            self.diagnostics.append(
                Diagnostic("SOA401", f"cannot import `{shown}`: {reason}", import_span)
            )
        else:
            self.diagnostics.append(Diagnostic("SOA002", f"cannot read `{shown}`: {reason}", where))
        return None


def read_schema(path: Path, shown: str) -> str | tuple[str, Span]:
    """A schema file's text, or why it cannot be read and where (a bad byte's place)."""
    try:
        # A FIFO or a device would block or never end: only regular files are schemas.
        if path.exists() and not path.is_file():
            return "not a regular file", Span(shown, 1, 1, 1, 1)
        data = path.read_bytes()
    except (OSError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        return reason, Span(shown, 1, 1, 1, 1)
    # Editors on Windows begin files with a byte order mark; the parser never sees it, so places
    # (a bad byte's too) are counted after it.
    data = data.removeprefix(b"\xef\xbb\xbf")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        where = _byte_span(shown, data, error.start)
        return (
            f"not UTF-8 text: byte 0x{data[error.start]:02x} at line {where.line}, column "
            f"{where.column} (save it as UTF-8)",
            where,
        )


def _byte_span(shown: str, data: bytes, offset: int) -> Span:
    """The line and column (in characters of the valid text before it) of a byte offset."""
    line_start = data.rfind(b"\n", 0, offset) + 1
    line = data.count(b"\n", 0, offset) + 1
    column = len(data[line_start:offset].decode("utf-8", errors="replace")) + 1
    return Span(shown, line, column, line, column + 1)


def _resolve(importer: Path, target: str) -> Path | None:
    """The absolute path an import names, relative to the importing file; None if it cannot be one."""
    if not target or "\x00" in target:
        return None
    try:
        return (importer.parent / target).resolve()
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a symlink loop, on older Pythons
        return None


def _module_name_problem(schema_file: SchemaFile) -> str | None:
    """Why the module generated from this file could not be imported, if it could not."""
    name = schema_file.module_name
    if not name.isascii() or not name.isidentifier():
        return f"module name `{name}` is not a Python identifier"
    if keyword.iskeyword(name):
        return f"module name `{name}` is a Python keyword"
    if name.startswith("__") and name.endswith("__"):
        return f"module name `{name}` is reserved by Python"
    return None


def load(path: str | os.PathLike[str]) -> LoadResult:
    """Parse and check a schema and its imports. Never raises for problems in the schema."""
    loader = _Loader()
    try:
        root = Path(path).resolve()
    except (OSError, ValueError, RuntimeError) as error:
        shown = os.fspath(path).replace("\x00", "\\0")
        span = Span(shown, 1, 1, 1, 1)
        return LoadResult(None, [Diagnostic("SOA002", f"cannot read `{shown}`: {error}", span)])
    loader.read_all(root)
    diagnostics = loader.diagnostics
    parsed = [f for p in loader.order if (f := loader.files[p]) is not None]
    # Files that could not be read or parsed: their layouts are unknown, so layouts missing from a
    # file that imports one of them are not reported, but every other problem still is.
    broken = {p for p, f in loader.files.items() if f is None}
    # Names are global across files: one generated class each, imported by name.
    owners: dict[str, tuple[SchemaFile, Span]] = {}
    module_names: dict[str, SchemaFile] = {}
    for schema_file in parsed:
        problem = _module_name_problem(schema_file)
        if problem is not None:
            diagnostics.append(
                Diagnostic(
                    "SOA108",
                    f"`{schema_file.path}` cannot become a Python module: {problem}",
                    Span(schema_file.path, 1, 1, 1, 1),
                    "rename the file: letters, digits and `_`, not starting with a digit",
                )
            )
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
        declarations: list[Layout | Model] = [*schema_file.layouts, *schema_file.models]
        for declaration in declarations:
            owner = owners.get(declaration.name)
            if owner is not None and owner[0] is not schema_file:
                diagnostics.append(
                    Diagnostic(
                        "SOA403",
                        f"`{declaration.name}` is also declared in `{owner[0].path}`",
                        declaration.span,
                        "rename one of them: generated modules import layouts by name",
                        related=(("declared", owner[1]),),
                    )
                )
            owners.setdefault(declaration.name, (schema_file, declaration.span))
    visible_by_file: dict[Path, dict[str, Layout]] = {}
    for file_path in loader.order:
        checked = loader.files[file_path]
        if checked is None:
            continue
        visible = visible_by_file[file_path] = {}
        closure = _closure(file_path, loader.dependencies)
        for dependency in closure:
            dependency_file = loader.files.get(dependency)
            if dependency_file is not None:
                visible.update({layout.name: layout for layout in dependency_file.layouts})
        visible.update({layout.name: layout for layout in checked.layouts})
        problems = check_file(checked, visible)
        if broken.intersection(closure):
            problems = [d for d in problems if d.code != "SOA102"]
        diagnostics += problems
    if diagnostics or loader.files.get(root) is None:
        return LoadResult(None, _sorted(diagnostics), loader.sources)
    resolved: dict[Path, SchemaFile] = {}
    for file_path in loader.order:
        parsed_file = loader.files[file_path]
        if parsed_file is not None:
            resolved[file_path] = resolve_file(parsed_file, visible_by_file[file_path])
    schema = Schema(resolved[root], tuple(resolved.values()), tuple(loader.import_paths))
    return LoadResult(schema, [], loader.sources)


def _closure(start: Path, dependencies: dict[Path, list[Path]]) -> list[Path]:
    """Files whose layouts `start` can use: the ones it imports, directly or through others."""
    seen: dict[Path, None] = {}  # ordered, with constant-time membership: chains can be long
    pending = list(dependencies.get(start, []))
    while pending:
        current = pending.pop()
        if current not in seen and current != start:
            seen[current] = None
            pending += dependencies.get(current, [])
    return list(seen)


def _sorted(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    unique = {(d.code, d.message, d.span): d for d in diagnostics}
    return sorted(unique.values(), key=Diagnostic.sort_key)
