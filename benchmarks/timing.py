"""Timing helpers the benchmark scripts share: repeated wall-clock samples and a Markdown row."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def samples(function: Callable[[], object], repeats: int) -> list[float]:
    """Seconds taken by each of `repeats` calls."""
    taken = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        taken.append(time.perf_counter() - start)
    return taken


def markdown_row(name: str, taken: list[float]) -> str:
    """`| name | median ms | min - max ms |`."""
    median = statistics.median(taken) * 1e3
    return f"| {name} | {median:.1f} | {min(taken) * 1e3:.1f} - {max(taken) * 1e3:.1f} |"
