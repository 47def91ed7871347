"""Course mode: tokencredit.py's equations as exercises, and a grader no submission can fool.

`python -m course --help` lists the commands; docs/course.md and docs/instructors.md say how a
grade is made. The grader: course/grading.py (the driver and the sandboxes), course/judge.py
(the tests, in a process that never runs a student's code), course/child.py (one exercise).
"""

import argparse
import csv
import hashlib
import importlib
import json
import os
import random
import re
import sys
import time
import traceback
from urllib.parse import quote

from . import grading, report, written
from .exercises import EXERCISES, SETS, names as exercise_names, points as exercise_points
from .grading import (BUNDLE_FILE, LIMITS, MAP_FILE, ROOT, Grader, course_secret, flag_row,
                      grade_submission, read, test_map, zero_rows)
from .submission import read_student, students_of
from .written import shown


def setting(set_name=None, seed=None) -> dict:
    """Where this kit sits: a handout (its own map, seed 0, no reference), a Gradescope bundle (its
    own set, secret and map) or the repository (the reference; a seed per file, or --seed's)."""
    if os.path.exists(os.path.join(ROOT, MAP_FILE)):
        saved = json.loads(read(os.path.join(ROOT, MAP_FILE)))
        return dict(reference=None, mapping=saved, exercises=saved["exercises"],
                    set=saved["set"], seed=0, limits={})
    reference, config = read(os.path.join(ROOT, "tokencredit.py")), dict(set=set_name or "all")
    if os.path.exists(os.path.join(ROOT, BUNDLE_FILE)):
        config = json.loads(read(os.path.join(ROOT, BUNDLE_FILE)))
    else:
        config.update(seed=seed, secret=course_secret() if seed is None else None)
    return dict(reference=reference, mapping=test_map(reference), set=config["set"],
                exercises=list(SETS[config["set"]]), seed=config.get("seed"),
                limits=config.get("limits", {}), secret=config.get("secret"))


def limits_of(args) -> dict:
    return {name: getattr(args, name) for name in LIMITS if getattr(args, name, None) is not None}


def cmd_grade(args) -> None:
    started = time.monotonic()
    path = args.path or os.path.join(ROOT, "tokencredit.py")
    where = setting(args.set, args.seed)
    if args.only and not set(args.only) <= set(where["exercises"]):
        raise SystemExit(f"course: exercises {args.only} asked for, this set has "
                         f"{where['exercises']}")
    student = read_student(None, os.path.abspath(path), form_beside=True)  # read once, here
    grader = Grader(where["reference"], where["mapping"], where["exercises"], where["seed"],
                    dict(where["limits"], **limits_of(args)), secret=where.get("secret"))
    try:
        rows, flags = grade_submission(grader, student, args.only, args.strict)
    finally:
        grader.close()
    seed = grader.seed_for(student["source"]) if "source" in student else where["seed"]
    official = bool(where["reference"])  # else a handout's grade, whose map has no values
    if official:  # an official grade says what isolated the code
        print(grader.sandbox_line())
    print(f"grading {shown(os.path.abspath(path))}, set {where['set']}, "
          + ("each exercise beside the reference's others, on fresh inputs (seed "
             f"{seed}, this file's; --seed {seed} grades other files on the same inputs)"
             if official else "the file whole, exercises in order"))
    for line in report.flag_lines(flags):
        print(line)
    print(report.format_rows(rows, args.verbose or bool(args.only)))
    table = None if official else where["mapping"].get("written", [])  # a handout's: no values
    answers = written.grade(student["form"], args.only or where["exercises"], table)
    for line in written.lines(*answers, instructor=official):
        print(line)
    print(f"({time.monotonic() - started:.1f} s)")
    results = report.gradescope(rows, flags, answers if official else None)
    if args.gradescope and results is not None:  # a grader error: no total, no results.json
        with open(args.gradescope, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.gradescope}")


def cell(value) -> str:
    """A CSV cell that a spreadsheet shows as text: never a formula (=, +, -, @), one line, each
    character that does not print escaped."""
    text = written.printable(str(value), one_line=True)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def folder_of(out: str, name: bytes) -> str:
    """OUT/NAME for a student's results.json: NAME percent-quoted (no /, no leading dot), a long
    one cut and told apart by its hash."""
    safe = quote(name, safe="") or "%"
    if len(safe) > 200:  # a file name may have 255 bytes
        safe = safe[:180] + "-" + hashlib.sha256(name).hexdigest()[:16]  # bytes: not UTF-8?
    return os.path.join(out, "%2E" + safe[1:] if safe[0] == "." else safe)


