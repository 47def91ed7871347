"""One file, one score on every route: grade PATH, grade-all and the Gradescope bundle grade the
same bytes the same way, whatever the file's name, its encoding (as Python reads it), or a map
handed in beside it. (One score on every regrade and every seed: test_score.py.)
"""

import json
import subprocess

import pytest

from course import source
from course.exercises import EXERCISES, MISTAKES
from submissions import (BASE, CORRECT, PY, REFERENCE, ROOT, SEED, UNBOXED, code_tests,
                         grade_path, needs_bwrap, run, run_bundle)

pytestmark = pytest.mark.slow  # python -m pytest -m slow


def test_grade_path_grade_all_and_the_bundle_give_one_score(bundle, tmp_path):
    """The same files, the same points and test counts per exercise, three ways."""
    _, root, _ = bundle
    files = {"blank35": source.blank(REFERENCE, [3, 5]),
             "clip": source.apply_edits(REFERENCE, MISTAKES[4][2]),
             "kl-reversed": source.apply_edits(REFERENCE, MISTAKES[7][2])}
    (tmp_path / "class").mkdir()
    for name, text in files.items():
        (tmp_path / "class" / f"{name}.py").write_text(text)
    done = subprocess.run([PY, "-m", "course", "grade-all", str(tmp_path / "class"), "--set",
                           "grpo", "--seed", str(SEED), "--csv", str(tmp_path / "g.csv"),
                           "--gradescope-dir", str(tmp_path / "gs"), *UNBOXED], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    for name, text in files.items():
        ways = [grade_path(tmp_path / "class" / f"{name}.py", tmp_path / "one.json",
                           "--set", "grpo"),
                json.loads((tmp_path / "gs" / name / "results.json").read_text()),
                run_bundle(root, text)]
        said = [[(t.get("score"), t["output"].splitlines()[0]) for t in way["tests"]]
                for way in ways]
        assert said[0] == said[1] == said[2], (name, said)


@needs_bwrap
def test_a_file_gets_one_score_whatever_its_name(attacked):
    """The module sees its label as __file__: its own name in grade-all (and grade PATH), but
    tokencredit.py in a folder and in the bundle; the same bytes got 0 and 30."""
    rows = attacked["rows"]
    assert rows["d-route-file"]["total"] == rows["d-route-dir"]["total"], (
        rows["d-route-file"]["notes"])


ENCODED = {  # a correct file as an editor may save it; Python imports each as it is
    "bom": b"\xef\xbb\xbf" + CORRECT.encode(),  # UTF-8 with a BOM (Windows Notepad)
    "latin-1": ("# -*- coding: latin-1 -*-\n# \u00e9tudiante: Ren\u00e9e\n"
                + CORRECT).encode("latin-1"),  # a coding cookie (PEP 263)
}


@needs_bwrap
@pytest.mark.parametrize("how", sorted(ENCODED))
def test_a_file_python_reads_is_read_as_python_reads_it(tmp_path, how):
    """read_submission decodes UTF-8 strictly: a BOM stays and compile() refuses U+FEFF; a
    PEP 263 cookie is ignored and the bytes are refused. Python and pytest run both files."""
    (tmp_path / "tokencredit.py").write_bytes(ENCODED[how])
    python = subprocess.run([PY, "-c", "import tokencredit"], cwd=tmp_path, capture_output=True)
    assert python.returncode == 0, python.stderr
    done = run("grade", tmp_path / "tokencredit.py", "--set", "grpo", "-e", "1", "--seed", SEED,
               timeout=120)
    assert done.returncode == 0 and b"total 10.0/10" in done.stdout, done.stdout[-1500:]


def test_a_submitted_course_map_does_not_choose_the_set(tmp_path):
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "tokencredit.py").write_text(BASE)
    (folder / "course_map.json").write_text(json.dumps(dict(set="dapo", exercises=[2])))
    got = grade_path(folder, tmp_path / "out.json")
    assert [t["name"][:10] for t in code_tests(got)] == [f"exercise {k}" for k in EXERCISES]
    assert "course_map.json" in got["output"]  # and it is flagged


@needs_bwrap
def test_a_form_saved_as_utf_16_gets_its_points_on_every_route(bundle, tmp_path):
    """Notepad's "Unicode" (UTF-16 with its BOM, CRLF lines): a correct form got 20 from grade
    PATH and 0 from grade-all. One reading, course/submission.py's, on every route: 20 each."""
    from test_written import filled
    _, root, _ = bundle
    form = filled([1, 3, 5]).replace("\n", "\r\n").encode("utf-16")
    (tmp_path / "class" / "aaa").mkdir(parents=True)
    (tmp_path / "class" / "aaa" / "tokencredit.py").write_text(BASE)
    (tmp_path / "class" / "aaa" / "written.txt").write_bytes(form)
    done = run("grade-all", tmp_path / "class", "--set", "grpo", "--seed", SEED, "--csv",
               tmp_path / "g.csv", "--gradescope-dir", tmp_path / "gs", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    ways = [json.loads((tmp_path / "gs" / "aaa" / "results.json").read_text()),
            grade_path(tmp_path / "class" / "aaa", tmp_path / "one.json", "--set", "grpo"),
            run_bundle(root, BASE, form)]
    assert [way["score"] for way in ways] == [20, 20, 20], ways
