"""A transformer nobody on the team wrote: weaver-core's Particle Transformer (ParT), end to end.

weaver-core is the public framework CMS jet taggers are trained with; its wheel comes from
conftest.py's `weaver_root` fixture, and the model's weights from a fixed seed. A small tagger
(1 layer, 64-wide embeddings) reads one jet per element of a SoA collection: its particle-flow
candidates and secondary vertices as array columns bound `[n, features, slots]`, whose element
axis is the one with stride 1, as CMSSW lays them out. Slots are fewer than CMSSW's (32 and 8, not
128 and 16) and there is one attention layer, for time: Inductor's compile time grows with the
layers and the pair features with the square of the slots (at 128 slots the eager runs of `soagen
compile` at its example size took a minute), and everything tested here, the miscompile included,
holds as well.

- eager and TorchScript agree with the model on contiguous copies, and leave the inputs as they are;
- `torch.compile` agrees with eager, and the Inductor miscompile this model meets under
  `backed_size_oblivious` is caught by the backend's check instead of returning wrong scores;
- `soagen compile` refuses it loudly: the NaN eager reference on random four-vectors, then (with
  `--examples` giving physical ones) the export error at the line of ParT's code that has a
  data-dependent size.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from soagen.build.compile import CompileError, compile_model  # noqa: E402
from soagen.build.errors import CommandError  # noqa: E402
from soagen.runtime import CompiledModelMismatchError  # noqa: E402
from tests.helpers import generate_package, import_generated  # noqa: E402

SCHEMA = """
/// One jet per element: its particle-flow candidates (32 slots) and secondary vertices (8).
layout Jets {
    column float32[17, 32] pf_features
    column float32[4, 32] pf_vectors
    column float32[1, 32] pf_mask
    column float32[11, 8] sv_features
    column float32[4, 8] sv_vectors
    column float32[1, 8] sv_mask
}

layout JetScores {
    column float32[10] probabilities
}

model Tagger {
    input pf_features = Jets{pf_features} as [n, 17, 32]
    input pf_vectors = Jets{pf_vectors} as [n, 4, 32]
    input pf_mask = Jets{pf_mask} as [n, 1, 32]
    input sv_features = Jets{sv_features} as [n, 11, 8]
    input sv_vectors = Jets{sv_vectors} as [n, 4, 8]
    input sv_mask = Jets{sv_mask} as [n, 1, 8]
    output probabilities = JetScores{probabilities} as [n, 10]
}
"""

FACTORY = """
import sys

sys.path.insert(0, {root!r})

import torch
from weaver.nn.model.ParticleTransformer import ParticleTransformerTagger


def build():
    torch.manual_seed(0)
    return ParticleTransformerTagger(
        pf_input_dim=17, sv_input_dim=11, num_classes=10, embed_dims=[64, 64],
        pair_embed_dims=[32, 32], num_heads=4, num_layers=1, num_cls_layers=1, fc_params=[],
        for_inference=True,
    )


def fill_jets(jets, seed):
    # Realistic jets: the first k slots of each jet filled, four-vectors with E > |p| (random
    # normal ones give the tagger NaN masses), features random, the other slots zero.
    generator = torch.Generator().manual_seed(seed)
    n = jets.size
    for prefix, slots, least in (("pf", 32, 1), ("sv", 8, 0)):
        filled = torch.randint(least, slots + 1, (n,), generator=generator)
        mask = (torch.arange(slots)[None, :] < filled[:, None]).float()[:, None, :]
        features = getattr(jets, f"{{prefix}}_features")
        features.copy_(torch.randn(features.shape, generator=generator) * mask)
        momentum = torch.randn(n, 3, slots, generator=generator) * 10
        mass = 0.1 + 0.9 * torch.rand(n, 1, slots, generator=generator)
        energy = (momentum.square().sum(1, keepdim=True) + mass.square()).sqrt()
        getattr(jets, f"{{prefix}}_vectors").copy_(torch.cat([momentum, energy], 1) * mask)
        getattr(jets, f"{{prefix}}_mask").copy_(mask)


def physical(collections):
    fill_jets(collections["Jets"], seed=collections["Jets"].size)