def cmd_grade_all(args) -> None:
    started = time.monotonic()
    if args.set is None and not any(os.path.exists(os.path.join(ROOT, f))
                                    for f in (MAP_FILE, BUNDLE_FILE)):
        raise SystemExit("course: grade-all needs --set (grpo, dapo, cscr or all): a class's "
                         "files hold the reference's code outside their set, which would score")
    where = setting(args.set, args.seed)
    if where["reference"] is None:
        raise SystemExit("course: grade a class from the repository (or a bundle), not from a "
                         "handout")
    grader = Grader(where["reference"], where["mapping"], where["exercises"], where["seed"],
                    limits_of(args), secret=where.get("secret"))
    top = os.open(args.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # read from, held
    students = students_of(top)  # names only: the judges start before any file is read
    order = students[::-1] if args.order == "reverse" else list(students)
    if args.order == "random":
        random.shuffle(order)
    graded, seeds, files = {}, {}, {}  # seeds: each student's; files: by inode
    try:
        grader.start(jobs=len(students) * len(where["exercises"]))  # and their sandboxes, 4 ahead
        if grader.sandbox() is None and not args.no_sandbox_ok:
            raise SystemExit(f"course: {grading.NO_SANDBOX}. grade-all refuses: install "
                             "bubblewrap (and allow user namespaces), or pass --no-sandbox-ok to "
                             "grade anyway (docs/instructors.md says what is then unprotected)")
        if os.path.exists(args.csv):
            os.remove(args.csv)  # a stopped run leaves no old file that looks new
        for name, entry, why in order:  # each read once, as it stands, just before its grade
            student = dict(why=why, form=(None, written.NO_FORM)) if why else \
                read_student(top, entry)
            answers = written.grade(student["form"], where["exercises"])
            if "source" in student:  # the inode read: a hard link (a tar can make one)
                files.setdefault(student["inode"], []).append(name)
                seeds[name] = grader.seed_for(student["source"])
            try:
                rows, flags = grade_submission(grader, student, strict=args.strict)
            except Exception as error:  # noqa: BLE001 -- the grader's own failure: the rest go on
                print(written.printable(traceback.format_exc()), file=sys.stderr)
                flags, rows = [], zero_rows(where["exercises"], f"{type(error).__name__}, the "
                                            "error above", grader=True)
            graded[name] = (rows, flags, answers)
    finally:
        grader.close()  # every process of every submission is gone before a grade is written
        os.close(top)
    for names in (n for n in files.values() if len(n) > 1):  # hard links (a tar can make them):
        for name in names:  # which name's file it is, you say; no row loses its points for it
            rows, flags, _ = graded[name]
            flag_row(rows, [] if flags else [name], args.strict)  # its "0 until reviewed" once
            flags.append("the same file as " + ", ".join(shown(n) for n in names if n != name)
                         + " (a hard link): whose is it?")
    sandbox = "bubblewrap" if grader.sandbox() else "none"
    tmp = args.csv + ".tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["student", "set", "seed"] + [f"exercise {k}" for k in where["exercises"]]
                     + ["total", "max"] + written.csv_header(where["exercises"])
                     + ["flags", "notes", "sandbox"])
        for name, _, _ in students:
            rows, flags, answers = graded[name]
            said = "; ".join(f"exercise {r['k']}: {n}" for r in rows for n in report.notes(r))
            total = report.total(rows)  # None: a grader error, no total until graded again
            out.writerow([cell(x) for x in [shown(name), where["set"], seeds.get(name, "")]
                          + ["grader error" if r["grader"] else f"{r['points']:.2f}" for r in rows]
                          + ["grader error" if total is None else f"{total:.2f}",
                             f"{sum(r['max'] for r in rows):g}"] + written.csv_cells(*answers)
                          + ["; ".join(flags), said, sandbox]])
            results = report.gradescope(rows, flags, answers)
            if args.gradescope_dir and results is not None:
                place = folder_of(args.gradescope_dir, name)
                os.makedirs(place, exist_ok=True)
                with open(os.path.join(place, "results.json"), "w") as g:
                    json.dump(results, g, indent=1)
    os.replace(tmp, args.csv)
    print(f"graded {len(students)} submissions (set {where['set']}, "
          + (f"seed {where['seed']}" if where["seed"] is not None else "each file's own seed")
          + f") in {time.monotonic() - started:.1f} s: wrote {args.csv}"
          + (f" and {args.gradescope_dir}/STUDENT/results.json" if args.gradescope_dir else "")
          + f"\n{grader.sandbox_line()}")
    failed = [shown(name) for name, _, _ in students if report.total(graded[name][0]) is None]
    if failed:
        raise SystemExit(f"course: a grader error on {len(failed)} files (the CSV says which "
                         f"exercises; no total): grade them again: {', '.join(failed)}")


