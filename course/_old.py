"""Course mode: tokencredit.py's equations as exercises, and a grader that checks itself.

  python course.py handout DIR [--set NAME] [--answers]    a student copy with the exercises blank
  python course.py grade [PATH] [--set NAME] [-e K] [--gradescope FILE]   one line per exercise
  python course.py grade-all DIR [--set NAME] [--csv FILE] [--gradescope-dir OUT]   a class
  python course.py gradescope OUT.zip --set NAME           a Gradescope autograder bundle
  python course.py list [--set NAME]                       each exercise's functions and tests
  python course.py plants DIR                              selfcheck's plants as a class to grade
  python course.py answers [FILE]                          the sheet's answers, for the instructor
  python course.py selfcheck                               the grader's own checks (CI runs it)

The sheet is docs/course.md. A blank keeps the function's signature, docstring and leading input
checks (`_check_*`); the rest of the body becomes raise NotImplementedError("exercise k: name").
The tests are test_tokencredit.py's. A function's tests are computed, not listed by hand: those
that fail when only that function is blank (the test map, computed once and kept in .course-cache
while tokencredit.py, the tests and the exercises are unchanged). Points: each exercise's points
are shared equally by its functions, and a function's share equally by its tests.

Where this file sits beside the complete tokencredit.py (the repository), `grade PATH` grades each
exercise as the reference with the student's functions of that exercise (and the student's own
imports, constants and helpers), so one mistake costs one exercise, each in its own time limit.
In a handout there is no reference: the student's file runs whole, an exercise is graded on the
tests that need it and no later exercise of the set, and the plain-loop references of the tests
are replaced by their recorded outputs (course_snapshots.json).
"""

import argparse
import ast
import csv
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = "test_tokencredit.py"
MAP_FILE = "course_map.json"  # written into a handout: its set, exercises and their tests
SNAPSHOTS = "course_snapshots.json"  # written into a handout: the plain loops' recorded outputs
BUNDLE_FILE = "course_autograder.json"  # written into a Gradescope bundle: its set
CACHE = os.path.join(HERE, ".course-cache")
MAP_VERSION = 2  # bump when the way the map is computed changes
TEST_LIMIT = 10.0  # seconds one test may run before it fails as out of time
EXERCISE_LIMIT = 120.0  # seconds one exercise's tests may run before the exercise gets 0

EXERCISES = {  # k: (title, the functions to write, points), in the README's order
    1: ("advantages", ("group_advantages", "overlong_penalty"), 10),
    2: ("dynamic sampling", ("informative_groups", "fill_batch"), 10),
    3: ("surrogate and clip", ("policy_gradient_surrogate", "importance_ratio",
                               "clipped_surrogate"), 10),
    4: ("KL", ("kl_k3",), 10),
    5: ("aggregation", ("loss_denominators", "token_weights", "aggregate", "policy_loss"), 10),
    6: ("GSPO", ("sequence_ratio",), 10),
    7: ("CSCR", ("counterfactual_shifts", "counterfactual_sensitivity", "cscr_weights",
                 "token_advantages"), 10),
    8: ("entropy mask", ("high_entropy_mask",), 10),
}
SETS = {"grpo": (1, 3, 5), "dapo": (1, 2, 3, 5), "cscr": (1, 3, 5, 7), "all": tuple(EXERCISES)}
EXERCISE_OF = {name: k for k, (_, names, _) in EXERCISES.items() for name in names}

# selfcheck's plants, edits of tokencredit.py: (exercise, what, ((text, replaced by), ...)).
# They quote the reference, so a handout's course.py carries neither tuple.
MISTAKES = (
    (1, "sign flip", (("centred = rewards - rewards.mean(dim=1, keepdim=True)",
                       "centred = rewards.mean(dim=1, keepdim=True) - rewards"),)),
    (1, "population std", (("rewards.std(dim=1, keepdim=True)",
                            "rewards.std(dim=1, keepdim=True, correction=0)"),)),
    (1, "RLOO without G / (G - 1)", (("centred = centred * (G / (G - 1))", "centred = centred"),)),
    (2, "keeps the surplus", (("keep.nonzero().squeeze(1)[: batch_size - n_kept]",
                               "keep.nonzero().squeeze(1)"),)),
    (3, "clip bounds swapped", (("torch.clamp(ratio, 1 - eps_low, 1 + eps_high)",
                                 "torch.clamp(ratio, 1 - eps_high, 1 + eps_low)"),)),
    (4, "k1 instead of k3", (("return torch.expm1(log_ratio) - log_ratio",
                              "return -log_ratio"),)),
    (5, '"sample" without N', (("return N * lengths.clamp(min=1)",
                                "return lengths.clamp(min=1)"),)),
    (5, "KL subtracted", (("per_token = per_token + beta * kl",
                           "per_token = per_token - beta * kl"),)),
    (6, "GSPO sum, not mean", (("log_s = log_ratio.sum(dim=-1, keepdim=True) / lengths",
                                "log_s = log_ratio.sum(dim=-1, keepdim=True)"),)),
    (7, "CSCR without renormalisation", (
        ("weights = lengths * w / w.sum(dim=-1, keepdim=True)",
         "weights = torch.exp(-strength * torch.clamp(sensitivity.float() - threshold, min=0))"),)),
    (7, "sensitivity without abs", (("torch.maximum(d_pos.abs(), d_neg.abs())",
                                     "torch.maximum(d_pos, d_neg)"),)),
    (8, "keeps the lowest entropies", (("torch.quantile(real, 1 - top_fraction)",
                                        "torch.quantile(real, top_fraction)"),)),
    # issue 29's real mistakes that passed every test before
    (2, "informative_groups as std > 0", (("return (values != values[:, :1]).any(dim=1)",
                                           "return values.float().std(dim=1) > 0"),)),
    (4, "k3 clamped at 10", (("return torch.expm1(log_ratio) - log_ratio",
                              "return torch.clamp(torch.expm1(log_ratio) - log_ratio, max=10)"),)),
    (6, "sequence_ratio in the input dtype", (
        ("dtype = torch.promote_types(logp.dtype, torch.float32)", "dtype = logp.dtype"),)),
    (8, "high_entropy_mask returning bool", (
        ("return (mask & (entropy.float() >= threshold)).float()",
         "return mask & (entropy.float() >= threshold)"),)),
    (8, "no fallback past torch.quantile's 2^24 limit", (
        ("if real.numel() <= 2 ** 24:", "if True:"),)),
)
CORRECT = (  # other correct solutions, each at full marks: (exercise, what, edits)
    (1, "a module-level constant", (
        ('SURROGATES = ("clip", "reinforce")\n',
         'SURROGATES = ("clip", "reinforce")\nOVERLONG_FLOOR = -1.0  # the penalty past max_len\n'),
        ("torch.full_like(lengths, -1.0)", "torch.full_like(lengths, OVERLONG_FLOOR)"))),
    (6, "a @torch.no_grad() helper for the stop-gradient", (
        ("def sequence_ratio(", "@torch.no_grad()\ndef _constant(x):\n    return x.clone()\n\n\n"
         "def sequence_ratio("),
        ("log_ratio = torch.where(mask, logp - old_logp.detach(), 0.0).to(dtype)",
         "log_ratio = torch.where(mask, logp - _constant(old_logp), 0.0).to(dtype)"),
        ("log_s = torch.where(mask, logp - logp.detach(), 0.0) + log_s.detach()",
         "log_s = torch.where(mask, logp - _constant(logp), 0.0) + _constant(log_s)"))),
)
ENDLESS = (2, "an endless loop in fill_batch", (
    ("while n_kept < batch_size and rounds < max_rounds:", "while True:"),))

# what a handout holds: not the other solutions, nor onestep.md (lab questions 1, 2): below
HANDOUT = ("tokencredit.py", TESTS, "train_tiny.py", "tiny_task.py", "lab", "course.py",
           "requirements.txt", "LICENSE", "docs/course.md", "docs/lab.md", "docs/credit.png",
           "docs/paired-token.png", "results")
