"""The written part (docs/course.md, "The written form"): the sheet's pencil and lab questions as
one plain-text answer form per set, written.txt, and its grade. QUESTIONS is the instructor's
table: a handout carries this file without it; a Gradescope bundle, whole, readable by root alone.
"""

import os
import re
import textwrap
import unicodedata

from .exercises import EXERCISES

FORM = "written.txt"
NO_FORM = f"no {FORM} handed in"
VISIBILITY = "after_due_date"  # Gradescope shows the written points after the due date

QUESTIONS = (  # id, exercise, points, expected (a number; a text: the rubric), abs, rel, question
    ("1.std", 1, 1, 0.866, 0.01, 0,
     'Pencil. One group, rewards [1, 1, 0, 0]: A of an answer with reward 1, scale="std".'),
    ("1.none", 1, 1, 0.5, 0.01, 0, 'The same, scale="none".'),
    ("1.loo", 1, 1, 0.667, 0.01, 0, 'The same, scale="none", baseline="leave_one_out".'),
    ("lab4.sampled", 1, 1, 0.003, 0.05, 0,
     "Lab question 4. The sign flipped in group_advantages: the sampled accuracy after, in the "
     "last line of train_tiny.py --quick --impl flipped.py --name flipped."),
    ("lab4.what", 1, 2,
     "1 point: the policy learns to be wrong: the batch's reward falls (0.63 at update 1 to 0.02 "
     "at update 7) and the accuracy to about 0. 1 point: the answers grow to the 32-token budget, "
     "because a negated advantage pushes the wrong answers up and an answer cut off at the "
     "budget is always wrong.", None, None,
     "What did the progress lines do, and why?"),
    ("2.rounds", 2, 1, 2, 0, 0,
     "Pencil. fill_batch(sampler, batch_size=3, max_rounds=5, filter_key=\"correct\") on the "
     "sheet's 4 groups: the stat rounds."),
    ("2.seen", 2, 1, 8, 0, 0, "The stat groups_seen."),
    ("2.informative", 2, 1, 4, 0, 0, "The stat groups_informative."),
    ("2.kept", 2, 1, 3, 0, 0, "The stat groups_kept."),
    ("2.full", 2, 1, 1, 0, 0, "The stat full (1 or 0)."),
    ("2.A", 2, 1, -1.5, 0.01, 0,
     "Shaped rewards [0, -0.5, 0, 0]: the group normalised advantage (scale=\"std\") of the answer "
     "at -0.5."),
    ("2.why", 2, 2,
     "1 point: by its rewards the group is informative (they are not all equal). 1 point: by the "
     "verdicts it is not (all four are wrong), and filtering on rewards would give full-size "
     "credit (A = -1.5 and 0.5) to a few tokens of length, not to being right.", None, None,
     "Is that all-wrong group informative by its rewards? Why filter on the verdicts?"),
    ("3.plus", 3, 1, 0, 0.01, 0,
     "Pencil. eps_low = eps_high = 0.2, rho = 1.25: d loss / d rho for A = +1."),
    ("3.minus", 3, 1, 1, 0.01, 0, "The same for A = -1."),
    ("3.higher", 3, 1, -1, 0.01, 0, "A = +1 with Clip-Higher (eps_high = 0.28)."),
    ("4.k3", 4, 1, 0.1065, 0.001, 0, "Pencil. k3 for logp = -1.0, ref_logp = -1.5."),
    ("4.swapped", 4, 1, 0.1487, 0.001, 0, "k3 for the swapped pair."),
    ("5.w.sample", 5, 1, 5.0e-3, 0, 0.01,
     'Pencil. Two answers of 100 and 1000 tokens (N = 2): the weight of one token of the short '
     'answer under "sample".'),
    ("5.w.token", 5, 1, 9.09e-4, 0, 0.01, 'The same under "token".'),
    ("5.w.constant", 5, 1, 5.0e-4, 0, 0.01, 'The same under "constant", max_len = 1000.'),
    ("5.long.sample", 5, 1, 0.5, 0.01, 0,
     'The loss weight of the long answer in all (sum_t w_{i,t}) under "sample".'),
    ("5.long.token", 5, 1, 0.909, 0.01, 0, 'The same under "token".'),
    ("5.long.constant", 5, 1, 0.5, 0.01, 0, 'The same under "constant".'),
    ("lab1.predicted", 5, 1, 2.67, 0.01, 0,
     "Lab question 1. The ratio sample/token of the short wrong answers' per-token change, "
     "predicted from their mean length alone."),
    ("lab1.sample", 5, 1, -4.99, 0.005, 0,
     'The measured mean change of log pi per token (x 1e-3) of the short wrong answers under '
     '"sample".'),
    ("lab1.token", 5, 1, -1.46, 0.005, 0, 'The same under "token".'),
    ("lab1.median", 5, 1, 4.00, 0.005, 0,
     "The measured median ratio sample/token per answer, short wrong answers."),
    ("lab1.long", 5, 1, 0.54, 0.005, 0, "The same for the long wrong answers."),
    ("lab5.why", 5, 2,
     "1 point: the numbers can differ: the one-step table, the diagnosis and the accuracy measure "
     "a starting policy whose warm-up depends on the machine's order of floating-point additions. "
     "1 point: the conclusions must not: \"sample\" pushes the short wrong answers harder than "
     "\"token\", the same token classes fall below 1, and the accuracy after meets the learning "
     "check's target.", None, None,
     "Lab question 5. Which numbers can differ from ours, and which conclusions must not?"),
    ("lab6.mean", 5, 1, -0.54, 0.005, 0,
     "Lab question 6. The mean difference token - sample of the wrong answers' length over the "
     "run (updates 1-60)."),
    ("lab6.seeds", 5, 1, 10, 0, 0, "In how many of the ten seeds is it negative?"),
    ("lab6.why", 5, 2,
     "1 point: the two runs of a seed share the warm-up, the problems and the first batch, so "
     "their difference is free of most of what a seed changes. 1 point: across seeds the wrong "
     "answers' length varies about as much as the effect (a std of 0.4 tokens), so two means "
     "over seeds can miss it.", None, None,
     "Why does a difference within each seed show what two means over seeds may not?"),
    ("6.ratio1", 6, 1, 1.350, 0.01, 0,
     "Pencil. logp - old_logp = [0.3, -0.1, 0.1], then padding: the first token's ratio."),
    ("6.s", 6, 1, 1.105, 0.01, 0, "s_i."),
    ("6.tokens", 6, 1, 0, 0, 0,
     "With GSPO's clip (eps_low = 3e-4, eps_high = 4e-4) and A = +1: how many of its tokens "
     "still get a gradient?"),
    ("lab2.gspo", 6, 1, -4.99, 0.005, 0,
     "Lab question 2. The gspo column of the one-step table for the short wrong answers."),
    ("lab2.why", 6, 2,
     "1 point: yes, GSPO's first step equals \"sample\"'s. 1 point: at rho = 1, s_i = 1 and "
     "d s_i / d logp_{i,t} = 1/|o_i|, the weight of \"sample\"; they differ once the ratio moves.",
     None, None, "Does GSPO's first step equal GRPO's, and why?"),
    ("7.w1", 7, 1, 1.318, 0.01, 0,
     "Pencil. A = -1, d+ = [0.0, 0.5, -0.2], d- = [0.0, -0.1, 0.4], alpha = 1, tau = 0: u~ of "
     "the first token."),
    ("7.w2", 7, 1, 0.799, 0.01, 0, "u~ of the second token."),
    ("7.w3", 7, 1, 0.883, 0.01, 0, "u~ of the third token."),
    ("7.sum", 7, 1, -3, 0.01, 0, "The sum of the token advantages."),
    ("lab3.intermediate", 7, 1, 0.953, 0.005, 0,
     "Lab question 3. The mean CSCR weight (strength 1) of the intermediate digits."),
    ("lab3.format", 7, 1, 0.997, 0.005, 0, "The same of the format tokens."),
    ("lab3.operator", 7, 1, 1.080, 0.005, 0, "The same of the operators."),
    ("lab3.answer", 7, 1, 1.044, 0.005, 0, "The same of the answer digits."),
    ("8.kept", 8, 1, 2, 0, 0,
     "Pencil. The sheet's entropies, top_fraction = 0.2: how many tokens are kept?"),
    ("8.threshold", 8, 1, 1.38, 0.01, 0, "The threshold, the 0.8 quantile of the real tokens."),
)
HEADER = """\
# {form}: your written answers to docs/course.md, set {set_name}. Hand it in beside your
# tokencredit.py. One answer per line, after its id and a colon, as in `1.std: -0.25`.
# A question that asks for a number takes a plain number (0.5, -1.25, 5e-4) and nothing else
# on its line: no fraction, no unit, no comment. The others take one line of text, graded by
# hand. Lines that start with # are comments. Keep the ids as they are.
"""
LINE = re.compile(r"\s*([A-Za-z0-9][\w.-]*)\s*:(.*)")


