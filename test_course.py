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
