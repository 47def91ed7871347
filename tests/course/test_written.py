"""Tests for the written part (course/written.py): the form, its grade in grade PATH, grade-all's
CSV and Gradescope's results.json, and a handout's blank form."""

import ast
import csv
import json
import os
import re

import pytest
import torch

import tokencredit as tc
from course import bundle, grading, written
from course.__main__ import main
from course.exercises import EXERCISES, SETS
from course.handout import all_answers, scan_handout, write_handout
from submissions import unquoted

pytestmark = pytest.mark.slow  # python -m pytest -m slow

ROOT = grading.ROOT
REFERENCE = grading.read(os.path.join(ROOT, "tokencredit.py"))
GRPO = SETS["grpo"]
t = torch.tensor


def filled(exercises, **changed) -> str:
    """A form with every expected number and a text for every rubric; `changed` replaces
    answers (id with "_" for ".")."""
    out = [written.HEADER]
    for q in written.questions(exercises):
        answer = changed.get(q["id"].replace(".", "_"), q["expected"] if q["number"]
                             else "an answer for the TA")
        out.append(f"{q['id']}: {answer!r}" if isinstance(answer, float) else
                   f"{q['id']}: {answer}")
    return "\n".join(out) + "\n"


def graded(text, exercises=GRPO):
    rows, problems = written.grade((text, None), exercises)
    return {r["id"]: r for r in rows}, problems


def form_of(path) -> tuple:
    """The form handed in with a submission at path, as every route reads it."""
    from course.submission import read_student
    return read_student(None, os.path.abspath(path), form_beside=True)["form"]


def numbers(rows) -> float:
    return sum(r["points"] for r in rows.values() if r["number"])


# -----------------------------------------------------------------------------
# the table's numbers

def pencil() -> dict:
    """Each pencil number of QUESTIONS, computed with tokencredit.py as the sheet's answer says."""
    A = tc.group_advantages
    ones = t([[1., 1, 0, 0]])
    rounds = [t([[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1]])]
    _, stats = tc.fill_batch(lambda: dict(correct=rounds[0]), batch_size=3, max_rounds=5,
                             filter_key="correct")

    def dloss_drho(a, eps_high=0.2):
        rho = t([[1.25]], requires_grad=True)
        tc.clipped_surrogate(rho, t([a]), 0.2, eps_high).sum().backward()
        return rho.grad[0, 0]
    m = torch.zeros(2, 1000)
    m[0, :100] = 1
    m[1] = 1
    w = {mode: tc.token_weights(m, mode, max_len=1000) for mode in ("sample", "token", "constant")}
    logp, mask = t([[.3, -.1, .1, 7]], requires_grad=True), t([[1, 1, 1, 0]])
    s = tc.sequence_ratio(logp, torch.zeros(1, 4), mask)
    tc.clipped_surrogate(s, t([1.]), 3e-4, 4e-4).sum().backward()
    cscr = tc.cscr_weights(t([[0, .5, .4]]), t([[1, 1, 1]]), 1.)[0]
    entropy, real = t([[.1, 2, .3, 5], [1.5, .2, .05, .9]]), t([[1, 1, 1, 0], [1] * 4])
    return {"1.std": A(ones)[0, 0], "1.none": A(ones, scale="none")[0, 0],
            "1.loo": A(ones, scale="none", baseline="leave_one_out")[0, 0],
            "2.rounds": stats["rounds"], "2.seen": stats["groups_seen"],
            "2.informative": stats["groups_informative"], "2.kept": stats["groups_kept"],
            "2.full": stats["full"], "2.A": A(t([[0., -0.5, 0, 0]]))[0, 1],
            "3.plus": dloss_drho(1.), "3.minus": dloss_drho(-1.),
            "3.higher": dloss_drho(1., eps_high=0.28),
            "4.k3": tc.kl_k3(t([[-1.0]]), t([[-1.5]]))[0, 0],
            "4.swapped": tc.kl_k3(t([[-1.5]]), t([[-1.0]]))[0, 0],
            **{f"5.w.{mode}": w[mode][0, 0] for mode in w},
            **{f"5.long.{mode}": w[mode][1].sum() for mode in w},
            "6.ratio1": tc.importance_ratio(logp, torch.zeros(1, 4), mask)[0, 0],
            "6.s": s[0, 0], "6.tokens": int((logp.grad[0, :3] != 0).sum()),
            "7.w1": cscr[0], "7.w2": cscr[1], "7.w3": cscr[2], "7.sum": (-1 * cscr).sum(),
            "8.kept": tc.high_entropy_mask(entropy, real, 0.2).sum(),
            "8.threshold": torch.quantile(entropy[real.bool()], 0.8)}