def questions(exercises, table=None) -> list:
    """The rows of these exercises, in the table's order, as dicts (`number`: graded here).
    tests/course/test_written.py checks QUESTIONS's rows; a handout's table is written by public."""
    keys = ("id", "k", "points", "expected", "abs", "rel", "question")
    rows = [dict(zip(keys, row), number=not isinstance(row[3], str))
            for row in (QUESTIONS if table is None else table)]
    return [q for q in rows if q["k"] in exercises]


def public(exercises) -> list:
    """What a handout keeps of the table, to read its form: no value, no rubric, no question."""
    return [[q["id"], q["k"], q["points"], None if q["number"] else "", 0, 0, ""]
            for q in questions(exercises)]


def tolerance(q) -> str:
    """How close a number must come: "to within ±0.01", "to within ±1 %", or "exactly"."""
    parts = [f"±{q['abs']:g}"] if q["abs"] else []
    parts += [f"±{q['rel'] * 100:g} %"] if q["rel"] else []
    return "to within " + " or ".join(parts) if parts else "exactly"


def blank_form(set_name: str, exercises) -> str:
    """The form a handout carries: each question as a comment, then its id and no answer."""
    out, k = [HEADER.format(form=FORM, set_name=set_name)], None
    for q in questions(exercises):
        if q["k"] != k:
            k = q["k"]
            out.append(f"\n## Exercise {k}: {EXERCISES[k][0]}\n")
        kind = f"a number, {tolerance(q)}" if q["number"] else "a line of text, graded by hand"
        said = f"({kind}; {q['points']:g} point{'s' * (q['points'] != 1)}) {q['question']}"
        out.append("\n" + textwrap.fill(said, 98, initial_indent="# ", subsequent_indent="# ")
                   + f"\n{q['id']}:\n")
    return "".join(out)


