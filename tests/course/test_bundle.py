"""The Gradescope bundle (course/bundle.py): what it carries (no plant, the grader's modules, the
hidden set the repository grades with) and that its setup resolves on Gradescope's Pythons.
"""

import json
import subprocess

import pytest

from course import grading
from submissions import PY

pytestmark = pytest.mark.slow  # python -m pytest -m slow


def test_the_bundle_carries_no_plants_and_installs_only_what_grading_imports(bundle):
    tmp, root, files = bundle
    assert "course/selfcheck.py" not in files and "course/handout.py" not in files
    assert grading.HIDDEN in files  # it grades as the repository
    text = (root / "source" / "course" / "exercises.py").read_text()
    assert "MISTAKES = ()" in text and "sign flip" not in text
    assert "QUESTIONS = ()" not in (root / "source" / "course" / "written.py").read_text()
    setup = (root / "source" / "setup.sh").read_text()
    assert "download.pytorch.org/whl/cpu" in setup and "transformers" not in setup
    assert "apt-get install -y bubblewrap" in setup
    assert (root / "source" / "requirements.txt").read_text().split() == ["numpy>=1.24,<3",
                                                                          "pytest>=8,<10"]


def test_setup_resolves_on_python_3_10_to_3_12(tmp_path, package_index):
    """setup.sh's packages resolve for Python 3.10 (Gradescope's Ubuntu 22.04), 3.11 and 3.12:
    numpy and pytest from PyPI, and a torch in setup.sh's range with a wheel for each. Where the
    CPU index (download.pytorch.org) cannot be reached, as here, PyPI's list of torch wheels
    stands in for it (the same releases; PyPI's are CUDA builds, several GB, so not fetched)."""
    import concurrent.futures
    import urllib.request
    from packaging.specifiers import SpecifierSet
    from course.bundle import REQUIREMENTS, TORCH
    def resolve(version):
        return subprocess.run([PY, "-m", "pip", "install", "--dry-run", "--quiet",
                               "--ignore-installed", "--python-version", version,
                               "--only-binary=:all:", "--target", str(tmp_path / version),
                               "--report", str(tmp_path / f"{version}.json"),
                               *REQUIREMENTS.split()], capture_output=True, text=True,
                              timeout=600)
    versions = ("3.10", "3.11", "3.12")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        done = dict(zip(versions, pool.map(resolve, versions)))
    with urllib.request.urlopen("https://pypi.org/pypi/torch/json", timeout=60) as answer:
        releases = json.load(answer)["releases"]
    wanted = SpecifierSet(TORCH[len("torch"):])
    for version in versions:
        assert done[version].returncode == 0, (version, done[version].stderr[-2000:])
        with open(tmp_path / f"{version}.json") as f:
            names = {i["metadata"]["name"].lower() for i in json.load(f)["install"]}
        assert {"numpy", "pytest"} <= names, (version, names)
        tag = "cp" + version.replace(".", "")
        assert any(release in wanted and any(f"-{tag}-{tag}-" in w["filename"] and "linux" in
                                             w["filename"] for w in wheels)
                   for release, wheels in releases.items()), (version, TORCH)
