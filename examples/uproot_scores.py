"""Score the jets of a ROOT file through a soagen model binding, and write the scores back with uproot.

    python -m examples.uproot_scores                                  # makes build/jets.root first
    python -m examples.uproot_scores --input events.root --output scored.root

The input is NanoAOD-like: a tree `Events` whose events hold `nJet` jets in the jagged branches
`Jet_pt`, `Jet_eta`, `Jet_phi` and `Jet_mass`. uproot reads them into awkward;
`Jets.from_awkward(events, prefix="Jet_")` copies every event's jets into one `Jets` collection and
returns the event offsets; the model reads zero-copy views of the collection and writes into a
`JetScores` collection, whose `to_awkward(offsets)` hands the scores back per event (zero-copy).
uproot adds no branch to a tree in an existing file, so the output file gets a new `Events` tree
with the input's jet branches and `Jet_score`.

The bindings are generated from `examples/jet_tagger.soa` into a temporary folder at start, as
`soagen examples/jet_tagger.soa -o DIR` would write them. Needs the `data` extra:
`pip install 'soagen[torch,data]'`.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import awkward as ak
import numpy as np
import torch
import uproot
from torch import nn

from soagen.dsl.loader import load
from soagen.generator.python import generate

SCHEMA = Path(__file__).with_name("jet_tagger.soa")
TREE = "Events"
PREFIX = "Jet_"


@functools.cache
def generated_bindings() -> ModuleType:
    """The module generated from SCHEMA, written to and imported from a temporary folder."""
    (text,) = generate(load(SCHEMA).unwrap()).values()
    with tempfile.TemporaryDirectory(prefix="soagen_jet_tagger_") as folder:
        path = Path(folder) / "jet_tagger.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location("soagen_example_jet_tagger", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses and typing resolve names through sys.modules
        spec.loader.exec_module(module)
    return module


class JetNet(nn.Module):
    """A small tagger: log pt, eta, the phi direction and log mass through a two-layer MLP."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(7)
        self.hidden = nn.Linear(5, 16)
        self.out = nn.Linear(16, 1)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        pt, eta, phi, mass = features.unbind(dim=1)
        inputs = torch.stack(
            [torch.log(pt), eta, torch.cos(phi), torch.sin(phi), torch.log1p(mass)], dim=1
        )
        return torch.sigmoid(self.out(torch.tanh(self.hidden(inputs)))).squeeze(1)


def write_events(path: Path, events: int, seed: int = 0) -> None:
    """A NanoAOD-like tree of `events` events with 0 to 5 jets each."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 6, events)
    total = int(counts.sum())
    jets = {
        "pt": 20 + rng.exponential(30, total),
        "eta": rng.uniform(-2.5, 2.5, total),
        "phi": rng.uniform(-np.pi, np.pi, total),
        "mass": rng.exponential(8, total),
    }
    record = ak.zip(
        {name: ak.unflatten(values.astype(np.float32), counts) for name, values in jets.items()}
    )
    with uproot.recreate(path) as file:
        write_tree(file, {"Jet": record})


def write_tree(file: Any, branches: dict[str, Any]) -> None:
    """A TTree (uproot's `file[name] = ...` writes an RNTuple) with NanoAOD's branch names: the
    record `Jet` becomes `nJet`, `Jet_pt`, `Jet_eta`, ..."""
    file.mktree(
        TREE,
        branches,
        counter_name=lambda counted: f"n{counted}",
        field_name=lambda outer, inner: f"{outer}_{inner}",
    )


def score_file(source: Path, target: Path, net: nn.Module | None = None) -> Any:
    """Score every jet of `source`, write the jets and scores to `target`; return the scores per
    event (an awkward array over the scores collection)."""
    bindings = generated_bindings()
    with uproot.open(source) as file:
        events = file[TREE].arrays(filter_name=f"{PREFIX}*")
    jets, offsets = bindings.Jets.from_awkward(events, prefix=PREFIX)
    scores = bindings.JetScores.allocate(jets.size)
    tagger = bindings.JetTagger(net if net is not None else JetNet())
    with torch.inference_mode():
        tagger(jets, out=scores)
    per_event = scores.to_awkward(offsets)
    branches = {name[len(PREFIX) :]: events[name] for name in events.fields}
    branches["score"] = per_event.score
    with uproot.recreate(target) as file:
        write_tree(file, {"Jet": ak.zip(branches)})
    return per_event.score


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--input", type=Path, help="a NanoAOD-like ROOT file (default: make one)")
    parser.add_argument("--output", type=Path, default=Path("build/jets_scored.root"))
    parser.add_argument("--events", type=int, default=1000, help="events to make without --input")
    args = parser.parse_args(argv)
    source = args.input
    if source is None:
        source = Path("build/jets.root")
        source.parent.mkdir(parents=True, exist_ok=True)
        write_events(source, args.events)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    scores = score_file(source, args.output)
    print(
        f"{len(scores)} events, {int(ak.sum(ak.num(scores)))} jets scored "
        f"(mean {float(ak.mean(ak.flatten(scores))):.4f}): {args.output}"
    )


if __name__ == "__main__":
    main()
