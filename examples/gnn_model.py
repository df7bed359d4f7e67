"""A small edge classifier over the tensors that `schemas/gnn.soa`'s EdgeClassifier binds.

forward(node_features [N, 4] float32, edge_index [2, E] int64, edge_features [E, 2] float32) -> [E]

Weights come from a fixed seed: the example downloads nothing.
"""

from __future__ import annotations

import torch
from torch import nn


class EdgeClassifierNet(nn.Module):
    """Encodes nodes, then scores each edge from its two end nodes and its own features."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.node_encoder = nn.Sequential(
            nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, hidden)
        )
        self.edge_scorer = nn.Sequential(
            nn.Linear(2 * hidden + 2, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def forward(
        self, node_features: torch.Tensor, edge_index: torch.Tensor, edge_features: torch.Tensor
    ) -> torch.Tensor:
        nodes = self.node_encoder(node_features)
        source = nodes.index_select(0, edge_index[0])
        target = nodes.index_select(0, edge_index[1])
        logits = self.edge_scorer(torch.cat([source, target, edge_features], dim=1))
        return torch.sigmoid(logits).squeeze(1)


def build_model(seed: int = 0) -> EdgeClassifierNet:
    """The factory `soagen compile --factory examples/gnn_model.py:build_model` calls."""
    torch.manual_seed(seed)
    return EdgeClassifierNet().eval()
