"""Writing a handout: a student copy with the exercises blank, the loops replaced by their recorded
outputs, and no answer; and the scan that checks a handout holds no solution, loop or answer."""

import ast
import contextlib
import json
import os
import re
import shutil

from . import written
from .bundle import MODULES, strip_selfcheck
from .exercises import SETS, names as exercise_names
from .grading import (HERE, HIDDEN, MAP_FILE, ROOT, SNAPSHOTS, TESTS, read, scheme, test_map,
                      write_to)
from .source import blank, code_part, functions, kept_statements, snapshot_tests, span

# what a handout holds: not the other solutions, nor the pages that quote the code; the
# bundle's course/ and this writer (written.py and exercises.py: stripped, in write_handout)
HANDOUT = ("tokencredit.py", TESTS, HIDDEN, "tests/conftest.py", "train_tiny.py", "tiny_task.py",
           "lab", "requirements.txt", ".ci/constraints.txt", "LICENSE", "docs/course.md",
           "docs/lab.md", "docs/credit.png", "docs/cscr-sweep.png", "results",
           *(f"course/{name}" for name in MODULES + ("handout.py",) if name != "written.py"))
LEFT_OUT = ("onestep.md", "test_translation.py", "tokencredit_trl", "test_trl_tokencredit.py",
            "tokencredit_verl", "test_verl_plugin.py", "verl.md", "bench", "test_bundle.py",
            "test_docs.py", "test_train_tiny.py", "speed.md", "translation.md", "trl.md",
            "paired-token.png", "README.md")
LAB_ANSWERS = (  # docs/lab.md's sections that answer a lab question: in the answers file only
    ("## Sample against token, seed by seed", 6),
    ("## Where does CSCR move credit?", 3),
)
DOC_EDITS = (  # a handout's pages stand on their own: what they say of the files it leaves out
    ("([onestep.md](onestep.md), `onestep.png`)",
     "(`python -m lab report results/readme.json` prints the one-step table)"),
    (" The lab's design is in\n[lab.md](lab.md), the one-step measurement in "
     "[onestep.md](onestep.md).",
     " The lab's design is in\n[lab.md](lab.md)."),
    ("README's results come from", "results tables come from"),
    ("the README's table)", "`python -m lab report results/readme.json`)"),
    ("another machine than the README's\ntables", "another machine than the results\ntables"),
)
HANDOUT_README = """# tokencredit: course handout ({set_name}: exercises {exercises})

The exercise sheet is docs/course.md. Write the functions of your exercises in tokencredit.py:
each keeps its signature, docstring and input checks, and raises NotImplementedError until you
write its body. The other functions are complete; read them, they use the same helpers.

    pip install -r requirements.txt -c .ci/constraints.txt   # Colab: leave out -c, keep its torch
    python -m course grade           # one line per exercise: tests passed, points
    python -m course grade -e 1      # one exercise, with the failing tests
    python train_tiny.py --quick     # your equations train the tiny model (exercises 1, 3, 5)

Answer the sheet's pencil and lab questions in written.txt, one `id: answer` per line, and hand
it in beside tokencredit.py; `python -m course grade` says which answers it cannot read.

At first every test of your exercises fails: that is the grader working. Do the exercises in
order: a test that also needs a later exercise you have not written waits for it. Where a test
compares with a plain loop, this copy compares with that loop's outputs recorded on the same
inputs (course_snapshots.json); tests/course/test_hidden.py runs here on seed 0. Your instructor's
grade runs each exercise beside the complete others, on inputs drawn from a seed of their own.

Left out of this copy, because they hold solutions: the answers of the sheet{answers_note},
test_translation.py (the same functions checked against verl's and TRL's formulas: your
instructor may run it), the TRL and verl bridges and their tests, bench (they call the complete
functions), the project's README and other docs (they quote the code), the plain-loop references
of the tests, and the git history. MIT licence: LICENSE.
"""


