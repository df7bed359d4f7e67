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


class GnnColumnsFirst(nn.Module):
    """The edge classifier on SoA blocks read in place as dense arrays, padding included:
    node features [4, PN], edge_index [2, PI] (int64 pitch), edge features [2, PF] (float32 pitch),
    and `edge_count`, any array of E elements (its shape says how many edges are real).

    Padding edges must not count: their messages would be summed into real nodes. So the edges
    are cut to the first E (ONNX Runtime's Slice copies those rows of edge_index and the edge
    features); padding nodes are encoded and never read. The result has E rows.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        node_columns: torch.Tensor,
        edge_index: torch.Tensor,
        edge_columns: torch.Tensor,
        edge_count: torch.Tensor,
    ) -> torch.Tensor:
        edges = edge_count.shape[0]
        result: torch.Tensor = self.model(
            node_columns.t(), edge_index[:, :edges], edge_columns[:, :edges].t()
        )
        return result


class DeepSetsTagger(nn.Module):
    """A per-jet tagger of the size CMS runs: each jet's 32 particle-flow candidates, 16 features
    each (`[n, 16, 32]`, as ParticleNet takes them), through a shared per-candidate network (1x1
    convolutions 16 -> 64 -> 64), summed over the real candidates (`mask` `[n, 1, 32]`), then
    64 -> 64 -> 5 and a softmax: the Deep Sets / Energy Flow Network architecture."""

    def __init__(self) -> None:
        super().__init__()
        self.candidate = nn.Sequential(
            nn.Conv1d(16, 64, 1), nn.ReLU(), nn.Conv1d(64, 64, 1), nn.ReLU()
        )
        self.jet = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pooled = (self.candidate(features) * mask).sum(2)
        result: torch.Tensor = torch.softmax(self.jet(pooled), dim=1)
        return result


def build_tagger(seed: int = 0) -> DeepSetsTagger:
    """The factory `soagen compile` calls for the tagger benchmark. Weights from a fixed seed."""
    torch.manual_seed(seed)
    return DeepSetsTagger().eval()
