"""Which AOTInductor packages for CUDA torch's loader crashes on, for a lent GPU (`.ci/gpu check
tests`). Session 21 found torch 2.11's `aoti_load_package` dying with SIGSEGV in its constructor
on `soagen compile`'s GNN package, however loaded, while the same build loads on CPU. Each variant
below compiles a package for CUDA in a fresh process and loads it there with torch's public
loader, from torch alone up to soagen's whole build, so the first one that crashes says what
brings the crash in:

- `linear`: a torch-only nn.Linear, contiguous inputs, static shapes;
- `gnn`: the example GNN exported by torch on contiguous inputs, dynamic element counts;
- `gnn-soa`: soagen's export (strided SoA views, its wrapper) compiled without soagen's metadata;
- `gnn-soagen`: `soagen compile`'s package (metadata included), its own check skipped.

Variants share a budget of BUDGET_S. The first variant ended by a signal (SIGSEGV) has its package
loaded again, alone, in fresh processes: with
`AOT_INDUCTOR_WEIGHT_USE_CACHING_ALLOCATOR=1` (the constructor's weights through torch's caching
allocator instead of its own cudaMalloc), and under gdb where the image has it (a native backtrace:
the model's library, libtorch or libcuda).

Usage: python3 .ci/aot_cuda_probe.py [VARIANT PACKAGE | load PACKAGE]; without arguments, runs each
variant in a child process and prints one line per variant and per follow-up.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("linear", "gnn", "gnn-soa", "gnn-soagen")
# A cold compile of the GNN took about a minute on an H100; four variants fit `.ci/gpu`'s budget.
PER_VARIANT_S = 110
# A load alone takes seconds; under gdb, more.
FOLLOW_UP_S = 45
# Within `.ci/gpu check tests`' `timeout 380`: later variants get what is left.
BUDGET_S = 370


def build(variant: str, package: Path) -> None:
    import torch
    from torch._inductor import aoti_compile_and_package

    sys.path.insert(0, str(REPO))
    if variant in ("gnn-soa", "gnn-soagen"):
        import soagen.build.compile as compile_module

        compile_module._verify = lambda *arguments, **options: None
        compile_module.loads_in_a_fresh_process = lambda *arguments, **options: None
        compile_module.index_checks_in_package = lambda *arguments, **options: {}
        if variant == "gnn-soa":

            def without_metadata(exported, path, metadata, log):  # type: ignore[no-untyped-def]
                aoti_compile_and_package(exported, package_path=str(path))

            compile_module._compile = without_metadata
        compile_module.compile_model(
            REPO / "schemas" / "gnn.soa",
            "EdgeClassifier",
            str(REPO / "examples" / "gnn_model.py:build_model"),
            output=package,
            device="cuda",
        )
        return
    if variant == "linear":
        model = torch.nn.Linear(4, 2).cuda().eval()
        inputs: tuple[torch.Tensor, ...] = (torch.randn(8, 4, device="cuda"),)
        exported = torch.export.export(model, inputs)
    else:
        from examples.gnn_model import build_model

        model = build_model().cuda()
        nodes, edges = 40, 129
        inputs = (
            torch.randn(nodes, 4, device="cuda"),
            torch.randint(0, nodes, (2, edges), device="cuda"),
            torch.randn(edges, 2, device="cuda"),
        )
        n_nodes, n_edges = torch.export.Dim("nodes", min=2), torch.export.Dim("edges", min=2)
        exported = torch.export.export(
            model, inputs, dynamic_shapes=({0: n_nodes}, {1: n_edges}, {0: n_edges})
        )
    aoti_compile_and_package(exported, package_path=str(package))


def probe(variant: str, package: Path) -> None:
    from torch._inductor import aoti_load_package

    if variant != "load":
        build(variant, package)
        print(f"built {package.stat().st_size} bytes", flush=True)
    aoti_load_package(str(package))
    print("loaded", flush=True)


def run(
    label: str, command: list[str], timeout: float, env: dict[str, str] | None = None
) -> int | None:
    """Run one child in a session of its own, print its line (and its error's tail); its exit
    status (negative: the signal that ended it), or None when it overran and was killed."""
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=env,
        start_new_session=True,  # gdb's debuggee too goes with the group
    )
    try:
        stdout, stderr = child.communicate(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        print(f"{label}: not done within {timeout:.0f} s", flush=True)
        return None
    steps = " / ".join(stdout.split("\n")).strip(" /")
    print(f"{label}: rc {child.returncode}: {steps[-2000:]}", flush=True)
    if child.returncode != 0:
        print(stderr.strip()[-3000:], flush=True)
    return child.returncode


def follow_up(package: Path, deadline: float) -> None:
    """Load a package that crashed again, alone: another allocator, and a native backtrace."""
    load = [sys.executable, "-X", "faulthandler", __file__, "load", str(package)]
    env = {**os.environ, "AOT_INDUCTOR_WEIGHT_USE_CACHING_ALLOCATOR": "1"}
    run("  load alone, caching allocator", load, min(FOLLOW_UP_S, left(deadline)), env)
    gdb = shutil.which("gdb")
    if gdb is None:
        print("  gdb: not on this image", flush=True)
        return
    batch = [gdb, "-batch", "-ex", "run", "-ex", "bt 30", "--args", *load]
    run("  load alone under gdb", batch, min(FOLLOW_UP_S, left(deadline)))


def left(deadline: float) -> float:
    return deadline - time.monotonic()


def main() -> int:
    if len(sys.argv) > 2:
        probe(sys.argv[1], Path(sys.argv[2]))
        return 0
    deadline = time.monotonic() + BUDGET_S
    followed = False
    for variant in VARIANTS:
        if left(deadline) < 30:
            print(f"{variant}: not run, the probe's {BUDGET_S} s are spent", flush=True)
            continue
        package = Path(tempfile.mkdtemp()) / f"{variant}.pt2"
        command = [sys.executable, "-X", "faulthandler", __file__, variant, str(package)]
        status = run(variant, command, min(PER_VARIANT_S, left(deadline)))
        crashed = status is not None and status < 0  # ended by a signal, SIGSEGV say
        if crashed and package.is_file() and not followed:
            followed = True  # the first crash names the cause
            follow_up(package, deadline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