def parse(text: str, ids) -> tuple:
    """({id: [(line, answer), ...]}, [what could not be read]). Plain string work, nothing run."""
    answers, problems = {}, []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        found = LINE.fullmatch(line)
        if not found:
            problems.append(f"line {n} is not `id: answer`: {line.strip()[:60]!r}, ignored")
        elif found.group(1) not in ids:
            problems.append(f"line {n}: no question {found.group(1)!r} in this form, ignored")
        else:
            answers.setdefault(found.group(1), []).append((n, found.group(2).strip()))
    return answers, problems


def number(answer: str):
    try:
        x = float(answer)
    except ValueError:
        return None
    return x if x - x == 0 else None  # not nan, not inf


def grade(form: tuple, exercises, table=None) -> tuple:
    """(one row per question of these exercises, the form's problems). A row: `points` (None:
    by hand), `read` (an answer of the right form), `said` (what the student is told, never the
    expected value) and `expected` (the instructor's). With a handout's table (no values) a
    number is only read."""
    text, why = form
    every = questions(EXERCISES, table)  # the form may hold other exercises' answers too
    rows, qs = [], [q for q in every if q["k"] in exercises]
    answers, problems = parse(text or "", {q["id"] for q in every})
    problems += [why] if text is None else []
    for q in qs:
        given = answers.get(q["id"], [])
        answer = given[0][1] if len(given) == 1 else ""
        row = dict(id=q["id"], k=q["k"], max=q["points"], number=q["number"], answer=answer,
                   points=0.0, read=False, right=False, expected=q["expected"] if not q["number"]
                   else None if q["expected"] is None else f"{q['expected']:g} {tolerance(q)}")
        if text is None:
            row["said"] = why
        elif len(given) > 1:
            row["said"] = f"answered on {len(given)} lines " \
                          f"({', '.join(str(n) for n, _ in given)}): write it once"
        elif not answer:
            row["said"] = f"missing: write {'a number' if q['number'] else 'a line of text'} " \
                          f"after `{q['id']}:`"
        elif q["number"] and number(answer) is None:
            row["said"] = f"{answer[:40]!r} is not a number (write one such as 0.5, -1.25, 5e-4)"
        elif not q["number"]:
            row.update(read=True, points=None,
                       said=f"received: {q['points']:g} points, graded by hand")
        elif q["expected"] is None:
            row.update(read=True, said="read")
        else:
            gap = abs(number(answer) - q["expected"])
            right = gap <= max(q["abs"], q["rel"] * abs(q["expected"]))
            row.update(read=True, right=right, points=float(q["points"]) if right else 0.0,
                       said=f"right ({tolerance(q)})" if right else
                       f"wrong: {answer[:40]} is not the expected value ({tolerance(q)})")
        rows.append(row)
    return rows, problems


