"""What a grade says: one line per exercise, the failing tests with the student's file and line,
and Gradescope's results.json. The same rows make all three."""

from . import written
from .exercises import EXERCISES
from .grading import blocker

SHOWN = 12  # failing tests, and waiting tests, listed per exercise


def notes(row: dict, error=True) -> list:
    out = []
    if row["blank"]:
        out.append("not written yet: " + ", ".join(row["blank"]))
    if error and row.get("error"):  # it may hold a student's text
        out.append(row["error"].splitlines()[0][:200])
    if row["waiting"]:
        n = len(row["waiting"])
        out.append(f"{n} more test{'s' * (n > 1)} wait{'s' * (n == 1)} on exercise "
                   + ", ".join(map(str, sorted(set(row["waiting"].values())))))
    come = row.get("may_come_from", {})
    if come:
        js = sorted({j for v in come.values() for j in v})
        out.append(f"{len(come)} failing test{'s' * (len(come) > 1)} may come from exercise "
                   + ", ".join(map(str, js)) + f"; the official grade grades {row['k']} alone")
    return out + row["notes"]


def details(row: dict, shown=SHOWN) -> list:
    lines = []
    if len(row["per_function"]) > 1 or row["failed"]:
        lines.append("    " + ", ".join(f"{n} {p}/{t} tests {got:g}/{share:g} points"
                                        for n, (p, t, got, share) in row["per_function"].items()))
    listed = [(t, f) for t, f in row["failed"].items()  # not those of a function not written yet
              if not (row["blank"] and blocker(f) == row["k"])]
    for test, failure in listed[:shown]:
        lines.append(f"    FAILED {test}")
        lines += [q for ln in failure.splitlines()[:14]
                  for q in written.quoted(ln[:400], " " * 8)]
        if test in row.get("may_come_from", {}):
            js = ", ".join(map(str, row["may_come_from"][test]))
            lines.append(f"        may come from exercise {js}; the official grade grades "
                         f"{row['k']} alone")
    if len(listed) > shown:
        lines.append(f"    ... and {len(listed) - shown} more failed tests")
    for test, j in list(row["waiting"].items())[:shown]:
        lines.append(f"    {test}: waiting on exercise {j}")
    if len(row["waiting"]) > shown:
        lines.append(f"    ... and {len(row['waiting']) - shown} more waiting tests")
    return lines


def format_rows(rows: list, verbose: bool) -> str:
    lines = []
    for row in rows:
        said = notes(row, error=False)  # the grader's; the error on lines of its own
        lines.append(f"exercise {row['k']}  {EXERCISES[row['k']][0]:<20} "
                     f"{row['passed']:3d}/{row['total']:<3d} tests {row['points']:5.1f}/"
                     f"{row['max']:g} points" + ("  " + "; ".join(said) if said else ""))
        lines += written.quoted(row["error"].splitlines()[0][:200], "    ") if row.get(
            "error") else []
        if verbose:
            lines += details(row)
    errors = ", ".join(str(r["k"]) for r in rows if r["grader"])
    lines.append(f"total: none, a grader error (exercise {errors}): grade the file again"
                 if errors else f"total {total(rows):.1f}/{sum(r['max'] for r in rows):g} points")
    return "\n".join(lines)


def total(rows: list):
    """The file's points, or None while the grader failed (twice: `Driver.done`) on an exercise."""
    return None if any(r["grader"] for r in rows) else sum(r["points"] for r in rows)


def flag_lines(flags: list) -> list:
    return ["FLAGGED for the instructor:"] * bool(flags) + [
        line for flag in flags for line in written.quoted(flag, "    ")]


def gradescope(rows: list, flags=(), answers=None):
    """Gradescope's results.json: one entry per exercise, then the written form's (`answers`:
    its rows and problems, course/written.py); None while the file has no total."""
    if total(rows) is None:
        return None
    tests = [dict(name=f"exercise {row['k']}: {EXERCISES[row['k']][0]}", score=row["points"],
                  max_score=row["max"], visibility="visible", output="\n".join(
                      [f"{row['passed']}/{row['total']} tests passed"] + notes(row) + details(row)))
             for row in rows]
    tests += written.gradescope_tests(*answers) if answers else []
    for test in tests:  # a student's text, escaped where it would not print
        test["output"] = written.printable(test.get("output", ""))
    out = dict(score=round(sum(t.get("score", 0) for t in tests), 2), tests=tests)
    if flags:
        out["output"] = "\n".join(flag_lines(flags))
    return out