LAB = {  # each lab number of QUESTIONS as docs/course.md's answers say it (they were measured)
    "lab1.predicted": ("24.0 / 9.0 = **2.67**", 2.67),
    "lab1.sample": ("**-4.99 under `\"sample\"`", -4.99),
    "lab1.token": ("-1.46 under `\"token\"`**", -1.46),
    "lab1.median": ("median ratio sample/token per answer is **4.00**", 4.00),
    "lab1.long": ("For the long wrong answers it is **0.54**", 0.54),
    "lab2.gspo": ("(-4.99 and -4.99 for the short wrong answers)", -4.99),
    "lab3.intermediate": ("**Intermediate digits 0.953", 0.953),
    "lab3.format": ("format tokens 0.997**", 0.997),
    "lab3.operator": ("**operators 1.080", 1.080),
    "lab3.answer": ("answer digits 1.044**", 1.044),
    "lab4.sampled": ("sampled 0.600 -> 0.003", 0.003),
    "lab6.mean": ("wrong answers are 0.54 tokens shorter under `\"token\"`", -0.54),
    "lab6.seeds": ("**Negative, in all ten seeds**", 10),
}


def test_every_expected_number_is_computed_by_tokencredit_or_read_in_the_sheet_s_answers():
    sheet = " ".join("".join(all_answers()).split())
    computed = pencil()
    for q in written.questions(EXERCISES):
        if not q["number"]:
            continue
        if q["id"] in LAB:
            quote, value = LAB[q["id"]]
            assert quote in sheet and q["expected"] == value, q["id"]
        else:  # the exact value is right by the row's own tolerance
            value = float(torch.as_tensor(computed[q["id"]]).detach())
            rows, _ = graded(f"{q['id']}: {value!r}", EXERCISES)
            assert rows[q["id"]]["right"], (q["id"], value, q["expected"])
    assert set(computed) | set(LAB) == {q["id"] for q in written.questions(EXERCISES)
                                       if q["number"]}


def test_the_form_parses_on_python_3_10_with_the_standard_library_only():
    source = grading.read(os.path.join(grading.HERE, "written.py"))
    tree = ast.parse(source, feature_version=(3, 10))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported == {"os", "re", "textwrap", "unicodedata"}
    assert [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] == ["exercises"]


def test_each_row_of_the_table_can_be_graded_and_has_an_id_of_its_own():
    """QUESTIONS is checked here, once: written.questions reads it as it is."""
    for row in written.QUESTIONS:
        fits = len(row) == 7 and written.LINE.fullmatch(f"{row[0]}:") and row[1] in EXERCISES \
            and row[2] > 0 and (isinstance(row[3], str) or row[4] >= 0 and row[5] >= 0)
        assert fits, ("course/written.py: a row of QUESTIONS should hold an id (letters, digits, "
                      f"'.', '_', '-'), an exercise of 1-{len(EXERCISES)}, points > 0, and a "
                      f"number with abs, rel >= 0 or a rubric; got {row}")
    ids = [row[0] for row in written.QUESTIONS]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    assert not twice, f"course/written.py: each row of QUESTIONS should have an id of its own; " \
        f"got {twice} twice"
    assert {row[1] for row in written.QUESTIONS} == set(EXERCISES), \
        "course/written.py: each exercise should have a question in QUESTIONS"


# -----------------------------------------------------------------------------
# the grade of a form

def test_a_correct_form_gets_every_number_s_points_and_leaves_the_texts_to_the_ta():
    for set_name, exercises in SETS.items():
        rows, problems = graded(filled(exercises), exercises)
        auto = [r for r in rows.values() if r["number"]]
        assert problems == [] and all(r["right"] for r in auto), set_name
        assert numbers(rows) == sum(r["max"] for r in auto) > 0
        hand = [r for r in rows.values() if not r["number"]]
        assert hand and all(r["points"] is None and r["read"] for r in hand)
    rows, _ = graded(filled(GRPO))
    assert numbers(rows) == 20 and sum(r["max"] for r in rows.values() if not r["number"]) == 6