LEFT_OUT = ("onestep.md", "tests/test_hidden.py", "tests/test_translation.py", "trl_bridge",
            "tests/test_trl_tokencredit.py", "bench", "test_course.py", "tests/test_docs.py",
            "tests/test_train_tiny.py", "docs/speed.md",
            "docs/translation.md", "docs/trl.md", "README.md")
DOC_EDITS = (  # a handout's pages stand on their own: what they say of the files it leaves out
    ("in the order the README tells it:", "in this order:"),
    ("([onestep.md](onestep.md), `onestep.png`)",
     "(`python lab.py report results/readme.json` prints the one-step table)"),
    (" The lab's design is in\n[lab.md](lab.md), the one-step measurement in "
     "[onestep.md](onestep.md).",
     " The lab's design is in\n[lab.md](lab.md)."),
    ("README's results come from", "results tables come from"),
    ("(see the README)", "(`python train_tiny.py --help` lists them)"),
    ("The results tables are in the README.",
     "The results tables: `python lab.py report results/readme.json`."),
    ("the README's table)", "`python lab.py report results/readme.json`)"),
    ("The token weights of the README's section 4 are",
     "The token weights of `loss_denominators` (exercise 5 of the sheet) are"),
    ("from the README's\nrun", "from the lab's\nrun"),
    ("the results and the\none-knob table in the README and [lab.md](lab.md).",
     "the results and the\none-knob tables of `python lab.py report results/*.json` and "
     "[lab.md](lab.md)."),
    ('Our answers to items 1 and 6 of the README\'s "Try it yourself":',
     "Two more questions, answered:"),
    ("another machine than the README's\ntables", "another machine than the results\ntables"),
    (' (docs/speed.md, "On a GPU")', " (pytorch.org lists them)"),
    ("the `grpo` row of the README's results table reads",
     "the `grpo` row of `python lab.py report results/readme.json` reads"),
)
HANDOUT_README = """# tokencredit: course handout ({set_name}: exercises {exercises})

The exercise sheet is docs/course.md. Write the functions of your exercises in tokencredit.py:
each keeps its signature, docstring and input checks, and raises NotImplementedError until you
write its body. The other functions are complete; read them, they use the same helpers.

    pip install -r requirements.txt
    python course.py grade           # one line per exercise: tests passed, points
    python course.py grade -e 1      # one exercise, with the failing tests
    python train_tiny.py --quick     # your equations train the tiny model (exercises 1, 3, 5)

At first every test of your exercises fails: that is the grader working. Do the exercises in
order: an exercise is graded on the tests that need it and no later exercise, so a correct one
gets full marks while the later ones are blank. Where a test compares with a plain loop, this
copy compares with that loop's outputs recorded on the same inputs (course_snapshots.json).

Left out of this copy, because they hold solutions: the answers of the sheet{answers_note},
test_translation.py (the same functions checked against verl's and TRL's formulas: your
instructor may run it as a hidden set), trl_tokencredit.py and its tests, bench.py (they call the
complete functions), the project's README and other docs (they quote the code), the plain-loop
references of the tests, and the git history. MIT licence: LICENSE.
"""


# -----------------------------------------------------------------------------
# blanks and substitutions, by ast: tokencredit.py carries no markers

def functions(source: str) -> dict:
    return {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}


def is_check(statement) -> bool:
    """`_check_x(...)`, `y = _check_x(...)`, or an `if` that holds only checks: kept in a blank."""
    if isinstance(statement, ast.If):
        return not statement.orelse and all(is_check(s) for s in statement.body)
    value = getattr(statement, "value", None)
    return (isinstance(statement, (ast.Expr, ast.Assign)) and isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name) and value.func.id.startswith("_check"))


def kept_statements(node) -> int:
    """How many statements a blank keeps: the docstring, then the leading checks."""
    body = node.body
    keep = int(isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant))
    while keep < len(body) - 1 and is_check(body[keep]):
        keep += 1
    return keep


def blank(source: str, exercises=(), names=()) -> str:
    """source with each function of the exercises (and each of `names`) blank: its body, after
    its docstring and leading checks, replaced by raise NotImplementedError("exercise k: name")."""
    lines, defs, edits = source.splitlines(keepends=True), functions(source), []
    for name in [n for k in exercises for n in EXERCISES[k][1]] + list(names):
        body, keep = defs[name].body, kept_statements(defs[name])
        indent = " " * body[keep].col_offset
        edits.append((body[keep - 1].end_lineno if keep else body[0].lineno - 1,
                       body[-1].end_lineno,
                       f'{indent}raise NotImplementedError("exercise {EXERCISE_OF[name]}: '
                       f'{name}")\n'))
    for after, last, text in sorted(set(edits), reverse=True):
        lines[after:last] = [text]
    return "".join(lines)


def span(node) -> tuple:
    """(first line index, end line) of a statement, its decorators included."""
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1, \
        node.end_lineno


