"""The runtime under NumPy 2 too. The test environment holds NumPy 1.26, because PyTriton pins
numpy < 2, while `pip install soagen[torch]` alone (the README's main command) gets NumPy 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

pytest.importorskip("torch")
numpy = pytest.importorskip("numpy")

# Every test file of the runtime that needs no server: buffers (NumPy and DLPack sources
# included), collections, layouts, model calls, and the adversarial inputs.
RUNTIME_TESTS = (
    "tests/runtime/test_runtime_buffers.py",
    "tests/runtime/test_runtime_collection.py",
    "tests/runtime/test_runtime_layout.py",
    "tests/runtime/test_model.py",
    "tests/runtime/test_adversarial_runtime.py",
)


@pytest.mark.skipif(numpy.__version__.startswith("2."), reason="this environment has NumPy 2")
def test_runtime_tests_pass_under_numpy_2(tmp_path: Path) -> None:
    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:"]
        + ["--target", str(site), "numpy>=2,<3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if installed.returncode != 0:
        why = f"NumPy 2 could not be installed (no package index?): {installed.stderr[-500:]}"
        if os.environ.get("CI"):  # CI has an index: there this is a failure, not a skip
            pytest.fail(why)
        pytest.skip(why)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    version = subprocess.run(
        [sys.executable, "-c", "import numpy; print(numpy.__version__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.startswith("2."), version.stdout
    report = tmp_path / "inner.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + [f"--junitxml={report}", *RUNTIME_TESTS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    skipped, passed = _outcomes(report)
    # Only tests of a device this machine lacks may skip; a skip for any other reason (NumPy's
    # version above all) means the inner run did not test what it is here for.
    unexpected = {test: why for test, why in skipped.items() if why not in DEVICE_SKIPS}
    assert not unexpected, f"the run under NumPy 2 skipped: {unexpected}"
    assert "test_read_only_wrap_gives_read_only_numpy_views_and_no_torch_views[dlpack]" in passed


# The only reasons the runtime tests skip for, here and on any machine without these devices.
DEVICE_SKIPS = frozenset({"no CUDA device", "no MPS device"})


def _outcomes(report: Path) -> tuple[dict[str, str], set[str]]:
    """From a JUnit XML report: skipped tests with their reasons, and the names of those passed."""
    import xml.etree.ElementTree as ElementTree

    skipped: dict[str, str] = {}
    passed: set[str] = set()
    for case in ElementTree.parse(report).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        skip = case.find("skipped")
        if skip is not None:
            skipped[name] = str(skip.get("message", ""))
        elif case.find("failure") is None and case.find("error") is None:
            passed.add(str(case.get("name")))
    return skipped, passed
