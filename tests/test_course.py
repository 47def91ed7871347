"""Tests for course.py's source surgery; `python course.py selfcheck` (CI) checks the grading."""

import ast
import re

import pytest

import course

REFERENCE = course.read(course.os.path.join(course.HERE, "tokencredit.py"))


def test_a_blank_keeps_signature_docstring_and_leading_checks_only():
    blank = course.blank(REFERENCE, course.EXERCISES)
    defs, ref = course.functions(blank), course.functions(REFERENCE)
    for k, (_, names, _) in course.EXERCISES.items():
        for name in names:
            body, ref_body = defs[name].body, ref[name].body
            assert ast.dump(defs[name].args) == ast.dump(ref[name].args)
            assert ast.get_docstring(defs[name]) == ast.get_docstring(ref[name])
            leading = 0  # the reference's input checks after the docstring, read as text
            while checks_only(ref_body[1 + leading]):
                leading += 1
            assert leading > 0 and [ast.unparse(s) for s in body[1:-1]] == [
                ast.unparse(s) for s in ref_body[1:1 + leading]]
            assert ast.unparse(body[-1]) == f"raise NotImplementedError('exercise {k}: {name}')"
    given = set(ref) - {n for _, names, _ in course.EXERCISES.values() for n in names}
    assert all(ast.dump(defs[n]) == ast.dump(ref[n]) for n in given)  # the rest is untouched
    exec(compile(blank, "blank.py", "exec"), {})  # and the file still imports


def checks_only(statement) -> bool:  # `_check_x(...)`, or an `if` with nothing else inside
    if isinstance(statement, ast.If):
        return not statement.orelse and all(checks_only(s) for s in statement.body)
    return bool(re.match(r"(\w+(, \w+)* = )?_check_\w+\(", ast.unparse(statement)))


def test_a_blank_keeps_the_checks_a_mode_asks_for():
    """loss_denominators checks group_size only for "group_token" and max_len only for
    "constant": the student keeps both checks, so no test asks for a message's wording."""
    body = course.functions(course.blank(REFERENCE, [5]))["loss_denominators"].body
    kept = [ast.unparse(s) for s in body[1:-1]]
    assert [line.split("\n")[0] for line in kept] == [
        "mask = _check_mask(mask)", "_check_choice(mode, 'mode', AGGREGATION_MODES)",
        "_check_dtype(dtype)", "if mode == 'group_token':", "if mode == 'constant':"]


def test_substitute_takes_only_the_named_functions_and_the_students_helpers():
    names = course.EXERCISES[5][1]
    blank = course.blank(REFERENCE, [5])
    assert course.substitute(REFERENCE, blank, names) == blank  # the student's exercise 5, no more
    assert course.substitute(blank, REFERENCE, names) == REFERENCE  # and back
    student = (blank.replace('raise NotImplementedError("exercise 5: aggregate")',
                             "return my_helper(per_token)")
               + "\nimport math\n\ndef my_helper(x):\n    return x.sum() * math.pi\n")
    merged = course.substitute(REFERENCE, student, ["aggregate"])
    namespace = {}
    exec(compile(merged, "merged.py", "exec"), namespace)
    ones = namespace["torch"].ones(2, 3)
    assert float(namespace["aggregate"](ones, ones.bool(), "token")) == pytest.approx(6 * 3.14159265)
    assert float(namespace["token_weights"](ones.bool(), "token").sum()) == 1  # still the reference
    with pytest.raises(ValueError, match="defines no policy_loss"):
        course.substitute(REFERENCE, "def aggregate():\n    pass\n", ["aggregate", "policy_loss"])


def test_blocker_reads_the_exercise_number_from_the_failure():
    assert course.blocker("NotImplementedError: exercise 3: clipped_surrogate\n...") == 3
    assert course.blocker("AssertionError: 1 != 2") is None
    assert course.blocker(None) is None


def run_student(merged: str, name: str, *args):
    namespace = {}
    exec(compile(merged, "merged.py", "exec"), namespace)
    return namespace[name](*args)


def test_substitute_keeps_the_students_constants_and_decorated_helpers():
    """The two correct solutions selfcheck grades at full marks, as code: a module-level constant
    and a @torch.no_grad() helper survive the substitution, decorator included."""
    (_, _, constant), (_, _, helper) = course.CORRECT
    import torch
    merged = course.substitute(REFERENCE, course.apply_edits(REFERENCE, constant),
                               course.EXERCISES[1][1])
    assert "OVERLONG_FLOOR = -1.0" in merged
    assert run_student(merged, "overlong_penalty", torch.tensor([20]), 16, 4).tolist() == [-1.0]
    merged = course.substitute(REFERENCE, course.apply_edits(REFERENCE, helper),
                               course.EXERCISES[6][1])
    assert "@torch.no_grad()\ndef _constant(x):" in merged
    logp = torch.tensor([[0.3, -0.1, 0.1, 7.0]], requires_grad=True)
    s = run_student(merged, "sequence_ratio", logp, torch.zeros(1, 4), torch.tensor([[1, 1, 1, 0]]))
    s[0, 0].backward()  # the stop-gradient held: d s / d logp_t = s / |o| on the real tokens
    assert torch.allclose(logp.grad, torch.tensor([[1.0, 1.0, 1.0, 0.0]]) * s[0, 0].item() / 3)