def bound_names(node) -> set:
    """The module-level names a statement defines."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = {ast.Assign: lambda n: n.targets, ast.AnnAssign: lambda n: [n.target],
               ast.AugAssign: lambda n: [n.target]}.get(type(node), lambda n: [])(node)
    return {t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)}


def substitute(reference: str, student: str, names) -> str:
    """The reference with the functions `names` taken from the student's file, and with the
    student's own imports, module-level names and helpers (decorators included) that the
    reference lacks: one exercise graded on its own."""
    ref_tree, stu_tree = ast.parse(reference), ast.parse(student)
    ref, stu = functions(reference), functions(student)
    missing = [name for name in names if name not in stu]
    if missing:
        raise ValueError(f"the student's file defines no {', '.join(missing)}")
    lines, stu_lines = reference.splitlines(keepends=True), student.splitlines(keepends=True)
    for name in sorted(names, key=lambda n: ref[n].lineno, reverse=True):
        (a, b), (c, d) = span(ref[name]), span(stu[name])
        lines[a:b] = stu_lines[c:d]
    known = set().union(*(bound_names(node) for node in ref_tree.body))
    ref_imports = {ast.dump(n) for n in ref_tree.body
                   if isinstance(n, (ast.Import, ast.ImportFrom))}
    imports, definitions = [], []
    for node in stu_tree.body:
        a, b = span(node)
        text = "".join(stu_lines[a:b])
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if ast.dump(node) not in ref_imports:
                imports.append(text)
        elif bound_names(node) - known:
            definitions.append(text + "\n\n")
    if not (imports or definitions):
        return "".join(lines)
    first_def = min(span(n)[0] for n in ref_tree.body if isinstance(n, ast.FunctionDef))
    last_import = max((n.end_lineno for n in ref_tree.body
                       if isinstance(n, (ast.Import, ast.ImportFrom))), default=0)
    lines[first_def:first_def] = ["# the student's own module-level names\n"] + definitions
    lines[last_import:last_import] = imports
    return "".join(lines)


def apply_edits(source: str, edits) -> str:
    """source with each (text, replacement) made once; the text must be there exactly once."""
    for text, replacement in edits:
        if source.count(text) != 1:
            raise ValueError(f"{text!r} is {source.count(text)} times in tokencredit.py, not once")
        source = source.replace(text, replacement)
    return source


# -----------------------------------------------------------------------------
# running the tests: worker processes that import torch once and run pytest in-process

def sha(*parts) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def worker(jobs_file: str) -> None:
    """`course.py _worker JOBS`: run each job's tests in this process, one results file each."""
    import pytest  # noqa: F401  (the worker's own import, once)
    sys.dont_write_bytecode = True
    with open(jobs_file) as f:
        jobs = json.load(f)
    for job in jobs:
        if os.path.exists(job["out"]):
            continue
        result = run_job(job)
        with open(job["out"] + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(job["out"] + ".tmp", job["out"])


class Collector:
    """pytest plugin: each test's outcome, a time limit per test, and (in the map's run) which
    exercise functions each test calls and what each test's ref_* loops return."""

    def __init__(self, wanted, test_limit, record, partial=None):
        self.wanted, self.limit, self.record, self.partial = wanted, test_limit, record, partial
        self.results, self.errors, self.calls, self.snapshots = {}, [], {}, {}
        self.current, self.counts = None, {}

    def pytest_collection_modifyitems(self, session, config, items):
        if self.wanted is not None:
            keep = [item for item in items if item.nodeid.split("::", 1)[1] in self.wanted]
            config.hook.pytest_deselected(items=[i for i in items if i not in keep])
            items[:] = keep
        if self.record:
            for module in {id(item.module): item.module for item in items}.values():
                for name in [n for n in vars(module) if n.startswith("ref_")]:
                    setattr(module, name, self.recorder(name, getattr(module, name)))

    def recorder(self, name, loop):
        import torch

        def recorded(*args, **kwargs):
            out = loop(*args, **kwargs)
            count = self.counts.get((self.current, name), 0)
            self.counts[(self.current, name)] = count + 1
            grads = {}
            if isinstance(out, torch.Tensor) and out.requires_grad and out.numel() == 1:
                given = [(str(i), x) for i, x in enumerate(args)] + list(kwargs.items())
                given = [(key, x) for key, x in given
                         if isinstance(x, torch.Tensor) and x.requires_grad]
                found = torch.autograd.grad(out, [x for _, x in given], retain_graph=True,
                                            allow_unused=True)
                grads = {key: encode(g) for (key, _), g in zip(given, found) if g is not None}
            self.snapshots[f"{self.current}::{name}::{count}"] = dict(value=encode(out),
                                                                      grads=grads)
            return out
        return recorded

    def pytest_runtest_protocol(self, item):
        self.current = item.nodeid.split("::", 1)[1]

    def pytest_runtest_setup(self, item):  # before the call, whatever the hooks' order
        def out_of_time(signum, frame):
            raise TimeoutError(f"this test ran past {self.limit:g} s: is a loop endless?")
        signal.signal(signal.SIGALRM, out_of_time)
        signal.setitimer(signal.ITIMER_REAL, self.limit)

    def pytest_runtest_teardown(self, item):
        signal.setitimer(signal.ITIMER_REAL, 0)

    def pytest_runtest_logreport(self, report):
        name = report.nodeid.split("::", 1)[-1]
        if report.failed:
            self.results[name] = self.results.get(name) or report.longreprtext or "failed"
        elif report.when == "call" or report.skipped:
            self.results.setdefault(name, None)
        if report.when == "teardown" and self.partial:  # kept if the job is stopped
            with open(self.partial, "a") as f:
                f.write(json.dumps([name, self.results.get(name)]) + "\n")

    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append(report.longreprtext)


def run_job(job: dict) -> dict:
    """One job in this process: the tests of job["dir"] against the tokencredit.py beside them."""
    import pytest
    signal.setitimer(signal.ITIMER_REAL, 0)
    for name in list(sys.modules):
        if name in ("tokencredit", "conftest") or name.startswith("test_"):
            del sys.modules[name]
    collector = Collector(set(job["tests"]) if job["tests"] is not None else None,
                          job["test_limit"], job.get("record", False), job["out"] + ".partial")
    cwd, path = os.getcwd(), list(sys.path)
    os.chdir(job["dir"])
    sys.path.insert(0, job["dir"])
    try:
        if job.get("record"):
            try:
                trace(collector)
            except Exception as error:  # the test run below reports it
                collector.errors.append(f"{type(error).__name__}: {error}")
        code = pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", job["dir"], "-o",
                            "addopts=", "--tb=native", TESTS], plugins=[collector])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.chdir(cwd)
        sys.path[:] = path
    return dict(results=collector.results, errors=collector.errors, code=int(code),
                calls={k: sorted(v) for k, v in collector.calls.items()},
                snapshots=collector.snapshots)


def trace(collector) -> None:
    """Wraps tokencredit's exercise functions before the tests import it: which test calls which
    (the map then blanks a function only for the tests that call it)."""
    import functools
    import tokencredit
    for name in EXERCISE_OF:
        function = getattr(tokencredit, name)

        def traced(*args, _function=function, _name=name, **kwargs):
            collector.calls.setdefault(_name, set()).add(collector.current)
            return _function(*args, **kwargs)
        setattr(tokencredit, name, functools.wraps(function)(traced))


def encode(x):
    """A JSON form of a loop's output: tensors (with their dtype), numbers, and their containers."""
    import torch
    if isinstance(x, torch.Tensor):
        return dict(tensor=x.detach().cpu().double().flatten().tolist(), dtype=str(x.dtype)[6:],
                    shape=list(x.shape))
    if isinstance(x, (tuple, list)):
        return {type(x).__name__: [encode(v) for v in x]}
    if isinstance(x, dict):
        return dict(dict=[[k, encode(v)] for k, v in x.items()])
    return x


SNAPSHOT_STUB = '''

def _snapshot(name, args, kwargs):
    """What the plain-loop reference `name` returned on this call of this test, recorded by
    `course.py handout` from the repository's loop on the same inputs: this copy holds no loop
    (it would be a solution). A loop whose output carries a gradient gets it back."""
    import json
    import os
    if "loops" not in _snapshot.__dict__:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "{snapshots}")) as f:
            _snapshot.loops, _snapshot.counts = json.load(f), {{}}
    test = os.environ["PYTEST_CURRENT_TEST"].rsplit(" (", 1)[0].split("::", 1)[1]
    count = _snapshot.counts.get((test, name), 0)
    _snapshot.counts[(test, name)] = count + 1
    key = f"{{test}}::{{name}}::{{count}}"
    if key not in _snapshot.loops:
        raise AssertionError(f"no recorded output for call {{count + 1}} of {{name}} in {{test}}")

    def decode(x):
        if isinstance(x, dict) and "tensor" in x:
            return torch.tensor(x["tensor"], dtype=torch.float64).to(
                getattr(torch, x["dtype"])).reshape(x["shape"])
        if isinstance(x, dict) and ("tuple" in x or "list" in x):
            values = [decode(v) for v in x.get("tuple", x.get("list"))]
            return tuple(values) if "tuple" in x else values
        if isinstance(x, dict) and "dict" in x:
            return {{k: decode(v) for k, v in x["dict"]}}
        return x

    out = decode(_snapshot.loops[key]["value"])
    for where, grad in _snapshot.loops[key]["grads"].items():
        x = args[int(where)] if where.isdigit() else kwargs[where]
        out = out + (decode(grad).to(x.dtype) * (x - x.detach())).sum()  # + 0, gradient `grad`
    return out
'''


def snapshot_tests(tests_source: str) -> str:
    """The tests with each ref_* loop replaced by a lookup of its recorded outputs."""
    tree, lines = ast.parse(tests_source), tests_source.splitlines(keepends=True)
    loops = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("ref_")]
    for node in sorted(loops, key=lambda n: n.lineno, reverse=True):
        a, b = span(node)
        lines[a:b] = [f"def {node.name}(*args, **kwargs):  # the loop's recorded outputs\n",
                      f"    return _snapshot({node.name!r}, args, kwargs)\n"]
    if loops:
        at = span(min(loops, key=lambda n: n.lineno))[0]
        lines[at:at] = [SNAPSHOT_STUB.format(snapshots=SNAPSHOTS).lstrip("\n") + "\n\n"]
    return "".join(lines)