def test_a_wrong_number_loses_exactly_its_points():
    full, _ = graded(filled(GRPO))
    for q in written.questions(GRPO):
        if q["number"]:
            answer = q["expected"] + 1.0
            rows, _ = graded(filled(GRPO, **{q["id"].replace(".", "_"): answer}))
            assert numbers(rows) == numbers(full) - q["points"], q["id"]
            assert [i for i in rows if rows[i]["points"] != full[i]["points"]] == [q["id"]]
            assert rows[q["id"]]["said"] == f"wrong: {answer!r} is not the expected value " \
                                            f"({written.tolerance(q)})"  # and not what it is


def test_a_number_within_its_tolerance_passes_and_one_just_outside_fails():
    rows, _ = graded("1.std: 0.875\n1.none: 0.511\n5.w.token: 9.18e-4\n5.w.constant: 5.06e-4\n"
                     "lab6.seeds: 10.0\nlab1.sample: -4.994\n")
    assert [rows[i]["right"] for i in ("1.std", "1.none", "5.w.token", "5.w.constant",
                                       "lab6.seeds", "lab1.sample")] == [
        True, False, True, False, True, True]  # ±0.01, ±1 % of 9.09e-4 and 5e-4, exactly
    for q in written.questions(EXERCISES):
        if q["number"]:
            gap = max(q["abs"], q["rel"] * abs(q["expected"]))
            for scale, right in ((0.99, True), (1.01, False)):
                for sign in (1, -1):
                    answer = q["expected"] + sign * (scale * gap if gap else 1e-9 * (not right))
                    rows, _ = graded(f"{q['id']}: {answer!r}", EXERCISES)
                    assert rows[q["id"]]["right"] is right, (q["id"], answer)


def test_missing_garbled_and_odd_forms_give_0_and_a_line_never_a_crash(tmp_path):
    (tmp_path / "empty").mkdir()
    assert form_of(tmp_path / "empty") == (None, written.NO_FORM)
    rows, problems = written.grade(form_of(tmp_path / "empty"), GRPO)
    assert numbers({r["id"]: r for r in rows}) == 0 and problems == [written.NO_FORM]
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / written.FORM).write_text("1.std: 0.866\n" * 10000)
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / written.FORM).symlink_to(os.path.join(grading.HERE, "written.py"))
    (tmp_path / "dir" / written.FORM).mkdir(parents=True)
    for name, said in (("big", "over 65536: not read"), ("link", "a symbolic link: not read"),
                       ("dir", "not a regular file")):
        text, why = form_of(tmp_path / name)
        assert text is None and said in why, name
        rows, problems = written.grade((text, why), GRPO)
        assert numbers({r["id"]: r for r in rows}) == 0 and problems == [why]
    (tmp_path / "bytes").mkdir()
    (tmp_path / "bytes" / written.FORM).write_bytes(b"\xff\xff\x00garbage\n1.std:\x000.866\n"
                                                    b"1.none: 0.5\n")
    rows, problems = written.grade(form_of(tmp_path / "bytes"), GRPO)
    rows = {r["id"]: r for r in rows}
    assert numbers(rows) == 1 and rows["1.none"]["right"]
    assert "not a number" in rows["1.std"]["said"] and "line 1 is not `id: answer`" in problems[0]
    rows, problems = graded("1.std: 0.866 # the Bessel std\n1.none: nan\n1.loo: 2/3\n"
                            "3.plus: 0\n3.plus: 0\n3.minus: inf\nlab4.what:\n1.std 0.866\n"
                            "9.nine: 1\n")
    for qid in ("1.std", "1.none", "1.loo", "3.minus"):
        assert rows[qid]["points"] == 0 and "is not a number" in rows[qid]["said"], qid
    assert rows["3.plus"]["said"] == "answered on 2 lines (4, 5): write it once"
    assert rows["lab4.what"]["points"] == 0 and rows["lab4.what"]["said"].startswith("missing")
    assert problems == ["line 8 is not `id: answer`: '1.std 0.866', ignored",
                        "line 9: no question '9.nine' in this form, ignored"]
    assert numbers(rows) == 0
    rows, problems = written.grade(("1.std: 0.866\n3.plus: 0\n", ""), [3])  # grade -e 3
    assert [r["k"] for r in rows] == [3] * len(rows) and problems == []  # 1.std: not unknown


# -----------------------------------------------------------------------------
# where the grade shows: grade PATH, grade-all's CSV, Gradescope (grade PATH and the bundle)

def submission(folder, form=None):
    folder.mkdir()
    (folder / "tokencredit.py").write_text(REFERENCE)
    if form is not None:
        (folder / written.FORM).write_text(form)
    return str(folder)


