"""Small helpers shared by the tests: running the CLI in-process and generating into a temp package."""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
from pathlib import Path
from types import ModuleType

from soagen.cli import main
from soagen.dsl.loader import load
from soagen.generator.python import generate

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(list(args))
    return status, stdout.getvalue(), stderr.getvalue()


def generate_package(schema_path: Path, root: Path, package: str) -> dict[str, Path]:
    """Generate a schema (and its imports) into `root/package/` and return module paths by name."""
    target = root / package
    target.mkdir(parents=True, exist_ok=True)
    (target / "__init__.py").write_text("")
    written = {}
    for name, text in generate(load(schema_path).unwrap()).items():
        path = target / f"{name}.py"
        path.write_text(text)
        written[name] = path
    return written


def import_generated(root: Path, package: str, module: str) -> ModuleType:
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    return importlib.import_module(f"{package}.{module}")