class Runner:
    """Runs jobs (a tokencredit.py source and the tests to run on it) in worker processes, each
    job in its own time limit; a job that runs past it is stopped and reported as out of time."""

    def __init__(self, tests_dir=HERE, workers=None, test_limit=TEST_LIMIT,
                 exercise_limit=EXERCISE_LIMIT):
        self.tests_dir, self.test_limit, self.exercise_limit = tests_dir, test_limit, exercise_limit
        self.workers = workers or min(4, os.cpu_count() or 1)
        self.done, self.runs = {}, 0

    def key(self, source, tests, record=False):
        return sha(source, json.dumps(sorted(tests) if tests is not None else None), str(record),
                   str(self.test_limit), str(self.exercise_limit))

    def run(self, jobs) -> list:
        """jobs: (source, tests or None, record). Returns one result dict per job."""
        todo, seen = [], set()
        for source, tests, record in jobs:
            key = self.key(source, tests, record)
            if key not in self.done and key not in seen:
                seen.add(key)
                todo.append((key, source, tests, record))
        if todo:
            with tempfile.TemporaryDirectory(prefix="course-") as tmp:
                chunks = [todo[i::self.workers] for i in range(self.workers)]
                threads = [threading.Thread(target=self.run_chunk, args=(tmp, i, chunk))
                           for i, chunk in enumerate(chunks) if chunk]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
        return [self.done[self.key(source, tests, record)] for source, tests, record in jobs]

    def run_chunk(self, tmp, index, chunk) -> None:
        specs = []
        for n, (key, source, tests, record) in enumerate(chunk):
            folder = os.path.join(tmp, f"w{index}-{n}")
            os.makedirs(folder)
            with open(os.path.join(folder, "tokencredit.py"), "w") as f:
                f.write(source)
            for name in (TESTS, SNAPSHOTS):
                if os.path.exists(os.path.join(self.tests_dir, name)):
                    shutil.copy(os.path.join(self.tests_dir, name), folder)
            limit = self.exercise_limit * (4 if tests is None or record else 1)
            specs.append(dict(key=key, dir=folder, tests=tests, record=record, limit=limit,
                              test_limit=self.test_limit, out=os.path.join(folder, "out.json")))
        remaining = specs
        while remaining:
            jobs_file = os.path.join(tmp, f"jobs{index}-{self.runs}.json")
            self.runs += 1
            with open(jobs_file, "w") as f:
                json.dump(remaining, f)
            log = open(jobs_file + ".log", "w")
            env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            process = subprocess.Popen([sys.executable, os.path.join(HERE, "course.py"),
                                        "_worker", jobs_file], stdout=log, stderr=log,
                                       env=env, start_new_session=True)
            started, finished = time.monotonic(), 0
            while True:
                now_done = sum(os.path.exists(s["out"]) for s in remaining)
                if now_done > finished:
                    finished, started = now_done, time.monotonic()
                if now_done == len(remaining) or process.poll() is not None:
                    break
                if time.monotonic() - started > remaining[now_done]["limit"]:
                    os.killpg(process.pid, signal.SIGKILL)
                    break
                time.sleep(0.02)
            process.wait()
            log.close()
            with open(jobs_file + ".log") as f:
                output = f.read()
            for n, spec in enumerate(remaining):
                if os.path.exists(spec["out"]):
                    with open(spec["out"]) as f:
                        self.done[spec["key"]] = json.load(f)
                else:
                    stopped = time.monotonic() - started > spec["limit"]
                    partial = {}
                    if os.path.exists(spec["out"] + ".partial"):
                        with open(spec["out"] + ".partial") as f:
                            partial = dict(json.loads(line) for line in f if line.endswith("\n"))
                    self.done[spec["key"]] = dict(
                        results=partial, code=-1, calls={}, snapshots={}, timed_out=stopped,
                        errors=[f"ran out of time: its tests ran past {spec['limit']:g} s"
                                if stopped else f"the test process stopped:\n{output[-3000:]}"])
                    remaining = remaining[n + 1:]
                    break
            else:
                remaining = []


def outcome(result: dict, test: str):
    """None if the test passed, else the failure's text."""
    if test in result["results"]:
        return result["results"][test]
    return "\n".join(result["errors"]) or "the test did not run"


# -----------------------------------------------------------------------------
# the test map: which tests fail when one function is blank; computed once, kept in the cache

def map_key(reference: str, tests_source: str) -> str:
    return sha(str(MAP_VERSION), reference, tests_source, json.dumps(EXERCISES))