"""


@pytest.fixture(scope="session")
def part(weaver_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, Any]:
    """The generated module and the factory module (`build`, `physical`)."""
    folder = tmp_path_factory.mktemp("part")
    (folder / "jets.soa").write_text(SCHEMA)
    (folder / "part_factory.py").write_text(FACTORY.format(root=str(weaver_root)))
    generate_package(folder / "jets.soa", folder, "pkg_part")
    sys.path.insert(0, str(folder))
    try:
        import part_factory
    finally:
        sys.path.remove(str(folder))
    return import_generated(folder, "pkg_part", "jets"), part_factory


def _event(part: tuple[ModuleType, Any], n: int) -> Any:
    module, factory = part
    jets = module.Jets.allocate(n)
    factory.fill_jets(jets, seed=n)
    return jets


def _reference(net: torch.nn.Module, module: ModuleType, jets: Any) -> torch.Tensor:
    blocks = [jets.block(spec.block).contiguous() for spec in module.Tagger.INPUTS]
    with torch.no_grad():
        result: torch.Tensor = net(*blocks)
    return result


def _run(model: Any, module: ModuleType, jets: Any) -> torch.Tensor:
    scores = module.JetScores.allocate(jets.size, zero=True)
    before = jets.buffer.clone()
    model(jets, out=scores)
    assert torch.equal(jets.buffer, before)  # inputs untouched
    return scores.probabilities.clone()


@pytest.mark.parametrize("backend", ["eager", "torchscript"])
def test_eager_and_torchscript_match_the_model_on_contiguous_copies(
    part: tuple[ModuleType, Any], backend: str
) -> None:
    module, factory = part
    net = factory.build().eval()
    if backend == "torchscript":
        example = tuple(
            _event(part, 37).block(spec.block).contiguous() for spec in module.Tagger.INPUTS
        )
        with torch.no_grad():
            model = module.Tagger(torch.jit.trace(net, example, check_trace=False))
    else:
        model = module.Tagger(net)
    for n in (1, 2, 37, 300):
        jets = _event(part, n)
        got, want = _run(model, module, jets), _reference(net, module, jets)
        assert got.isfinite().all()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"n={n}")


def test_torch_compile_agrees_with_eager_or_is_refused(part: tuple[ModuleType, Any]) -> None:
    """What soagen sets (dynamic sizes, no duck shaping) compiles ParT right; under
    `backed_size_oblivious`, Inductor miscompiles it (scores off by up to 0.8), and the backend's
    check raises instead of writing them."""
    import torch.fx.experimental._config as fx_config
    from torch._inductor import config as inductor_config

    module, factory = part
    net = factory.build().eval()
    jets = _event(part, 37)
    want = _reference(net, module, jets)
    model = module.Tagger(net, backend="compile")
    torch.testing.assert_close(_run(model, module, jets), want, rtol=1e-4, atol=1e-5)
    assert model.compiled_graphs and model.compiled_graphs[0].inputs[0][1] == (37, 17, 32)
    # Dynamo's graphs for ParT's code serve any instance: forget them, so that the next call
    # compiles under the setting (and forget those after, so that no later test meets them). At
    # n = 300 the miscompiled scores were off by up to 0.84 (2976 of 3000 values) with this
    # config, 0.73 with the former 2 layers and 128 slots; at other sizes by varying amounts.
    torch._dynamo.reset()
    model = module.Tagger(factory.build().eval(), backend="compile")
    jets = _event(part, 300)
    scores = module.JetScores.allocate(300, zero=True)
    # Compiled, not read from Inductor's on-disk caches, whose keys may not hold the setting.
    no_caches = inductor_config.patch(force_disable_caches=True)  # type: ignore[attr-defined]
    try:
        with fx_config.patch(backed_size_oblivious=True), no_caches:  # type: ignore[attr-defined]
            with pytest.raises(
                CompiledModelMismatchError,
                match=r"output 'probabilities' at pf_features n=300, .* values differ beyond",
            ):
                model(jets, out=scores)
    finally:
        torch._dynamo.reset()
    assert not scores.probabilities.any()


def test_soagen_compile_refuses_it_loudly(part: tuple[ModuleType, Any], tmp_path: Path) -> None:
    """Random normal four-vectors give ParT NaN masses: the reference is named as NaN. With
    physical ones (--examples) the export fails at ParT's own line with a data-dependent size
    (`ones().tril().nonzero()` pairs), which the message shows with torch's hint."""
    module, factory = part
    schema = Path(module.__file__).parent.parent / "jets.soa"
    factory_file = Path(factory.__file__)
    arguments: Mapping[str, Any] = {"output": tmp_path / "tagger.pt2"}
    with pytest.raises(CommandError, match="the eager model itself returns NaN") as nan:
        compile_model(schema, "Tagger", f"{factory_file}:build", **arguments)
    assert "--examples FILE.py:FUNCTION" in str(nan.value)
    with pytest.raises(CompileError) as refused:
        compile_model(
            schema,
            "Tagger",
            f"{factory_file}:build",
            examples=f"{factory_file}:physical",
            **arguments,
        )
    message = str(refused.value)
    assert "torch.export cannot export the model for Tagger" in message
    assert "ParticleTransformer.py:497 in _embed_pairs: elements = self.embed(x)" in message
    assert "the full text is in" in message and (tmp_path / "tagger.compile.log").is_file()
    assert len(message.splitlines()) < 10 and not (tmp_path / "tagger.pt2").exists()