def written_tests(results: dict) -> dict:
    return {t["name"]: t for t in results["tests"] if not t["name"].startswith("exercise")}


def test_grade_path_prints_the_written_grade_and_gradescope_holds_its_tests(tmp_path, capsys):
    path = submission(tmp_path / "alice", filled(GRPO, **{"1_std": 0.9, "1_none": "half"}))
    main(["grade", path, "--set", "grpo", "--seed", "1", "--gradescope",
          str(tmp_path / "r.json")])
    said = unquoted(capsys.readouterr().out)
    assert "written (written.txt): 18/20 points for numbers; 3 answers to grade by hand" in said
    assert "1.std: wrong: 0.9 is not the expected value (to within ±0.01) [expected 0.866 to " \
           "within ±0.01]" in said  # the instructor's: what was expected
    results = json.loads((tmp_path / "r.json").read_text())
    tests = written_tests(results)
    assert list(tests) == ["written.txt: the form", "written answers, exercise 1",
                           "written answers, exercise 3", "written answers, exercise 5"]
    assert tests["written.txt: the form"]["visibility"] == "visible"
    assert "score" not in tests["written.txt: the form"]
    assert "1.none: 'half' is not a number" in tests["written.txt: the form"]["output"]
    one = tests["written answers, exercise 1"]
    assert (one["score"], one["max_score"], one["visibility"]) == (2, 4, written.VISIBILITY)
    assert "1.std: wrong: 0.9 is not the expected value (to within ±0.01)" in one["output"]
    assert "lab4.what: received: 2 points, graded by hand" in one["output"]
    assert "0.866" not in json.dumps(results) and "Rubric" not in json.dumps(results)
    assert results["score"] == 30 + 18


def test_grade_all_writes_the_written_columns(tmp_path):
    class_ = tmp_path / "class"
    class_.mkdir()
    submission(class_ / "alice", filled(GRPO, lab1_sample=-4.98))
    (class_ / "bob.py").write_text(REFERENCE)
    (class_ / "carol").mkdir()
    (class_ / "carol" / written.FORM).write_text("1.std: 0.866\nlab5.why: =1+1\n")
    main(["grade-all", str(class_), "--set", "grpo", "--seed", "1", "--csv",
          str(tmp_path / "g.csv"), "--gradescope-dir", str(tmp_path / "gs")])
    with open(tmp_path / "g.csv", newline="") as f:
        header, *rows = list(csv.reader(f))
    assert header[header.index("max") + 1:header.index("flags")] == written.csv_header(GRPO)
    assert {"written", "written max", "by hand max", "1.std", "lab4.what by hand",
            "lab4.what answer", "written notes"} <= set(header)
    rows = {r[0]: dict(zip(header, r)) for r in rows}
    alice, bob, carol = rows["alice"], rows["bob"], rows["carol"]
    assert (alice["total"], alice["written"], alice["written max"], alice["by hand max"]) == (
        "30.00", "19.00", "20", "6")
    assert alice["lab1.sample"] == "0" and alice["1.std"] == "1"
    assert alice["lab4.what by hand"] == "" and alice["lab4.what answer"] == "an answer for the TA"
    assert "lab1.sample: wrong: -4.98 is not the expected value (to within ±0.005) " \
           "[expected -4.99 to within ±0.005]" in alice["written notes"]
    assert (bob["written"], bob["lab4.what by hand"], bob["written notes"]) == (
        "0.00", "0", written.NO_FORM)
    assert (carol["total"], carol["written"]) == ("0.00", "1.00")
    assert carol["lab5.why by hand"] == "" and carol["lab5.why answer"] == "'=1+1"  # no formula
    results = json.loads((tmp_path / "gs" / "alice" / "results.json").read_text())
    assert results["score"] == 49 and "-4.99" not in json.dumps(results)


def test_the_bundle_grades_the_form_handed_in(tmp_path, monkeypatch):
    source = tmp_path / "source"
    source.mkdir()
    (source / "tokencredit.py").write_text(REFERENCE)
    (source / grading.BUNDLE_FILE).write_text(json.dumps(dict(set="grpo", seed=1)))
    monkeypatch.setattr(bundle, "ROOT", str(source))
    submission(tmp_path / "submission", filled(GRPO, **{"3_plus": 0.02}))
    bundle.cmd_autograde(str(tmp_path))
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert written_tests(results)["written answers, exercise 3"]["score"] == 2
    assert results["score"] == 30 + 19
    (tmp_path / "submission" / "tokencredit.py").unlink()  # no code: the form still counts
    bundle.cmd_autograde(str(tmp_path))
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert results["score"] == 19 and len(written_tests(results)) == 4
    assert "written.py" in bundle.MODULES  # carried whole: the bundle grades with its values