def test_a_handouts_course_py_and_sheet_hold_no_solution_and_no_answer():
    stripped = course.strip_selfcheck(course.read(course.__file__))
    for _, _, edits in course.MISTAKES + course.CORRECT + (course.ENDLESS,):
        for text, _ in edits:
            assert text not in stripped
    assert "MISTAKES = ()" in stripped and "CORRECT = ()" in stripped
    exec(compile(stripped, "course.py", "exec"), dict(__name__="handout", __file__="course.py"))  # and it still imports
    sheet = course.read(course.os.path.join(course.HERE, "docs", "course.md"))
    without, answers = course.strip_answers(sheet)
    assert len(answers) >= 9 and "<details>" not in without and "Check:" not in without
    assert all(block.strip().startswith("<details>") for block in answers)


def test_a_handouts_tests_replay_the_loops_with_their_gradient(tmp_path):
    """snapshot_tests: each ref_* becomes a lookup of what the loop returned on that call; a
    recorded gradient comes back on the inputs that required it."""
    import json
    import torch
    tests = ("import torch\n\n\ndef ref_twice(x, k=1):\n    return sum(2 * v for v in x) * k\n\n\n"
             "def test_it():\n    x = torch.ones(3, requires_grad=True)\n"
             "    out = ref_twice(x)\n    out.backward()\n    assert out.item() == 6\n"
             "    assert x.grad.tolist() == [2.0, 2.0, 2.0]\n")
    replay = course.snapshot_tests(tests)
    assert "sum(2 * v" not in replay and "def ref_twice(*args, **kwargs):" in replay
    x = torch.ones(3, dtype=torch.float64)
    (tmp_path / course.SNAPSHOTS).write_text(json.dumps({"test_it::ref_twice::0": dict(
        value=course.encode(torch.tensor(6.0)), grads={"0": course.encode(2 * x)})}))
    (tmp_path / "test_replay.py").write_text(replay)
    done = course.subprocess.run([course.sys.executable, "-m", "pytest", "-q", "-p",
                                  "no:cacheprovider", "test_replay.py"], cwd=tmp_path,
                                 capture_output=True, text=True)
    assert "1 passed" in done.stdout, done.stdout


def test_in_order_a_test_counts_for_the_latest_exercise_of_the_set_it_needs():
    mapping = dict(fails={"group_advantages": ["a", "b"], "overlong_penalty": ["c"],
                          "clipped_surrogate": ["b", "d"], "policy_loss": ["d", "e"]})
    plan = course.scheme(mapping, (1, 3, 5), in_order=True)
    assert plan[1]["functions"] == {"group_advantages": ["a"], "overlong_penalty": ["c"]}
    assert plan[1]["waiting"] == {"b": [3]}
    assert plan[3]["functions"]["clipped_surrogate"] == ["b"] and plan[3]["waiting"] == {"d": [5]}
    assert plan[5]["functions"]["policy_loss"] == ["d", "e"]
    full = course.scheme(mapping, (1, 3), in_order=False)  # the instructor's: every test, no wait
    assert full[3]["functions"]["clipped_surrogate"] == ["b", "d"] and not full[3]["waiting"]
    # the points: a function's share split by its tests; a blank function gets 0 of its share
    row = course.score(plan[1], 1, dict(results={"a": None, "c": "boom"}, errors=[]))
    assert row["points"] == 5.0 and row["per_function"]["overlong_penalty"] == (0, 1)
    waiting = course.score(plan[1], 1, dict(results={"a": None, "c": None, "b": (
        "NotImplementedError: exercise 3: clipped_surrogate")}, errors=[]))
    assert waiting["points"] == 10.0 and waiting["waiting"] == {"b": 3}
    said = course.format_rows([waiting], verbose=True)
    assert "b: written; waiting on exercise 3" in said and "10.0/10 points" in said


def test_a_long_list_of_failures_says_how_many_it_left_out_and_keeps_pytests_details():
    failure = ('Traceback (most recent call last):\n  File "/x/test_tokencredit.py", line 9, in '
               'test_t\n    assert f(1) == 2\n    ^^^^^^\nAssertionError: assert 3 == 2\n'
               ' +  where 3 = f(1)\n')
    row = dict(k=2, points=0.0, max=10, passed=0, total=14, failed={f"t{i}": failure
                                                                    for i in range(14)},
               waiting={}, per_function={}, timed_out=False, error=None)
    said = course.format_rows([row], verbose=True)
    assert "... and 2 more failed tests" in said and "+  where 3 = f(1)" in said
    assert "test_tokencredit.py:9 (test_t)" in said


