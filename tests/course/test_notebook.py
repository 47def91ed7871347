"""The students' notebook: course/notebook.ipynb is what `python -m course notebook` writes from
course/notebook.py, the converter gives the cells worked out by hand, and the script runs end to
end in quick mode (COURSE_NOTEBOOK_QUICK=1) in a folder of its own."""

import json
import os
import subprocess
import sys

import pytest

from course.ipynb import NOTEBOOK, SCRIPT, cells, notebook

pytestmark = pytest.mark.slow  # python -m pytest -m slow

ONE_CELL = """{
 "cells": [
  {
   "cell_type": "code",
   "execution_count": null,
   "metadata": {},
   "outputs": [],
   "source": [
    "x = 1"
   ]
  }
 ],
 "metadata": {
  "kernelspec": {
   "display_name": "Python 3",
   "language": "python",
   "name": "python3"
  },
  "language_info": {
   "name": "python"
  }
 },
 "nbformat": 4,
 "nbformat_minor": 4
}
"""


def test_the_committed_notebook_is_the_script_converted():
    with open(SCRIPT) as f:
        script = f.read()
    with open(NOTEBOOK) as f:
        assert f.read() == notebook(script), "run `python -m course notebook` and commit both"
    first_code = next(lines for kind, lines in cells(script) if kind == "code")
    assert first_code[0].startswith("REPO_URL = ")  # Colab users set it first


def test_converter_on_a_hand_written_script():
    assert notebook("# %%\nx = 1\n") == ONE_CELL  # the exact bytes: indent 1, sorted keys
    script = ("\n# %% [markdown]\n# # Title\n#\n# Some *text*.\n\n"
              "# %%\nx = 1\n\n\nprint(x)\n\n"
              "# %%\n\n")
    assert json.loads(notebook(script))["cells"] == [
        {"cell_type": "markdown", "metadata": {}, "source": ["# Title\n", "\n", "Some *text*."]},
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
         "source": ["x = 1\n", "\n", "\n", "print(x)"]},
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
         "source": []}]
    for bad, said in (("x = 1\n# %%\n", "start with a '# %%' line"),
                      ("# %% title\n", "expected '# %%' or '# %% [markdown]'"),
                      ("# %% [markdown]\ntext\n", "'# text' or '#'")):
        with pytest.raises(ValueError, match=said.replace("[", r"\[").replace("]", r"\]")):
            notebook(bad)


def test_the_script_runs_in_quick_mode(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, COURSE_NOTEBOOK_QUICK="1"), timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    handout = tmp_path / "handout-grpo"
    assert (handout / "tokencredit.py").is_file() and "def group_advantages(" in out
    assert "not written yet: group_advantages, overlong_penalty" in out  # graded: a blank handout
    assert "held-out accuracy before -> after 2 updates" in out
    curves = handout / "runs" / "notebook" / "notebook-curves.png"
    assert f"the curves: {curves}" in out and curves.read_bytes()[:4] == b"\x89PNG"
