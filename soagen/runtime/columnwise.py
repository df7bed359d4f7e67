"""Narrow dense layers computed column by column across elements, the way SoA data lies.

An `nn.Linear` over a block view `[n, k]` is a matrix product whose rows are elements: BLAS computes
it row by row and writes an `[n, out]` intermediate per layer. For narrow layers (a few inputs or a
few outputs per element) that costs memory traffic, not arithmetic. Written as a sum over input
columns, `out[:, o] = b[o] + sum_k W[o, k] * x[:, k]`, a layer is elementwise along n: Inductor
(`soagen compile --columnwise`, or `torch.compile`) then fuses consecutive layers and their
activations into one loop over elements, vectorized along the columns, with no intermediate.

Only layers where that fusion happens are rewritten, and wider ones stay BLAS, which beats a
reduction loop over many columns:
- at most `unroll_reductions_threshold` inputs (Inductor's default: 8), a sum Inductor unrolls
  into an elementwise expression that the next layer takes inline;
- at most 4 outputs, one reduction per output that recomputes its elementwise input each time.
Layers called on anything but a 2-D `[n, k]` tensor run as written. Results agree with the
original model to float rounding (the sums run in another order); `soagen compile` checks that.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

# A reduction with this many outputs or fewer recomputes its elementwise input once per output:
# cheap next to writing and reading an [n, out] intermediate.
MAX_FUSED_OUTPUTS = 4


class ColumnwiseLinear(nn.Module):
    """`nn.Linear` as a sum over input columns; the same parameters under the same names."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if features.dim() != 2:
            return nn.functional.linear(features, self.weight, self.bias)
        # [out, k, 1] * [1, k, n] summed over k: one elementwise product per input column.
        columns = (self.weight[:, :, None] * features.t()[None]).sum(1)
        if self.bias is not None:
            columns = columns + self.bias[:, None]
        return columns.t()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def max_unrolled_inputs() -> int:
    """The widest sum Inductor unrolls into an elementwise expression."""
    from torch._inductor import config

    return int(config.unroll_reductions_threshold)


def fuses(linear: nn.Linear) -> bool:
    """Whether the column-by-column form of this layer fuses with its neighbours (see above)."""
    return linear.in_features <= max_unrolled_inputs() or linear.out_features <= MAX_FUSED_OUTPUTS


def columnwise(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """A copy of `model` whose narrow `nn.Linear` layers compute column by column, and their
    names. The copy shares the original's parameters and buffers (no memory is duplicated); the
    original is left as it was."""
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError(
            "columnwise() rewrites Python modules, not TorchScript: apply it before scripting"
        )
    shared: dict[int, object] = {id(tensor): tensor for tensor in model.parameters()}
    shared.update((id(tensor), tensor) for tensor in model.buffers())
    if isinstance(model, nn.Linear):
        return (
            (ColumnwiseLinear(model), [""]) if fuses(model) else (copy.deepcopy(model, shared), [])
        )
    rewritten = copy.deepcopy(model, shared)
    names: list[str] = []
    # Every place a layer is registered, a shared one included, in the model's own order.
    for name, module in list(rewritten.named_modules(remove_duplicate=False)):
        if type(module) is nn.Linear and fuses(module):
            owner_name, _, child_name = name.rpartition(".")
            owner = rewritten.get_submodule(owner_name)
            setattr(owner, child_name, ColumnwiseLinear(module))
            names.append(name)
    return rewritten, names
