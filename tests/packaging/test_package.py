"""pyproject.toml: `pip install .` and `pip install -e .` give `import tokencredit` from any folder,
put only tokencredit's own names in site-packages, ask for torch alone, and offer requirements.txt's
packages as the [demo] extra, each bridge's as its own.

Offline and quick (a few seconds each): a copy of the project is installed with --no-deps and
--no-build-isolation into a throwaway virtualenv, built by the setuptools this Python has.
The import runs in that virtualenv from another folder, with this Python's packages (torch) on
PYTHONPATH behind the virtualenv's own: where this Python has tokencredit installed editable (as
CI does), its editable finder's module has the same name as the virtualenv's.
"""

import email.parser
import glob
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # python -m pytest -m slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# what may land at the top of site-packages: the module, the demo's task (the TRL bridge's tiny
# example trains its model), and the bridges' packages
ALLOWED = {"tokencredit.py", "tiny_task.py", "tokencredit_trl", "tokencredit_verl"}
# what runs from a clone only
CLONE_ONLY = ("train_tiny", "lab", "course", "bench", "tests")
EXTRAS = {"demo": "requirements.txt", "trl": "tokencredit_trl/requirements.txt",
          "verl": "tokencredit_verl/requirements.txt"}


def site_of(module) -> str:  # the site-packages folder a module is installed in
    return os.path.dirname(os.path.dirname(module.__file__))


def install(tmp_path, editable: bool):
    """A copy of the project (what a clone holds) installed into a new virtualenv.
    Returns (the copy, the virtualenv's python, its site-packages)."""
    from importlib.metadata import version
    setuptools = version("setuptools")
    if int(setuptools.split(".")[0]) < 77:
        pytest.skip(f"pyproject.toml needs setuptools >= 77 to build; this Python has {setuptools}"
                    " (pip install 'setuptools>=77')")
    import setuptools as st
    project = tmp_path / "project"
    shutil.copytree(ROOT, project, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "runs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
        ".course-cache", "handout-*"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
         "--no-build-isolation", "--no-index"] + (["-e"] if editable else []) + [str(project)],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=site_of(st)))  # the build runs in the virtualenv
    assert done.returncode == 0, done.stderr[-3000:]
    site = glob.glob(str(venv / "lib" / "python*" / "site-packages"))[0]
    return project, python, site


def import_elsewhere(tmp_path, python: str, site: str, code: str) -> str:
    """Runs code in the virtualenv from an empty folder; returns what it printed."""
    import torch
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    done = subprocess.run([python, "-c", code], cwd=elsewhere, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=os.pathsep.join([site, site_of(torch)])))
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


PROBE = ("import importlib.util, tokencredit\n"
         "print(tokencredit.__file__)\n"
         f"print(*[m for m in {CLONE_ONLY!r} if importlib.util.find_spec(m)])\n")


def requirement_lines(path: str) -> set:
    from packaging.requirements import Requirement
    with open(path) as f:
        lines = [line.split("#")[0].strip() for line in f]
    return {str(Requirement(line)) for line in lines if line}


def test_pip_install_puts_only_tokencredits_names_in_site_packages(tmp_path):
    from packaging.requirements import Requirement
    _, python, site = install(tmp_path, editable=False)
    installed = {name for name in os.listdir(site)
                 if name != "__pycache__" and not name.endswith(".dist-info")}
    assert installed == ALLOWED, installed
    assert sorted(os.listdir(os.path.join(site, "tokencredit_trl", "examples"))) == [
        "cscr.yaml", "dapo.yaml"]  # package data
    file, clone_only = import_elsewhere(tmp_path, python, site, PROBE).splitlines()
    assert file == os.path.join(site, "tokencredit.py") and clone_only == ""
    # the dependency is torch, in requirements.txt's range; each extra's, its requirements file's
    info, = glob.glob(os.path.join(site, "tokencredit-*.dist-info"))
    with open(os.path.join(info, "METADATA")) as f:
        metadata = email.parser.Parser().parse(f)
    assert metadata["Name"] == "tokencredit" and metadata["License-Expression"] == "MIT"
    assert metadata["Requires-Python"] == ">=3.10"
    assert os.path.exists(os.path.join(info, "licenses", "LICENSE"))
    needs = [Requirement(r) for r in metadata.get_all("Requires-Dist", [])]
    torch, = [line for line in requirement_lines(os.path.join(ROOT, "requirements.txt"))
              if Requirement(line).name == "torch"]
    assert [str(r) for r in needs if r.marker is None] == [torch]
    assert set(metadata.get_all("Provides-Extra")) == set(EXTRAS)
    for extra, path in EXTRAS.items():
        mine = {str(Requirement(f"{r.name}{r.specifier}")) for r in needs
                if r.marker is not None and r.marker.evaluate(dict(extra=extra))}
        expected = (requirement_lines(os.path.join(ROOT, path))
                    if os.path.exists(os.path.join(ROOT, path)) else set())
        assert mine == expected, extra


def test_pip_install_editable_imports_the_clones_file_and_nothing_else(tmp_path):
    project, python, site = install(tmp_path, editable=True)
    file, clone_only = import_elsewhere(tmp_path, python, site, PROBE).splitlines()
    assert file == str(project / "tokencredit.py") and clone_only == ""