# -----------------------------------------------------------------------------
# the handout, the answers, the sheet

def test_a_handout_holds_the_blank_form_and_no_expected_value_or_rubric(tmp_path):
    out = str(tmp_path / "grpo")
    write_handout(out, "grpo", False, REFERENCE)
    form = grading.read(os.path.join(out, written.FORM))
    assert form == written.blank_form("grpo", GRPO)
    comments = " ".join(" ".join(ln[2:] for ln in form.splitlines()
                                 if ln.startswith("# ")).split())
    for q in written.questions(GRPO):  # every id, its question as a comment, no answer
        assert f"\n{q['id']}:\n" in form and q["question"] in comments
    answers = [ln.split(":", 1)[1] for ln in form.splitlines()
               if ln.strip() and not ln.startswith("#")]
    assert len(answers) == len(written.questions(GRPO)) and not any(a.strip() for a in answers)
    texts = {}
    for root, _, names in os.walk(out):
        for name in names:
            try:
                texts[os.path.relpath(os.path.join(root, name), out)] = grading.read(
                    os.path.join(root, name))
            except UnicodeDecodeError:
                pass
    everything = " ".join(" ".join(texts.values()).split())
    for q in written.questions(EXERCISES):
        if not q["number"]:
            assert q["expected"][:60] not in everything, q["id"]  # no rubric, anywhere
    ours = " ".join(texts[n] for n in texts if n.startswith("course") or n in (
        written.FORM, "README.md", grading.MAP_FILE))
    for q in written.questions(GRPO):
        if q["number"] and len(str(q["expected"]).strip("-0.")) >= 3:  # 0.866, 9.09e-4, -4.99
            assert not re.search(rf"(?<![\d.]){re.escape(str(q['expected']))}(?!\d)", ours), q
    assert "\nQUESTIONS = ()  # left out" in texts["course/written.py"]
    assert scan_handout(out, REFERENCE, GRPO, all_answers()) == []
    saved = json.loads(texts[grading.MAP_FILE])["written"]  # the handout reads its form alone
    rows, _ = written.grade(("1.std: 0.1\n1.none: x\n", None), GRPO, saved)
    assert [r["said"] for r in rows[:3]] == ["read", "'x' is not a number (write one such as "
                                             "0.5, -1.25, 5e-4)", "missing: write a number "
                                             "after `1.loo:`"]
    assert all(r["points"] == 0 for r in rows if r["number"])


def test_the_answers_file_lists_every_value_and_rubric_for_instructors():
    block = all_answers()[-1]
    assert "## The written form (written.txt), for instructors" in block
    for q in written.questions(EXERCISES):
        assert (f"`{q['id']}` (exercise {q['k']}, {q['points']:g} point" in block
                and (f"{q['expected']:g} {written.tolerance(q)}" if q["number"]
                     else f"Rubric: {q['expected']}") in block), q["id"]


def test_the_sheet_states_each_number_s_tolerance():
    sheet = grading.read(os.path.join(ROOT, "docs", "course.md"))
    table = dict(re.findall(r"\n\| (exactly|to within [^|]+?) \| (.+?) \|", sheet))
    stated = {qid: tol for tol, ids in table.items() for qid in re.findall(r"`([^`]+)`", ids)}
    assert stated == {q["id"]: written.tolerance(q) for q in written.questions(EXERCISES)
                      if q["number"]}


NOTEPAD_FORM = "1.std: 0.866\n1.none: 0.5\n1.loo: 0.667\n"


@pytest.mark.parametrize("saved", ["utf-8", "utf-8-sig", "utf-16"])
def test_a_written_form_saved_with_a_bom_keeps_its_answers(tmp_path, saved):
    """Windows Notepad saves UTF-8 with a byte order mark, or UTF-16 ("Unicode"): read_form
    kept the mark, the first line read as "\\ufeff1.std: 0.866", "not `id: answer`", and its
    right answer got 0 (2 of 3); in UTF-16 every answer got 0."""
    (tmp_path / "written.txt").write_bytes(NOTEPAD_FORM.encode(saved))
    rows, problems = written.grade(form_of(tmp_path), [1])
    assert sum(r["points"] or 0 for r in rows if r["id"] in ("1.std", "1.none", "1.loo")) == 3, (
        problems)
