"""A published HEP tagger nobody on the team wrote, as CMS deploys it: weaver-core's ParticleNet in
ONNX, run by soagen's ONNX Runtime backend on the SoA blocks in place.

weaver-core (its wheel from conftest.py's `weaver_root` fixture) exports ParticleNet for CMSSW with
`train.py --export-onnx`: the model built `for_inference` (softmax outputs, the gather of
neighbours in its "cpu mode"), in eval mode, traced by the TorchScript-based exporter
(`dynamo=False`) with a dynamic batch axis, on inputs of ones whose dynamic axes are at least 2
(weaver's note: a traced axis of 1 can be baked into the graph). The session fixture here does the same with a small
`ParticleNetTagger` (two EdgeConv blocks of k = 8 neighbours, fixed-seed weights and batch-norm
statistics) reading one jet per element: its particle-flow candidates (32 slots) and secondary
vertices (8) as array columns bound `[n, C, P]`, whose element axis has stride 1 in the buffer.

Its k-nearest-neighbour search is a `TopK` over the pairwise distances, and the neighbours' features
are gathered with index arithmetic over the flattened batch (`arange(batch) * points + idx`): both
export with the batch dynamic and run in ONNX Runtime as in torch. Padded slots are ties in
that search (all at weaver's 1e9 coordinate shift) whose gathered features are all zero, so the
order ONNX Runtime breaks them in does not change the scores.

The scores soagen writes equal eager torch's on contiguous copies of the blocks (within 2e-7) at
n = 0, 1, 2, 7 and 300, on slices of a larger collection (in its middle, and at its end where the rows are bound
from before the slice), at two alignments, with staged and in-place outputs; each geometry's
first call is compared with the original file on contiguous copies, and passes.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import soagen.runtime.onnx as soagen_onnx  # noqa: E402
from tests.helpers import generate_package, import_generated  # noqa: E402

# One jet per element: its particle-flow candidates (32 slots) and secondary vertices (8), each
# with (eta, phi) points, 16 and 11 features and a mask; 5 classes.
SCHEMA = """
layout Jets {{
    align {align}
    column float32[2, 32] pf_points
    column float32[16, 32] pf_features
    column float32[1, 32] pf_mask
    column float32[2, 8] sv_points
    column float32[11, 8] sv_features
    column float32[1, 8] sv_mask
}}

layout JetScores {{
    align {align}
    column float32[5] softmax
}}

model Tagger {{
    input pf_points = Jets{{pf_points}} as [n, 2, 32]
    input pf_features = Jets{{pf_features}} as [n, 16, 32]
    input pf_mask = Jets{{pf_mask}} as [n, 1, 32]
    input sv_points = Jets{{sv_points}} as [n, 2, 8]
    input sv_features = Jets{{sv_features}} as [n, 11, 8]
    input sv_mask = Jets{{sv_mask}} as [n, 1, 8]
    output softmax = JetScores{{softmax}} as [n, 5]
}}
"""

# Each input's [features, slots], in the model's order.
INPUTS = {
    "pf_points": (2, 32),
    "pf_features": (16, 32),
    "pf_mask": (1, 32),
    "sv_points": (2, 8),
    "sv_features": (11, 8),
    "sv_mask": (1, 8),
}


def _build(weaver_root: Path) -> Any:
    """weaver's ParticleNetTagger as its ONNX export builds it, with fixed weights and statistics."""
    sys.path.insert(0, str(weaver_root))
    try:
        from weaver.nn.model.ParticleNet import ParticleNetTagger
    finally:
        sys.path.remove(str(weaver_root))
    torch.manual_seed(0)
    net = ParticleNetTagger(
        pf_features_dims=16,
        sv_features_dims=11,
        num_classes=5,
        conv_params=[(8, (32, 32)), (8, (64, 64))],
        fc_params=[(64, 0.1)],
        for_inference=True,
    )
    # Batch norms as a trained model has them (fresh ones are the identity on their inputs).
    for module in net.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.running_mean.normal_(0, 0.2)
            module.running_var.uniform_(0.5, 2.0)
    net.eval()
    # A trained tagger's scores spread over (0, 1); a fresh one's stay within 0.01 of 1/5. Its
    # last layer scaled, and its bias centring the logits of some jets: scores as a trained one's.
    last = net.pn.fc[-1]
    logits: list[torch.Tensor] = []
    hook = last.register_forward_hook(lambda module, args, output: logits.append(output))
    with torch.no_grad():
        last.weight.mul_(10)
        last.bias.zero_()
        net(*_jet_tensors(500, seed=12345).values())
        last.bias.sub_(logits[0].mean(0))
    hook.remove()
    return net


