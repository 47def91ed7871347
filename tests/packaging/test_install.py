"""The set-up resolves where classes run: requirements.txt with .ci/constraints.txt, for Python
3.10 (Ubuntu 22.04, Gradescope's image) and 3.13, asked of the package index without installing.

PyPI's torch is a CUDA build: resolving it downloads it and its CUDA packages (about 1.5 GB for
each Python, two minutes here). So pip resolves everything but torch, and torch is checked apart:
its wheel for that Python exists on the index, and its own requirements hold for the pins.
Skipped where the index cannot be reached.
"""

import concurrent.futures
import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # python -m pytest -m slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# what each Python must get: the newest releases that support it, as .ci/constraints.txt pins them
EXPECTED = {"3.10": dict(transformers="5.20.2", numpy="2.2.6", matplotlib="3.10.9"),
            "3.13": dict(transformers="5.24.0", numpy="2.4.6", matplotlib="3.11.2")}
PINNED_TORCH = "2.13.0"
CONSTRAINTS = os.path.join(ROOT, ".ci", "constraints.txt")


def constraints_for(version: str, folder) -> str:
    """.ci/constraints.txt as pip on that Python reads it: pip evaluates a line's marker for the
    Python it runs on, not for --python-version, so the lines are chosen here."""
    from packaging.requirements import Requirement
    kept = [line for line in open(CONSTRAINTS).read().splitlines()
            if line.strip() and not line.startswith("#")
            and (Requirement(line).marker is None or Requirement(line).marker.evaluate(
                dict(python_version=version, python_full_version=version + ".0")))]
    path = os.path.join(folder, f"constraints-{version}.txt")
    with open(path, "w") as f:
        f.write("\n".join(str(Requirement(line)).split(";")[0] for line in kept) + "\n")
    return path


def resolve(version: str, folder) -> dict:
    """{package: version} pip would install for that Python, torch left out, or pip's error."""
    report, requirements = (os.path.join(folder, f"{n}-{version}") for n in ("report", "req"))
    with open(requirements, "w") as f:
        f.write("".join(line + "\n" for line in
                        open(os.path.join(ROOT, "requirements.txt")).read().splitlines()
                        if not line.startswith("torch")))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
         "--python-version", version, "--only-binary=:all:", "--target",
         os.path.join(folder, f"t{version}"), "--report", report,
         "-r", requirements, "-c", constraints_for(version, folder)],
        capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return dict(error=done.stderr[-2000:])
    with open(report) as f:
        return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
                for i in json.load(f)["install"]}


def torch_wheels(version: str) -> list:
    """The index's torch wheels of the pinned version for that Python on x86_64 Linux."""
    import urllib.request
    with urllib.request.urlopen("https://pypi.org/pypi/torch/json", timeout=60) as answer:
        files = json.load(answer)["releases"][PINNED_TORCH]
    tag = "cp" + version.replace(".", "")
    return [f["filename"] for f in files
            if f"-{tag}-{tag}-" in f["filename"] and "linux" in f["filename"]
            and "x86_64" in f["filename"]]


def test_constraints_pin_inside_the_ranges():
    """Every package requirements.txt names has one pin per Python in .ci/constraints.txt, and
    the pin lies in the range (checked by hand-written rules: floors and caps)."""
    ranges = dict(re.findall(r"^([\w-]+)(>=.*)$", open(os.path.join(ROOT, "requirements.txt")).read(), re.M))
    pins = re.findall(r'^([\w-]+)==([\d.]+)(?: ; python_version ([<>=]+) "3.11")?$',
                      open(CONSTRAINTS).read(), re.M)
    assert set(ranges) == {"torch", "transformers", "numpy", "matplotlib", "pytest"}

    def key(v):
        return tuple(int(x) for x in v.split("."))
    for name, spec in ranges.items():
        mine = [(v, marker) for n, v, marker in pins if n == name]
        assert mine and (len(mine) == 1 and mine[0][1] == "" or
                         sorted(m for _, m in mine) == ["<", ">="]), (name, mine)
        for version, _ in mine:
            for op, bound in re.findall(r"(>=|<)([\d.]+)", spec):
                assert (key(version) >= key(bound)) if op == ">=" else (key(version) < key(bound)), \
                    (name, version, spec)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="pip also holds the running Python to a "
                    "package's Requires-Python (transformers 5.24.0 asks >= 3.11): run from 3.11+")
def test_requirements_resolve_for_python_3_10_and_3_13(tmp_path, package_index):
    from importlib.metadata import requires, version as installed
    from packaging.requirements import Requirement
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        got = dict(zip(EXPECTED, pool.map(lambda v: resolve(v, str(tmp_path)), EXPECTED)))
    here = installed("torch").split("+")[0] == PINNED_TORCH  # its requirements are read here
    for version, expected in EXPECTED.items():
        assert "error" not in got[version], f"Python {version}: {got[version].get('error')}"
        assert {n: got[version].get(n) for n in expected} == expected, version
        assert "pytest" in got[version] and "torch" not in got[version]
        assert torch_wheels(version), f"no torch {PINNED_TORCH} wheel for Python {version}"
        pins = dict(line.split("==") for line in
                    open(constraints_for(version, str(tmp_path))).read().split())
        pins = {n.lower().replace("_", "-"): v for n, v in pins.items()}
        for need in map(Requirement, requires("torch") if here else []):
            name = need.name.lower().replace("_", "-")
            if need.marker is None and name in pins:  # torch's own, pinned by us
                assert need.specifier.contains(pins[name]), (version, str(need), pins[name])