def strip_answers(sheet: str) -> tuple:
    """(the sheet without its <details> answers and its answered section, the answers)."""
    found = re.findall(r"\n<details>.*?</details>\n", sheet, flags=re.S)
    sheet = re.sub(r"\n<details>.*?</details>\n", "\n", sheet, flags=re.S)
    answered = r"\n## Try it yourself, answered\n.*?(?=\n## |\Z)"  # up to the next section
    found += re.findall(answered, sheet, flags=re.S)
    return re.sub(answered, "", sheet, flags=re.S), found


def strip_lab(page: str) -> tuple:
    """(docs/lab.md without the sections that answer a lab question, those sections)."""
    removed = []
    for title, question in LAB_ANSWERS:
        found = re.search(rf"\n{re.escape(title)}\n.*?(?=\n## |\Z)", page, flags=re.S)
        if found:
            removed.append(found.group(0))
            page = page.replace(found.group(0), f"\n{title}\n\nLeft out of the handout: it "
                                f"answers lab question {question} of the sheet.\n")
    return page, removed


def all_answers() -> list:
    _, found = strip_answers(read(os.path.join(ROOT, "docs", "course.md")))
    _, lab = strip_lab(read(os.path.join(ROOT, "docs", "lab.md")))
    return found + [f"\nFrom docs/lab.md:\n{block}" for block in lab] + [written.answers_block()]


def write_handout(out: str, set_name: str, answers: bool, reference: str) -> dict:
    """The handout of set_name in out; returns the map it carries: the official grade's, whose
    snapshots are the loops' outputs on the inputs the hidden set draws at seed 0."""
    exercises, mapping = SETS[set_name], test_map(reference)
    for name in HANDOUT:
        src, target = os.path.join(ROOT, name), os.path.join(out, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.isdir(src):
            shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, target)
    lab, _ = strip_lab(read(os.path.join(ROOT, "docs", "lab.md")))
    course = re.sub(r"\n<!-- instructors -->\n.*?\n<!-- /instructors -->\n", "\n",
                    read(os.path.join(ROOT, "docs", "course.md")), flags=re.S)
    files = {"tokencredit.py": blank(reference, exercises),
             TESTS: snapshot_tests(read(os.path.join(ROOT, TESTS)), SNAPSHOTS),
             "course/exercises.py": strip_selfcheck(read(os.path.join(HERE, "exercises.py"))),
             "course/written.py": strip_selfcheck(read(os.path.join(HERE, "written.py")),
                                                  ("QUESTIONS",)),
             written.FORM: written.blank_form(set_name, exercises),
             SNAPSHOTS: json.dumps(mapping["snapshots"]),
             MAP_FILE: json.dumps(dict(set=set_name, exercises=list(exercises),
                                       written=written.public(exercises),
                                       **{k: mapping[k] for k in ("fails", "tests", "kinds",
                                                                  "constants", "functions")}),
                                  indent=1),
             "docs/lab.md": lab,
             "docs/course.md": course if answers else strip_answers(course)[0],
             "README.md": HANDOUT_README.format(
                 set_name=set_name, exercises=", ".join(map(str, exercises)),
                 answers_note=" (this copy has them: made for self-study)" if answers else "")}
    for page in ("docs/course.md", "docs/lab.md"):  # what they say of the files left out
        for old, new in DOC_EDITS:
            files[page] = files[page].replace(old, new)
    for name, text in files.items():
        write_to(os.path.join(out, name), text)
    return mapping


def new_folder(out: str) -> None:
    """Stop unless `out` is a new or empty folder: a handout or a class is never written over."""
    if os.path.exists(out) and os.listdir(out):
        raise SystemExit(f"course: {out} exists and is not empty; name a new folder")


def cmd_handout(out: str, set_name: str, answers: bool) -> None:
    new_folder(out)
    reference = read(os.path.join(ROOT, "tokencredit.py"))
    plan = scheme(write_handout(out, set_name, answers, reference), SETS[set_name], in_order=True)
    print(f"wrote {out}: exercises {', '.join(map(str, SETS[set_name]))} blank in tokencredit.py; "
          f"{len({t for p in plan.values() for ts in p['functions'].values() for t in ts})} "
          f"graded tests; the sheet "
          + ("with its answers" if answers else "without its answers (`python -m course answers`)"))


