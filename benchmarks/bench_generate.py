"""How long `soagen SCHEMA` takes, in-process and as a command, and what it imports.

    python benchmarks/bench_generate.py [--quick] [--schema schemas/gnn.soa]

Prints a Markdown table of medians (min-max). The command must stay well under a second and import
neither torch nor numpy; the script exits 1 if it imports either.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from timing import markdown_row, samples

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="few repeats: checks the script works")
    parser.add_argument("--schema", default=str(REPO / "schemas" / "gnn.soa"))
    args = parser.parse_args()
    repeats = 3 if args.quick else 20

    sys.path.insert(0, str(REPO))
    from soagen.dsl.loader import load
    from soagen.generator.python import generate

    out = tempfile.mkdtemp(prefix="soagen-bench-")
    command = [sys.executable, "-m", "soagen", args.schema, "-o", out]
    rows = [
        markdown_row(
            "load + check (in process)", samples(lambda: load(args.schema).unwrap(), repeats)
        ),
        markdown_row(
            "load + check + generate (in process)",
            samples(lambda: generate(load(args.schema).unwrap()), repeats),
        ),
        markdown_row(
            "`soagen SCHEMA` command (new process)",
            samples(lambda: subprocess.run(command, check=True, capture_output=True), repeats),
        ),
    ]
    trace = subprocess.run(
        [sys.executable, "-X", "importtime", *command[1:]],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    heavy = sorted(
        {
            line.rsplit("|", 1)[-1].strip().split(".")[0]
            for line in trace.stderr.splitlines()
            if line.rsplit("|", 1)[-1].strip().split(".")[0] in ("torch", "numpy")
        }
    )
    print(f"Schema: {args.schema}, {repeats} repeats\n")
    print("| step | median ms | min - max ms |\n|---|---|---|")
    print("\n".join(rows))
    print(f"\nHeavy imports during `soagen SCHEMA`: {', '.join(heavy) if heavy else 'none'}")
    return 1 if heavy else 0


if __name__ == "__main__":
    raise SystemExit(main())