def notes(rows: list, problems: list, instructor: bool) -> list:
    """The answers missing, in one line; each answer that could not be read; the instructor's
    also each number that is wrong, with what was expected."""
    missing = [r["id"] for r in rows if r["said"].startswith("missing")]
    out = [f"missing (no answer after the id): {', '.join(missing)}"] if missing else []
    out += [f"{r['id']}: {r['said']}"
            + (f" [expected {r['expected']}]" if instructor and r["number"] else "")
            for r in rows if r["id"] not in missing and r["said"] not in problems
            and (not r["read"] or instructor and r["number"] and not r["right"])]
    return out + problems


def lines(rows: list, problems: list, instructor: bool) -> list:
    """What `grade` prints. The instructor's: the points, each number not right with what was
    expected, the answers to grade by hand. A handout's (no values): what could not be read."""
    said = [q for n in notes(rows, problems, instructor) for q in quoted(n, "    ")]
    if not instructor:
        return [f"written ({FORM}): {sum(r['read'] for r in rows)} of {len(rows)} answers read; "
                "your instructor grades them"] + said
    auto, hand = [r for r in rows if r["number"]], [r for r in rows if not r["number"]]
    return ([f"written ({FORM}): {sum(r['points'] for r in auto):g}/"
             f"{sum(r['max'] for r in auto):g} points for numbers; {len(hand)} answers to grade "
             f"by hand ({sum(r['max'] for r in hand):g} points)"] + said
            + [q for r in hand if r["read"] for q in quoted(
                f"{r['id']}, by hand ({r['max']:g} points): {r['answer'][:70]!r}", "    ")])


