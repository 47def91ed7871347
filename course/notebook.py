# %% [markdown]
# # tokencredit's course, the grpo set: a notebook
#
# This notebook writes your handout (the project with exercises 1, 3 and 5 blank), shows
# exercise 1, grades it, and trains the tiny model with GRPO. It runs on Colab and in a local
# Jupyter. Its source is `course/notebook.py`, which also runs as a plain script
# (`python course/notebook.py`); `python -m course notebook` writes this notebook from it.
#
# Run the cells in order. The first one finds the repository; on Colab it clones it and
# installs what the project needs (`requirements.txt`), which takes a few minutes.

# %%
REPO_URL = "https://github.com/REPLACE-ME/tokencredit.git"  # PLACEHOLDER: the repository's address

import ast
import os
import shlex
import subprocess
import sys

QUICK = os.environ.get("COURSE_NOTEBOOK_QUICK") == "1"  # CI: the demo as small as it goes


def checkout(start):
    """The repository at or above the folder start (it holds course/notebook.py), or None."""
    path = os.path.abspath(start)
    while not os.path.isfile(os.path.join(path, "course", "notebook.py")):
        if os.path.dirname(path) == path:
            return None
        path = os.path.dirname(path)
    return path


def run(*command, cwd):
    """Run a command and print its output as it comes (a notebook shows only what Python prints:
    a child's own output would go to the terminal that started Jupyter)."""
    print("$", shlex.join("python" if part == sys.executable else part for part in command))
    with subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=dict(os.environ, PYTHONUNBUFFERED="1")) as child:
        for line in child.stdout:
            print(line, end="")
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, command)


REPO = checkout(os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else ".")
if REPO is None:  # Colab, or a folder outside the repository: clone it and install
    if "REPLACE-ME" in REPO_URL:
        raise RuntimeError("set REPO_URL at the top of this cell to the repository's address")
    REPO = os.path.abspath("tokencredit")
    if not os.path.isdir(REPO):
        run("git", "clone", "--depth", "1", REPO_URL, REPO, cwd=".")
    run(sys.executable, "-m", "pip", "install", "-q", "-r", "requirements.txt", cwd=REPO)
WORK = REPO if checkout(".") == REPO else os.path.abspath(".")  # the handout goes here
HANDOUT = os.path.join(WORK, "handout-grpo")
print(f"the repository: {REPO}\nyour handout:   {HANDOUT}")

# %% [markdown]
# ## 1. Your handout
#
# `python -m course handout DIR --set grpo` writes your copy of the project: `tokencredit.py`
# with exercises 1, 3 and 5 blank, the tests, the grader, the tiny demo and the exercise sheet
# (`docs/course.md`, without its answers). This cell writes it once; run again, it keeps your work.

# %%
if os.path.isfile(os.path.join(HANDOUT, "tokencredit.py")):
    print(f"{HANDOUT} is there already: kept as it is")
else:
    run(sys.executable, "-m", "course", "handout", HANDOUT, "--set", "grpo", cwd=REPO)

# %% [markdown]
# ## 2. Exercise 1: `group_advantages`
#
# Its signature and docstring, as your handout's `tokencredit.py` has them. The sheet's
# exercise 1 (`docs/course.md` in the handout) gives the equations and a pencil question: answer
# it in the handout's `written.txt` first (the form you hand in with your code).

# %%
def signature_and_docstring(path, name):
    """The lines of the function name in the file at path, from `def` to its docstring's end."""
    with open(path) as f:
        source = f.read()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return "\n".join(source.splitlines()[node.lineno - 1:node.body[0].end_lineno])
    raise ValueError(f"expected a function {name} in {path}, found none")


print(signature_and_docstring(os.path.join(HANDOUT, "tokencredit.py"), "group_advantages"))

# %% [markdown]
# Write its body, and `overlong_penalty`'s (exercise 1 is both), in `handout-grpo/tokencredit.py`
# (Colab: the folder icon on the left, then double-click the file; Jupyter: File > Open). Keep
# the signature, the docstring and the input checks; save, and grade. At first every test fails:
# that is the grader working.

# %%
run(sys.executable, "-m", "course", "grade", "-e", "1", cwd=HANDOUT)

# %% [markdown]
# ## 3. The tiny demo
#
# `train_tiny.py --quick` warms up a small model on adding numbers, then trains it with GRPO and
# prints the held-out accuracy before and after. It runs the repository's `tokencredit.py` until
# you set `USE_MINE = True`: do that once exercises 1, 3 and 5 pass (`python -m course grade`),
# and your equations train the model (the sheet's "The learning check" says what to expect).

# %%
USE_MINE = False
demo = ["--quick", "--name", "notebook",
        "--impl", "tokencredit.py" if USE_MINE else os.path.join(REPO, "tokencredit.py")]
if QUICK:  # a 1-layer model, 4 warm-up steps, 2 updates of 2 groups of 2
    demo += ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--warmup-steps", "4",
             "--warmup-batch", "8", "--steps", "2", "--prompts-per-step", "2", "--group-size", "2",
             "--max-new-tokens", "16", "--eval-size", "4", "--eval-samples", "1"]
run(sys.executable, "train_tiny.py", *demo, cwd=HANDOUT)

# %% [markdown]
# Its tables and curves, which the lab's `report` reads from the run's files: held-out accuracy,
# answer lengths, truncated rollouts, entropy, informative groups.

# %%
RUN = os.path.join("runs", "notebook")
CURVES = os.path.join(HANDOUT, RUN, "notebook-curves.png")  # --curves DIR draws DIR/NAME-curves.png
run(sys.executable, "-m", "lab", "report", RUN, "--curves", RUN, cwd=HANDOUT)
if "get_ipython" in globals():  # Jupyter or Colab: IPython puts it in a notebook's namespace
    from IPython.display import Image, display
    display(Image(filename=CURVES))
else:
    print(f"the curves: {CURVES}")

# %% [markdown]
# ## Next
#
# Exercises 3 (the surrogate and the clip) and 5 (aggregation) are on the sheet. Grade all three
# with `python -m course grade` in the handout (the grade cell, without `"-e", "1"`), then set
# `USE_MINE = True` and run the demo again.
