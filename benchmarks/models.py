"""Models the benchmarks run: a plain MLP, and the transposing wrapper ONNX Runtime's zero-copy path
needs (it reads a block of c columns of pitch P as a dense [c, P] array)."""

from __future__ import annotations

import torch
from torch import nn


class HitMlp(nn.Module):
    """4 -> 32 -> 2 over rows of hit features."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.layers(features)
        return result


class ColumnsFirst(nn.Module):
    """The same model on [c, n] in and out: the layout of SoA columns, read without a copy."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, columns: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.model(columns.t()).t()
        return result


def build_mlp(seed: int = 0) -> HitMlp:
    """The factory `soagen compile` calls for the MLP benchmark. Weights from a fixed seed."""
    torch.manual_seed(seed)
    return HitMlp().eval()
