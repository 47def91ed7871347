"""The Gradescope bundle (docs/course.md, "Gradescope", says what it carries and why): `gradescope`
writes it; in it, run_autograder runs `autograde`, which grades the submission."""

import json
import os
import zipfile

from .exercises import SETS
from .grading import (BUNDLE_FILE, CACHE, HERE, NO_SANDBOX, ROOT, Grader, course_secret,
                      grade_submission, map_key, read, test_files, test_map, zero_rows)

MODULES = ("__init__.py", "__main__.py", "source.py", "protocol.py", "child.py", "judge.py",
           "grading.py", "report.py", "flags.py", "bundle.py", "written.py", "submission.py")
REQUIREMENTS = "numpy>=1.24,<3\npytest>=8,<10\n"  # requirements.txt's ranges; torch: setup.sh
TORCH = "torch>=2.4,<3"
SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, in /autograder/source, when it builds the autograder's image.
set -euo pipefail
cd "$(dirname "$0")"
apt-get update && apt-get install -y bubblewrap  # the sandbox each submission runs in
if ! command -v python3 > /dev/null || ! python3 -m pip --version > /dev/null 2>&1; then
    apt-get install -y python3 python3-pip
fi
export PIP_BREAK_SYSTEM_PACKAGES=1  # newer images: pip may install beside the system's python
python3 -m pip install --index-url https://download.pytorch.org/whl/cpu "{torch}"
python3 -m pip install -r requirements.txt
"""
RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission: the grade goes to /autograder/results/results.json.
# AUTOGRADER_ROOT and PYTHON override /autograder and python3 (to run it on your own machine).
root="$(cd "${AUTOGRADER_ROOT:-/autograder}" && pwd)"  # absolute: it is used after the cd
cd "$root/source"
exec "${PYTHON:-python3}" -m course autograde --root "$root"
"""


def strip_selfcheck(source: str, names=("MISTAKES", "CORRECT", "ENDLESS")) -> str:
    """exercises.py without MISTAKES, CORRECT and ENDLESS: they quote the reference. (Or another
    module without the tables `names`: written.py's QUESTIONS holds the answers.)"""
    import ast
    tree, lines = ast.parse(source), source.splitlines(keepends=True)
    for node in reversed(tree.body):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id in names:
            name = node.targets[0].id
            empty = "()" if name != "ENDLESS" else "(0, '', ())"
            lines[node.lineno - 1:node.end_lineno] = [
                f"{name} = {empty}  # left out of this copy: it quotes solutions or answers\n"]
    return "".join(lines)


def cmd_gradescope(out: str, set_name: str, seed, limits: dict, no_sandbox_ok=False) -> None:
    reference, tests = read(os.path.join(ROOT, "tokencredit.py")), test_files()
    test_map(reference, tests)  # into the cache, whose file (the map and its hash) the bundle holds
    cached = f"map-{map_key(reference, tests)[:16]}.json"
    secret = None if seed is not None else course_secret()  # each file its own seed
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name in MODULES:
            z.write(os.path.join(HERE, name), f"course/{name}")
        z.writestr("course/exercises.py", strip_selfcheck(read(os.path.join(HERE, "exercises.py"))))
        z.write(os.path.join(ROOT, "tokencredit.py"), "tokencredit.py")
        for path in tests.values():  # test_tokencredit.py and the official hidden set
            z.write(path, os.path.relpath(path, ROOT))
        z.write(os.path.join(CACHE, cached), f".course-cache/{cached}")
        z.writestr(BUNDLE_FILE, json.dumps(dict(set=set_name, seed=seed, secret=secret,
                                                limits=limits, no_sandbox_ok=no_sandbox_ok)))
        z.writestr("requirements.txt", REQUIREMENTS)
        for name, text in (("setup.sh", SETUP_SH.format(torch=TORCH)),
                           ("run_autograder", RUN_AUTOGRADER)):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16
            z.writestr(info, text)
    print(f"wrote {out}: a Gradescope autograder for set {set_name} (exercises "
          f"{', '.join(map(str, SETS[set_name]))}), fresh inputs from "
          + (f"seed {seed}" if seed is not None else "each file's seed (COURSE_SECRET's)")
          + "; students submit their tokencredit.py and written.txt")


def cmd_autograde(root: str) -> None:
    """What run_autograder runs: grade ROOT/submission, write ROOT/results/results.json after
    every process of the submission is gone."""
    from . import report, written
    from .submission import read_student
    config = json.loads(read(os.path.join(ROOT, BUNDLE_FILE)))
    exercises = list(SETS[config["set"]])
    results = os.path.join(root, "results", "results.json")
    os.makedirs(os.path.dirname(results), exist_ok=True)
    reference = read(os.path.join(ROOT, "tokencredit.py"))
    student = read_student(None, os.path.abspath(os.path.join(root, "submission")))  # once, here
    answers = written.grade(student["form"], exercises)
    grader = Grader(reference, test_map(reference), exercises, config.get("seed"),
                    config.get("limits"), secret=config.get("secret"))
    flags = []
    try:
        grader.start(jobs=len(exercises))  # no code runs unless its judges and sandboxes do
        if grader.sandbox() is None and not config.get("no_sandbox_ok"):  # it could write its own
            raise ValueError(f"NO SANDBOX: {NO_SANDBOX}; this bundle grades no code without one "
                             "(one made with --no-sandbox-ok would)")
        if "why" in student:
            raise ValueError(student["why"])
    except (ValueError, OSError) as error:
        rows, said = zero_rows(exercises, str(error)), f"No grade: {error}."
    else:
        (rows, flags), said = grade_submission(grader, student), grader.sandbox_line()
    finally:
        grader.close()  # its sandboxes, and all in them, go with the judges
    out = report.gradescope(rows, flags, answers)
    print(said)
    print(report.format_rows(rows, True))  # run_autograder's stdout: for the instructor
    print("\n".join(written.lines(*answers, instructor=True)))
    if out is None:  # Gradescope then shows the autograder failed: regrade the submission
        raise SystemExit("course: a grader error: no results.json")
    if said.startswith(("NO SANDBOX", "No grade")):  # where the student reads it
        out["output"] = "\n".join(filter(None, [said, out.get("output")]))
    with open(results, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {results}: {out['score']} points")
