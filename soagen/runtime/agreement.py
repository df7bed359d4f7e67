"""Whether an optimized form of a model (a `torch.compile` graph, an AOTInductor package, a
TorchScript or ONNX conversion) agrees with the eager model on the same inputs.

One tolerance per dtype serves every check, at run time (`soagen.runtime.backends`) and at build
time (`soagen.build.model`). NaN and infinities compare equal to themselves in the same places: a
reference that is itself NaN proves nothing there, which `nonfinite_outputs` lets callers say.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass

if typing.TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class Disagreement:
    """The first output that differs, and how: `detail` is a sentence fragment for messages."""

    output: str
    detail: str


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol): half precision 1e-2 both, other floats 1e-3 and 1e-4, integers and bools exact."""
    import torch

    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2, 1e-2
    if dtype.is_floating_point:
        return 1e-3, 1e-4
    return 0.0, 0.0


def first_disagreement(
    names: Sequence[str], actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]
) -> Disagreement | None:
    """The first output (in `names`' order) whose shape, dtype or values differ beyond `tolerance`
    of the expected dtype; None when all agree."""
    import torch

    for name, got, want in zip(names, actual, expected, strict=True):
        if got.shape != want.shape:
            return Disagreement(name, f"shape {list(got.shape)}, expected {list(want.shape)}")
        if got.dtype != want.dtype:
            return Disagreement(name, f"dtype {got.dtype}, expected {want.dtype}")
        if not got.numel():
            continue
        rtol, atol = tolerance(want.dtype)
        got_values, want_values = got.detach().cpu(), want.detach().cpu()
        if want.is_floating_point() or want.is_complex():
            close = torch.isclose(got_values, want_values, rtol=rtol, atol=atol, equal_nan=True)
        else:
            close = got_values == want_values
        if bool(close.all()):
            continue
        wrong = int((~close).sum())
        position = tuple(int(i) for i in torch.nonzero(~close)[0])
        difference = (got_values.double() - want_values.double()).abs()
        largest = float(difference.nan_to_num(nan=float("inf")).max())
        at = f"[{', '.join(map(str, position))}]"
        return Disagreement(
            name,
            f"{wrong} of {want.numel()} values differ beyond rtol={rtol:g}, atol={atol:g}; "
            f"largest difference {largest:.3g}; first at {at}: {got_values[position].item()!r} "
            f"against {want_values[position].item()!r}",
        )
    return None


def nonfinite_outputs(
    names: Sequence[str], tensors: Sequence[torch.Tensor]
) -> list[tuple[str, int, int]]:
    """(output, values that are NaN or infinite, values) of each floating output that has any."""
    import torch

    found = []
    for name, tensor in zip(names, tensors, strict=True):
        if tensor.is_floating_point() and tensor.numel():
            count = int((~torch.isfinite(tensor)).sum())
            if count:
                found.append((name, count, tensor.numel()))
    return found


__all__ = ["Disagreement", "first_disagreement", "nonfinite_outputs", "tolerance"]