def test_the_gradescope_bundle_grades_a_submission_laid_out_as_gradescope_does(tmp_path):
    """The issue's case: a grpo submission with exercises 3 and 5 blank scores exercise 1's 10
    of 30 (before: 59/80, the complete exercises of the handout counted); run_autograder runs
    from the unzipped bundle with the paths moved under tmp_path, and reuses the bundled map."""
    import json
    import zipfile
    bundle = tmp_path / "autograder.zip"
    done = course.subprocess.run([course.sys.executable, course.__file__, "gradescope",
                                  str(bundle), "--set", "grpo"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    root = tmp_path / "autograder"
    with zipfile.ZipFile(bundle) as z:
        assert {"setup.sh", "run_autograder", "course.py", "tokencredit.py"} <= set(z.namelist())
        z.extractall(root / "source")
    setup = (root / "source" / "setup.sh").read_text()
    assert "torch==2.13.0" in setup and "download.pytorch.org/whl/cpu" in setup
    assert "requirements.txt" in setup
    (root / "submission").mkdir()
    (root / "submission" / "tokencredit.py").write_text(course.blank(REFERENCE, [3, 5]))
    env = dict(course.os.environ, AUTOGRADER_ROOT=str(root), PYTHON=course.sys.executable)
    done = course.subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env,
                                 capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "computed the test map" not in done.stderr  # the bundle's own map
    results = json.loads((root / "results" / "results.json").read_text())
    assert [t["name"] for t in results["tests"]] == [
        "exercise 1: advantages", "exercise 3: surrogate and clip", "exercise 5: aggregation"]
    assert [t["score"] for t in results["tests"]] == [10.0, 0.0, 0.0] and results["score"] == 10
    (root / "submission" / "tokencredit.py").unlink()  # nothing submitted: a 0, and a message
    course.subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env,
                          capture_output=True, text=True, timeout=300)
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 0 and "Submit your tokencredit.py" in results["output"]


def test_grade_all_writes_a_row_per_student_and_a_column_per_exercise(tmp_path):
    import csv
    mistake = course.apply_edits(REFERENCE, course.MISTAKES[4][2])  # exercise 3's swapped clip
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "ada.py").write_text(REFERENCE)
    (tmp_path / "class" / "bob").mkdir()
    (tmp_path / "class" / "bob" / "tokencredit.py").write_text(mistake)
    (tmp_path / "class" / "cy.py").write_text("def group_advantages(:\n")  # does not parse
    done = course.subprocess.run(
        [course.sys.executable, course.__file__, "grade-all", str(tmp_path / "class"), "--set",
         "grpo", "--csv", str(tmp_path / "grades.csv"), "--gradescope-dir", str(tmp_path / "gs")],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = list(csv.DictReader(open(tmp_path / "grades.csv")))
    assert [r["student"] for r in rows] == ["ada", "bob", "cy"]
    assert [r["exercise 1"] for r in rows] == ["10.00", "10.00", "0.00"]
    assert float(rows[1]["exercise 3"]) < 10 and rows[1]["exercise 5"] == "10.00"
    assert rows[0]["total"] == "30.00" and "SyntaxError" in rows[2]["notes"]
    assert (tmp_path / "gs" / "bob" / "results.json").exists()


def test_plants_writes_one_submission_per_plant_named_by_its_exercise(tmp_path):
    course.main(["plants", str(tmp_path / "class")])
    files = sorted((tmp_path / "class").iterdir())
    plants = course.MISTAKES + course.CORRECT + (course.ENDLESS,)
    assert len(files) == len(plants) == 20
    for path, (k, _, edits) in zip(files, plants):
        assert f"-ex{k}-" in path.name and path.read_text() == course.apply_edits(REFERENCE, edits)
    with pytest.raises(SystemExit, match="not empty"):
        course.main(["plants", str(tmp_path / "class")])


def test_the_handout_scan_finds_a_pointer_to_a_left_out_file_in_any_page_or_script(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "tokencredit.py").write_text(course.blank(REFERENCE, (1,)))
    tests = course.read(course.os.path.join(course.HERE, course.TESTS))
    (tmp_path / course.TESTS).write_text(course.snapshot_tests(tests))
    (tmp_path / "README.md").write_text("Left out: the project's README, docs/speed.md.\n")
    (tmp_path / "docs" / "lab.md").write_text("The tables are in the README's section 4.\n")
    (tmp_path / "requirements.txt").write_text("# see docs/speed.md\ntorch\n")
    (tmp_path / "lab.py").write_text('"""the order the README tells it"""\n')
    found = course.scan_handout(str(tmp_path), REFERENCE, (1,), [])
    assert sorted(p.split(" points to ")[0] for p in found) == ["docs/lab.md", "lab.py",
                                                               "requirements.txt"], found