def cmd_list(args) -> None:
    where = setting(args.set, 0)
    plan = grading.scheme(where["mapping"], where["exercises"], False)
    print("points: each function's share of its exercise (course/exercises.py, EXERCISES)")
    for k in where["exercises"]:
        print(f"exercise {k}: {EXERCISES[k][0]}, {exercise_points(k):g} points")
        for name in exercise_names(k):
            tests = plan[k]["functions"][name]
            kinds = [where["mapping"]["kinds"].get(t, "other") for t in tests]
            counts = ", ".join(f"{kinds.count(x)} {x}" for x in ("hand", "loop", "fresh", "other")
                               if kinds.count(x))
            print(f"  {name}: {EXERCISES[k][1][name]:g} points, {len(tests)} tests ({counts})")
            for test in tests if args.verbose else ():
                print(f"      {test}")


def cmd_plants(args) -> None:
    from .exercises import CORRECT, ENDLESS, MISTAKES
    from .handout import new_folder
    from .source import apply_edits
    new_folder(args.dir)
    os.makedirs(args.dir, exist_ok=True)
    reference, plants = read(os.path.join(ROOT, "tokencredit.py")), MISTAKES + CORRECT + (ENDLESS,)
    for i, (k, what, edits) in enumerate(plants, 1):
        slug = re.sub(r"[^a-z0-9]+", "-", what.lower().replace(">", "above")).strip("-")
        with open(os.path.join(args.dir, f"{i:02d}-ex{k}-{slug[:40]}.py"), "w") as f:
            f.write(apply_edits(reference, edits))
    print(f"wrote {len(plants)} submissions to {args.dir}: {len(MISTAKES)} planted mistakes, "
          f"{len(CORRECT)} other correct solutions, 1 endless loop (exercise {ENDLESS[0]}); "
          f"the file name says which exercise each should cost")


def later(module: str):
    """course/MODULE, imported when its command runs: a handout or a bundle lacks some."""
    return importlib.import_module(f".{module}", __package__)


