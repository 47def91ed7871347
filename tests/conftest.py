import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the project root

import subprocess  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def package_index(tmp_path):
    """Skips the test unless pip can reach the package index from here (one small download)."""
    probe = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                            "--dest", str(tmp_path / "probe"), "six==1.16.0"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip("the package index cannot be reached from here: " + probe.stderr[-200:])