def test_map(reference: str, runner=None, quiet=False) -> dict:
    """{"tests": every test, "fails": {function: the tests that fail when only it is blank},
    "snapshots": the ref_* loops' outputs}, from the cache when nothing has changed."""
    tests_source = read(os.path.join(HERE, TESTS))
    key = map_key(reference, tests_source)
    path = os.path.join(CACHE, f"map-{key[:16]}.json")
    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        if saved.get("key") == key:
            return saved
    runner = runner or Runner()
    started = time.monotonic()
    whole, = runner.run([(reference, None, True)])
    failing = [t for t, failure in whole["results"].items() if failure]
    if whole["errors"] or failing or not whole["results"]:
        raise SystemExit(f"course.py: the reference fails {len(failing)} tests: {failing[:5]}"
                         + "".join(whole["errors"])[-2000:])
    names = list(EXERCISE_OF)
    results = runner.run([(blank(reference, names=[name]), whole["calls"].get(name, []), False)
                          for name in names])
    fails = {name: sorted(t for t in whole["calls"].get(name, []) if outcome(result, t))
             for name, result in zip(names, results)}
    saved = dict(key=key, tests=sorted(whole["results"]), fails=fails,
                 snapshots=whole["snapshots"])
    os.makedirs(CACHE, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(saved, f)
    os.replace(path + ".tmp", path)
    if not quiet:
        print(f"course.py: computed the test map in {time.monotonic() - started:.1f} s "
              f"({len(names) + 1} runs); kept in {os.path.relpath(path)}", file=sys.stderr)
    return saved


def needs(mapping: dict) -> dict:
    """{test: the exercises it fails without}."""
    out = {}
    for name, tests in mapping["fails"].items():
        for test in tests:
            out.setdefault(test, set()).add(EXERCISE_OF[name])
    return out


def scheme(mapping: dict, exercises, in_order: bool) -> dict:
    """{k: {"functions": {name: its tests}, "waiting": {test: later exercises it needs}}}.
    in_order (a handout): exercise k keeps the tests that need it and no later exercise of the
    set; the others wait on a later exercise."""
    need, out = needs(mapping), {}
    for k in exercises:
        later = lambda t: sorted(j for j in need[t] if j > k and j in exercises)  # noqa: E731
        tests = {name: mapping["fails"].get(name, []) for name in EXERCISES[k][1]}
        names = {name: [t for t in ts if not (in_order and later(t))] for name, ts in tests.items()}
        waiting = {t: later(t) for ts in tests.values() for t in ts if in_order and later(t)}
        out[k] = dict(functions=names, waiting=waiting)
    return out


# -----------------------------------------------------------------------------
# grading

def blocker(failure: str):
    """The exercise whose NotImplementedError stopped a test, if one did."""
    found = re.search(r"NotImplementedError: exercise (\d+):", failure or "")
    return int(found.group(1)) if found else None


def score(plan: dict, k: int, result: dict) -> dict:
    """Exercise k's row: each function's share of the points split by its tests."""
    functions = {name: tests for name, tests in plan["functions"].items() if tests}
    share = EXERCISES[k][2] / max(len(functions), 1)
    tests = sorted({t for ts in functions.values() for t in ts})
    failed = {t: outcome(result, t) for t in tests if outcome(result, t)}
    points = sum(share * sum(t not in failed for t in ts) / len(ts) for ts in functions.values())
    waiting = {t: blocker(outcome(result, t)) for t in plan["waiting"]
               if blocker(outcome(result, t)) not in (None, k)}
    return dict(k=k, points=round(points, 2), max=EXERCISES[k][2], passed=len(tests) - len(failed),
                total=len(tests), failed=failed, waiting=waiting,
                per_function={n: (sum(t not in failed for t in ts), len(ts))
                              for n, ts in functions.items()},
                timed_out=bool(result.get("timed_out")), error=None)


def instructor_jobs(reference, student, mapping, exercises) -> tuple:
    """(the jobs to run, (source or None, tests) per exercise, errors): exercise k as the
    reference with the student's exercise k; a source equal to the reference needs no run."""
    plan = scheme(mapping, exercises, False)
    jobs, errors = [], {}
    for k in exercises:
        try:
            source = substitute(reference, student, EXERCISES[k][1])
        except (SyntaxError, ValueError) as error:
            errors[k], source = f"{type(error).__name__}: {error}", None
        jobs.append((source, sorted({t for ts in plan[k]["functions"].values() for t in ts})))
    todo = [(s, t, False) for s, t in jobs if s is not None and s != reference]
    return todo, jobs, errors


def grade(student: str, mapping: dict, exercises, reference=None, runner=None,
          in_order=False, only=None) -> list:
    """One row per exercise of the set (or of `only`). With a reference, exercise k runs as the
    reference with the student's exercise k (each in its own job and time limit); without, the
    file runs whole."""
    runner = runner or Runner()
    plan = scheme(mapping, exercises, in_order)
    exercises = [k for k in exercises if k in only] if only else exercises
    if reference is None:
        wanted = sorted({t for k in exercises for ts in plan[k]["functions"].values() for t in ts}
                        | {t for k in exercises for t in plan[k]["waiting"]})
        result, = runner.run([(student, wanted, False)])
        return [score(plan[k], k, result) for k in exercises]
    todo, jobs, errors = instructor_jobs(reference, student, mapping, exercises)
    results = dict(zip([(s, tuple(t)) for s, t, _ in todo], runner.run(todo)))
    rows = []
    for k, (source, tests) in zip(exercises, jobs):
        if source is None:
            result = dict(results={}, errors=[errors[k]])
        elif source == reference:  # the student's exercise k is the reference's, to the byte
            result = dict(results={t: None for t in tests}, errors=[])
        else:
            result = results[(source, tuple(tests))]
        rows.append(score(plan[k], k, result))
        rows[-1]["error"] = errors.get(k)
    return rows


def details(failure: str) -> list:
    """What pytest says failed: where (the last frame) and the exception with its detail lines."""
    lines = failure.rstrip().splitlines()
    frames = [i for i, ln in enumerate(lines) if ln.startswith('  File "')
              and not ln.startswith(f'  File "{os.path.abspath(__file__)}"')]
    if not frames:
        return [ln.strip()[:110] for ln in lines if ln.strip()][-6:]
    found = re.match(r'  File "(.*)", line (\d+), in (.*)', lines[frames[-1]])
    where = [f"{os.path.basename(found.group(1))}:{found.group(2)} ({found.group(3)})"
             if found else lines[frames[-1]].strip()]
    rest = [ln for ln in lines[frames[-1] + 1:] if ln.strip() and not set(ln.strip()) <= {"^", "~"}]
    return [ln.strip()[:110] for ln in where + rest]


def format_rows(rows, verbose: bool, in_order=False, shown=12) -> str:
    lines = []
    for row in rows:
        k, failed, waiting = row["k"], row["failed"], row["waiting"]
        own = any(blocker(f) == k for f in failed.values())
        blocked = sorted({blocker(f) for f in failed.values()} - {None, k})
        notes = ["not written yet"] if own else []
        if blocked:
            notes.append(f"{sum(blocker(f) in blocked for f in failed.values())} blocked by "
                         f"exercise " + ", ".join(map(str, blocked)))
        if time_note(row):
            notes.append(time_note(row))
        if row["error"]:
            notes.append(row["error"].splitlines()[0][:100])
        if waiting:
            notes.append(f"{len(waiting)} more test{'s' * (len(waiting) > 1)} of its functions "
                         f"wait{'s' * (len(waiting) == 1)} on exercise "
                         + ", ".join(map(str, sorted(set(waiting.values())))))
        lines.append(f"exercise {k}  {EXERCISES[k][0]:<20} {row['passed']:3d}/{row['total']:<3d}"
                     f" tests {row['points']:5.1f}/{row['max']} points"
                     + ("  " + "; ".join(notes) if notes else ""))
        if verbose:
            if len(row["per_function"]) > 1 and failed:
                lines.append("    " + ", ".join(f"{n} {p}/{t}"
                                                for n, (p, t) in row["per_function"].items()))
            for name, failure in list(failed.items())[:shown]:
                lines.append(f"    FAILED {name}\n        "
                             + "\n        ".join(details(failure)[:7]))
            if len(failed) > shown:
                lines.append(f"    ... and {len(failed) - shown} more failed tests")
            for name, j in list(waiting.items())[:shown]:
                lines.append(f"    {name}: {'' if own else 'written; '}waiting on exercise {j}")
            if len(waiting) > shown:
                lines.append(f"    ... and {len(waiting) - shown} more waiting")
    total, top = sum(r["points"] for r in rows), sum(r["max"] for r in rows)
    lines.append(f"total {total:.1f}/{top} points")
    if any(blocker(f) not in (None, r["k"]) for r in rows for f in r["failed"].values()):
        lines.append("A blocked test counts as failed until the earlier exercise it waits for is "
                     "written.")
    return "\n".join(lines)


def time_note(row) -> str:
    """What ran out of time in an exercise, if anything did."""
    slow = sum("TimeoutError: this test ran past" in f for f in row["failed"].values())
    if row["timed_out"]:
        return "RAN OUT OF TIME: its tests were stopped (is a loop endless?)"
    return f"{slow} tests ran out of time (is a loop endless?)" if slow else ""


def gradescope(rows) -> dict:
    """Gradescope's results.json: one entry per exercise."""
    tests = []
    for row in rows:
        output = f"{row['passed']}/{row['total']} tests passed"
        output += "".join(f"\n{n}: {p}/{t} tests" for n, (p, t) in row["per_function"].items())
        if time_note(row):
            output += "\n" + time_note(row)
        if row["error"]:
            output += "\n" + row["error"]
        output += "".join(f"\nFAILED {name}\n    " + "\n    ".join(details(f)[:7])
                          for name, f in row["failed"].items())  # as grade -e shows it
        tests.append(dict(name=f"exercise {row['k']}: {EXERCISES[row['k']][0]}",
                          score=row["points"], max_score=row["max"], visibility="visible",
                          output=output))
    return dict(score=round(sum(t["score"] for t in tests), 2), tests=tests)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def setting(set_name=None):
    """(reference or None, mapping, exercises, set name, in order) for where this file sits."""
    if os.path.exists(os.path.join(HERE, MAP_FILE)):  # a handout: no reference here
        with open(os.path.join(HERE, MAP_FILE)) as f:
            saved = json.load(f)
        return None, saved, saved["exercises"], saved["set"], True
    reference = read(os.path.join(HERE, "tokencredit.py"))
    exercises = list(SETS[set_name or "all"])
    return reference, test_map(reference), exercises, set_name or "all", False


def find_student(path: str):
    """A submission: a tokencredit.py, or a folder holding one (its course_map.json names the
    set of a handout). Returns (the file, the set recorded beside it or None)."""
    if os.path.isdir(path):
        found = sorted(os.path.join(root, name) for root, _, names in os.walk(path)
                       for name in names if name == "tokencredit.py")
        if not found:
            raise ValueError(f"{path} holds no tokencredit.py")
        path = min(found, key=lambda p: (p.count(os.sep), p))
    recorded = os.path.join(os.path.dirname(os.path.abspath(path)), MAP_FILE)
    set_name = None
    if os.path.exists(recorded):
        with open(recorded) as f:
            set_name = json.load(f).get("set")
    return path, set_name


# -----------------------------------------------------------------------------
# the handout

def strip_answers(sheet: str) -> tuple:
    """(the sheet without its <details> answers, the answers)."""
    found = re.findall(r"\n<details>.*?</details>\n", sheet, flags=re.S)
    for block in found:
        sheet = sheet.replace(block, "\n")
    return sheet, found


def strip_selfcheck(source: str) -> str:
    """course.py without MISTAKES, CORRECT and ENDLESS: they quote the reference."""
    tree, lines = ast.parse(source), source.splitlines(keepends=True)
    for node in reversed(tree.body):
        if isinstance(node, ast.Assign) and bound_names(node) & {"MISTAKES", "CORRECT", "ENDLESS"}:
            name = next(iter(bound_names(node)))
            lines[node.lineno - 1:node.end_lineno] = [
                f"{name} = ()  # left out of a handout: they quote the solutions\n"]
    return "".join(lines)


def write_handout(out: str, set_name: str, answers: bool, reference: str, mapping: dict) -> None:
    exercises = SETS[set_name]
    for name in HANDOUT:
        source, target = os.path.join(HERE, name), os.path.join(out, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        (shutil.copytree if os.path.isdir(source) else shutil.copy)(source, target)
    files = {"tokencredit.py": blank(reference, exercises),
             TESTS: snapshot_tests(read(os.path.join(HERE, TESTS))),
             "course.py": strip_selfcheck(read(os.path.join(HERE, "course.py"))),
             SNAPSHOTS: json.dumps(mapping["snapshots"]),
             MAP_FILE: json.dumps(dict(set=set_name, exercises=list(exercises),
                                       fails=mapping["fails"], tests=mapping["tests"]), indent=1),
             "README.md": HANDOUT_README.format(
                 set_name=set_name, exercises=", ".join(map(str, exercises)),
                 answers_note=" (this copy has them: made for self-study)" if answers else "")}
    for page in ("docs/course.md", "docs/lab.md", "requirements.txt"):
        text = read(os.path.join(HERE, page))
        for old, new in DOC_EDITS:
            text = text.replace(old, new)
        if page == "docs/course.md":
            text = re.sub(r"\n<!-- instructors -->\n.*?\n<!-- /instructors -->\n", "\n", text,
                          flags=re.S)
            text = text if answers else strip_answers(text)[0]
        files[page] = text
    for name, text in files.items():
        with open(os.path.join(out, name), "w") as f:
            f.write(text)


def new_folder(out: str) -> None:
    """Stop unless `out` is a new or empty folder: a handout or a class is never written over."""
    if os.path.exists(out) and os.listdir(out):
        raise SystemExit(f"course.py: {out} exists and is not empty; name a new folder")


def cmd_handout(out: str, set_name: str, answers: bool) -> None:
    new_folder(out)
    reference, mapping, _, _, in_handout = setting()
    if in_handout:
        raise SystemExit("course.py: make a handout from the repository, not from a handout")
    write_handout(out, set_name, answers, reference, mapping)
    plan = scheme(mapping, SETS[set_name], in_order=True)
    print(f"wrote {out}: exercises {', '.join(map(str, SETS[set_name]))} blank in tokencredit.py; "
          f"{len({t for p in plan.values() for ts in p['functions'].values() for t in ts})} "
          f"graded tests; the sheet "
          + ("with its answers" if answers else "without its answers (`course.py answers`)"))


# -----------------------------------------------------------------------------
# the commands

def cmd_grade(path, set_name, only, gradescope_file, verbose, limit) -> None:
    student_path, recorded = find_student(path or os.path.join(HERE, "tokencredit.py"))
    reference, mapping, exercises, set_name, in_order = setting(set_name or recorded)
    if reference is not None and os.path.samefile(student_path,
                                                  os.path.join(HERE, "tokencredit.py")):
        reference = None  # the reference graded as itself
    if only and not set(only) <= set(exercises):
        raise SystemExit(f"course.py: exercises {only} asked for, this set has {exercises}")
    runner = Runner(exercise_limit=limit or EXERCISE_LIMIT)
    started = time.monotonic()
    rows = grade(read(student_path), mapping, exercises, reference, runner, in_order, only)
    print(f"grading {os.path.abspath(student_path)}, set {set_name}"
          + (": each exercise against the reference" if reference else ""))
    print(format_rows(rows, verbose or bool(only), in_order))
    print(f"({time.monotonic() - started:.1f} s)")
    if gradescope_file:
        with open(gradescope_file, "w") as f:
            json.dump(gradescope(rows), f, indent=1)
        print(f"wrote {gradescope_file}")


def cmd_grade_all(folder, set_name, csv_file, gradescope_dir, limit) -> None:
    reference, mapping, exercises, set_name, in_order = setting(set_name)
    if reference is None:
        raise SystemExit("course.py: grade a class from the repository (or a bundle), "
                         "not from a handout")
    students = []
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if os.path.isdir(path) or entry.endswith(".py"):
            students.append((entry[:-3] if entry.endswith(".py") else entry, path))
    runner = Runner(exercise_limit=limit or EXERCISE_LIMIT)
    started = time.monotonic()
    sources = {}
    for name, path in students:
        try:
            sources[name] = read(find_student(path)[0])
        except (ValueError, OSError) as error:
            sources[name] = error
    jobs = [job for source in sources.values() if isinstance(source, str)
            for job in instructor_jobs(reference, source, mapping, exercises)[0]]
    runner.run(jobs)  # every student's exercises at once, so the workers stay busy
    csv_file = csv_file or "grades.csv"
    with open(csv_file, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["student", "set"] + [f"exercise {k}" for k in exercises]
                     + ["total", "max", "notes"])
        for name, source in sources.items():
            if isinstance(source, str):
                rows = grade(source, mapping, exercises, reference, runner)
            else:
                rows = [dict(k=k, points=0.0, max=EXERCISES[k][2], passed=0, total=0, failed={},
                             waiting={}, per_function={}, timed_out=False, error=str(source))
                        for k in exercises]
            notes = "; ".join(f"exercise {r['k']}: {note}" for r in rows
                              for note in [time_note(r) or (r["error"] or "").split("\n")[0]]
                              if note)
            out.writerow([name, set_name] + [f"{r['points']:.2f}" for r in rows]
                         + [f"{sum(r['points'] for r in rows):.2f}",
                            sum(r["max"] for r in rows), notes])
            if gradescope_dir:
                os.makedirs(os.path.join(gradescope_dir, name), exist_ok=True)
                with open(os.path.join(gradescope_dir, name, "results.json"), "w") as g:
                    json.dump(gradescope(rows), g, indent=1)
    print(f"graded {len(students)} submissions (set {set_name}) in "
          f"{time.monotonic() - started:.1f} s: wrote {csv_file}"
          + (f" and {gradescope_dir}/STUDENT/results.json" if gradescope_dir else ""))


SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, in /autograder/source, when it builds the autograder's image.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v python3 > /dev/null || ! python3 -m pip --version > /dev/null 2>&1; then
    apt-get update && apt-get install -y python3 python3-pip
fi
export PIP_BREAK_SYSTEM_PACKAGES=1  # newer images: pip may install beside the system's python
python3 -m pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
python3 -m pip install -r requirements.txt
"""
RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission: the grade goes to /autograder/results/results.json.
# AUTOGRADER_ROOT and PYTHON override /autograder and python3 (to run it on your own machine).
root="${AUTOGRADER_ROOT:-/autograder}"
cd "$root/source"
exec "${PYTHON:-python3}" course.py autograde --root "$root"
"""


def cmd_gradescope(out: str, set_name: str) -> None:
    reference, mapping, _, _, in_handout = setting()
    if in_handout:
        raise SystemExit("course.py: make the bundle from the repository, not from a handout")
    key = map_key(reference, read(os.path.join(HERE, TESTS)))
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name in ("course.py", "tokencredit.py", TESTS, "requirements.txt"):
            z.write(os.path.join(HERE, name), name)
        z.writestr(f".course-cache/map-{key[:16]}.json", json.dumps(mapping))
        z.writestr(BUNDLE_FILE, json.dumps(dict(set=set_name)))
        for name, text in (("setup.sh", SETUP_SH), ("run_autograder", RUN_AUTOGRADER)):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16
            z.writestr(info, text)
    print(f"wrote {out}: a Gradescope autograder for set {set_name} (exercises "
          f"{', '.join(map(str, SETS[set_name]))}); students submit their tokencredit.py")


def cmd_autograde(root: str) -> None:
    """What run_autograder runs: grade ROOT/submission, write ROOT/results/results.json."""
    results = os.path.join(root, "results", "results.json")
    os.makedirs(os.path.dirname(results), exist_ok=True)
    with open(os.path.join(HERE, BUNDLE_FILE)) as f:
        set_name = json.load(f)["set"]
    try:
        student_path, _ = find_student(os.path.join(root, "submission"))
        reference, mapping, exercises, _, _ = setting(set_name)
        rows = grade(read(student_path), mapping, exercises, reference)
        out = gradescope(rows)
        print(format_rows(rows, True))
    except (ValueError, OSError) as error:
        out = dict(score=0.0, output=f"No grade: {error}. Submit your tokencredit.py.",
                   tests=[dict(name=f"exercise {k}: {EXERCISES[k][0]}", score=0.0,
                               max_score=EXERCISES[k][2], output=str(error))
                          for k in SETS[set_name]])
    with open(results, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {results}: {out['score']} points")


def cmd_list(set_name) -> None:
    _, mapping, exercises, set_name, in_order = setting(set_name)
    plan = scheme(mapping, exercises, in_order)
    for k in exercises:
        print(f"exercise {k}: {EXERCISES[k][0]}, {EXERCISES[k][2]} points")
        for name, tests in plan[k]["functions"].items():
            print(f"  {name}: {len(tests)} tests, "
                  f"{EXERCISES[k][2] / len(EXERCISES[k][1]):.2f} points")
            for test in tests:
                print(f"      {test}")
        if plan[k]["waiting"]:
            print(f"  and {len(plan[k]['waiting'])} tests that also need a later exercise")


def cmd_plants(out: str) -> None:
    """selfcheck's plants as a class to grade: one submission per planted mistake, other correct
    solution and the endless loop, each the reference with that one edit."""
    if not MISTAKES:
        raise SystemExit("course.py: a handout holds no planted mistakes; run this in the repository")
    new_folder(out)
    os.makedirs(out, exist_ok=True)
    reference = read(os.path.join(HERE, "tokencredit.py"))
    plants = MISTAKES + CORRECT + (ENDLESS,)
    for i, (k, what, edits) in enumerate(plants, 1):
        slug = re.sub(r"[^a-z0-9]+", "-", what.lower().replace(">", "above")).strip("-")
        name = f"{i:02d}-ex{k}-{slug[:40]}"
        with open(os.path.join(out, name + ".py"), "w") as f:
            f.write(apply_edits(reference, edits))
    print(f"wrote {len(plants)} submissions to {out}: {len(MISTAKES)} planted mistakes, "
          f"{len(CORRECT)} other correct solutions, 1 endless loop (exercise {ENDLESS[0]}); "
          f"the file name says which exercise each should cost")


def cmd_answers(out) -> None:
    _, found = strip_answers(read(os.path.join(HERE, "docs", "course.md")))
    if not found:
        raise SystemExit("course.py: this copy of the sheet holds no answers")
    text = "# Answers to docs/course.md, for the instructor\n" + "".join(found)
    if out:
        with open(out, "w") as f:
            f.write(text)
        print(f"wrote {out}: {len(found)} answers")
    else:
        print(text)


def solution_lines(reference: str, exercises) -> dict:
    """{line: function}: each code line of a blanked function's body (after what the blank
    keeps) that is long enough to say something and that no given function of the handout holds."""
    defs, names = functions(reference), [n for k in exercises for n in EXERCISES[k][1]]
    given = blank(reference, exercises)
    given_lines = {code_part(ln) for ln in given.splitlines()}
    out = {}
    for name in names:
        body = defs[name].body[kept_statements(defs[name]):]
        for statement in body:
            for line in ast.get_source_segment(reference, statement).splitlines():
                code = code_part(line)
                if len(code) >= 16 and code not in given_lines:
                    out[code] = name
    return out


def code_part(line: str) -> str:
    return line.split("  # ")[0].split(" # ")[0].strip()


def scan_handout(out: str, reference: str, exercises, answers: list) -> list:
    """What a handout must not hold: a solution line, a reference loop, an answer, a pointer to
    a file it leaves out. Returns the problems found."""
    problems, solution = [], solution_lines(reference, exercises)
    texts = {}
    for root, _, names in os.walk(out):
        for name in names:
            path = os.path.join(root, name)
            try:
                texts[os.path.relpath(path, out)] = read(path)
            except UnicodeDecodeError:
                continue  # a picture
    for name, text in texts.items():
        for line, function in solution.items():
            if line in text:
                problems.append(f"{name} holds a line of {function}'s solution: {line!r}")
        for block in answers:
            for line in block.splitlines():
                if len(line.strip()) >= 30 and line.strip() in text:
                    problems.append(f"{name} holds an answer line: {line.strip()[:60]!r}")
    tests, repo = ast.parse(texts[TESTS]), read(os.path.join(HERE, TESTS))
    loops = [n for n in ast.parse(repo).body
             if isinstance(n, ast.FunctionDef) and n.name.startswith("ref_")]
    outside = repo.splitlines()
    for node in sorted(loops, key=lambda n: n.lineno, reverse=True):
        del outside[span(node)[0]:node.end_lineno]
    outside = {code_part(ln) for ln in outside}
    handout_lines = {code_part(ln) for ln in texts[TESTS].splitlines()}
    for node in loops:
        for line in ast.get_source_segment(repo, node).splitlines()[1:]:
            code = code_part(line)
            if len(code) >= 16 and code not in outside and code in handout_lines:
                problems.append(f"{TESTS} holds a line of the loop {node.name}: {code!r}")
    for node in ast.walk(tests):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("ref_") and any(
                isinstance(n, (ast.For, ast.While, ast.comprehension)) for n in ast.walk(node)):
            problems.append(f"{TESTS}: {node.name} still loops")
    for name, text in texts.items():
        # the handout's README names what it leaves out, course.py lists it, and the tests'
        # comments may cite the project's README: they are code, not a page to follow
        if name in ("README.md", "course.py", TESTS) or not name.endswith((".md", ".py", ".txt")):
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


def cmd_selfcheck() -> None:
    """The grader's checks on itself; exit 1 if one fails."""
    started = time.monotonic()
    reference = read(os.path.join(HERE, "tokencredit.py"))
    runner = Runner()
    mapping = test_map(reference, runner)  # the reference passes every test, or this stops
    problems = []
    full = scheme(mapping, EXERCISES, in_order=False)
    graded = sorted({t for p in full.values() for ts in p["functions"].values() for t in ts})
    print(f"{len(graded)} of {len(mapping['tests'])} tests grade an exercise; per exercise: "
          + ", ".join(f"{k}: {len({t for ts in p['functions'].values() for t in ts})}"
                      for k, p in full.items()))
    problems += few_tests(full, "the instructor's grade")

    def lost(source, exercises=EXERCISES, **kw):
        return {r["k"]: round(r["max"] - r["points"], 2)
                for r in grade(source, mapping, exercises, reference, runner, **kw)
                if r["points"] < r["max"]}

    empty, = runner.run([(blank(reference, EXERCISES), graded, False)])
    passing = [t for t in graded if not outcome(empty, t)]
    other = [t for t in graded if outcome(empty, t) and blocker(outcome(empty, t)) is None]
    problems += [f"{t} passes on the blank file" for t in passing]
    problems += [f"{t} fails on the blank file without NotImplementedError" for t in other]
    print(f"blank file: {len(graded) - len(passing) - len(other)} of {len(graded)} graded tests "
          f"fail with NotImplementedError")
    plants = [(k, what, edits, "mistake") for k, what, edits in MISTAKES]
    plants += [(k, what, edits, "correct") for k, what, edits in CORRECT]
    sources = {}
    for k, what, edits, kind in plants:
        try:
            sources[what] = apply_edits(reference, edits)
        except ValueError as error:
            problems.append(f"{kind} {what!r}: {error}")
    runner.run([job for s in sources.values()
                for job in instructor_jobs(reference, s, mapping, EXERCISES)[0]])
    print("points lost, graded against the reference one exercise at a time:")
    for k, what, edits, kind in plants:
        if what in sources:
            cost = lost(sources[what])
            print(f"  {kind} {what!r:50} (exercise {k}): "
                  + (", ".join(f"exercise {j} -{p:g}" for j, p in cost.items()) or "none"))
            if kind == "mistake" and list(cost) != [k]:
                problems.append(f"mistake {what!r} should cost exercise {k} only, cost {cost}")
            if kind == "correct" and cost:
                problems.append(f"the correct {what!r} loses points: {cost}")
    k, what, edits = ENDLESS
    slow = Runner(test_limit=2, exercise_limit=30)
    rows = grade(apply_edits(reference, edits), mapping, EXERCISES, reference, slow)
    said = format_rows(rows, False)
    cost = {r["k"] for r in rows if r["points"] < r["max"]}
    print(f"  {what}: costs exercise(s) {sorted(cost)}; the report says "
          + repr([ln for ln in said.splitlines() if "out of time" in ln]))
    if cost != {k} or "out of time" not in said.splitlines()[k - 1]:
        problems.append(f"{what} should cost exercise {k} only, named as out of time: {said}")
    for set_name in ("grpo", "cscr"):
        rows = grade(blank(reference, SETS[set_name]), mapping, SETS[set_name], reference, runner)
        print(f"set {set_name}, its exercises blank: {sum(r['points'] for r in rows):g}/"
              f"{sum(r['max'] for r in rows)} points, exercises {[r['k'] for r in rows]}")
        if any(r["points"] for r in rows) or [r["k"] for r in rows] != list(SETS[set_name]):
            problems.append(f"set {set_name}: a blank submission scores {rows}")
    problems += check_handouts(reference, mapping, runner)
    for problem in problems:
        print("FAILED:", problem)
    print(f"selfcheck: {'FAILED' if problems else 'OK'} in {time.monotonic() - started:.0f} s")
    sys.exit(1 if problems else 0)


def few_tests(plan: dict, where: str) -> list:
    """No function's share of the points all or nothing: each is split over >= 3 tests."""
    return [f"{where}: {name} (exercise {k}) is graded by {len(tests)} tests, not >= 3"
            for k, p in plan.items() for name, tests in p["functions"].items() if len(tests) < 3]


def check_handouts(reference: str, mapping: dict, runner) -> list:
    """Each set's handout: nothing that solves it, in order, and graded as the repository."""
    problems = []
    _, answers = strip_answers(read(os.path.join(HERE, "docs", "course.md")))
    if not answers:
        problems.append("docs/course.md holds no <details> answers")
    with tempfile.TemporaryDirectory(prefix="handout-") as tmp:
        for set_name, exercises in SETS.items():
            out = os.path.join(tmp, set_name)
            write_handout(out, set_name, False, reference, mapping)
            found = scan_handout(out, reference, exercises, answers)
            problems += [f"handout {set_name}: {p}" for p in found]
            problems += few_tests(scheme(mapping, exercises, True), f"handout {set_name}")
            handout_runner = Runner(tests_dir=out, workers=runner.workers)
            with open(os.path.join(out, MAP_FILE)) as f:
                saved = json.load(f)
            steps = []  # in order: the first i exercises written (the reference's), the rest blank
            for i in range(len(exercises) + 1):
                steps.append(blank(reference, exercises[i:]))
            handout_runner.run([(s, None, False) for s in steps])
            said = []
            for i, source in enumerate(steps):
                rows = grade(source, saved, exercises, None, handout_runner, in_order=True)
                points = [r["points"] for r in rows]
                want = [r["max"] if j < i else 0 for j, r in enumerate(rows)]
                said.append(f"{sum(points):g}")
                if points != want:
                    problems.append(f"handout {set_name}, exercises {exercises[:i]} written: "
                                    f"points {points}, not {want}")
                failed = [r for r in rows[:i] if r["failed"]]
                if failed:
                    problems.append(f"handout {set_name}: exercise {failed[0]['k']} written, "
                                    f"yet shown failing: {list(failed[0]['failed'])[:3]}")
            print(f"handout {set_name}: {len(found)} solution lines, loops, answers or pointers "
                  f"found; written in order, the totals are " + " -> ".join(said))
        out = os.path.join(tmp, "answers")
        write_handout(out, "grpo", True, reference, mapping)
        if any(block not in read(os.path.join(out, "docs", "course.md")) for block in answers):
            problems.append("handout --answers: the sheet lacks answers")
    return problems


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        return worker(argv[1])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="The exercise sheet: docs/course.md")
    commands = parser.add_subparsers(dest="command", required=True)
    sets = "; ".join(f"{name} = {', '.join(map(str, ks))}" for name, ks in SETS.items())
    handout = commands.add_parser("handout", help="write a student copy with the exercises blank")
    handout.add_argument("dir", help="a new or empty folder")
    handout.add_argument("--set", default="all", choices=SETS, help="which exercises: " + sets)
    handout.add_argument("--answers", action="store_true",
                         help="keep the sheet's answers (self-study); by default they are left out")
    grade_ = commands.add_parser("grade", help="grade a tokencredit.py, one line per exercise")
    grade_.add_argument("path", nargs="?", help="the student's tokencredit.py, or a folder holding "
                        "it (default: the one beside course.py)")
    grade_.add_argument("--set", choices=SETS, help="grade only this set's exercises (default: "
                        "the handout's, or the one recorded beside PATH, else all)")
    grade_.add_argument("-e", "--exercise", type=int, action="append", dest="only",
                        help="only this exercise, with its failing tests (repeatable)")
    grade_.add_argument("-v", "--verbose", action="store_true", help="list the failing tests")
    grade_.add_argument("--gradescope", metavar="FILE", help="also write Gradescope's results.json")
    grade_.add_argument("--time-limit", type=float, metavar="S",
                        help=f"seconds per exercise (default {EXERCISE_LIMIT:g})")
    class_ = commands.add_parser("grade-all", help="grade a folder of submissions into one CSV")
    class_.add_argument("dir", help="one tokencredit.py per student: STUDENT.py or STUDENT/")
    class_.add_argument("--set", choices=SETS, help="which exercises (default all)")
    class_.add_argument("--csv", metavar="FILE", help="default grades.csv")
    class_.add_argument("--gradescope-dir", metavar="OUT",
                        help="also write OUT/STUDENT/results.json")
    class_.add_argument("--time-limit", type=float, metavar="S", help="seconds per exercise")
    bundle = commands.add_parser("gradescope", help="write a Gradescope autograder bundle (.zip)")
    bundle.add_argument("out", help="the .zip to write")
    bundle.add_argument("--set", required=True, choices=SETS, help=sets)
    auto = commands.add_parser("autograde", help="in a bundle: what run_autograder runs")
    auto.add_argument("--root", default="/autograder")
    list_ = commands.add_parser("list", help="each exercise's functions and their tests")
    list_.add_argument("--set", choices=SETS)
    plants = commands.add_parser("plants", help="write selfcheck's planted mistakes as a class "
                                 "to grade (try grade-all on it)")
    plants.add_argument("dir", help="a new or empty folder")
    answers = commands.add_parser("answers", help="the sheet's answers (left out of a handout)")
    answers.add_argument("file", nargs="?", help="write them here (default: print them)")
    commands.add_parser("selfcheck", help="check the grader: reference, blank, planted mistakes, "
                        "handouts")
    args = parser.parse_args(argv)
    if args.command == "handout":
        cmd_handout(args.dir, args.set, args.answers)
    elif args.command == "grade":
        cmd_grade(args.path, args.set, args.only, args.gradescope, args.verbose, args.time_limit)
    elif args.command == "grade-all":
        cmd_grade_all(args.dir, args.set, args.csv, args.gradescope_dir, args.time_limit)
    elif args.command == "gradescope":
        cmd_gradescope(args.out, args.set)
    elif args.command == "autograde":
        cmd_autograde(args.root)
    elif args.command == "list":
        cmd_list(args.set)
    elif args.command == "plants":
        cmd_plants(args.dir)
    elif args.command == "answers":
        cmd_answers(args.file)
    else:
        cmd_selfcheck()


if __name__ == "__main__":
    main()