def add_seed_and_limits(parser) -> None:
    parser.add_argument("--seed", type=int, help="the fresh inputs' seed, one for every file "
                        "(default: each file's own, from COURSE_SECRET)")
    parser.add_argument("--time-limit", type=float, dest="time_s", metavar="S",
                        help=f"seconds per exercise (default {LIMITS['time_s']:g})")
    parser.add_argument("--memory-limit", type=int, dest="memory_mb", metavar="MB",
                        help=f"memory per exercise beyond torch's (default {LIMITS['memory_mb']})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m course", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="The exercise sheet: docs/course.md")
    commands = parser.add_subparsers(dest="command", required=True)
    sets = "; ".join(f"{name} = {', '.join(map(str, ks))}" for name, ks in SETS.items())
    handout = commands.add_parser("handout", help="write a student copy with the exercises blank "
                                  "and the blank answer form written.txt")
    handout.add_argument("dir", help="a new or empty folder")
    handout.add_argument("--set", default="all", choices=SETS, help="which exercises: " + sets)
    handout.add_argument("--answers", action="store_true",
                         help="keep the sheet's answers (self-study); by default they are left out")
    handout.set_defaults(run=lambda a: later("handout").cmd_handout(a.dir, a.set, a.answers))
    grade = commands.add_parser("grade", help="grade a tokencredit.py, one line per exercise, "
                                "and the written.txt beside it")
    grade.add_argument("path", nargs="?", help="the student's tokencredit.py, or a folder holding "
                       "it and written.txt (default: the one beside course/)")
    grade.add_argument("--set", choices=SETS, help="grade only this set's exercises (default: "
                       "the handout's, else all); never read from the submission")
    grade.add_argument("-e", "--exercise", type=int, action="append", dest="only",
                       help="only this exercise, with its failing tests (repeatable)")
    grade.add_argument("-v", "--verbose", action="store_true", help="list the failing tests")
    grade.add_argument("--gradescope", metavar="FILE", help="also write Gradescope's results.json")
    grade.add_argument("--strict", action="store_true", help="a flagged submission gets 0")
    add_seed_and_limits(grade)
    grade.set_defaults(run=cmd_grade)
    class_ = commands.add_parser("grade-all", help="grade a folder of submissions into one CSV")
    class_.add_argument("dir", help="one tokencredit.py per student: STUDENT.py or STUDENT/ (with "
                        "written.txt)")
    class_.add_argument("--set", choices=SETS, help="which exercises (needed in the repository; "
                        "a handout or a bundle knows its own)")
    class_.add_argument("--csv", metavar="FILE", default="grades.csv", help="default grades.csv")
    class_.add_argument("--gradescope-dir", metavar="OUT",
                        help="also write OUT/STUDENT/results.json")
    class_.add_argument("--strict", action="store_true", help="a flagged submission gets 0")
    class_.add_argument("--order", choices=("name", "reverse", "random"), default="name",
                        help="the order students are graded in (the CSV is always by name)")
    class_.add_argument("--no-sandbox-ok", action="store_true", help="grade even where no "
                        "sandbox can run (students can then reach each other: docs/instructors.md)")
    add_seed_and_limits(class_)
    class_.set_defaults(run=cmd_grade_all)
    bundle = commands.add_parser("gradescope", help="write a Gradescope autograder bundle (.zip)")
    bundle.add_argument("out", help="the .zip to write")
    bundle.add_argument("--set", required=True, choices=SETS, help=sets)
    bundle.add_argument("--no-sandbox-ok", action="store_true", help="grade even on an image "
                        "where no sandbox can run (a student's code could write its results.json)")
    add_seed_and_limits(bundle)
    bundle.set_defaults(run=lambda a: later("bundle").cmd_gradescope(
        a.out, a.set, a.seed, limits_of(a), a.no_sandbox_ok))
    auto = commands.add_parser("autograde", help="in a bundle: what run_autograder runs")
    auto.add_argument("--root", default="/autograder")
    auto.set_defaults(run=lambda a: later("bundle").cmd_autograde(a.root))
    list_ = commands.add_parser("list", help="the points table and each function's tests")
    list_.add_argument("--set", choices=SETS)
    list_.add_argument("-v", "--verbose", action="store_true", help="name each test")
    list_.set_defaults(run=cmd_list)
    plants = commands.add_parser("plants", help="write selfcheck's planted mistakes as a class "
                                 "to grade (try grade-all on it)")
    plants.add_argument("dir", help="a new or empty folder")
    plants.set_defaults(run=cmd_plants)
    answers = commands.add_parser("answers", help="the sheet's answers, the written form's values "
                                  "and rubrics (left out of a handout)")
    answers.add_argument("file", nargs="?", help="write them here (default: print them)")
    answers.set_defaults(run=lambda a: later("handout").cmd_answers(a.file))
    commands.add_parser("selfcheck", help="check the grader: reference, blank, planted mistakes, "
                        "handouts").set_defaults(run=lambda a: later("selfcheck").cmd_selfcheck())
    commands.add_parser("notebook", help="write course/notebook.ipynb from course/notebook.py"
                        ).set_defaults(run=lambda a: later("ipynb").cmd_notebook())
    args = parser.parse_args(argv)
    repo_only = ("handout", "plants", "selfcheck", "notebook", "gradescope")
    in_repository = os.path.exists(os.path.join(ROOT, "course", "selfcheck.py"))  # no handout's
    if args.command in repo_only and not in_repository:
        raise SystemExit(f"course: {args.command} is the instructors'; run it in the repository")
    args.run(args)


if __name__ == "__main__":
    main()
