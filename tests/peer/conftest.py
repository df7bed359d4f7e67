"""weaver-core's wheel, shared by the tests of its taggers (ParT, ParticleNet).

weaver-core is the public framework CMS jet taggers are trained with. Its package pins NumPy 2 and a
dozen heavy libraries, so the session fetches its wheel alone (`pip download --no-deps`, cached in
pytest's cache folder) and the tests import its model files, which need only torch.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

WEAVER = "weaver-core==0.5.3"


@pytest.fixture(scope="session")
def weaver_root(request: pytest.FixtureRequest) -> Path:
    """weaver-core's wheel, unpacked: its model files need only torch."""
    cache = Path(request.config.cache.mkdir("weaver-core"))
    root = cache / "unpacked"
    if not (root / "weaver" / "nn" / "model" / "ParticleTransformer.py").is_file():
        download = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), WEAVER],
            capture_output=True,
            text=True,
            timeout=300,
        )
        wheels = sorted(cache.glob("weaver_core-*.whl"))
        if download.returncode or not wheels:
            pytest.skip(f"{WEAVER} could not be fetched from PyPI: {download.stderr[-300:]}")
        with zipfile.ZipFile(wheels[-1]) as wheel:
            wheel.extractall(root)
    return root
