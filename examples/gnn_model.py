"""A small message-passing edge classifier over the tensors `schemas/gnn.soa`'s EdgeClassifier binds.

forward(node_features [N, 4] float32, edge_index [2, E] int64, edge_features [E, 2] float32) -> [E]

Weights come from a fixed seed: the example downloads nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


class EdgeClassifierNet(nn.Module):
    """One round of message passing, then edge scores.

    Nodes are encoded; each edge sends a message built from its two end nodes and its own
    features; each node sums the messages it receives (`scatter_reduce`, which keeps ATen's kernel
    under Inductor, where `index_add` becomes atomic loops) and updates its encoding; each edge is
    scored from its two updated end nodes and its features.
    """

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.node_encoder = nn.Sequential(
            nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, hidden)
        )
        self.message = nn.Sequential(nn.Linear(2 * hidden + 2, hidden), nn.ReLU())
        self.node_update = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU())
        self.edge_scorer = nn.Sequential(
            nn.Linear(2 * hidden + 2, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def forward(
        self, node_features: torch.Tensor, edge_index: torch.Tensor, edge_features: torch.Tensor
    ) -> torch.Tensor:
        source_index, target_index = edge_index[0], edge_index[1]
        nodes = self.node_encoder(node_features)
        messages = self.message(self._edge_inputs(nodes, source_index, target_index, edge_features))
        receivers = target_index.unsqueeze(1).expand_as(messages)
        received = torch.zeros_like(nodes).scatter_reduce(0, receivers, messages, reduce="sum")
        nodes = self.node_update(torch.cat([nodes, received], dim=1))
        edges = self._edge_inputs(nodes, source_index, target_index, edge_features)
        return torch.sigmoid(self.edge_scorer(edges)).squeeze(1)

    @staticmethod
    def _edge_inputs(
        nodes: torch.Tensor,
        source_index: torch.Tensor,
        target_index: torch.Tensor,
        edge_features: torch.Tensor,
    ) -> torch.Tensor:
        """Each edge's two end nodes and its own features, side by side."""
        source = nodes.index_select(0, source_index)
        target = nodes.index_select(0, target_index)
        return torch.cat([source, target, edge_features], dim=1)


def build_model(seed: int = 0) -> EdgeClassifierNet:
    """The factory `soagen compile --factory examples/gnn_model.py:build_model` calls."""
    torch.manual_seed(seed)
    return EdgeClassifierNet().eval()


def fill_examples(collections: Mapping[str, Any]) -> None:
    """What `soagen compile --examples examples/gnn_model.py:fill_examples` calls: an event with
    realistic values in the example collections soagen allocated (layout name -> collection),
    written in place: hits spread in space with positive energies, each edge joining two hits
    with the distance and the z difference between them as its features."""
    nodes, edges = collections["Nodes"], collections["Edges"]
    generator = torch.Generator().manual_seed(nodes.size + edges.size)
    for column in (nodes.x, nodes.y, nodes.z):
        column.copy_(torch.randn(nodes.size, generator=generator) * 10)
    nodes.energy.copy_(torch.empty(nodes.size).exponential_(0.2, generator=generator) + 0.5)
    nodes.bfield.fill_(3.8)
    for column in (edges.src, edges.dst):
        column.copy_(torch.randint(0, nodes.size, (edges.size,), generator=generator))
    source, target = edges.src.long(), edges.dst.long()
    positions = nodes.block("node_features")[:, :3]
    edges.delta_r.copy_((positions[source] - positions[target]).norm(dim=1))
    edges.delta_eta.copy_(nodes.z[source] - nodes.z[target])
