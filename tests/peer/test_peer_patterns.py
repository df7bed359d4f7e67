"""CMSSW's PyTorch-Alpaka test cases, restated on soagen.

CMSSW tests its SoA-to-torch bridge with end-to-end producers (PhysicsTools/PyTorchAlpakaTest:
SimpleNet, MaskedNet, MultiHeadNet, TinyResNet, TrackHitDeepSet, SimpleNetMiniBatch,
TinyResNetMiniBatch) and unit tests (PhysicsTools/PyTorchAlpaka/test: SoAToTorch, SoADataTypes).
Each is restated here in our own schema (`tests/peer/peer.soa`: the same columns, Eigen vectors and
matrices as array columns, the same blocks bound in the same tensor shapes) and our own models
(`FACTORY` below: the same shapes, seeded or constant weights), and run through the generated
binding on every backend: eager, TorchScript, AOTInductor (one package per model, built once per
session in background processes while the other tests run) and, for three cases, torch.compile.
Every run is checked against the model on contiguous copies of the blocks, the inputs must be
unchanged afterwards, and each case also makes its own check, as CMSSW's sink does.

Where soagen differs from CMSSW: it has no per-batch collection (CMSSW's TrackBegin, sliced with
batch size 1), so the track layout carries each track's global number, sliced with the tracks, and
the deep set finds the hits of its slice's tracks by comparing numbers (a test checks this against
CMSSW's formulation, rebasing by the slice's first track). `batch_size` rounds the slice size up to
the alignment's element count (32 float32 elements for 128 bytes), so CMSSW's default of 8 runs as 32.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from soagen.runtime.aot import read_metadata  # noqa: E402
from soagen.runtime.errors import BindingError  # noqa: E402
from tests.helpers import REPO, generate_package, import_generated  # noqa: E402

# TorchScript is what CMSSW runs; torch 2.13 deprecates it.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")

SCHEMA = Path(__file__).resolve().parent / "peer.soa"

# The models, written to a temporary factory file: `soagen compile` builds the packages from it,
# and the eager, TorchScript and torch.compile runs import the same file.
FACTORY = '''
"""Models of CMSSW's PyTorch-Alpaka tests, restated: their shapes, our own code and weights."""

import torch
from torch import nn