def gradescope_tests(rows: list, problems: list) -> list:
    """Gradescope's tests of the form (docs/course.md, "The written form", says what each shows)."""
    out = [dict(name=f"{FORM}: the form", visibility="visible", output="\n".join(
        [f"{sum(r['read'] for r in rows)} of {len(rows)} answers read; whether they are right "
         "shows after the due date"] + notes(rows, problems, False)))]
    for k in sorted({r["k"] for r in rows}):
        mine = [r for r in rows if r["k"] == k]
        alike = {r["said"] for r in mine} <= set(problems)  # no form: say it once
        test = dict(name=f"written answers, exercise {k}", visibility=VISIBILITY,
                    output="\n".join(sorted({r["said"] for r in mine}) if alike else
                                     [f"{r['id']}: {r['said']}" for r in mine]))
        numbers = [r for r in mine if r["number"]]
        if numbers:
            test.update(score=sum(r["points"] for r in numbers),
                        max_score=sum(r["max"] for r in numbers))
        out.append(test)
    return out


def csv_header(exercises) -> list:
    out = ["written", "written max", "by hand max"]
    for q in questions(exercises):
        out += [q["id"]] if q["number"] else [f"{q['id']} by hand", f"{q['id']} answer"]
    return out + ["written notes"]


def csv_cells(rows: list, problems: list) -> list:
    """The written columns, as docs/course.md lists them (__main__'s cell() escapes them)."""
    auto = [r for r in rows if r["number"]]
    out = [f"{sum(r['points'] for r in auto):.2f}", f"{sum(r['max'] for r in auto):g}",
           f"{sum(r['max'] for r in rows if not r['number']):g}"]
    for r in rows:
        cell = "" if r["points"] is None else f"{r['points']:g}"
        out += [cell] if r["number"] else [cell, r["answer"]]
    return out + ["; ".join(notes(rows, problems, True))]


def answers_block() -> str:
    """The table for the instructor's answers file: expected values, tolerances, rubrics."""
    out = [f"\n## The written form ({FORM}), for instructors\n\nEach answer's expected value "
           "and tolerance (graded automatically) or rubric (graded by hand), from QUESTIONS in "
           "course/written.py:\n"]
    for q in questions(EXERCISES):
        head = f"- `{q['id']}` (exercise {q['k']}, {q['points']:g} point" \
               f"{'s' * (q['points'] != 1)})"
        out.append(f"{head}: {q['expected']:g} {tolerance(q)}" if q["number"] else
                   f"{head}, by hand. Rubric: {q['expected']}")
    return "\n".join(out) + "\n"


def shown(name) -> str:
    """A file name (str or bytes) as text that prints anywhere and names one file only (NFC: no
    two names look alike): as is, else escaped as Python would (bytes not UTF-8 as \\udcXX)."""
    text = os.fsdecode(name)
    return text if text.isprintable() and "\\" not in text and \
        unicodedata.normalize("NFC", text) == text else ascii(text)[1:-1]


def printable(text: str, one_line=False) -> str:
    """A student's text that cannot redraw a report (docs/instructors.md): each character that does
    not print escaped as Python would; newlines and tabs kept, unless one_line."""
    keep = "" if one_line else "\t"
    out = "\n".join(line if line.isprintable() else "".join(
        c if c.isprintable() or c in keep else ascii(c)[1:-1] for c in line)
        for line in text.split("\n"))
    return out.replace("\n", "\\n") if one_line else out


REPORT_WIDTH = 78  # columns at most of a report line that holds a student's text: none wraps


def quoted(text: str, indent: str) -> list:
    """Text that holds a student's, as report lines of its own, each `indent> ` first so that it
    starts none: printable, runs of spaces folded, REPORT_WIDTH columns at most (wide ones: 2)."""
    lines, line, room = [], "", REPORT_WIDTH - len(indent) - 2
    for c in re.sub(" {2,}", " ", printable(text, one_line=True)):
        if sum(1 + (unicodedata.east_asian_width(x) in "WFA") for x in line + c) > room:
            cut = line.rfind(" ") + 1 or len(line)  # after its last space, else here
            lines, line = lines + [line[:cut]], line[cut:]
        line += c
    return [f"{indent}> {piece}" for piece in lines + [line]]
