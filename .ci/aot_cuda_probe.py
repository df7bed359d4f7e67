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

Usage: python3 .ci/aot_cuda_probe.py [VARIANT]; without one, runs each in a child process and
prints one line per variant.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("linear", "gnn", "gnn-soa", "gnn-soagen")
# A cold compile of the GNN took about a minute on an H100; four variants fit `.ci/gpu`'s budget.
PER_VARIANT_S = 110


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


def probe(variant: str) -> None:
    from torch._inductor import aoti_load_package

    package = Path(tempfile.mkdtemp()) / f"{variant}.pt2"
    build(variant, package)
    print(f"built {package.stat().st_size} bytes", flush=True)
    aoti_load_package(str(package))
    print("loaded", flush=True)


def main() -> int:
    if len(sys.argv) > 1:
        probe(sys.argv[1])
        return 0
    for variant in VARIANTS:
        try:
            done = subprocess.run(
                [sys.executable, "-X", "faulthandler", __file__, variant],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=PER_VARIANT_S,
            )
        except subprocess.TimeoutExpired:
            print(f"{variant}: not done within {PER_VARIANT_S} s", flush=True)
            continue
        steps = " / ".join(done.stdout.split("\n")).strip(" /")
        print(f"{variant}: rc {done.returncode}: {steps}", flush=True)
        if done.returncode != 0:
            print(done.stderr.strip()[-3000:], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