@pytest.fixture(scope="session")
def particlenet(
    weaver_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Path, dict[int, ModuleType]]:
    """(the eager model, its ONNX file, the generated module by alignment)."""
    folder = tmp_path_factory.mktemp("particlenet")
    net = _build(weaver_root)
    path = folder / "particlenet.onnx"
    # weaver's own example inputs: ones, with a batch of 2.
    example = tuple(torch.ones(2, *shape) for shape in INPUTS.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's warnings on Python scalars from sizes
        torch.onnx.export(
            net,
            example,
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=list(INPUTS),
            output_names=["softmax"],
            dynamic_axes={name: {0: "N"} for name in [*INPUTS, "softmax"]},
        )
    onnx = pytest.importorskip("onnx")
    graph = onnx.load(str(path)).graph
    assert {"TopK", "Gather"} <= {node.op_type for node in graph.node}
    assert {put.type.tensor_type.shape.dim[0].dim_param for put in graph.input} == {"N"}
    modules = {}
    for align in (32, 256):
        schema = folder / f"jets{align}.soa"
        schema.write_text(SCHEMA.format(align=align))
        generate_package(schema, folder, f"pkg_pnet{align}")
        modules[align] = import_generated(folder, f"pkg_pnet{align}", f"jets{align}")
    return net, path, modules


def _jet_tensors(n: int, seed: int) -> dict[str, torch.Tensor]:
    """Jets whose first slots are filled (1 to 32 candidates, 0 to 8 vertices), the others zero:
    (eta, phi) within a jet's cone, features random about the jet's own offsets."""
    generator = torch.Generator().manual_seed(seed)
    found: dict[str, torch.Tensor] = {}
    for prefix, least in (("pf", 1), ("sv", 0)):
        features, slots = INPUTS[f"{prefix}_features"]
        filled = torch.randint(least, slots + 1, (n,), generator=generator)
        mask = (torch.arange(slots)[None, :] < filled[:, None]).float()[:, None, :]
        points = torch.randn(n, 2, slots, generator=generator) * 0.3
        values = torch.randn(n, features, slots, generator=generator)
        values += 2 * torch.randn(n, features, 1, generator=generator)
        found |= {f"{prefix}_points": points * mask, f"{prefix}_features": values * mask}
        found[f"{prefix}_mask"] = mask
    return {name: found[name] for name in INPUTS}


def _jets(module: ModuleType, n: int, seed: int) -> Any:
    jets = module.Jets.allocate(n)
    for name, values in _jet_tensors(n, seed).items():
        getattr(jets, name).copy_(values)
    return jets


def _eager(net: Any, module: ModuleType, jets: Any) -> torch.Tensor:
    blocks = [jets.block(spec.block).contiguous() for spec in module.Tagger.INPUTS]
    with torch.no_grad():
        result: torch.Tensor = net(*blocks)
    return result


@pytest.mark.parametrize(("align", "outputs"), [(32, "staged"), (256, "in_place")])
def test_particlenet_onnx_on_the_blocks_equals_eager_torch(
    particlenet: tuple[Any, Path, dict[int, ModuleType]],
    align: int,
    outputs: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net, path, modules = particlenet
    module = modules[align]
    compared: list[bool] = []  # each first-call comparison with the original file, and its verdict
    real = soagen_onnx.OnnxBackend._compare

    def counted(self: Any, *args: Any) -> None:
        compared.append(False)
        real(self, *args)
        compared[-1] = True

    monkeypatch.setattr(soagen_onnx.OnnxBackend, "_compare", counted)
    model = module.Tagger.load(path, backend_options={"outputs": outputs})
    worst = 0.0
    for n in (0, 1, 2, 7, 300):
        jets = _jets(module, n, seed=n)
        scores = module.JetScores.allocate(n, zero=True)
        before = jets.buffer.clone()
        model(jets, out=scores)
        assert torch.equal(jets.buffer, before)  # inputs untouched
        want = _eager(net, module, jets)
        torch.testing.assert_close(scores.softmax, want, rtol=1e-5, atol=1e-6, msg=f"n={n}")
        worst = max([worst, *(scores.softmax - want).abs().flatten().tolist()])
    # The scores tell jets apart: a wrong read would show.
    assert len(set(want.argmax(1).tolist())) > 1 and want.std(0).min() > 0.01, (
        want.std(0),
        want.argmax(1).bincount(),
    )
    # Slices of a larger collection: in its middle, and at its end (bound from before the slice).
    jets = _jets(module, 500, seed=500)
    scores = module.JetScores.allocate(500, zero=True)
    for start, stop in ((123, 160), (470, 500)):
        model(jets.slice(start, stop), out=scores.slice(start, stop))
        want = _eager(net, module, jets.slice(start, stop))
        got = scores.softmax[start:stop]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"[{start}:{stop}]")
        worst = max([worst, *(got - want).abs().flatten().tolist()])
    # Only the slices' elements were written.
    assert not scores.softmax[:123].any() and not scores.softmax[160:470].any()
    assert torch.allclose(scores.softmax[123:160].sum(1), torch.ones(37))
    # Compared with the original file: the first call, and the slice bound from before its start.
    assert compared == [True, True], compared
    print(f"align {align}, {outputs}: max |soagen - eager| = {worst:.3g}")
