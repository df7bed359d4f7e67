"""`soagen triton`: the config model and its validation, the repository writer, the Python-backend
model run in-process with a stand-in for Triton's `triton_python_backend_utils`, and a real
tritonserver (the one PyTriton bundles) on 127.0.0.1 serving repositories the writer produced."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from soagen.dsl.dtypes import DTYPES
from soagen.dsl.loader import load
from soagen.serving.model_config import (
    TRITON_TYPES,
    InstanceGroup,
    ModelConfig,
    Options,
    TensorConfig,
    TritonError,
    build_config,
    output_sizes,
    render,
    validate,
)
from soagen.serving.wire import DEFAULT_MAX_QUEUE_DELAY_US, TRITON_DATATYPES, wire_tensor
from tests.helpers import REPO, free_ports, run_cli

GNN = REPO / "schemas" / "gnn.soa"
FACTORY = f"{(REPO / 'examples' / 'gnn_model.py').as_posix()}:build_model"
GNN_SIZES = ["--output-size", "edge_scores=edge_features"]

# A model with a scalar input (one value per event), an output written into an input's collection
# and an output with a fixed count per event.
SCALED = """\
layout Hits {
    column float32 x, y
    scalar float32 scale
    column float32 result
}

layout Summary {
    column float32 total
}

model Scaled {
    input  points = Hits{x, y} as [n, c]
    input  scale  = Hits{scale}
    output scaled = Hits{result}
    output total  = Summary{total}
}
"""
SCALED_FACTORY = """\
import torch


class Scaled(torch.nn.Module):
    def forward(self, points: torch.Tensor, scale: torch.Tensor):
        scaled = points.sum(1) * scale
        return scaled, scaled.sum().reshape(1)


def build():
    return Scaled()
"""


def _gnn_config(**options: Any) -> ModelConfig:
    return build_config(load(GNN).unwrap(), "EdgeClassifier", Options(**options))


def _schema_files(folder: Path, name: str, schema_text: str, factory_text: str) -> tuple[Path, str]:
    """`folder/NAME.soa` and `folder/NAME_model.py`; the schema's path and the factory argument."""
    schema = folder / f"{name}.soa"
    schema.write_text(schema_text)
    factory = folder / f"{name}_model.py"
    factory.write_text(factory_text)
    return schema, f"{factory.as_posix()}:build"


def _scaled_schema(tmp_path: Path) -> tuple[Path, str]:
    return _schema_files(tmp_path, "scaled", SCALED, SCALED_FACTORY)


# The config model: torch-free.


def test_gnn_config_dims_types_and_names() -> None:
    """The Python backend's tensors are soagen serve's wire form (storage order, a batch axis of
    events, ragged); the PyTorch backend's keep the declared axes, one request at a time."""
    config = _gnn_config()
    assert config.backend == "python" and config.max_batch_size == 64
    assert [(t.name, t.data_type, t.dims) for t in config.inputs] == [
        ("node_features", "TYPE_FP32", (4, -1)),
        ("edge_index", "TYPE_INT64", (2, -1)),
        ("edge_features", "TYPE_FP32", (2, -1)),
    ]
    assert [(t.name, t.data_type, t.dims) for t in config.outputs] == [
        ("edge_scores", "TYPE_FP32", (-1,))
    ]
    # The same tensors `soagen serve` declares, from one definition (soagen.serving.wire).
    from generated.gnn import EdgeClassifier

    served = [wire_tensor(spec) for spec in (*EdgeClassifier.INPUTS, *EdgeClassifier.OUTPUTS)]
    assert [(f"TYPE_{w.datatype}", w.dims) for w in served] == [
        (t.data_type, t.dims) for t in (*config.inputs, *config.outputs)
    ]
    assert config.dynamic_batching == DEFAULT_MAX_QUEUE_DELAY_US
    assert all(t.allow_ragged_batch for t in config.inputs)
    assert config.instance_groups == (InstanceGroup("KIND_CPU", 1),)
    text = render(config)
    assert text == render(_gnn_config())  # deterministic
    assert text.startswith("# Written by soagen ")
    assert "# edge_index: Edges{src, dst} as [c, n], int64\n" in text
    assert "# node_features: Nodes{x, y, z, energy} as [n, c], float32; sent as [c, n]" in text
    pytorch = _gnn_config(backend="pytorch")
    assert pytorch.max_batch_size == 0 and pytorch.dynamic_batching is None
    assert [t.dims for t in pytorch.inputs] == [(-1, 4), (2, -1), (-1, 2)]
    assert "allow_ragged_batch" not in render(pytorch)


def test_pytorch_backend_names_follow_the_index_convention() -> None:
    config = _gnn_config(backend="pytorch")
    assert [t.name for t in config.inputs] == [
        "node_features__0",
        "edge_index__1",
        "edge_features__2",
    ]
    assert [t.name for t in config.outputs] == ["edge_scores__0"]
    assert 'default_model_filename: "model.pt"' in render(config)
    forward = _gnn_config(backend="pytorch", naming="forward", forward_names=("a", "b", "c"))
    assert [t.name for t in forward.inputs] == ["a", "b", "c"]
    assert [t.name for t in forward.outputs] == ["edge_scores__0"]
    with pytest.raises(TritonError, match="forward takes 2 tensor"):
        _gnn_config(backend="pytorch", naming="forward", forward_names=("a", "b"))


def test_batching_gpu_and_instances() -> None:
    config = _gnn_config(max_batch_size=16, merge_events=True, kind="gpu", count=2, gpus=(0, 1))
    assert all(t.allow_ragged_batch for t in config.inputs)
    assert not any(t.allow_ragged_batch for t in config.outputs)
    text = render(config)
    assert "max_batch_size: 16" in text and "max_queue_delay_microseconds: 500" in text
    assert "kind: KIND_GPU" in text and "gpus: [ 0, 1 ]" in text and "count: 2" in text
    assert "one concatenation along each collection's element axis" in " ".join(config.header)
    with pytest.raises(TritonError, match="PyTorch backend hands ragged"):
        _gnn_config(backend="pytorch", max_batch_size=4)
    with pytest.raises(TritonError, match="only --backend python does"):
        _gnn_config(backend="pytorch", merge_events=True)
    with pytest.raises(TritonError, match="carry Triton's batch axis"):
        _gnn_config(max_batch_size=0)
    assert _gnn_config(max_batch_size=1, merge_events=True).max_batch_size == 1


def test_rendered_config_parses_as_triton_model_config() -> None:
    """Triton's own protobuf schema (shipped with tritonclient's gRPC client) reads what we write."""
    pytest.importorskip("tritonclient.grpc")
    text_format = pytest.importorskip("google.protobuf.text_format")
    from tritonclient.grpc import model_config_pb2

    for options in (
        {},
        {"backend": "pytorch"},
        {"max_batch_size": 8, "merge_events": True, "kind": "gpu", "gpus": (0,)},
    ):
        config = _gnn_config(**options)
        parsed = text_format.Parse(render(config), model_config_pb2.ModelConfig())
        assert parsed.name == "EdgeClassifier"
        assert [list(i.dims) for i in parsed.input] == [list(t.dims) for t in config.inputs]
        assert parsed.max_batch_size == config.max_batch_size
        assert parsed.input[0].allow_ragged_batch == (config.max_batch_size > 0)


