"""Runs that cannot meet (issue 53): a grade beside another grading run, one that grades six
attacks on the machine itself, on cores that other processes keep busy, gets the points it gets
alone on an idle machine, on every route. The sandbox's root is read-only and /tmp its one
disk (as an ordinary user too: test_sandbox.py's test_as_an_ordinary_user_too). The attacks
(classes.BESIDE_ATTACKS) are written from the issue's descriptions, and one on the time
limits' count of waits (a-wait).
"""

import json
import os
import re
import shutil
import subprocess
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from classes import BESIDE_ATTACKS as ATTACKS
from course import grading, source
from submissions import BASE, CORRECT, PLANT, PY, REFERENCE, ROOT, SEED, needs_bwrap, rows_of, run

pytestmark = [pytest.mark.slow, needs_bwrap]

PLANTED = source.apply_edits(REFERENCE, PLANT[2])  # costs exercise 1 alone: 23 of 30
# the same file graded this many times by each route while another grade runs: 3 in CI (10
# once by hand: COURSE_REGRADES=10, docs/instructors.md)
REGRADES = int(os.environ.get("COURSE_REGRADES", 3))


def grade_all(folder, csv, *options):
    return subprocess.Popen([PY, "-m", "course", "grade-all", folder, "--set", "grpo", "--seed",
                             str(SEED), "--csv", csv, *options], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wrote(notes: str) -> list:
    return [int(n) for n in re.findall(r"wrote (\d+) bytes", notes)]


def spinners(n: int) -> list:
    """n processes that spin, each a session of its own, outside any sandbox."""
    return [subprocess.Popen([PY, "-c", "while True: pass"], start_new_session=True)
            for _ in range(n)]


def regrade(tmp, n: int):
    """The plant's n-th regrade: by `grade PATH` (exercise 1, which it costs) for n even, else
    by the bundle (in a folder of its own): exercise 1's points, or the bundle's score."""
    if n % 2 == 0:
        done = run("grade", tmp / "plant.py", "--set", "grpo", "-e", "1", "--seed", SEED)
        assert done.returncode == 0, done
        return re.search(rb"exercise 1 .* ([\d.]+)/10 points", done.stdout)[1].decode()
    root = tmp / f"ag{n}"
    shutil.copytree(tmp / "ag", root)
    done = subprocess.run(["bash", root / "source" / "run_autograder"], capture_output=True,
                          env=dict(os.environ, AUTOGRADER_ROOT=root, PYTHON=PY), timeout=600)
    assert done.returncode == 0, done
    return json.loads((root / "results" / "results.json").read_text())["score"]


@pytest.fixture(scope="module")
def beside(tmp_path_factory):
    """On cores kept busy by one spinning process each, outside any sandbox: class B (the five
    attacks and two classmates) and class A (the plant REGRADES times, a correct file, a blank)
    graded at once; meanwhile the plant graded REGRADES times by `grade PATH` and by the bundle,
    two at a time. What each said, and how long it all took."""
    tmp = tmp_path_factory.mktemp("beside")
    for folder, files in (("B", {**{f"{n}.py": BASE + a for n, a in ATTACKS.items()},
                                 "zz-correct.py": CORRECT, "zz-plant.py": PLANTED}),
                          ("A", {**{f"p{i:02d}.py": PLANTED for i in range(REGRADES)},
                                 "zz-correct.py": CORRECT, "zz-blank.py": BASE})):
        (tmp / folder).mkdir()
        for name, text in files.items():
            (tmp / folder / name).write_text(text)
    (tmp / "plant.py").write_text(PLANTED)
    assert run("gradescope", tmp / "ag.zip", "--set", "grpo", "--seed", SEED).returncode == 0
    with zipfile.ZipFile(tmp / "ag.zip") as z:
        z.extractall(tmp / "ag" / "source")
    (tmp / "ag" / "submission").mkdir()
    shutil.copy(tmp / "plant.py", tmp / "ag" / "submission" / "tokencredit.py")
    started, busy = time.monotonic(), spinners(os.cpu_count())
    try:
        b = grade_all(tmp / "B", tmp / "B.csv", "--time-limit", "10", "--memory-limit", "512")
        a = grade_all(tmp / "A", tmp / "A.csv")
        with ThreadPoolExecutor(2) as pool:
            regrades = list(pool.map(lambda n: regrade(tmp, n), range(2 * REGRADES)))
        said = {name: p.communicate(timeout=900)[0].decode() for name, p in (("A", a), ("B", b))}
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert a.returncode == 0 and b.returncode == 0, said
    yield dict(A=rows_of(tmp / "A.csv"), B=rows_of(tmp / "B.csv"), paths=regrades[::2],
               bundles=regrades[1::2], took=time.monotonic() - started)


def test_two_classes_graded_at_once_keep_the_grades_each_gets_alone(beside):
    """A correct file 30, the plant 23 (exercise 1 alone), a blank 0, in both classes, as alone
    on an idle machine; every attack 0."""
    for rows in (beside["A"], beside["B"]):
        assert rows["zz-correct"]["total"] == "30.00", rows["zz-correct"]
        assert [rows["zz-correct"][f"exercise {k}"] for k in (1, 3, 5)] == ["10.00"] * 3
    assert beside["B"]["zz-plant"]["total"] == "23.00", beside["B"]["zz-plant"]
    assert beside["A"]["zz-blank"]["total"] == "0.00"
    for name in ATTACKS:
        assert beside["B"][name]["total"] == "0.00", beside["B"][name]
    # its processes' waits are not taken off its time: their CPU time counts (Session.clock)
    limit = "0 points: the time limit (10 s per exercise) was reached"
    assert beside["B"]["a-wait"]["notes"].count(limit) == 3, beside["B"]["a-wait"]["notes"]
    assert beside["took"] < 600


def test_the_same_file_gets_one_score_on_every_route_beside_another_run(beside):
    """REGRADES grades of the plant by each route, during the two class runs: one score, the
    same on every route (exercise 1's 3 of 10, 23 of 30 in all)."""
    plants = {tuple(row[k] for k in ("exercise 1", "exercise 3", "exercise 5", "total", "notes"))
              for name, row in beside["A"].items() if name.startswith("p")}
    assert len(plants) == 1, plants
    (first, third, fifth, total, _), = plants
    assert (third, fifth, total) == ("10.00", "10.00", "23.00")
    assert beside["paths"] == [f"{float(first):.1f}"] * REGRADES, beside["paths"]
    assert beside["bundles"] == [23.0] * REGRADES, beside["bundles"]


def test_the_sandbox_s_root_is_read_only_and_tmp_its_one_disk(beside):
    """bwrap's root was a tmpfs of its own, writable and unbounded: 300 MB were written to /.
    Now / takes nothing, and all the mounts together no more than the disk limit (64 MB)."""
    assert wrote(beside["B"]["a-root"]["notes"]) == [0] * 3, beside["B"]["a-root"]["notes"]
    most = wrote(beside["B"]["a-mounts"]["notes"])
    assert len(most) == 3 and 0 < max(most) <= grading.LIMITS["disk_mb"] << 20, most
