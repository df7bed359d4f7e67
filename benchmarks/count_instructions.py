"""Instructions per call of the small-call paths (`bench_models.small_call_paths`), counted by
valgrind's callgrind: a count that this noisy guest's timings cannot blur.

    python benchmarks/count_instructions.py [--calls 2000] [--out benchmarks/results]

The AOT packages are built first, outside valgrind (cached as `bench_models.py` caches them). Then
a second process runs under `valgrind --tool=callgrind --instr-atstart=no`: it checks every path
against its reference, warms each up, and only then turns instrumentation on; each path runs
`--calls` times between a reset of the counters and a dump named after it (callgrind's client
requests, through a small C helper built with the system compiler). An empty call's count, the
loop's own cost, is taken off every path. Prints a markdown table and writes it, with the raw
counts, to `--out/instructions.json`.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import bench_models  # noqa: E402
from benchmarks.models import build_mlp  # noqa: E402
from examples.gnn_model import build_model as build_gnn  # noqa: E402
from soagen.runtime import set_cpu_threads  # noqa: E402

# The packages the counted paths load: the AOT runner as `soagen compile` builds it by default,
# and with --write-outputs (the call a plan runs as one bound call of the runner).
BACKENDS = ["eager", "aot", "aot-write"]
EMPTY_CALL = "empty call (the loop)"
# The paths counted at the main tables' sizes (`--sizes`), besides the ideal one.
SIZED_PATHS = ("soagen ", "naive torch.stack")
MARCH = "x86-64-v3"

_CLIENT_REQUESTS = r"""
#include <valgrind/callgrind.h>
void start_instrumentation(void) { CALLGRIND_START_INSTRUMENTATION; }
void zero_stats(void) { CALLGRIND_ZERO_STATS; }
void dump_stats_at(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
"""


def client_requests(folder: Path) -> ctypes.CDLL:
    """callgrind's client requests as C functions (they are machine-code sequences that valgrind
    recognises, so Python needs them compiled): outside valgrind they do nothing."""
    source, library = folder / "requests.c", folder / "requests.so"
    source.write_text(_CLIENT_REQUESTS)
    subprocess.run(
        ["cc", "-O1", "-shared", "-fPIC", str(source), "-o", str(library)],
        check=True,
        capture_output=True,
    )
    return ctypes.CDLL(str(library))


def counted(dumps: Path) -> dict[str, int]:
    """Instructions per dump label, read from callgrind's dump files (`desc: Trigger: Client
    Request: LABEL` and the `summary:` or `totals:` line)."""
    found: dict[str, int] = {}

    def dump_number(path: Path) -> int:
        suffix = path.name.rsplit(".", 1)[-1]
        return int(suffix) if suffix.isdigit() else 0

    for path in sorted(dumps.glob("callgrind.out.*"), key=dump_number):
        text = path.read_text(errors="replace")
        label = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.MULTILINE)
        total = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
        if label and total:
            found[label.group(1)] = int(total.group(1))
    return found


def child(args: argparse.Namespace) -> int:
    """The process valgrind runs: every path checked and warmed up, then counted."""
    set_cpu_threads(1, 1)
    requests = client_requests(Path(args.folder))
    workdir = Path(tempfile.mkdtemp(prefix="soagen-count-"))
    tools = bench_models.Tools(
        modules={
            "mlp": bench_models.generated_module(bench_models.MLP_SCHEMA, workdir, "count_mlp"),
            "gnn": bench_models.generated_module(bench_models.GNN_SCHEMA, workdir, "count_gnn"),
        },
        nets={"mlp": build_mlp(), "gnn": build_gnn()},
        backends=BACKENDS,
    )
    for entry in args.package:
        key, path = entry.split("=", 1)
        tools.packages[key] = Path(path)
    labelled: list[tuple[str, Callable[[], object], int]] = [(EMPTY_CALL, lambda: None, args.calls)]
    for model, (case, paths) in bench_models.small_call_paths(tools).items():
        check = bench_models.verifier(case)
        for name, path in paths.items():
            label = f"{model}/{name}"
            if args.only is None or args.only in label or name.endswith("runner alone"):
                check(name, path)
                labelled.append((label, path, args.calls))
    for n in args.sizes:
        # Fewer calls where each does more: the count per call is as exact with a few.
        calls = max(5, args.calls * 100 // n)
        for model, build in bench_models.BUILDERS.items():
            prefix = f"{model} n={n}/"
            if (
                args.only is not None
                and "/" in args.only
                and args.only.split("/")[0] + "/" not in prefix
            ):
                continue  # another model or size: not built, as valgrind runs it slowly
            case = build(n, "cpu", tools)
            check = bench_models.verifier(case)
            for name, path in case.paths.items():
                if name == "ideal" or (
                    name.startswith(SIZED_PATHS)
                    and (args.only is None or args.only in prefix + name)
                ):
                    check(name, path)
                    labelled.append((f"{model} n={n}/{name}", path, calls))
    for _, path, calls in labelled:
        for _ in range(min(calls, 100)):
            path()
    (Path(args.folder) / "calls.json").write_text(
        json.dumps({label: calls for label, _, calls in labelled})
    )
    requests.start_instrumentation()
    for label, path, calls in labelled:
        requests.zero_stats()
        for _ in range(calls):
            path()
        requests.dump_stats_at(label.encode())
    return 0


def table(counts: Mapping[str, int], calls: Mapping[str, int]) -> list[str]:
    """Instructions per call of each path (`calls`: how many each ran), the empty call's taken
    off: at n = 2, set against its backend's bare runner; at the sizes of the main tables, against
    the ideal path at that size."""
    loop = counts[EMPTY_CALL] / calls[EMPTY_CALL]
    per_call = {label: counts[label] / calls[label] - loop for label in counts}
    small = [
        "| model | path | instructions per call | over its bare runner |",
        "|---|---|---:|---:|",
    ]
    sized = ["| model | n | path | instructions per call | to ideal |", "|---|---:|---|---:|---:|"]
    for label, value in per_call.items():
        if label == EMPTY_CALL:
            continue
        model, name = label.split("/", 1)
        if " n=" in model:
            model, n = model.split(" n=")
            ideal = per_call.get(f"{model} n={n}/ideal")
            ratio = f"{value / ideal:.3f}x" if ideal else ""
            sized.append(f"| {model} | {int(n):.0e} | {name} | {value:,.0f} | {ratio} |")
            continue
        runner = f"{model}/{bench_models.backend_of(name)} runner alone"
        over = f"{value - per_call[runner]:+,.0f}" if runner in per_call else ""
        small.append(f"| {model} | {name} | {value:,.0f} | {over} |")
    footer = f"\nAn empty call (the loop, taken off every row): {loop:,.0f} instructions."
    return small + ([""] + sized if len(sized) > 2 else []) + [footer]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per path (default 2000)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument(
        "--sizes",
        type=lambda text: [int(float(n)) for n in text.split(",") if n],
        default=[],
        help="also count the ideal, naive and soagen paths at these n (e.g. 1e3,1e5)",
    )
    parser.add_argument("--keep", type=Path, help="copy callgrind's dumps into this folder")
    parser.add_argument(
        "--only",
        help="count only the paths whose MODEL/NAME (MODEL n=N/NAME at --sizes) has this text; "
        "with a slash, only that model (and size) is built",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--package", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("count_instructions: valgrind is not on PATH; nothing was counted", file=sys.stderr)
        return 2
    # Valgrind runs no AVX-512, which a native build on such a CPU uses: the packages are built
    # for x86-64-v3 with AVX2 vectors instead (ATen picks the same for itself under valgrind), in
    # a cache of their own.
    os.environ["TORCHINDUCTOR_CPP_MARCH"] = MARCH
    os.environ["ATEN_CPU_CAPABILITY"] = "avx2"
    packages, failed = bench_models.aot_packages(
        BACKENDS, ["cpu"], args.out / f"packages-{MARCH}-avx2"
    )
    if failed is not None:
        print(f"count_instructions: the AOT packages did not build: {failed}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="soagen-callgrind-") as folder:
        command = [
            valgrind,
            "--tool=callgrind",
            "--quiet",
            "--instr-atstart=no",
            f"--callgrind-out-file={folder}/callgrind.out",
            sys.executable,
            __file__,
            "--child",
            f"--folder={folder}",
            f"--calls={args.calls}",
            *([] if args.only is None else [f"--only={args.only}"]),
            *([f"--sizes={','.join(map(str, args.sizes))}"] if args.sizes else []),
            *(f"--package={key}={path}" for key, path in packages.items()),
        ]
        print("running the paths under callgrind (minutes) ...", file=sys.stderr, flush=True)
        subprocess.run(command, check=True)
        counts = counted(Path(folder))
        calls = json.loads((Path(folder) / "calls.json").read_text())
        if args.keep is not None:  # for `callgrind_annotate`: one dump per path, named by it
            args.keep.mkdir(parents=True, exist_ok=True)
            for dump in Path(folder).glob("callgrind.out.*"):
                shutil.copy(dump, args.keep / dump.name)
    lines = table(counts, calls)
    print("\n".join(lines))
    report: dict[str, Any] = {"calls": calls, "instructions": counts, "table": lines}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "instructions.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
