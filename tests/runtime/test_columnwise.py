"""`soagen.runtime.columnwise`: narrow `nn.Linear` layers rewritten as sums over input columns.

The rewrite must pick exactly the layers whose column form fuses, leave the original model as it
was, share its parameters, and compute what it computes on the strided block views soagen hands
over (any pitch, n = 0 and 1 included). Compiling the rewritten form is covered by the track
package in test_compile.py, built with `columnwise=True`.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from soagen.runtime.columnwise import (  # noqa: E402
    MAX_FUSED_OUTPUTS,
    ColumnwiseLinear,
    columnwise,
    max_unrolled_inputs,
)


def _mlp(*widths: int, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for width_in, width_out in zip(widths, widths[1:], strict=False):
        layers += [nn.Linear(width_in, width_out), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).eval()


def _block_view(n: int, columns: int, pitch_extra: int, seed: int) -> torch.Tensor:
    """A [n, c] view of c SoA columns with pitch n + pitch_extra, as a collection's block."""
    pitch = n + pitch_extra
    buffer = torch.randn(columns * pitch + 7, generator=torch.Generator().manual_seed(seed))
    return buffer.as_strided((n, columns), (1, pitch), 7)


def test_only_layers_whose_column_form_fuses_are_rewritten() -> None:
    wide_in = max_unrolled_inputs() + 1
    model = nn.Sequential(
        nn.Linear(4, 64),  # few inputs: unrolled into an elementwise expression
        nn.ReLU(),
        nn.Linear(64, wide_in),  # wide on both sides: stays a matrix product
        nn.ReLU(),
        nn.Sequential(nn.Linear(wide_in, MAX_FUSED_OUTPUTS)),  # few outputs, nested
        nn.Linear(MAX_FUSED_OUTPUTS, MAX_FUSED_OUTPUTS + 1),
    )
    rewritten, names = columnwise(model)
    assert names == ["0", "4.0", "5"]
    assert [type(layer).__name__ for layer in rewritten] == [
        "ColumnwiseLinear",
        "ReLU",
        "Linear",
        "ReLU",
        "Sequential",
        "ColumnwiseLinear",
    ]
    assert isinstance(rewritten[4][0], ColumnwiseLinear)


def test_a_layer_registered_twice_is_rewritten_in_both_places() -> None:
    shared = nn.Linear(2, 2)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    rewritten, names = columnwise(model)
    assert names == ["0", "2"]
    assert isinstance(rewritten[0], ColumnwiseLinear) and isinstance(rewritten[2], ColumnwiseLinear)
    assert rewritten[0].weight is rewritten[2].weight is shared.weight


def test_the_original_is_untouched_and_parameters_are_shared() -> None:
    model = _mlp(4, 32, 2)
    before = {name: type(module) for name, module in model.named_modules()}
    rewritten, names = columnwise(model)
    assert names == ["0", "2"]
    assert {name: type(module) for name, module in model.named_modules()} == before
    assert rewritten.state_dict().keys() == model.state_dict().keys()
    for (name, original), (_, shared) in zip(
        model.named_parameters(), rewritten.named_parameters(), strict=True
    ):
        assert shared is original, name
    # Training the original moves the copy too: one set of weights.
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert torch.equal(rewritten[0].weight, model[0].weight)


@pytest.mark.parametrize("widths", [(4, 32, 2), (8, 8, 8, 8), (3, 16, 1), (2, 5)])
def test_rewritten_model_computes_the_same_on_block_views(widths: tuple[int, ...]) -> None:
    model = _mlp(*widths)
    rewritten, names = columnwise(model)
    assert names
    for n, pitch_extra in ((0, 32), (1, 31), (2, 30), (17, 15), (1000, 24), (4097, 63)):
        view = _block_view(n, widths[0], pitch_extra, seed=n)
        with torch.inference_mode():
            expected = model(view.contiguous())
            got = rewritten(view)
        assert got.shape == expected.shape == (n, widths[-1])
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_layers_without_bias_and_other_ranks() -> None:
    torch.manual_seed(3)
    layer = nn.Linear(3, 2, bias=False)
    rewritten, names = columnwise(layer)
    assert names == [""] and isinstance(rewritten, ColumnwiseLinear)
    assert rewritten.bias is None and "in_features=3, out_features=2" in repr(rewritten)
    for shape in ((5, 3), (3,), (2, 4, 3)):
        features = torch.randn(shape)
        torch.testing.assert_close(rewritten(features), layer(features))


def test_subclasses_and_wide_layers_stay_as_written() -> None:
    class Scaled(nn.Linear):
        def forward(self, features: torch.Tensor) -> torch.Tensor:
            return super().forward(features) * 2

    model = nn.Sequential(Scaled(2, 2), nn.Linear(64, 64))
    rewritten, names = columnwise(model)
    assert names == []
    assert type(rewritten[0]) is Scaled and type(rewritten[1]) is nn.Linear
    assert rewritten is not model


def test_torchscript_is_refused() -> None:
    scripted = torch.jit.script(_mlp(4, 2))
    with pytest.raises(TypeError, match="not TorchScript: apply it before scripting"):
        columnwise(scripted)