def test_every_soagen_dtype_has_a_triton_type() -> None:
    assert set(TRITON_TYPES) == set(DTYPES) == set(TRITON_DATATYPES)
    assert TRITON_TYPES["bool"] == "TYPE_BOOL" and TRITON_TYPES["bfloat16"] == "TYPE_BF16"
    # The wire form (the Python backend's tensors) carries bfloat16 as its bits.
    assert TRITON_DATATYPES["bfloat16"] == "UINT16"


def _config(**changes: Any) -> ModelConfig:
    tensor = TensorConfig("x", "TYPE_FP32", (-1, 4), variable=(0,))
    base = ModelConfig(
        name="m",
        backend="python",
        max_batch_size=0,
        inputs=(tensor,),
        outputs=(TensorConfig("y", "TYPE_FP32", (-1,), variable=(0,)),),
        instance_groups=(InstanceGroup("KIND_CPU"),),
    )
    return replace(base, **changes)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"inputs": (TensorConfig("x", "TYPE_FP32", ()),)}, "rank 1 or more"),
        ({"inputs": (TensorConfig("x", "TYPE_FP32", (4, -1), variable=(0,)),)}, "axis 1 is fixed"),
        ({"inputs": (TensorConfig("x", "TYPE_FP32", (0,)),)}, "axis 0 is 0"),
        ({"inputs": (TensorConfig("x", "TYPE_FLOAT", (1,)),)}, "not a Triton TYPE_*"),
        ({"inputs": (TensorConfig("y", "TYPE_FP32", (1,)),)}, "already an input"),
        ({"inputs": ()}, "at least one input"),
        ({"name": "a/b"}, "folder name"),
        ({"backend": "onnx"}, "backend 'onnx'"),
        ({"dynamic_batching": 100}, "dynamic_batching needs max_batch_size > 0"),
        (
            {"inputs": (TensorConfig("x", "TYPE_FP32", (-1,), (0,), allow_ragged_batch=True),)},
            "allow_ragged_batch needs max_batch_size > 0",
        ),
        ({"instance_groups": (InstanceGroup("KIND_TPU"),)}, "kind 'KIND_TPU'"),
        ({"instance_groups": (InstanceGroup("KIND_CPU", 0),)}, "count is 0"),
        ({"instance_groups": (InstanceGroup("KIND_CPU", 1, (0,)),)}, "only for KIND_GPU"),
        ({"instance_groups": (InstanceGroup("KIND_GPU", 1, (1, 1)),)}, "distinct indices"),
        (
            {"backend": "pytorch", "inputs": (TensorConfig("x", "TYPE_BF16", (1,)),)},
            "PyTorch backend has no TYPE_BF16",
        ),
        (
            {
                "backend": "pytorch",
                "inputs": (
                    TensorConfig("a__0", "TYPE_FP32", (1,)),
                    TensorConfig("b__2", "TYPE_FP32", (1,)),
                ),
            },
            "must number the inputs 0 to 1",
        ),
    ],
)
def test_validation_names_each_broken_rule(changes: dict[str, Any], problem: str) -> None:
    assert validate(_config()) == []
    problems = validate(_config(**changes))
    assert any(problem in p for p in problems), problems
    with pytest.raises(TritonError, match="invalid"):
        render(_config(**changes))


def test_scalar_inputs_carry_one_value_per_event(tmp_path: Path) -> None:
    schema_path, _ = _scaled_schema(tmp_path)
    schema = load(schema_path).unwrap()
    python = build_config(schema, "Scaled", Options())
    assert [t.dims for t in python.inputs] == [(2, -1), (1,)]
    assert python.inputs[1].variable == ()
    # The PyTorch backend hands the model what comes: the scalar goes as n values.
    pytorch = build_config(schema, "Scaled", Options(backend="pytorch"))
    assert [t.dims for t in pytorch.inputs] == [(-1, 2), (-1,)]
    with pytest.raises(TritonError, match="binds scalars of Hits"):
        build_config(schema, "Scaled", Options(max_batch_size=4, merge_events=True))
    only_scalars = tmp_path / "only.soa"
    only_scalars.write_text(
        "layout A {\n    column float32 x\n    scalar float32 s\n}\n"
        "model M {\n    input s = A{s}\n    output x = A{x}\n}\n"
    )
    with pytest.raises(TritonError, match="no other input gives A's element count"):
        build_config(load(only_scalars).unwrap(), "M", Options())


def test_output_sizes(tmp_path: Path) -> None:
    gnn = load(GNN).unwrap()
    assert output_sizes(gnn, "EdgeClassifier", {"edge_scores": "edge_features"}) == {
        "edge_scores": {"input": "edge_features"}
    }
    assert output_sizes(gnn, "EdgeClassifier", {"edge_scores": "7"}) == {
        "edge_scores": {"count": 7}
    }
    with pytest.raises(TritonError, match="--output-size edge_scores=INPUT"):
        output_sizes(gnn, "EdgeClassifier", {})
    with pytest.raises(TritonError, match="neither an input"):
        output_sizes(gnn, "EdgeClassifier", {"edge_scores": "nodes"})
    with pytest.raises(TritonError, match="has no output 'scores'"):
        output_sizes(gnn, "EdgeClassifier", {"scores": "edge_features"})
    schema_path, _ = _scaled_schema(tmp_path)
    scaled = load(schema_path).unwrap()
    # `scaled` writes into Hits, which an input binds; Summary is the one other layout.
    assert output_sizes(scaled, "Scaled", {"total": "1"}) == {
        "scaled": {"layout": "Hits"},
        "total": {"count": 1},
    }
    assert output_sizes(scaled, "Scaled", {})["total"] == {"input": "points"}
    with pytest.raises(TritonError, match="writes into Hits"):
        output_sizes(scaled, "Scaled", {"scaled": "points"})


# The repository writer (torch from here on).


