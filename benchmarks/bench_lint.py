"""How long `soagen lint` takes over 100 generated schemas of realistic size, and what it imports.

    python benchmarks/bench_lint.py [--quick] [--files 100]

Each schema imports a shared file and declares 4 layouts of 10 to 16 members (column groups, array
columns, scalars) and 2 models of 4 bindings: about 70 lines, like a reconstruction step's schema.
Prints a Markdown table of medians (min-max); the budget is 1 s for the command over 100 files. Exits
1 over budget or if lint imports torch or numpy.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from timing import markdown_row, samples

REPO = Path(__file__).resolve().parent.parent
BUDGET_S = 1.0

COMMON = """//! Layouts every step shares.

/// Beam spot of the event.
layout BeamSpot {
    align 128
    column float32 x0, y0, z0
    column float32[3, 3] covariance
    scalar float32 sigma_z
}
"""


def schema(index: int) -> str:
    """One realistic schema; names vary with the index so every file is distinct."""
    lines = [f"//! Reconstruction step {index}.", 'import "common.soa"', ""]
    for layout in range(4):
        name = f"Step{index}Collection{layout}"
        extra = ", ".join(f"q{k}" for k in range(layout + 2))
        lines += [
            f"/// Collection {layout} of step {index}.",
            f"layout {name} {{",
            "    align 128",
            "    /// Position.",
            "    column float32 x, y, z",
            "    column float32 px, py, pz, energy",
            f"    column float32 {extra}",
            "    column int32 detector_id, quality",
            "    column int16 charge",
            "    column float32[3, 3] covariance",
            "    scalar float32 bfield",
            "    scalar int64 run",
            "}",
            "",
        ]
    for model in range(2):
        first, second = f"Step{index}Collection{model * 2}", f"Step{index}Collection{model * 2 + 1}"
        lines += [
            f"/// Model {model} of step {index}.",
            f"model Step{index}Model{model} {{",
            f"    input  positions = {first}{{x, y, z}} as [n, c]",
            f"    input  momenta   = {first}{{px, py, pz, energy}} as [n, c]",
            "    input  beam      = BeamSpot{x0, y0, z0} as [c, n]",
            f"    output scores    = {second}{{x, y, z}} as [n, c]",
            "}",
            "",
        ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="few repeats: checks the script works")
    parser.add_argument("--files", type=int, default=100, help="number of schemas (default 100)")
    args = parser.parse_args()
    repeats = 3 if args.quick else 10

    sys.path.insert(0, str(REPO))
    from soagen.tools.lint import lint

    folder = Path(tempfile.mkdtemp(prefix="soagen-bench-lint-"))
    (folder / "common.soa").write_text(COMMON)
    paths = [folder / f"step{i}.soa" for i in range(args.files)]
    for index, path in enumerate(paths):
        path.write_text(schema(index))
    lines = sum(len(path.read_text().splitlines()) for path in paths)

    report = lint(paths)
    if report.schema_errors:
        print("generated schemas have errors:", report.diagnostics[:3], file=sys.stderr)
        return 1
    command = [sys.executable, "-m", "soagen", "lint", str(folder)]
    command_samples = samples(
        lambda: subprocess.run(command, check=True, capture_output=True), repeats
    )
    rows = [
        markdown_row(
            f"lint {args.files} files (in process)", samples(lambda: lint(paths), repeats)
        ),
        markdown_row(f"`soagen lint` over {args.files} files (new process)", command_samples),
    ]
    print(f"{args.files} schemas, {lines} lines, {len(report.diagnostics)} findings\n")
    print("| what | median ms | min - max ms |\n|---|---|---|")
    print("\n".join(rows))

    probe = (
        "import sys; from soagen.cli import main; "
        f"main(['lint', {str(folder)!r}, '--format', 'json']); "
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules), file=sys.stderr)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )
    heavy = result.stderr.strip().splitlines()[-1]
    print(f"\nimports torch/numpy: {heavy}")
    median = statistics.median(command_samples)
    if heavy != "[]":
        return 1
    if median > BUDGET_S:
        print(f"over budget: {median:.2f} s > {BUDGET_S} s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
