"""The classes graded once for all of the course's test files (classes.py says what each holds),
and the Gradescope bundle several of them run."""

import subprocess
import time
import zipfile

import pytest

from classes import (CRASHES, DRIVER_ATTACKS, LIMIT_ATTACKS, LONG, MEMORY_MB, ROUTE,
                     attack_sources, judges, rss_mb, write_attacks, write_class)
from submissions import BASE, CORRECT, PY, ROOT, SEED, UNBOXED, rows_of, run


@pytest.fixture(scope="session")
def klass(tmp_path_factory):
    """One grade-all of the whole class, as root (or as whoever runs the tests)."""
    tmp = tmp_path_factory.mktemp("class")
    before = write_class(tmp / "class")
    started = time.monotonic()
    done = run("grade-all", tmp / "class", "--set", "grpo", "--seed", SEED,
               "--csv", tmp / "grades.csv", "--gradescope-dir", tmp / "out" / "gs")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    time.sleep(1)  # a leftover would act now
    yield tmp, before, rows_of(tmp / "grades.csv"), took, done.stdout.decode()
    subprocess.run(["rm", "-rf", str(tmp / "class" / "b-deep")])  # too deep for shutil.rmtree


@pytest.fixture(scope="session")
def attacked(tmp_path_factory):
    """One grade-all of the attacks, the crashes and two classmates, as root (or whoever runs the
    tests), with --memory-limit MEMORY_MB; the most RSS (MB) of each judge and of the driver."""
    tmp = tmp_path_factory.mktemp("attacked")
    write_attacks(tmp / "class", {**LIMIT_ATTACKS, **CRASHES, **DRIVER_ATTACKS})
    (tmp / "class" / f"{LONG}.py").write_text(BASE)
    for name in ("d-route-file.py", "d-route-dir/tokencredit.py"):  # the same bytes, twice
        (tmp / "class" / name).parent.mkdir(exist_ok=True)
        (tmp / "class" / name).write_text(CORRECT + ROUTE)
    (tmp / "class" / "g-written").mkdir()  # a hand-graded answer that reads reversed in a sheet
    (tmp / "class" / "g-written" / "tokencredit.py").write_text(BASE)
    (tmp / "class" / "g-written" / "written.txt").write_text(
        "lab4.what: \u202e.gnorw era srewsna lla\x1b[8m\n")
    (tmp / "class" / "g-jos\u00e9.py").write_text(BASE)  # NFC
    (tmp / "class" / "g-jose\u0301.py").write_text(CORRECT)  # NFD: looks the same
    most, driver = {}, 0
    with open(tmp / "said", "wb") as said:
        grading_all = subprocess.Popen(
            [PY, "-m", "course", "grade-all", tmp / "class", "--set", "grpo", "--seed",
             str(SEED), "--memory-limit", str(MEMORY_MB), "--csv", tmp / "g.csv",
             "--gradescope-dir", tmp / "gs"], cwd=ROOT, stdout=said, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 900
            while grading_all.poll() is None and time.monotonic() < deadline:
                try:
                    driver = max(driver, rss_mb(grading_all.pid))
                    for pid in judges(grading_all.pid):
                        most[pid] = max(most.get(pid, 0), rss_mb(pid))
                except (OSError, StopIteration):
                    pass
                time.sleep(0.1)
        finally:
            grading_all.kill()
            grading_all.wait()
    assert grading_all.returncode == 0, (tmp / "said").read_text()
    yield dict(tmp=tmp, rows=rows_of(tmp / "g.csv"), said=(tmp / "said").read_bytes(),
               most=most, driver=driver, pid=grading_all.pid)


@pytest.fixture(scope="session")
def cheats(tmp_path_factory):
    """The attacks of issue 34 (classes.attack_sources) and the folder they were made in."""
    tmp = tmp_path_factory.mktemp("cheats")
    return tmp, attack_sources(tmp)


@pytest.fixture(scope="session")
def bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bundle")
    done = subprocess.run([PY, "-m", "course", "gradescope", str(tmp / "ag.zip"), "--set",
                           "grpo", "--seed", str(SEED)] + UNBOXED, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    root = tmp / "root"
    with zipfile.ZipFile(tmp / "ag.zip") as z:
        z.extractall(root / "source")
    return tmp, root, set(z.namelist())