def test_cli_writes_a_python_backend_model(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "repo"
    status, stdout, stderr = run_cli(
        "triton", str(GNN), "--model", "EdgeClassifier", "--factory", FACTORY, *GNN_SIZES,
        "-o", str(out), "--format", "json",
    )  # fmt: skip
    assert status == 0, stderr
    report = json.loads(stdout)
    assert report["backend"] == "python" and report["runtime"] == "eager"
    folder = out / "EdgeClassifier"
    assert {
        "config.pbtxt",
        "1/model.py",
        "1/soagen_model.json",
        "1/factory.py",
        "1/weights.pt",
        "1/soagen_generated/__init__.py",
        "1/soagen_generated/gnn.py",
    } <= set(report["files"])
    config = (folder / "config.pbtxt").read_text()
    assert 'backend: "python"' in config
    spec = json.loads((folder / "1" / "soagen_model.json").read_text())
    assert spec["index_bounds"] == {"edge_index": "node_features"}  # the schema's `indexes`
    assert spec["outputs"][0]["size"] == {"input": "edge_features"}
    # Writing again replaces the folder soagen wrote; the same inputs give the same text files.
    before = {p: (folder / p).read_bytes() for p in ("config.pbtxt", "1/model.py")}
    status, stdout, stderr = run_cli(
        "triton", str(GNN), "--model", "EdgeClassifier", "--factory", FACTORY, *GNN_SIZES,
        "-o", str(out),
    )  # fmt: skip
    assert status == 0, stderr
    # The text report lists each file, and the generated modules as one folder.
    assert "  1/model.py\n" in stdout and "  1/soagen_generated/ (2 generated files)\n" in stdout
    assert before == {p: (folder / p).read_bytes() for p in before}
    assert sorted(p.name for p in out.iterdir()) == ["EdgeClassifier"]  # no staging left


def test_cli_refuses_to_replace_a_folder_it_did_not_write(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    foreign = tmp_path / "repo" / "EdgeClassifier"
    foreign.mkdir(parents=True)
    (foreign / "config.pbtxt").write_text('name: "EdgeClassifier"\n')
    status, _, stderr = run_cli(
        "triton", str(GNN), "--model", "EdgeClassifier", "--factory", FACTORY, *GNN_SIZES,
        "-o", str(tmp_path / "repo"),
    )  # fmt: skip
    assert status == 2 and "was not written by soagen" in stderr
    assert (foreign / "config.pbtxt").read_text() == 'name: "EdgeClassifier"\n'


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--output-size edge_scores=INPUT"),
        (["--backend", "pytorch", "--max-batch-size", "4"], "PyTorch backend hands ragged"),
        ([*GNN_SIZES, "--max-batch-size", "0"], "--max-batch-size 0: the Python backend"),
        (["--backend", "pytorch", "--merge-events"], "only --backend python does"),
        ([*GNN_SIZES, "--runtime", "aot", "--package", "PT"], "is a TorchScript file"),
        ([*GNN_SIZES, "--output-size", "edge_scores=edge_index"], "gives 'edge_scores' twice"),
        ([*GNN_SIZES, "--index", "edge_index"], "--index takes INDEX=BOUND"),
        ([*GNN_SIZES, "--gpus", "0"], "--gpus needs --device gpu"),
        ([*GNN_SIZES, "--columnwise"], "--columnwise is an option of `soagen compile`"),
        ([*GNN_SIZES, "--write-outputs"], "--write-outputs is an option of `soagen compile`"),
        ([*GNN_SIZES, "--runtime", "torchscript", "--columnwise"], "it needs --runtime aot"),
        (["--model", "Nope"], "has no model 'Nope'; its models are EdgeClassifier"),
    ],
)
def test_cli_usage_errors(tmp_path: Path, extra: list[str], message: str) -> None:
    torch = pytest.importorskip("torch")
    from examples.gnn_model import build_model

    package = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(build_model()), str(package))
    extra = [str(package) if item == "PT" else item for item in extra]
    source = [] if "--package" in extra else ["--factory", FACTORY]
    status, _, stderr = run_cli(
        "triton", str(GNN), "--model", "EdgeClassifier", *source, "-o", str(tmp_path / "r"),
        *extra,
    )  # fmt: skip
    assert status == 2, stderr
    assert message in stderr
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_cli_schema_errors_and_empty_paths(tmp_path: Path) -> None:
    bad = tmp_path / "bad.soa"
    bad.write_text("layout A {\n    column float x\n}\n")
    status, _, stderr = run_cli("triton", str(bad), "--model", "M", "--factory", FACTORY, "-o", "r")
    assert status == 1 and "bad.soa:2:" in stderr
    status, _, stderr = run_cli("triton", str(GNN), "--model", "M", "--factory", FACTORY, "-o", "")
    assert status == 2 and "argument -o/--output: empty path" in stderr


def test_cli_needs_a_model_source(tmp_path: Path) -> None:
    status, _, stderr = run_cli(
        "triton", str(GNN), "--model", "EdgeClassifier", *GNN_SIZES, "-o", str(tmp_path / "r")
    )
    assert status == 2 and "give --factory FILE.py:FUNCTION" in stderr


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ("a.double().sum(1)", "output 'edge_scores' is torch.float64"),
        # Checked as a binding checks what a model returns: a dict needs the outputs' names.
        (
            "{'scores': c[:, 0]}",
            "EdgeClassifier returned a dict with keys scores; the schema's outputs are edge_scores",
        ),
    ],
)
def test_model_that_does_not_fit_its_outputs_exits_1(
    tmp_path: Path, returned: str, message: str
) -> None:
    pytest.importorskip("torch")
    factory = tmp_path / "bad.py"
    factory.write_text(
        "import torch\n\nclass Bad(torch.nn.Module):\n"
        f"    def forward(self, a, b, c):\n        return {returned}\n\n"
        "def build():\n    return Bad()\n"
    )
    status, _, stderr = run_cli(
        "triton", str(GNN), "--model", "EdgeClassifier", "--factory", f"{factory}:build",
        *GNN_SIZES, "-o", str(tmp_path / "r"),
    )  # fmt: skip
    assert status == 1 and message in stderr


def test_pytorch_backend_writes_torchscript(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from examples.gnn_model import build_model

    out = tmp_path / "repo"
    status, _, stderr = run_cli(
        "triton", str(GNN), "--model", "EdgeClassifier", "--factory", FACTORY,
        "--backend", "pytorch", "--naming", "forward", "-o", str(out),
    )  # fmt: skip
    assert status == 0, stderr
    folder = out / "EdgeClassifier"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) == [
        "1",
        "1/model.pt",
        "config.pbtxt",
    ]
    config = (folder / "config.pbtxt").read_text()
    # Inputs named as the forward's arguments, as Triton's PyTorch backend binds them.
    for name in ('"node_features"', '"edge_index"', '"edge_features"', '"edge_scores__0"'):
        assert f"name: {name}" in config
    # What the libtorch backend would do: the module on contiguous tensors, outputs by index.
    module = torch.jit.load(str(folder / "1" / "model.pt"))
    gen = torch.Generator().manual_seed(0)
    x, features = torch.randn(7, 4, generator=gen), torch.randn(11, 2, generator=gen)
    index = torch.randint(0, 7, (2, 11), generator=gen)
    torch.testing.assert_close(module(x, index, features), build_model()(x, index, features))


def test_traces_models_that_do_not_script(tmp_path: Path) -> None:
    """A model torch.jit.script cannot take (here: *args, dict output) is traced; its forward then
    has no argument names for --naming forward."""
    pytest.importorskip("torch")
    factory = tmp_path / "dict_model.py"
    factory.write_text(
        "import torch\nfrom examples.gnn_model import build_model\n\n"
        "class AsDict(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.net = build_model()\n"
        "    def forward(self, *inputs):\n"
        "        return {'edge_scores': self.net(*inputs)}\n\n"
        "def build():\n    return AsDict()\n"
    )
    args = ["triton", str(GNN), "--model", "EdgeClassifier", "--factory", f"{factory}:build"]
    status, _, stderr = run_cli(*args, "--backend", "pytorch", "-o", str(tmp_path / "r"))
    assert status == 0, stderr
    assert (tmp_path / "r" / "EdgeClassifier" / "1" / "model.pt").is_file()
    status, _, stderr = run_cli(
        *args, "--backend", "pytorch", "--naming", "forward", "-o", str(tmp_path / "r2")
    )
    assert status == 2 and "--naming forward needs" in stderr