def cmd_answers(out) -> None:
    found = all_answers()
    text = "# Answers to docs/course.md, for the instructor\n" + "".join(found)
    if out:
        write_to(out, text)
        print(f"wrote {out}: {len(found)} answers")
    else:
        print(text)


def solution_lines(reference: str, exercises) -> dict:
    """{line: function}: each code line of a blanked function's body (after what the blank
    keeps) that is long enough to say something and that no given function of the handout holds."""
    defs, names = functions(reference), [n for k in exercises for n in exercise_names(k)]
    given_lines = {code_part(ln) for ln in blank(reference, exercises).splitlines()}
    return {code: name for name in names
            for statement in defs[name].body[kept_statements(defs[name]):]
            for code in map(code_part, ast.get_source_segment(reference, statement).splitlines())
            if len(code) >= 16 and code not in given_lines}


def scan_handout(out: str, reference: str, exercises, answers: list) -> list:
    """What a handout must not hold: a solution line, a reference loop, an answer, a pointer to
    a file it leaves out. Returns the problems found."""
    problems, solution, texts = [], solution_lines(reference, exercises), {}
    for root, _, names in os.walk(out):
        for name in names:
            path = os.path.join(root, name)
            with contextlib.suppress(UnicodeDecodeError):  # a picture
                texts[os.path.relpath(path, out)] = read(path)
    ids = {q["id"] for q in written.questions(exercises)}
    given, _ = written.parse(texts.get(written.FORM, ""), ids)
    if set(given) != ids or any(answer for lines in given.values() for _, answer in lines):
        problems.append(f"{written.FORM} is not this set's blank form")
    if "\nQUESTIONS = ()  # left out" not in texts.get("course/written.py", ""):
        problems.append("course/written.py holds the written answers")
    tests, repo = ast.parse(texts[TESTS]), read(os.path.join(ROOT, TESTS))
    loops = [n for n in ast.parse(repo).body
             if isinstance(n, ast.FunctionDef) and n.name.startswith("ref_")]
    inside = {i for node in loops for i in range(*span(node))}  # the loops' line indices
    outside = {code_part(ln) for i, ln in enumerate(repo.splitlines()) if i not in inside}
    handout_lines = {code_part(ln) for ln in texts[TESTS].splitlines()}
    problems += [f"{TESTS} holds a line of the loop {node.name}: {code!r}" for node in loops
                 for code in map(code_part, ast.get_source_segment(repo, node).splitlines()[1:])
                 if len(code) >= 16 and code not in outside and code in handout_lines]
    for node in ast.walk(tests):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("ref_") and any(
                isinstance(n, (ast.For, ast.While, ast.comprehension)) for n in ast.walk(node)):
            problems.append(f"{TESTS}: {node.name} still loops")
    for name, text in texts.items():
        problems += [f"{name} holds a line of {function}'s solution: {line!r}"
                     for line, function in solution.items() if line in text]
        problems += [f"{name} holds an answer line: {line.strip()[:60]!r}"
                     for block in answers for line in block.splitlines()
                     if len(line.strip()) >= 30 and line.strip() in text
                     and not line.startswith(("python -m lab", "```", "|---", "## "))]
        # the handout's README names what it leaves out, course/ lists it, and the tests'
        # comments may cite the project's README: they are code, not a page to follow
        if name in ("README.md", TESTS, HIDDEN) or name.startswith("course/") or \
                not name.endswith((".md", ".py", ".txt")):
            continue
        for left in LEFT_OUT:
            word = "README" if left == "README.md" else os.path.basename(left)
            for said in re.findall(rf"[^\n]*\b{re.escape(word)}\b[^\n]*", text):
                problems.append(f"{name} points to {left}, left out: {said.strip()[:70]!r}")
        if name.startswith("docs/"):
            for link in re.findall(r"\]\(([^)#]+)", text):
                if not link.startswith("http") and not os.path.exists(
                        os.path.join(out, "docs", link)):
                    problems.append(f"{name} links to {link}, not in the handout")
    return problems