def _mlp(widths: list[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class SimpleNet(nn.Module):
    """3 -> 32 -> 64 -> 256 -> 64 -> 32 -> 1, ReLU between the layers."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp([3, 32, 64, 256, 64, 32, 1], last_relu=False)

    def forward(self, particles: torch.Tensor) -> torch.Tensor:
        return self.net(particles)


class MaskedNet(nn.Module):
    """No weights: each particle's features whose mask is 0, summed."""

    def forward(self, particles: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (particles * (1 - mask)).sum(dim=1, keepdim=True)


class MultiHeadNet(nn.Module):
    """A constant-weight backbone 3 -> 32 -> 64 -> 256 -> 64 -> 32, a regression head and a
    3-class softmax head, returned as a tuple in that order."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = _mlp([3, 32, 64, 256, 64, 32], last_relu=True)
        self.regression = nn.Linear(32, 1)
        self.classification = nn.Linear(32, 3)
        with torch.no_grad():
            for layer in self.backbone:
                if isinstance(layer, nn.Linear):
                    layer.weight.fill_(0.025)
                    layer.bias.fill_(0.1)
            self.regression.weight.fill_(0.03)
            self.regression.bias.fill_(0.1)
            per_class = torch.tensor([0.06, 0.07, 0.08])
            self.classification.weight.copy_(per_class[:, None].expand(3, 32))
            self.classification.bias.copy_(torch.tensor([0.1, 0.2, 0.3]))

    def forward(self, particles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.backbone(particles)
        return self.regression(h), torch.softmax(self.classification(h), dim=1)


class Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class TinyResNet(nn.Module):
    """conv 3 -> 16, two residual blocks, stride-2 conv 16 -> 32 (9x9 -> 5x5), two residual
    blocks, average pool, 32 -> 10, softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        self.stage1 = nn.Sequential(Residual(16), Residual(16))
        self.down = nn.Sequential(
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU()
        )
        self.stage2 = nn.Sequential(Residual(32), Residual(32))
        self.head = nn.Linear(32, 10)
        # Running statistics other than 0 and 1, so that the eval-mode batch norms act.
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.BatchNorm2d):
                    size = module.num_features
                    module.running_mean.copy_(0.1 * torch.randn(size, generator=generator))
                    module.running_var.copy_(0.5 + torch.rand(size, generator=generator))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.down(self.stage1(self.stem(images))))
        return torch.softmax(self.head(x.mean(dim=(2, 3))), dim=1)


class TrackHitDeepSet(nn.Module):
    """Each track's hits encoded and summed, joined to the encoded track, classified.

    A hit belongs to the t-th track of the slice when its global track number equals that
    track's number (CMSSW subtracts the slice's first track number instead: the same sets)."""

    def __init__(self, embedding: int = 16) -> None:
        super().__init__()
        self.track_encoder = _mlp([3, embedding, embedding], last_relu=True)
        self.hit_encoder = _mlp([3, embedding, embedding], last_relu=True)
        self.classifier = _mlp([2 * embedding, embedding, 1], last_relu=False)

    def forward(
        self,
        track_features: torch.Tensor,
        track_number: torch.Tensor,
        hit_features: torch.Tensor,
        hit_to_track: torch.Tensor,
        hit_scale: torch.Tensor,
    ) -> torch.Tensor:
        hits = self.hit_encoder(hit_features * hit_scale)
        belongs = (hit_to_track == track_number[:, 0][None, :]).to(hits.dtype)  # [H, B]
        joined = torch.cat([self.track_encoder(track_features), belongs.t() @ hits], dim=1)
        return torch.sigmoid(self.classifier(joined))


class LinearDnn(nn.Module):
    """A bias-free 3 -> 2 linear map with fixed weights."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2, bias=False)
        with torch.no_grad():
            self.linear.weight.copy_(torch.tensor([[-0.1, 0.2, 2.0], [0.1, -2.3, 4.0]]))

    def forward(self, main: torch.Tensor) -> torch.Tensor:
        return self.linear(main)


class DataTypesProbe(nn.Module):
    """v = x and w = y, each plus the distance of every block from what the test writes in it
    (row i, found from x = 12 + i): a block bound wrongly in any way moves v and w."""

    def forward(
        self,
        column: torch.Tensor,
        scalar: torch.Tensor,
        matrix: torch.Tensor,
        vector: torch.Tensor,
        single_column: torch.Tensor,
        single_vector: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = column[:, 0:1]
        i = x - 12.0
        a = i + 1.0 + torch.arange(3, dtype=torch.float64, device=x.device)[None, :]
        c = torch.cat([i + 4.0, i + 6.0, i + 8.0, i + 10.0], dim=1).reshape(-1, 2, 2)
        off = (column[:, 1:2] - (1.0 + 2.5 * i)).abs() + (column[:, 2:3] - 36.0 * i).abs()
        off = off + (scalar.double() - 4.0).abs()
        off = off + (matrix.double() - c).abs().sum(dim=(1, 2))[:, None]
        off = off + (vector[:, 0] - a).abs().sum(dim=1, keepdim=True)
        off = off + (vector[:, 1] - (a + 3.0)).abs().sum(dim=1, keepdim=True)
        off = off + (single_column - x).abs()
        off = off + (single_vector - a).abs().sum(dim=1, keepdim=True)
        return x + off, column[:, 1:2] + off


def simple_net() -> nn.Module:
    torch.manual_seed(2)
    return SimpleNet().eval()


def masked_net() -> nn.Module:
    return MaskedNet().eval()


def multi_head_net() -> nn.Module:
    return MultiHeadNet().eval()


def tiny_resnet() -> nn.Module:
    torch.manual_seed(3)
    return TinyResNet().eval()


def track_hit_deep_set() -> nn.Module:
    torch.manual_seed(1234)
    return TrackHitDeepSet().eval()


def linear_dnn() -> nn.Module:
    return LinearDnn().eval()


def data_types_probe() -> nn.Module:
    return DataTypesProbe().eval()


def track_examples(collections: dict) -> None:
    """Example collections for the deep set: tracks numbered, hits in turn on every track."""
    tracks, hit_to_track = collections["Track"], collections["HitToTrack"]
    tracks.number.copy_(torch.arange(tracks.size, dtype=torch.int32))
    hits = torch.arange(hit_to_track.size, dtype=torch.int32)
    hit_to_track.track_index.copy_(hits % max(tracks.size, 1))
    collections["Hit"].hit_scale.fill_(0.5)


def data_types_examples(collections: dict) -> None:
    """The values the data-types test writes, so that the probe's distances are 0."""
    mixed = collections["Mixed"]
    i = torch.arange(mixed.size, dtype=torch.float64)
    for k in range(3):
        mixed.a[:, k] = 1 + i + k
        mixed.b[:, k] = 4 + i + k
    for (r, c), base in {(0, 0): 4, (0, 1): 6, (1, 0): 8, (1, 1): 10}.items():
        mixed.c[:, r, c] = (base + i).float()
    mixed.x.copy_(12 + i)
    mixed.y.copy_(1 + 2.5 * i)
    mixed.z.copy_(36 * i)
    mixed.type.fill_(4)
    mixed.some_number.fill_(5)
'''


@dataclass(frozen=True)
class Case:
    """One of CMSSW's cases: its binding in peer.soa, the factory function of its model and the
    function that fills `soagen compile`'s example collections (None: soagen's random ones)."""

    model: str
    factory: str
    examples: str | None = None
    trace: bool = False  # TorchScript by tracing, as CMSSW exports this model, not scripting


CASES = {
    case.model: case
    for case in (
        Case("SimpleNet", "simple_net"),
        Case("MaskedNet", "masked_net", trace=True),
        Case("MultiHeadNet", "multi_head_net"),
        Case("TinyResNet", "tiny_resnet", trace=True),
        Case("TrackHitDeepSet", "track_hit_deep_set", "track_examples"),
        Case("SoAToTorch", "linear_dnn", trace=True),
        Case("SoADataTypes", "data_types_probe", "data_types_examples"),
    )
}
# torch.compile takes seconds per model: the cases it also runs (not at n = 1, which soagen's
# compiles keep specialized: a graph of its own).
COMPILED = ("SimpleNet", "MaskedNet", "TrackHitDeepSet")
# The sizes every case runs at: one element, CMSSW's 4 points, a partial 128-byte bunch, several.
SIZES = (1, 4, 35, 300)
# CMSSW's mini-batch pipeline: 35 elements in batches of 32, so the second batch holds 3.
TOTAL, BATCH = 35, 32
MINI_BATCH = ("SimpleNet", "TinyResNet", "TrackHitDeepSet")
HITS_PER_TRACK = (2, 3, 1, 4, 1, 2, 3, 0)  # the pattern of CMSSW's deep-set export example

DEVICES = [
    "cpu",
    pytest.param(
        "cuda:0",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    ),
]


def _runs(models: tuple[str, ...] | None = None, sizes: tuple[int, ...] | None = None) -> list[Any]:
    """(model, backend[, n]) for the in-process backends: eager, TorchScript and, for the
    `COMPILED` cases, torch.compile (AOT packages have tests of their own, at the module's end,
    so that they run once the packages have been built in the background)."""
    runs = []
    for model in models or tuple(CASES):
        for backend in ("eager", "torchscript", "compile"):
            if backend == "compile" and model not in COMPILED:
                continue
            if sizes is None:
                runs.append((model, backend))
            else:
                runs += [(model, backend, n) for n in sizes if backend != "compile" or n > 1]
    return runs


# Fixtures: the generated module, the factory file, and the packages built in the background.


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    root = tmp_path_factory.mktemp("peer_module")
    generate_package(SCHEMA, root, "pkg_peer_patterns")
    return import_generated(root, "pkg_peer_patterns", "peer")


@pytest.fixture(scope="module")
def factory_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("peer_factory") / "peer_models.py"
    path.write_text(FACTORY)
    return path


@pytest.fixture(scope="module")
def factory(factory_file: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("_peer_models", factory_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class PackageBuilds:
    """The cases' AOT packages, built by `compile_model` in subprocesses, two at a time, started
    with the module's first test so that they compile while the other tests run."""

    def __init__(self, factory_file: Path, folder: Path) -> None:
        self._pool = ThreadPoolExecutor(max_workers=2)
        self._lock = threading.Lock()
        self._processes: list[subprocess.Popen[str]] = []
        self._closed = False
        self.builds: dict[str, Future[Path]] = {
            name: self._pool.submit(self._build, case, factory_file, folder)
            for name, case in CASES.items()
        }

    def _build(self, case: Case, factory_file: Path, folder: Path) -> Path:
        output = folder / f"{case.model}.pt2"
        examples = None if case.examples is None else f"{factory_file}:{case.examples}"
        script = (
            "import sys\n"
            "from soagen.build.compile import compile_model\n"
            "compile_model(sys.argv[1], sys.argv[2], sys.argv[3], output=sys.argv[4],\n"
            "              examples=sys.argv[5] or None)\n"
        )
        arguments = [str(SCHEMA), case.model, f"{factory_file}:{case.factory}", str(output)]
        with self._lock:
            if self._closed:
                raise RuntimeError("the module's tests are over")
            process = subprocess.Popen(
                [sys.executable, "-c", script, *arguments, examples or ""],
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            self._processes.append(process)
        log, _ = process.communicate(timeout=600)
        if process.returncode != 0:
            raise AssertionError(f"compile_model({case.model}) failed:\n{log}")
        return output

    def package(self, model: str) -> Path:
        return self.builds[model].result(timeout=600)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for process in self._processes:
                if process.poll() is None:
                    process.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module", autouse=True)
def packages(
    request: pytest.FixtureRequest, factory_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PackageBuilds | None]:
    """Starts the package builds at the module's first test, if any selected test needs them."""
    needed = any(
        item.name.startswith("test_aot_")
        for item in request.session.items
        if getattr(item, "module", None) is request.module
    )
    if not needed:
        yield None
        return
    builds = PackageBuilds(factory_file, tmp_path_factory.mktemp("peer_packages"))
    yield builds
    builds.close()


def _bind(
    peer: ModuleType,
    factory: ModuleType,
    packages: PackageBuilds | None,
    model: str,
    backend: str,
    example: list[torch.Tensor] | None = None,
) -> tuple[Any, torch.nn.Module]:
    """The binding of `model` on `backend`, and the eager model it must agree with."""
    binding = getattr(peer, model)
    case = CASES[model]
    net = getattr(factory, case.factory)()
    if backend == "eager":
        return binding(net), net
    if backend == "compile":
        return binding(getattr(factory, case.factory)(), backend="compile"), net
    if backend == "torchscript":
        if case.trace:
            assert example is not None
            script = torch.jit.trace(getattr(factory, case.factory)(), tuple(example))
        else:
            script = torch.jit.script(getattr(factory, case.factory)())
        assert isinstance(script, torch.jit.ScriptModule)
        return binding(script), net
    assert backend == "aot" and packages is not None
    loaded = binding.load(packages.package(model))
    assert loaded.backend == "aot"
    return loaded, net


# Events: each case's collections, filled as CMSSW's DataSource fills them.


@dataclass
class Event:
    """The binding's positional input collections and its output collection."""

    inputs: list[Any]
    out: Any

    def collections(self) -> dict[str, Any]:
        return {type(c).NAME: c for c in self.inputs}


def _particles(peer: ModuleType, n: int, device: str, seed: int, high: float = 1.0) -> Any:
    generator = torch.Generator().manual_seed(seed)
    particles = peer.Particle.allocate(n, device)
    particles.block("particles").copy_(high * torch.rand(n, 3, generator=generator))
    return particles


def _deep_set_event(peer: ModuleType, n: int, device: str, seed: int = 0) -> Event:
    """n tracks, hits in runs per track (some tracks have none), hit_scale 0.5."""
    generator = torch.Generator().manual_seed(seed)
    counts = torch.tensor(
        [HITS_PER_TRACK[t % len(HITS_PER_TRACK)] for t in range(n)], dtype=torch.long
    )
    owner = torch.repeat_interleave(torch.arange(n), counts).to(torch.int32)
    tracks = peer.Track.allocate(n, device)
    tracks.block("track_features").copy_(torch.rand(n, 3, generator=generator))
    tracks.number.copy_(torch.arange(n, dtype=torch.int32))
    hits = peer.Hit.allocate(len(owner), device)
    hits.block("hit_features").copy_(torch.rand(len(owner), 3, generator=generator))
    hits.hit_scale.fill_(0.5)
    hit_to_track = peer.HitToTrack.allocate(len(owner), device)
    hit_to_track.track_index.copy_(owner)
    return Event([tracks, hits, hit_to_track], peer.SimpleNetOut.allocate(n, device))


def _mixed(peer: ModuleType, n: int, device: str) -> Any:
    """The data-types layout filled as CMSSW's test fills it: row i holds a = (1+i, 2+i, 3+i),
    b = (4+i, 5+i, 6+i), c = [[4+i, 6+i], [8+i, 10+i]], x = 12+i, y = 1+2.5i, z = 36i, and the
    scalars type = 4, some_number = 5."""
    mixed = peer.Mixed.allocate(n, device, zero=True)
    i = torch.arange(n, dtype=torch.float64)
    mixed.a.copy_(1 + i[:, None] + torch.arange(3.0, dtype=torch.float64))
    mixed.b.copy_(4 + i[:, None] + torch.arange(3.0, dtype=torch.float64))
    mixed.c.copy_(torch.stack([4 + i, 6 + i, 8 + i, 10 + i], dim=1).reshape(n, 2, 2).float())
    mixed.x.copy_(12 + i)
    mixed.y.copy_(1 + 2.5 * i)
    mixed.z.copy_(36 * i)
    mixed.type.fill_(4)
    mixed.some_number.fill_(5)
    return mixed


POSITIONS = [[1.0, 2.0, 1.0], [2.0, 4.0, 3.0], [3.0, 4.0, 1.0], [2.0, 3.0, 2.0]]
RESULTS = [[2.3, -0.5], [6.6, 3.0], [2.5, -4.9], [4.4, 1.3]]


def _event(peer: ModuleType, model: str, n: int, device: str, seed: int = 0) -> Event:
    if model == "SimpleNet":
        return Event([_particles(peer, n, device, seed)], peer.SimpleNetOut.allocate(n, device))
    if model == "MaskedNet":
        mask = peer.Mask.allocate(n, device)
        mask.mask.copy_(torch.tensor([0, 1, 0], dtype=torch.uint8).expand(n, 3))
        particles = _particles(peer, n, device, seed)
        return Event([particles, mask], peer.SimpleNetOut.allocate(n, device))
    if model == "MultiHeadNet":
        # Below 0.88 per feature, pt + eta + phi stays under 2.66, where the constant-weight
        # regression (about 0.3146 s + 4.1638) stays within CMSSW's bounds [4, 5].
        particles = _particles(peer, n, device, seed, high=0.88)
        return Event([particles], peer.MultiHeadOut.allocate(n, device))
    if model == "TinyResNet":
        generator = torch.Generator().manual_seed(seed)
        images = peer.Image.allocate(n, device)
        # CMSSW writes one value to all three planes; distinct planes also catch a swapped one.
        images.block("images").copy_(torch.rand(n, 3, 9, 9, generator=generator))
        return Event([images], peer.Logits.allocate(n, device))
    if model == "TrackHitDeepSet":
        return _deep_set_event(peer, n, device, seed)
    if model == "SoAToTorch":
        positions = peer.Position.allocate(n, device)
        rows = torch.tensor(POSITIONS)[torch.arange(n) % 4]
        positions.block("main").copy_(rows)
        return Event([positions], peer.Result.allocate(n, device))
    assert model == "SoADataTypes"
    mixed = _mixed(peer, n, device)
    return Event([mixed], mixed)  # v and w are written into the collection that holds x and y


# Running a case and checking it.


def _input_blocks(binding: type[Any], event: Event) -> list[torch.Tensor]:
    collections = event.collections()
    return [collections[spec.block.layout].block(spec.block) for spec in binding.INPUTS]


def _reference(binding: type[Any], net: torch.nn.Module, event: Event) -> list[torch.Tensor]:
    """The eager model on contiguous copies of the input blocks, its outputs in schema order."""
    with torch.no_grad():
        result = net(*[view.contiguous() for view in _input_blocks(binding, event)])
    return list(result) if isinstance(result, tuple) else [result]


def _run(model: Any, event: Event, batch_size: int | None = None) -> list[torch.Tensor]:
    """Run the binding on the event (outputs filled with NaN first, so that an output left
    unwritten shows), check that no input changed, and return clones of the output blocks."""
    binding = type(model)
    for spec in binding.OUTPUTS:
        event.out.block(spec.block).fill_(float("nan"))
    before = [view.clone() for view in _input_blocks(binding, event)]
    untouched = [c for c in event.inputs if c is not event.out]
    buffers = [c.buffer.clone() for c in untouched]
    model(*event.inputs, out=event.out, batch_size=batch_size)
    for spec, view, old in zip(binding.INPUTS, _input_blocks(binding, event), before, strict=True):
        assert torch.equal(view, old), f"input {spec.name!r} changed"
    for collection, old in zip(untouched, buffers, strict=True):
        assert torch.equal(collection.buffer, old), f"{type(collection).NAME} changed"
    return [event.out.block(spec.block).clone() for spec in binding.OUTPUTS]


def _check_case(model: str, event: Event, outputs: list[torch.Tensor]) -> None:
    """The case's own check, as CMSSW's sink or unit test makes it."""
    if model in ("SimpleNet", "MaskedNet", "MultiHeadNet", "TrackHitDeepSet"):
        features = event.inputs[0].block(
            "particles" if model != "TrackHitDeepSet" else "track_features"
        )
        assert bool(((features >= 0) & (features <= 1)).all())
    if model == "MaskedNet":
        # Mask (0, 1, 0) drops eta: exact float equality, as CMSSW checks it.
        particles = event.inputs[0]
        assert torch.equal(outputs[0][:, 0], particles.pt + particles.phi)
    elif model == "MultiHeadNet":
        regression, classes = outputs
        assert bool(((regression >= 4) & (regression <= 5)).all()), regression
        assert bool((classes > 0).all())
        torch.testing.assert_close(
            classes.sum(dim=1), torch.ones(len(classes), device=classes.device), atol=1e-4, rtol=0
        )
    elif model == "TinyResNet":
        (logits,) = outputs
        torch.testing.assert_close(
            logits.sum(dim=1), torch.ones(len(logits), device=logits.device), atol=1e-4, rtol=0
        )
    elif model == "TrackHitDeepSet":
        (scores,) = outputs
        assert bool(torch.isfinite(scores).all())
        assert bool(((scores >= 0) & (scores <= 1)).all())
    elif model == "SoAToTorch":
        n = len(outputs[0])
        want = torch.tensor(RESULTS, device=outputs[0].device)[torch.arange(n) % 4]
        torch.testing.assert_close(outputs[0], want, atol=1e-5, rtol=0)
    elif model == "SoADataTypes":
        mixed = event.out
        torch.testing.assert_close(outputs[0][:, 0], mixed.x, atol=1e-5, rtol=0)
        torch.testing.assert_close(outputs[1][:, 0], mixed.y, atol=1e-5, rtol=0)


def _check_against_reference(
    peer: ModuleType,
    factory: ModuleType,
    packages: PackageBuilds | None,
    model: str,
    backend: str,
    n: int,
) -> None:
    event = _event(peer, model, n, "cpu", seed=n)
    binding = getattr(peer, model)
    bound, net = _bind(peer, factory, packages, model, backend, _input_blocks(binding, event))
    outputs = _run(bound, event)
    for spec, got, want in zip(
        binding.OUTPUTS, outputs, _reference(binding, net, event), strict=True
    ):
        assert got.shape == want.shape, spec.name
        torch.testing.assert_close(got, want, msg=lambda m, name=spec.name: f"{name}: {m}")
    _check_case(model, event, outputs)


def _check_mini_batch(
    peer: ModuleType,
    factory: ModuleType,
    packages: PackageBuilds | None,
    model: str,
    backend: str,
) -> None:
    event = _event(peer, model, TOTAL, "cpu", seed=5)
    binding = getattr(peer, model)
    bound, net = _bind(peer, factory, packages, model, backend, _input_blocks(binding, event))
    full = _run(bound, event)
    batched = _run(bound, event, batch_size=BATCH)
    for spec, got, want, reference in zip(
        binding.OUTPUTS, batched, full, _reference(binding, net, event), strict=True
    ):
        assert bool(torch.isfinite(got).all()), spec.name
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        torch.testing.assert_close(got, reference)
    _check_case(model, event, batched)


@pytest.mark.parametrize(("model", "backend", "n"), _runs(sizes=SIZES))
def test_case_matches_contiguous_reference(
    peer: ModuleType, factory: ModuleType, model: str, backend: str, n: int
) -> None:
    """Every case at 1, 4, 35 and 300 elements: the model's results on the SoA views equal its
    results on contiguous copies, the inputs stay as they were, and the case's own check holds
    (MaskedNet: reco_pt == pt + phi; MultiHeadNet: regression in [4, 5], probabilities summing
    to 1; TinyResNet: rows summing to 1; TrackHitDeepSet: scores in [0, 1]; SoAToTorch: its
    table; SoADataTypes: v == x, w == y)."""
    _check_against_reference(peer, factory, None, model, backend, n)


@pytest.mark.parametrize(("model", "backend"), _runs(MINI_BATCH))
def test_mini_batch_equals_full_run(
    peer: ModuleType, factory: ModuleType, model: str, backend: str
) -> None:
    """SimpleNetMiniBatch, TinyResNetMiniBatch and the batched TrackHitDeepSet: 35 elements in
    slices of 32 give what one call over all 35 gives (within 1e-6), the hits going whole to
    every slice of tracks."""
    _check_mini_batch(peer, factory, None, model, backend)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model", tuple(CASES))
def test_empty_collections_run_nothing(
    peer: ModuleType, factory: ModuleType, model: str, device: str
) -> None:
    """n = 0 (CMSSW's empty-collection cases): nothing to compute, the model is never called."""
    event = _event(peer, model, 0, device)
    recorder = Recorder(getattr(factory, CASES[model].factory)())
    outputs = _run(getattr(peer, model)(recorder), event)
    assert recorder.calls == []
    assert all(output.shape[0] == 0 for output in outputs)


class Recorder(torch.nn.Module):
    """The model, keeping (shape, strides, copy) of every input of every call."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls: list[list[tuple[tuple[int, ...], tuple[int, ...], torch.Tensor]]] = []

    def forward(self, *inputs: torch.Tensor) -> Any:
        self.calls.append([(tuple(t.shape), t.stride(), t.clone()) for t in inputs])
        return self.inner(*inputs)


@pytest.mark.parametrize("device", DEVICES)
def test_batches_reach_the_model_as_slices(
    peer: ModuleType, factory: ModuleType, device: str
) -> None:
    """What each slice of a `batch_size` call hands the model: tracks and their numbers sliced at
    aligned starts (the numbers play CMSSW's TrackBegin: the slice's first is its first track's),
    every hit, its track number and the broadcast hit scale whole to each slice; CMSSW's
    default batch size of 8 is rounded up to 32, one 128-byte bunch of float32."""
    event = _deep_set_event(peer, TOTAL, device)
    hits = event.inputs[1].size
    # On the event's device already: a model elsewhere is copied there, recorder and all.
    recorder = Recorder(factory.track_hit_deep_set()).to(device)
    _run(peer.TrackHitDeepSet(recorder), event, batch_size=BATCH)
    assert len(recorder.calls) == 2
    for (start, stop), call in zip(((0, 32), (32, 35)), recorder.calls, strict=True):
        tracks, numbers, hit_features, hit_to_track, hit_scale = call
        assert tracks[0] == (stop - start, 3) and numbers[0] == (stop - start, 1)
        assert torch.equal(tracks[2], event.inputs[0].block("track_features")[start:stop])
        assert numbers[2][:, 0].tolist() == list(range(start, stop))
        assert hit_features[0] == (hits, 3) and hit_to_track[0] == (hits, 1)
        assert torch.equal(hit_features[2], event.inputs[1].block("hit_features"))
        assert torch.equal(hit_to_track[2], event.inputs[2].block("hit_to_track"))
        assert hit_scale[0] == (hits, 1) and hit_scale[1][0] == 0  # one value, stride 0
        assert bool((hit_scale[2] == 0.5).all())
    for model, shape in (("SimpleNet", (3,)), ("TinyResNet", (3, 9, 9))):
        event = _event(peer, model, TOTAL, device)
        recorder = Recorder(getattr(factory, CASES[model].factory)()).to(device)
        _run(getattr(peer, model)(recorder), event, batch_size=8)
        assert [call[0][0] for call in recorder.calls] == [(32, *shape), (3, *shape)]


def _check_deep_set_without_hits(
    peer: ModuleType, factory: ModuleType, packages: PackageBuilds | None, backend: str
) -> None:
    """40 tracks, no hits at all (an event CMSSW's producer meets): every track's pooled hits
    are zeros, in one call and in slices."""
    tracks = _deep_set_event(peer, 40, "cpu", seed=3).inputs[0]
    event = Event(
        [tracks, peer.Hit.allocate(0), peer.HitToTrack.allocate(0)],
        peer.SimpleNetOut.allocate(40),
    )
    binding = peer.TrackHitDeepSet
    bound, net = _bind(peer, factory, packages, "TrackHitDeepSet", backend)
    with torch.no_grad():
        encoded = net.track_encoder(tracks.block("track_features"))
        want = torch.sigmoid(net.classifier(torch.cat([encoded, torch.zeros(40, 16)], dim=1)))
    for batch_size in (None, BATCH):
        (got,) = _run(bound, event, batch_size=batch_size)
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, _reference(binding, net, event)[0])


@pytest.mark.parametrize("backend", ["eager", "torchscript"])
def test_deep_set_without_hits(peer: ModuleType, factory: ModuleType, backend: str) -> None:
    _check_deep_set_without_hits(peer, factory, None, backend)


def test_deep_set_matches_cmssw_formulation(peer: ModuleType, factory: ModuleType) -> None:
    """Our deep set finds a slice's hits by comparing global track numbers; CMSSW's keeps the
    hits whose number lies in [first, first + B) of the slice, rebases them by its first track
    (TrackBegin) and sums them per track with index_add. Same weights, same scores."""
    event = _deep_set_event(peer, TOTAL, "cpu", seed=11)
    net = factory.track_hit_deep_set()
    got = _run(peer.TrackHitDeepSet(net), event, batch_size=BATCH)[0]
    tracks, hits, hit_to_track = event.inputs
    owner = hit_to_track.track_index.long()
    with torch.no_grad():
        encoded = net.hit_encoder(hits.block("hit_features") * hits.hit_scale)
        for first in range(0, TOTAL, BATCH):
            size = min(BATCH, TOTAL - first)
            inside = (owner >= first) & (owner < first + size)
            pooled = torch.zeros(size, encoded.shape[1])
            pooled.index_add_(0, owner[inside] - first, encoded[inside])
            features = tracks.block("track_features")[first : first + size]
            joined = torch.cat([net.track_encoder(features), pooled], dim=1)
            want = torch.sigmoid(net.classifier(joined))
            torch.testing.assert_close(got[first : first + size], want, atol=1e-6, rtol=0)
    assert float(got.std()) > 1e-3  # the scores depend on the tracks: not a constant


@pytest.mark.parametrize("n", [64, 1, 0])
def test_data_types_blocks(peer: ModuleType, n: int) -> None:
    """testSoADataTypes' conversions: each block's shape, dtype and values, the matrix read back
    from the buffer's bytes at CMSSW's column-major coefficient addresses, the scalar broadcast
    with stride 0 over n (also at n = 1 and n = 0)."""
    mixed = _mixed(peer, n, "cpu")
    i = torch.arange(n, dtype=torch.float64)
    a = 1 + i[:, None] + torch.arange(3, dtype=torch.float64)
    blocks = {name: mixed.block(name) for name in peer.Mixed.BLOCKS}
    expected = {
        "column": ((n, 3), torch.float64),
        "scalar": ((n, 1), torch.float32),
        "matrix": ((n, 2, 2), torch.float32),
        "vector": ((n, 2, 3), torch.float64),
        "single_column": ((n, 1), torch.float64),
        "single_vector": ((n, 3), torch.float64),
        "v": ((n, 1), torch.float64),
        "w": ((n, 1), torch.float64),
    }
    assert {name: (tuple(b.shape), b.dtype) for name, b in blocks.items()} == expected
    assert blocks["scalar"].stride()[0] == 0
    torch.testing.assert_close(blocks["column"], torch.stack([12 + i, 1 + 2.5 * i, 36 * i], 1))
    assert bool((blocks["scalar"] == 4).all()) and int(mixed.some_number) == 5
    torch.testing.assert_close(blocks["vector"], torch.stack([a, a + 3], dim=1))
    torch.testing.assert_close(blocks["single_column"], (12 + i)[:, None])
    torch.testing.assert_close(blocks["single_vector"], a)
    matrix = torch.stack([4 + i, 6 + i, 8 + i, 10 + i], dim=1).reshape(n, 2, 2).float()
    torch.testing.assert_close(blocks["matrix"], matrix)
    # Coefficient (r, c) of element i at offset + ((r + 2 c) * pitch + i) * 4 bytes.
    raw = mixed.buffer[mixed.offsets(n)["c"] :]
    pitch = -(-n * 4 // 128) * 128 // 4
    for r in range(2):
        for c in range(2):
            start = 4 * (r + 2 * c) * pitch
            values = raw[start : start + 4 * n].view(torch.float32)
            assert torch.equal(values, matrix[:, r, c]), (r, c)


@pytest.mark.parametrize("n", [64, 1])
def test_data_types_reach_the_model(peer: ModuleType, factory: ModuleType, n: int) -> None:
    """testInterface and testMultiOutput through the binding: the model gets column, scalar,
    matrix, vector, single_column and single_vector in that order and shape, and its two results
    land in v and w, in the collection that holds the inputs."""
    mixed = _mixed(peer, n, "cpu")
    recorder = Recorder(factory.data_types_probe())
    outputs = _run(peer.SoADataTypes(recorder), Event([mixed], mixed))
    (call,) = recorder.calls
    shapes = [shape for shape, _, _ in call]
    assert shapes == [(n, 3), (n, 1), (n, 2, 2), (n, 2, 3), (n, 1), (n, 3)]
    assert call[1][1][0] == 0 and bool((call[1][2] == 4).all())
    torch.testing.assert_close(call[4][2], mixed.x[:, None])
    torch.testing.assert_close(outputs[0][:, 0], mixed.x, atol=1e-5, rtol=0)
    torch.testing.assert_close(outputs[1][:, 0], mixed.y, atol=1e-5, rtol=0)
    torch.testing.assert_close(mixed.v, mixed.x, atol=1e-5, rtol=0)
    # The probe sees a wrongly filled block: v moves away from x.
    mixed.c[:, 1, 0] += 1
    bad = _run(peer.SoADataTypes(factory.data_types_probe()), Event([mixed], mixed))
    torch.testing.assert_close(bad[0][:, 0], mixed.x + 1)


def _check_size_mismatch(model: Any, peer: ModuleType) -> None:
    """Particles of 5, a mask of 4: refused before the model runs, naming both inputs."""
    particles = _particles(peer, 5, "cpu", seed=0)
    mask = peer.Mask.allocate(4, zero=True)
    out = peer.SimpleNetOut.allocate(5)
    out.reco_pt.fill_(-7)
    for batch_size in (None, BATCH):
        with pytest.raises(BindingError) as caught:
            model(particles, mask, out=out, batch_size=batch_size)
        message = str(caught.value)
        for part in ("'mask'", "'particles'", "n=4", "n=5", "same n as particles"):
            assert part in message, message
    assert bool((out.reco_pt == -7).all())


@pytest.mark.parametrize("backend", ["eager", "torchscript"])
def test_same_n_mismatch_is_refused(peer: ModuleType, factory: ModuleType, backend: str) -> None:
    event = _event(peer, "MaskedNet", 5, "cpu")
    model, _ = _bind(
        peer, factory, None, "MaskedNet", backend, _input_blocks(peer.MaskedNet, event)
    )
    _check_size_mismatch(model, peer)
    # The deep set's hit numbers must come with their hits too.
    deep_set = peer.TrackHitDeepSet(factory.track_hit_deep_set())
    event = _deep_set_event(peer, 8, "cpu")
    short = peer.HitToTrack.allocate(event.inputs[2].size - 1, zero=True)
    with pytest.raises(BindingError, match=r"'hit_to_track'.*'hit_features'"):
        deep_set(event.inputs[0], event.inputs[1], short, out=event.out)


def test_index_inputs_under_batch_size(
    peer: ModuleType, factory: ModuleType, generated_from_text: Callable[[str], ModuleType]
) -> None:
    """An index input may index only `whole` inputs under batch_size: the deep set's hit
    numbers, declared to index the sliced tracks, are refused (the values count from the first
    track of all, not of the slice); bounded by the whole hits, they pass."""
    event = _deep_set_event(peer, TOTAL, "cpu")
    net = factory.track_hit_deep_set()
    full = _run(peer.TrackHitDeepSet(net), event)
    declared = SCHEMA.read_text().replace(
        "same n as hit_features whole", "indexes track_features same n as hit_features whole"
    )
    assert declared != SCHEMA.read_text()
    variant = generated_from_text(declared)
    tracks = variant.Track.allocate(TOTAL)
    tracks.buffer.copy_(event.inputs[0].buffer)
    hits = variant.Hit.allocate(event.inputs[1].size)
    hits.buffer.copy_(event.inputs[1].buffer)
    hit_to_track = variant.HitToTrack.allocate(event.inputs[2].size)
    hit_to_track.buffer.copy_(event.inputs[2].buffer)
    on_variant = Event([tracks, hits, hit_to_track], variant.SimpleNetOut.allocate(TOTAL))
    refused = [
        variant.TrackHitDeepSet(net),
        peer.TrackHitDeepSet(net, index_bounds={"hit_to_track": "track_features"}),
    ]
    for model, target in zip(refused, (on_variant, event), strict=True):
        target.out.block("regression_head").fill_(-7)
        with pytest.raises(BindingError, match=r"'hit_to_track' indexes 'track_features'"):
            model(*target.inputs, out=target.out, batch_size=BATCH)
        assert bool((target.out.reco_pt == -7).all())
        torch.testing.assert_close(_run(model, target)[0], full[0])  # whole: checked, and run
    whole = peer.TrackHitDeepSet(net, index_bounds={"hit_to_track": "hit_features"})
    torch.testing.assert_close(_run(whole, event, batch_size=BATCH)[0], full[0])


def test_batch_size_needs_equal_sliced_sizes(peer: ModuleType, factory: ModuleType) -> None:
    """The sliced collections (tracks, output) must agree; the whole ones (hits) need not."""
    event = _deep_set_event(peer, TOTAL, "cpu")
    with pytest.raises(BindingError, match="inputs passed whole: hit_features, hit_scale"):
        peer.TrackHitDeepSet(factory.track_hit_deep_set())(
            *event.inputs, out=peer.SimpleNetOut.allocate(TOTAL - 1), batch_size=BATCH
        )


# AOT packages: last in the module, so that the background builds have had time to finish.


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("model", tuple(CASES))
def test_aot_case_matches_contiguous_reference(
    peer: ModuleType, factory: ModuleType, packages: PackageBuilds, model: str, n: int
) -> None:
    """As test_case_matches_contiguous_reference, with the case's package."""
    _check_against_reference(peer, factory, packages, model, "aot", n)


@pytest.mark.parametrize("model", MINI_BATCH)
def test_aot_mini_batch_equals_full_run(
    peer: ModuleType, factory: ModuleType, packages: PackageBuilds, model: str
) -> None:
    """As test_mini_batch_equals_full_run, with the case's package."""
    _check_mini_batch(peer, factory, packages, model, "aot")


def test_aot_same_n(peer: ModuleType, packages: PackageBuilds) -> None:
    """`soagen compile` exports one element count for inputs tied by `same n as` (and keeps the
    others apart), and the package refuses mismatched sizes as the other backends do."""
    geometry = read_metadata(packages.package("MaskedNet"))["input_geometry"]
    assert geometry[0]["sizes"][0] == geometry[1]["sizes"][0]
    assert not geometry[0]["sizes"][0].isdigit()
    geometry = read_metadata(packages.package("TrackHitDeepSet"))["input_geometry"]
    tracks, numbers, hit_features, hit_to_track, hit_scale = (g["sizes"][0] for g in geometry)
    assert tracks == numbers and hit_features == hit_to_track == hit_scale != tracks
    assert geometry[4]["strides"][0] == "0"
    _check_size_mismatch(peer.MaskedNet.load(packages.package("MaskedNet")), peer)


@pytest.mark.parametrize("model", tuple(CASES))
def test_aot_empty_collections_run_nothing(
    peer: ModuleType, packages: PackageBuilds, model: str
) -> None:
    compiled = getattr(peer, model).load(packages.package(model))
    outputs = _run(compiled, _event(peer, model, 0, "cpu"))
    assert all(output.shape[0] == 0 for output in outputs)
    assert compiled._backend.devices == ()  # never placed: no call reached the package


def test_aot_deep_set_without_hits(
    peer: ModuleType, factory: ModuleType, packages: PackageBuilds
) -> None:
    _check_deep_set_without_hits(peer, factory, packages, "aot")