@pytest.mark.parametrize("conversion", ["script", "trace"])
def test_a_torchscript_module_that_disagrees_is_refused_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, conversion: str
) -> None:
    """A stand-in for a bad conversion (the scripted or traced module's scores off by 0.5): the
    check against the eager model names the output and the difference, exits 1, and the folder
    written before stays as it was, with no staging folder left."""
    torch = pytest.importorskip("torch")
    out = tmp_path / "repo"
    factory = FACTORY
    if conversion == "trace":  # *args and a dict: torch.jit.script fails, so it is traced
        dict_factory = tmp_path / "dict_model.py"
        dict_factory.write_text(
            "import torch\nfrom examples.gnn_model import build_model\n\n"
            "class AsDict(torch.nn.Module):\n"
            "    def __init__(self):\n        super().__init__()\n        self.net = build_model()\n"
            "    def forward(self, *inputs):\n"
            "        return {'edge_scores': self.net(*inputs)}\n\n"
            "def build():\n    return AsDict()\n"
        )
        factory = f"{dict_factory}:build"
    args = ["triton", str(GNN), "--model", "EdgeClassifier", "--factory", factory]
    status, _, stderr = run_cli(*args, "--backend", "pytorch", "-o", str(out))
    assert status == 0, stderr
    folder = out / "EdgeClassifier"
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    # The stand-in is scripted, so it lives in a file of its own: TorchScript reads its source.
    double = tmp_path / "off_by_half.py"
    double.write_text(
        "import torch\n\n"
        "class OffByHalf(torch.nn.Module):\n"
        "    def __init__(self, model):\n        super().__init__()\n        self.model = model\n\n"
        "    def forward(self, x: torch.Tensor, index: torch.Tensor, features: torch.Tensor):\n"
        "        return self.model(x, index, features) + 0.5\n\n"
        "class TupleOffByHalf(OffByHalf):\n"
        "    def forward(self, x: torch.Tensor, index: torch.Tensor, features: torch.Tensor):\n"
        "        return tuple(value + 0.5 for value in self.model(x, index, features))\n"
    )
    spec = importlib.util.spec_from_file_location("off_by_half", double)
    assert spec is not None and spec.loader is not None
    doubles = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "off_by_half", doubles)
    spec.loader.exec_module(doubles)

    real_script, real_trace = torch.jit.script, torch.jit.trace
    if conversion == "script":

        def script(obj: Any, *args: Any, **kwargs: Any) -> Any:
            # torch.jit.script calls itself for what it compiles inside: only the model is wrapped.
            if isinstance(obj, torch.nn.Module) and not isinstance(obj, doubles.OffByHalf):
                obj = doubles.OffByHalf(obj)
            return real_script(obj, *args, **kwargs)

        monkeypatch.setattr(torch.jit, "script", script)
    else:
        monkeypatch.setattr(
            torch.jit,
            "trace",
            lambda model, example: real_trace(doubles.TupleOffByHalf(model), example),
        )
    status, _, stderr = run_cli(*args, "--backend", "pytorch", "-o", str(out))
    what = "the scripted model" if conversion == "script" else r"the traced model \(.*\)"
    assert status == 1, stderr
    assert re.search(
        rf"^soagen: error: {what} disagrees with the eager model on output 'edge_scores' for "
        r"Nodes n=\d+, Edges n=\d+: \d+ of \d+ values differ .*; largest difference 0\.5;",
        stderr,
        re.MULTILINE,
    ), stderr
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in out.iterdir()) == ["EdgeClassifier"]  # no staging left


# The Python-backend model in-process, with a stand-in for Triton's pb_utils.


class _Tensor:
    def __init__(self, name: str, value: Any) -> None:
        self._name, self.value = name, value

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> Any:
        return self.value


class _TritonError:
    INVALID_ARG, INTERNAL = 3, 13

    def __init__(self, message: str, code: int = 13) -> None:
        self.message, self.code = message, code


class _Response:
    def __init__(self, output_tensors: Any = None, error: Any = None) -> None:
        self.tensors = {t.name(): t.value for t in output_tensors or []}
        self.error = error


def _pb_utils() -> types.ModuleType:
    module = types.ModuleType("triton_python_backend_utils")
    module.Tensor = _Tensor  # type: ignore[attr-defined]
    module.TritonError = _TritonError  # type: ignore[attr-defined]
    module.InferenceResponse = _Response  # type: ignore[attr-defined]
    module.get_input_tensor_by_name = lambda request, name: request.get(name)  # type: ignore[attr-defined]
    return module


@contextlib.contextmanager
def _triton_model(folder: Path, version: str = "1") -> Iterator[Any]:
    """Import the repository's model.py as Triton's Python backend does and initialize it."""
    sys.modules["triton_python_backend_utils"] = _pb_utils()
    try:
        name = f"_triton_model_{uuid.uuid4().hex}"
        spec = importlib.util.spec_from_file_location(name, folder / version / "model.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        model = module.TritonPythonModel()
        model.initialize(
            {
                "model_name": folder.name,
                "model_version": version,
                "model_instance_kind": "CPU",
                "model_instance_device_id": "0",
                "model_repository": str(folder),
            }
        )
        yield model
        model.finalize()
    finally:
        del sys.modules["triton_python_backend_utils"]


def _gnn_request(n_nodes: int, n_edges: int, seed: int) -> dict[str, Any]:
    """One event as a request carries it: each block in storage order (one row per column), after
    a batch axis of 1."""
    from examples.run_gnn import make_event

    nodes, edges = make_event(n_nodes, n_edges, "cpu", seed=seed)
    import torch

    arrays = {
        "node_features": torch.stack([nodes.x, nodes.y, nodes.z, nodes.energy]).numpy(),
        "edge_index": torch.stack([edges.src, edges.dst]).numpy(),
        "edge_features": torch.stack([edges.delta_r, edges.delta_eta]).numpy(),
    }
    return {name: _Tensor(name, a[None]) for name, a in arrays.items()}


def _expected(request: dict[str, Any]) -> Any:
    """The model's edge scores for the request's (first) event, its blocks in declared order."""
    import torch

    from examples.gnn_model import build_model

    node_features, edge_index, edge_features = (
        torch.from_numpy(request[name].value[0])
        for name in ("node_features", "edge_index", "edge_features")
    )
    with torch.no_grad():
        return build_model()(node_features.T, edge_index, edge_features.T)


@pytest.fixture(scope="module")
def gnn_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One repository with the GNN served four ways, the bfloat16 model `half_sum` and the model
    `scaled` with a scalar input (built once: the server tests reuse it)."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("triton")
    out = root / "repository"
    schema, factory = _half_schema(root)
    status, _, stderr = run_cli(
        "triton", str(schema), "--model", "Sum", "--factory", factory, "--name", "half_sum",
        "-o", str(out),
    )  # fmt: skip
    assert status == 0, stderr
    schema, factory = _scaled_schema(root)
    status, _, stderr = run_cli(
        "triton", str(schema), "--model", "Scaled", "--factory", factory, "--name", "scaled",
        "--output-size", "total=1", "-o", str(out),
    )  # fmt: skip
    assert status == 0, stderr
    base = ["triton", str(GNN), "--model", "EdgeClassifier", "--factory", FACTORY, *GNN_SIZES]
    for extra in (
        ["--name", "gnn_eager"],
        ["--name", "gnn_torchscript", "--runtime", "torchscript"],
        ["--name", "gnn_batched", "--max-batch-size", "8", "--max-queue-delay-us", "200000"],
        [
            "--name", "gnn_merged", "--max-batch-size", "8", "--merge-events",
            "--max-queue-delay-us", "200000",
        ],
    ):  # fmt: skip
        status, _, stderr = run_cli(*base, *extra, "-o", str(out))
        assert status == 0, stderr
    return out


@pytest.mark.parametrize("name", ["gnn_eager", "gnn_torchscript"])
def test_python_model_runs_one_event_per_request(gnn_repository: Path, name: str) -> None:
    import torch

    with _triton_model(gnn_repository / name) as model:
        requests = [_gnn_request(50, 200, 1), _gnn_request(3, 1, 2), _gnn_request(9, 0, 3)]
        responses = model.execute(requests)
        for request, response in zip(requests, responses, strict=True):
            assert response.error is None
            got = torch.as_tensor(response.tensors["edge_scores"])
            assert got.shape[0] == 1
            torch.testing.assert_close(got[0], _expected(request), rtol=1e-4, atol=1e-5)


def test_python_model_answers_bad_requests_one_by_one(gnn_repository: Path) -> None:
    good = _gnn_request(20, 40, 1)
    out_of_range = _gnn_request(5, 10, 2)
    out_of_range["edge_index"].value[0, 0, 3] = 5
    missing = _gnn_request(5, 10, 3)
    del missing["edge_features"]
    disagree = _gnn_request(5, 10, 4)
    disagree["edge_features"] = _Tensor("edge_features", disagree["edge_features"].value[..., :7])
    wrong_dtype = _gnn_request(5, 10, 5)
    wrong_dtype["node_features"].value = wrong_dtype["node_features"].value.astype("float64")
    wrong_shape = _gnn_request(5, 10, 6)
    wrong_shape["node_features"].value = wrong_shape["node_features"].value[:, :3]
    declared_order = _gnn_request(5, 10, 7)  # [1, n, 4]: the old convention
    declared_order["node_features"].value = declared_order["node_features"].value.transpose(0, 2, 1)
    with _triton_model(gnn_repository / "gnn_eager") as model:
        responses = model.execute(
            [good, out_of_range, missing, disagree, wrong_dtype, wrong_shape, declared_order]
        )
    assert responses[0].error is None
    messages = [r.error.message for r in responses[1:]]
    assert all(r.error.code == _TritonError.INVALID_ARG for r in responses[1:])
    assert "holds indices 0..5, outside [0, 5)" in messages[0]
    assert "input 'edge_features' is missing" in messages[1]
    assert "disagree on the element count of Edges (10 and 7)" in messages[2]
    assert "holds float64, expected float32 (FP32)" in messages[3]
    assert "has shape [1, 3, 5], expected [b, 4, n]" in messages[4]
    assert "has shape [1, 5, 4], expected [b, 4, n]" in messages[5]
    assert all(m.startswith("gnn_eager: ") for m in messages)


@pytest.mark.parametrize("name", ["gnn_batched", "gnn_merged"])
def test_python_model_runs_gathered_events(gnn_repository: Path, name: str) -> None:
    import torch

    requests = [_gnn_request(10 + 7 * k, 30 + 11 * k, k) for k in range(4)]
    # One request carrying two events of equal shapes: Triton's batch axis of 2.
    pair = [_gnn_request(6, 9, 10 + k) for k in range(2)]
    requests.append(
        {
            n: _Tensor(n, __import__("numpy").concatenate([p[n].value for p in pair]))
            for n in pair[0]
        }
    )
    bad = _gnn_request(4, 4, 20)
    bad["edge_index"].value[0, 0, 0] = -1
    requests.insert(2, bad)
    with _triton_model(gnn_repository / name) as model:
        runs = []
        original = model.model.model.run
        model.model.model.run = lambda *a, **k: (runs.append(1), original(*a, **k))
        responses = model.execute(requests)
    assert len(runs) == (1 if name == "gnn_merged" else 6)
    assert "outside [0, 4)" in responses[2].error.message
    kept = requests[:2] + requests[3:5]
    for request, response in zip(kept, responses[:2] + responses[3:5], strict=True):
        assert response.error is None
        got = torch.as_tensor(response.tensors["edge_scores"])
        assert got.shape[0] == 1
        torch.testing.assert_close(got[0], _expected(request), rtol=1e-4, atol=1e-5)
    got = torch.as_tensor(responses[5].tensors["edge_scores"])
    assert got.shape == (2, 9)
    for k, one in enumerate(pair):
        torch.testing.assert_close(got[k], _expected(one), rtol=1e-4, atol=1e-5)


def test_python_model_with_scalars_in_place_outputs_and_counts(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    schema, factory = _scaled_schema(tmp_path)
    out = tmp_path / "repo"
    status, _, stderr = run_cli(
        "triton", str(schema), "--model", "Scaled", "--factory", factory,
        "--output-size", "total=1", "-o", str(out),
    )  # fmt: skip
    assert status == 0, stderr
    points = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    request = {
        "points": _Tensor("points", points.T.contiguous()[None].numpy()),  # [1, c, n]
        "scale": _Tensor("scale", torch.tensor([[2.0]]).numpy()),  # one value per event
    }
    no_points = {  # an event with no hits still has its scale
        "points": _Tensor("points", torch.zeros(1, 2, 0).numpy()),
        "scale": _Tensor("scale", torch.tensor([[2.0]]).numpy()),
    }
    with _triton_model(out / "Scaled") as model:
        (response, empty) = model.execute([request, no_points])
    assert response.error is None
    scaled = points.sum(1) * 2
    torch.testing.assert_close(torch.as_tensor(response.tensors["scaled"]), scaled[None])
    torch.testing.assert_close(torch.as_tensor(response.tensors["total"]), scaled.sum()[None, None])
    assert empty.error is None, empty.error.message
    assert empty.tensors["scaled"].shape == (1, 0) and empty.tensors["total"].tolist() == [[0.0]]


# A narrow MLP for `--runtime aot --columnwise`: both layers are rewritten column by column.
NARROW = """\
layout Hits {
    column float32 x, y
    column float32 score
}

model Score {
    input  xy    = Hits{x, y} as [n, c]
    output score = Hits{score}
}
"""
NARROW_FACTORY = """\
import torch


class Score(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.mix = torch.nn.Linear(2, 3)
        self.out = torch.nn.Linear(3, 1)

    def forward(self, xy):
        return self.out(torch.relu(self.mix(xy))).squeeze(1)


def build():
    return Score().eval()
"""


def test_python_model_runs_an_aot_package_compiled_columnwise(tmp_path: Path) -> None:
    """`--runtime aot --factory F --columnwise --write-outputs`: soagen compile rewrites the narrow
    layers and has the package store into the output blocks, the package says so, and the
    repository's model.py runs it with the eager model's results."""
    torch = pytest.importorskip("torch")
    from soagen.runtime.aot import AotBackend
    from soagen.serving.server import load_binding

    schema, factory = _schema_files(tmp_path, "narrow", NARROW, NARROW_FACTORY)
    out = tmp_path / "repo"
    status, _, stderr = run_cli(
        "triton", str(schema), "--model", "Score", "--factory", factory, "--runtime", "aot",
        "--columnwise", "--write-outputs", "-o", str(out),
    )  # fmt: skip
    assert status == 0, stderr
    assert "columnwise: mix, out (2 of 2 nn.Linear layers)" in stderr
    binding = load_binding(schema, "Score").binding
    metadata = AotBackend(out / "Score" / "1" / "model.pt2", binding).metadata
    assert metadata["columnwise"] == ["mix", "out"] and metadata["writes_outputs"] is True
    namespace: dict[str, Any] = {}
    exec(NARROW_FACTORY, namespace)
    eager = namespace["build"]()
    with _triton_model(out / "Score") as model:
        for n in (1, 2, 37, 1000):
            xy = torch.randn(n, 2, generator=torch.Generator().manual_seed(n))
            request = {"xy": _Tensor("xy", xy.T.contiguous()[None].numpy())}  # [1, c, n]
            (response,) = model.execute([request])
            assert response.error is None, response.error
            with torch.no_grad():
                expected = eager(xy)
            got = torch.as_tensor(response.tensors["score"])
            torch.testing.assert_close(got, expected[None], rtol=1e-5, atol=1e-6)


def test_a_package_that_writes_a_fixed_count_output_refuses_another_count(tmp_path: Path) -> None:
    """`total` is one value per event: the package's output axis is 1, not a free size that
    `copy_` would broadcast into; Triton's model.py and a local binding both hold to it."""
    torch = pytest.importorskip("torch")
    from soagen.runtime.errors import BindingError
    from soagen.serving.server import load_binding

    schema, factory = _scaled_schema(tmp_path)
    out = tmp_path / "repo"
    status, _, stderr = run_cli(
        "triton", str(schema), "--model", "Scaled", "--factory", factory, "--runtime", "aot",
        "--write-outputs", "--output-size", "total=1", "-o", str(out),
    )  # fmt: skip
    assert status == 0, stderr
    points = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    request = {
        "points": _Tensor("points", points.T.contiguous()[None].numpy()),
        "scale": _Tensor("scale", torch.tensor([[2.0]]).numpy()),
    }
    with _triton_model(out / "Scaled") as model:
        (response,) = model.execute([request])
    assert response.error is None, response.error
    torch.testing.assert_close(
        torch.as_tensor(response.tensors["total"]), (points.sum(1) * 2).sum()[None, None]
    )
    loaded = load_binding(schema, "Scaled")
    package = loaded.binding.load(out / "Scaled" / "1" / "model.pt2")
    hits = loaded.layouts["Hits"].allocate(5, zero=True)
    totals = loaded.layouts["Summary"].allocate(5, zero=True)
    with pytest.raises(BindingError, match="size of output 'total' along axis n is 5"):
        package(hits, out=(hits, totals))
    assert not totals.total.any()
    # The package recorded its count: a repository whose model.py would allocate another is
    # refused when written, not at every request.
    status, _, stderr = run_cli(
        "triton", str(schema), "--model", "Scaled", "--package", str(out / "Scaled" / "1" / "model.pt2"),
        "--output-size", "total=points", "-o", str(tmp_path / "other"),
    )  # fmt: skip
    assert status == 2, stderr
    assert "'total' would get as many elements as 'points' per event" in stderr
    assert "exported with 1 elements" in stderr and not (tmp_path / "other" / "Scaled").exists()
    # Given nothing, model.py allocates what the package recorded, not the one input layout's n.
    status, _, stderr = run_cli(
        "triton", str(schema), "--model", "Scaled", "--package", str(out / "Scaled" / "1" / "model.pt2"),
        "-o", str(tmp_path / "recorded"),
    )  # fmt: skip
    assert status == 0, stderr
    with _triton_model(tmp_path / "recorded" / "Scaled") as model:
        (response,) = model.execute([request])
    assert response.error is None, response.error
    torch.testing.assert_close(
        torch.as_tensor(response.tensors["total"]), (points.sum(1) * 2).sum()[None, None]
    )


def test_python_model_sizes_outputs_as_a_writing_package_recorded(tmp_path: Path) -> None:
    """The GNN built with --write-outputs (inputs of two layouts, EdgeScores a layout of its
    own): with no --output-size, model.py allocates as many scores as the package recorded (one
    per edge), and answers what the model computes; a size that contradicts it is refused."""
    torch = pytest.importorskip("torch")
    out = tmp_path / "repo"
    status, _, stderr = run_cli(
        "triton", str(GNN), "--model", "EdgeClassifier", "--factory", FACTORY, "--runtime", "aot",
        "--write-outputs", "-o", str(out),
    )  # fmt: skip
    assert status == 0, stderr
    (written,) = json.loads((out / "EdgeClassifier" / "1" / "soagen_model.json").read_text())[
        "outputs"
    ]
    assert written["size"] == {"input": "edge_index"}
    with _triton_model(out / "EdgeClassifier") as model:
        requests = [_gnn_request(50, 200, 1), _gnn_request(3, 1, 2)]
        for request, response in zip(requests, model.execute(requests), strict=True):
            assert response.error is None, response.error
            got = torch.as_tensor(response.tensors["edge_scores"])
            torch.testing.assert_close(got[0], _expected(request), rtol=1e-4, atol=1e-5)
    status, _, stderr = run_cli(
        "triton", str(GNN), "--model", "EdgeClassifier",
        "--package", str(out / "EdgeClassifier" / "1" / "model.pt2"),
        "--output-size", "edge_scores=node_features", "-o", str(tmp_path / "other"),
    )  # fmt: skip
    assert status == 2, stderr
    assert "exported with as many elements as 'edge_index'" in stderr


def test_a_writing_package_cannot_overwrite_its_inputs_in_the_python_backend(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    schema, factory = _schema_files(
        tmp_path,
        "rescale",
        "layout Hits {\n    column float32 x, y\n}\n\nmodel Rescale {\n"
        "    input xy = Hits{x, y} as [n, c]\n    output x = Hits{x}\n}\n",
        "import torch\n\n\nclass Sum(torch.nn.Module):\n    def forward(self, xy):\n"
        "        return xy.sum(1)\n\n\ndef build():\n    return Sum()\n",
    )
    status, _, stderr = run_cli(
        "triton", str(schema), "--model", "Rescale", "--factory", factory, "--runtime", "aot",
        "--write-outputs", "-o", str(tmp_path / "repo"),
    )  # fmt: skip
    assert status == 2 and "output 'x' binds members of input 'xy'" in stderr


# A bfloat16 model: NumPy has no bfloat16, so its blocks travel as their bits (UINT16).
HALF = """\
layout A {
    column bfloat16 x, y
    column bfloat16 out
}

model Sum {
    input xy = A{x, y} as [n, c]
    output out = A{out}
}
"""
HALF_FACTORY = """\
import torch


class Sum(torch.nn.Module):
    def forward(self, xy):
        return xy.sum(1)


def build():
    return Sum()
"""


def _half_schema(folder: Path) -> tuple[Path, str]:
    return _schema_files(folder, "half", HALF, HALF_FACTORY)


def test_python_model_carries_bfloat16_as_its_bits(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    schema, factory = _half_schema(tmp_path)
    out = tmp_path / "repo"
    status, _, stderr = run_cli(
        "triton", str(schema), "--model", "Sum", "--factory", factory, "-o", str(out)
    )
    assert status == 0, stderr
    config = (out / "Sum" / "config.pbtxt").read_text()
    assert "TYPE_UINT16" in config and "TYPE_BF16" not in config
    xy = torch.randn(6, 2).to(torch.bfloat16)
    bits = xy.T.contiguous().view(torch.int16).numpy().view("uint16")[None]  # [1, 2, 6]
    with _triton_model(out / "Sum") as model:
        (response,) = model.execute([{"xy": _Tensor("xy", bits)}])
        (wrong,) = model.execute([{"xy": _Tensor("xy", bits.view("float16"))}])
    assert response.error is None
    got = response.tensors["out"]
    assert got.dtype.name == "uint16" and got.shape == (1, 6)
    assert torch.equal(torch.from_numpy(got.view("int16")).view(torch.bfloat16)[0], xy.sum(1))
    assert "holds float16, expected uint16 (UINT16)" in wrong.error.message


# A real tritonserver: the one PyTriton's wheel bundles, with its Python backend.


def _server_command(
    root: Path, repository: Path, http: int, grpc: int
) -> tuple[list[str], dict[str, str]]:
    pytriton = pytest.importorskip(
        "pytriton", reason="nvidia-pytriton (the serve extra) is not installed"
    )
    bundle = Path(pytriton.__file__).parent / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = bundle / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        pytest.skip(f"PyTriton bundles no Python backend stub for Python {version}")
    # The backend folder Triton loads: the bundle's Python backend with this Python's stub.
    backend = root / "backends" / "python"
    backend.mkdir(parents=True)
    for item in (bundle / "backends" / "python").iterdir():
        if item.is_file():
            (backend / item.name).symlink_to(item)
    shutil.copy(stub, backend / "triton_python_backend_stub")
    from soagen.serving.server import interpreter_library_path

    libraries = str(Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs")
    env = dict(os.environ)
    if env.get("LD_LIBRARY_PATH"):
        libraries += os.pathsep + env["LD_LIBRARY_PATH"]
    # A pyenv-built (or any shared-library) Python: the stub must load this interpreter's
    # libpython, not the system one, or it fails inside threading.
    env["LD_LIBRARY_PATH"] = interpreter_library_path(libraries) or libraries
    # The stub's embedded Python finds its packages (torch, soagen) through `python3` on PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    command = [
        str(bundle / "bin" / "tritonserver"),
        f"--model-repository={repository}",
        f"--backend-directory={root / 'backends'}",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--allow-metrics=false",
        "--exit-timeout-secs=5",
        f"--backend-config=python,shm-region-prefix-name=soagen{os.getpid()}{uuid.uuid4().hex[:6]}",
    ]
    return command, env


@dataclass(frozen=True)
class _Addresses:
    http: str
    grpc: str


@pytest.fixture(scope="module")
def triton_server(
    gnn_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_Addresses]:
    """tritonserver on 127.0.0.1 serving `gnn_repository`; its HTTP and gRPC addresses."""
    pytest.importorskip("tritonclient.http", reason="tritonclient is not installed")
    root = tmp_path_factory.mktemp("tritonserver")
    http, grpc = free_ports(2)
    command, env = _server_command(root, gnn_repository, http, grpc)
    log_path = root / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    address = f"127.0.0.1:{http}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"tritonserver exited ({process.returncode}):\n{log_path.read_text()[-3000:]}"
                )
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://{address}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            if time.monotonic() > deadline:
                pytest.fail(f"tritonserver not ready in 60 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield _Addresses(address, f"127.0.0.1:{grpc}")
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        # The Python backend's stub processes are in the server's session: none may outlive it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


def _infer(client: Any, model: str, request: dict[str, Any], *, wait: bool = True) -> Any:
    import tritonclient.http as httpclient

    types_ = {"float32": "FP32", "int64": "INT64"}
    inputs = []
    for name, tensor in request.items():
        item = httpclient.InferInput(
            name, list(tensor.value.shape), types_[str(tensor.value.dtype)]
        )
        item.set_data_from_numpy(tensor.value)
        inputs.append(item)
    return client.infer(model, inputs) if wait else client.async_infer(model, inputs)


def test_real_server_matches_local_execution(triton_server: _Addresses) -> None:
    import numpy
    import torch
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(triton_server.http, concurrency=8)
    try:
        for model in ("gnn_eager", "gnn_torchscript"):
            assert client.is_model_ready(model)
            for n_nodes, n_edges, seed in ((50, 200, 1), (3, 1, 2), (1000, 5000, 3)):
                request = _gnn_request(n_nodes, n_edges, seed)
                scores = _infer(client, model, request).as_numpy("edge_scores")
                assert scores.shape == (1, n_edges)
                torch.testing.assert_close(
                    torch.from_numpy(numpy.array(scores[0])),
                    _expected(request),
                    rtol=1e-4,
                    atol=1e-5,
                )
        bad = _gnn_request(5, 10, 4)
        bad["edge_index"].value[0, 1, 2] = 99
        with pytest.raises(InferenceServerException, match=r"outside \[0, 5\)"):
            _infer(client, "gnn_eager", bad)
        # Events of different sizes, sent at once: the dynamic batcher gathers them (ragged inputs)
        # and gnn_merged runs each gathered set as one concatenation.
        for model in ("gnn_batched", "gnn_merged"):
            requests = [_gnn_request(10 + 7 * k, 30 + 11 * k, k) for k in range(6)]
            pending = [_infer(client, model, r, wait=False) for r in requests]
            for request, call in zip(requests, pending, strict=True):
                scores = call.get_result().as_numpy("edge_scores")
                torch.testing.assert_close(
                    torch.from_numpy(numpy.array(scores[0])),
                    _expected(request),
                    rtol=1e-4,
                    atol=1e-5,
                )
            stats = client.get_inference_statistics(model)["model_stats"][0]
            assert int(stats["inference_count"]) == 6
            assert int(stats["execution_count"]) < 6, stats  # gathered, not one by one
    finally:
        client.close()


def test_remote_binding_calls_a_python_backend_repository(
    triton_server: _Addresses, tmp_path: Path
) -> None:
    """`Model.remote()` reads the repository's configuration (soagen serve's wire form) and runs
    the model there: results equal local execution bit for bit, through shared memory or in the
    request, one event at a time or with events merged; bfloat16 travels as its bits."""
    import torch

    from examples.gnn_model import build_model
    from generated.gnn import EdgeClassifier, EdgeScores
    from soagen.serving.server import load_binding
    from tests.serving.test_serving import _event

    local = EdgeClassifier(build_model())
    for model, shared_memory in (
        ("gnn_eager", None),
        ("gnn_eager", False),
        ("gnn_torchscript", None),
        ("gnn_merged", None),
    ):
        with EdgeClassifier.remote(
            triton_server.grpc, model_name=model, shared_memory=shared_memory, timeout=30
        ) as remote:
            for n_nodes, n_edges, seed in ((50, 200, 1), (3, 1, 2), (1000, 5000, 3)):
                nodes, edges = _event(n_nodes, n_edges, seed)
                expected = EdgeScores.allocate(n_edges, zero=True)
                local(nodes, edges, out=expected)
                got = EdgeScores.allocate(n_edges, zero=True)
                remote(nodes, edges, out=got)
                assert torch.equal(got.score, expected.score), (model, n_nodes, n_edges)
            assert remote.uses_shared_memory == (shared_memory is None)
            assert remote.stats.writes == 3 and remote.stats.fallbacks == 0
            assert (remote.stats.bytes_shared > 0) == (shared_memory is None)
    # bfloat16: the repository declares UINT16, which the client sends and reads as bfloat16 bits.
    schema, _ = _half_schema(tmp_path)  # the schema half_sum was written for
    loaded = load_binding(schema, "Sum")
    collection = loaded.layouts["A"].allocate(7, zero=True)
    generator = torch.Generator().manual_seed(0)
    for column in (collection.x, collection.y):
        column.copy_(torch.randn(column.shape, generator=generator).to(torch.bfloat16))
    with loaded.binding.remote(triton_server.grpc, model_name="half_sum", timeout=30) as remote:
        remote(collection, out=collection)
    assert collection.out.dtype == torch.bfloat16
    assert torch.equal(collection.out, torch.stack([collection.x, collection.y], 1).sum(1))


def test_remote_binding_sends_a_block_of_scalars_once_per_event(
    triton_server: _Addresses, tmp_path: Path
) -> None:
    """The Python backend takes a scalar input as one value per event (1 on the element axis): the
    client sends that value, not n copies of it, and the results equal local execution."""
    import torch

    from soagen.serving.server import load_binding

    schema, factory = _scaled_schema(tmp_path)  # the schema `scaled` was written for
    loaded = load_binding(schema, "Scaled")
    hits_class, summary_class = loaded.layouts["Hits"], loaded.layouts["Summary"]
    namespace: dict[str, Any] = {}
    exec(SCALED_FACTORY, namespace)
    local = loaded.binding(namespace["build"]())
    with loaded.binding.remote(triton_server.grpc, model_name="scaled", timeout=30) as remote:
        for n, scale in ((5, 2.0), (1, -0.5), (1000, 3.25)):
            hits = hits_class.allocate(n, zero=True)
            generator = torch.Generator().manual_seed(n)
            hits.x.copy_(torch.randn(n, generator=generator))
            hits.y.copy_(torch.randn(n, generator=generator))
            hits.scale.fill_(scale)
            expected = hits_class.allocate(n, zero=True)
            expected.buffer.copy_(hits.buffer)
            expected_total = summary_class.allocate(1, zero=True)
            local(expected, out=(expected, expected_total))
            total = summary_class.allocate(1, zero=True)
            remote(hits, out=(hits, total))
            assert torch.equal(hits.result, expected.result), n
            assert torch.equal(total.total, expected_total.total), n
        assert remote.stats.calls == 3
        # x and y (8 bytes per element) and one 4-byte scale per event.
        assert remote.stats.bytes_copied == sum(8 * n + 4 for n in (5, 1, 1000))
        # No hits: the scale still travels (a scalar exists whatever n is), and the total is 0.
        empty, total = hits_class.allocate(0), summary_class.allocate(1)
        empty.scale.fill_(1.5)
        total.total.fill_(7.0)
        remote(empty, out=(empty, total))
        assert total.total.tolist() == [0.0]


def test_the_client_takes_a_served_block_of_scalars_once_per_event(tmp_path: Path) -> None:
    """Without a server: the client matches a Python-backend repository's one-value tensor and
    reads the scalar through a view of one element, also from a collection of none."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("numpy")
    from soagen.serving.client import _served, _wire_source
    from soagen.serving.errors import RemoteConfigurationError
    from soagen.serving.server import load_binding
    from soagen.serving.wire import wire_tensors

    schema, _ = _scaled_schema(tmp_path)
    loaded = load_binding(schema, "Scaled")
    points, scale = wire_tensors(loaded.binding.INPUTS)
    assert scale.scalars and not points.scalars and scale.dims == (-1,)
    served = {"scale": {"dims": ["1"], "data_type": "TYPE_FP32"}}
    one = _served("Scaled", "url", scale, served, batched=True)
    assert one.dims == (1,) and one.is_one_value and not scale.is_one_value
    wrong = {"points": {"dims": ["2", "1"], "data_type": "TYPE_FP32"}}  # columns: never once
    with pytest.raises(RemoteConfigurationError, match="declares 'points' as FP32"):
        _served("Scaled", "url", points, wrong, batched=True)
    for n in (0, 1, 6):
        hits = loaded.layouts["Hits"].allocate(n, zero=True)
        hits.scale.fill_(2.5)
        block = loaded.binding.INPUTS[1].block
        assert _wire_source(hits, block, scale).shape == (n,)  # soagen serve's: n values
        value = _wire_source(hits, block, one)
        assert value.shape == (1,) and value.tolist() == [2.5] and not value.flags.writeable
        if torch.cuda.is_available():
            on_gpu = _wire_source(hits.to("cuda"), block, one)
            assert on_gpu.shape == (1,) and on_gpu.tolist() == [2.5]


def test_examples_need_a_model_checked_here(
    tmp_path: Path, gnn_build: tuple[Path, str, str]
) -> None:
    status, _, stderr = run_cli(
        "triton", str(GNN), "--model", "EdgeClassifier", "--package", str(gnn_build[0]),
        *GNN_SIZES, "--examples", "examples/gnn_model.py:fill_examples", "-o", str(tmp_path / "r"),
    )  # fmt: skip
    assert status == 2 and "a .pt2 package is not checked again: give --factory" in stderr, stderr
