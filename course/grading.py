"""Grading: the driver that runs the judges and the students' processes, the test map, the points.

The driver (this process) starts the judge workers (course/judge.py), then grades one submission
at a time: exercise k is one job, on worker n mod the workers (n: its place in the set), in a
bubblewrap sandbox no job has used (`sandbox_argv`, ENTER, `find_cgroup`). What the sandbox, its
uid, its cgroups and the limits guard: docs/instructors.md, "What the grader protects against".
"""

import ast
import contextlib
import fcntl
import glob
import hashlib
import json
import math
import os
import re
import resource
import secrets
import select
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time

from .exercises import EXERCISE_OF, EXERCISES, names as exercise_names, points as exercise_points
from .source import blank, constants, functions, kept_statements
from .flags import scan
from .written import printable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)  # the repository, a handout or a bundle's source
TESTS = "test_tokencredit.py"
HIDDEN = os.path.join("tests", "course", "test_hidden.py")  # the hidden set: every grade's
MAP_FILE = "course_map.json"  # a handout's: its set, exercises and their tests
SNAPSHOTS = "course_snapshots.json"  # a handout's: the plain loops' recorded outputs
BUNDLE_FILE = "course_autograder.json"  # a Gradescope bundle's: its set, secret (or seed), limits
CACHE = os.path.join(ROOT, ".course-cache")
MAP_VERSION = 3  # bump when the way the map is computed changes
LIMITS = dict(  # the instructor's: an exercise past one of them gets 0, and the report says which
    # the two times: wall time less waits for a CPU that other work held, never less than the CPU
    # time used (judge.Session.clock)
    time_s=120.0,  # for one exercise's tests
    test_s=10.0,  # for one test
    memory_mb=2048,  # what its sandbox may add to torch's (docs/instructors.md; `Driver.warm`)
    file_mb=16,  # the largest file it may write (its printed output goes to one)
    processes=64,  # processes of the student's user (RLIMIT_NPROC)
    cpu_s=240,  # CPU time of the student's process
    disk_mb=64,  # all it writes, together (its sandbox's tmpfs)
)
LIMIT_NAMES = {"time": "the time limit ({time_s:g} s per exercise) was reached",
               "test time": "the time limit ({test_s:g} s per test) was reached",
               "memory": "the memory limit ({memory_mb} MB) was reached",
               "file size": "the file size limit ({file_mb} MB) was reached",
               "cpu time": "the CPU time limit ({cpu_s} s) was reached",
               "output size": "the output size limit (2 MB of header, 256 MB per answer) was "
                              "reached",
               "malformed": "it broke the grader's protocol",
               "died": "its process died"}
SANDBOX_UID = 1_500_000_000  # as root, a run's n-th sandbox runs as uid + its block's + n
UID_BLOCK = 10 ** 6  # uids per run's block (`claim_uids`); 2,000 blocks fit below 2**32
UID_LOCKS = "/run/course-sandbox-uids"  # a lock file per block, held by the run that uses it
NO_SANDBOX = ("no sandbox (bubblewrap could not run here): students' code runs as the grader's "
              "user and can read, signal and write what it can")
SAME_NOTE = "the published reference's code, statement for statement: the student's own?"


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def write_to(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def sha(*parts) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def sandbox_argv(code_dir: str, disk_mb: int, uid=None) -> list:
    """bwrap's command line for the sandbox docs/instructors.md describes (code_dir as /course,
    disk_mb of /tmp); with uid (as root), ENTER's, which starts it as that outside uid."""
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--as-pid-1", "--new-session", "--uid", "65534", "--gid", "65534",
            "--ro-bind", "/usr", "/usr", "--size", str(int(disk_mb) << 20), "--tmpfs", "/tmp"]
    for name in ("/bin", "/sbin", "/lib", "/lib64"):
        argv += ["--symlink", os.readlink(name), name] if os.path.islink(name) else [
            "--ro-bind-try", name, name]
    sites = [p for p in site.getsitepackages() + sys.path
             if p.endswith(("site-packages", "dist-packages"))]
    pythons = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(
        sys.executable)))] + sites
    for path in sorted({q for p in pythons if os.path.isdir(p) for q in (p, os.path.realpath(p))
                        if not q.startswith("/usr/")}):
        argv += ["--ro-bind", path, path]
    # hidden: the project (its reference) where pip may have installed it, in a bound Python
    places = sites + [q for p in pythons + ["/usr"]
                      for pattern in ("lib/python*/*-packages", "local/lib/python*/*-packages")
                      for q in glob.glob(os.path.join(p, pattern))]
    installed = {r for p in places for pattern in ("tokencredit*", "__pycache__/tokencredit*")
                 for q in glob.glob(os.path.join(p, pattern)) for r in (q, os.path.realpath(q))}
    for path in sorted(installed):  # an empty folder or file, neither one to write in
        argv += ["--tmpfs", path, "--remount-ro", path] if os.path.isdir(path) else [
            "--ro-bind", "/dev/null", path]
    argv += ["--ro-bind", code_dir, "/course", "--proc", "/proc", "--dev", "/dev",  # read-only:
             "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp"]  # /tmp, the one disk
    if uid is None:
        return argv
    sources = {os.path.realpath(argv[i + 1]) for i, a in enumerate(argv) if a == "--ro-bind"}
    over = {p: closed_to(p, uid) for p in sources}
    paths = sorted(p for p in sources if over[p] and not any(
        q != p and over[q] and p.startswith(q.rstrip("/") + "/") for q in sources))
    return [sys.executable, "-I", "-S", "-c", ENTER, str(uid),
            json.dumps(dict(over=sorted({over[p] for p in paths}), paths=paths))] + argv


def closed_to(path: str, uid: int):
    """The first folder above path that uid (gid uid, no other group) cannot search, or None."""
    parts = os.path.realpath(path).split("/")[1:-1]
    for n in range(len(parts) + 1):
        folder = "/" + "/".join(parts[:n])
        st = os.stat(folder)
        if not st.st_mode & (0o100 if st.st_uid == uid else 0o010 if st.st_gid == uid else 0o001):
            return folder
    return None


# Run as root by sandbox_argv(..., uid): bwrap resolves what it binds as the uid it runs as, and
# that uid may not reach this Python (under /root, mode 700). So, in a mount namespace of its
# own, a tmpfs (mode 755) covers each folder it cannot search and the paths bwrap needs under it
# are bound back from descriptors opened before the tmpfs hid them; then uid, its gid and no other
# group, and bwrap. (bwrap's --ro-bind-fd does not help: it resolves /proc/self/fd/N to the path.)
ENTER = """
import ctypes, json, os, sys
uid, plan, argv = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3:]
libc = ctypes.CDLL(None, use_errno=True)
def check(result, what):
    if result != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")
if plan["over"]:
    check(libc.unshare(0x20000), "unshare(CLONE_NEWNS)")
    check(libc.mount(None, b"/", None, 0x44000, None), "mount --make-rprivate /")  # REC|PRIVATE
    fds = [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in plan["paths"]]  # in this namespace
    for folder in plan["over"]:
        check(libc.mount(b"tmpfs", folder.encode(), b"tmpfs", 6, b"mode=755"),  # NOSUID|NODEV
              "tmpfs " + folder)
    for fd, path in zip(fds, plan["paths"]):
        os.makedirs(path, exist_ok=True)
        check(libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, 0x5000, None),
              "bind " + path)  # BIND|REC
        os.close(fd)
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
os.execvp(argv[0], argv)
"""


def find_sandbox():
    """{"uid": the first sandbox's uid (as root, where bwrap runs under one; else None), "cgroup",
    "cpu", "cpuacct": find_cgroup's} if bwrap runs this Python here; else None."""
    with tempfile.TemporaryDirectory(prefix="course-probe-") as code:
        os.chmod(code, 0o755)
        for uid in [SANDBOX_UID, None][os.geteuid() != 0:] * bool(shutil.which("bwrap")):
            with contextlib.suppress(OSError, subprocess.SubprocessError):  # then the next, if any
                argv = sandbox_argv(code, 1, uid) + [sys.executable, "-E", "-s", "-c", "pass"]
                subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=60)
                return dict(uid=uid, cgroup=find_cgroup("memory"), cpu=find_cgroup("cpu"),
                            cpuacct=find_cgroup("cpuacct"))
    return None


def claim_uids() -> tuple:
    """(the first uid of a block that no other run on this machine holds, the lock's file
    descriptor): two runs' sandboxes never share a uid. The lock goes with this process."""
    os.makedirs(UID_LOCKS, mode=0o700, exist_ok=True)
    for block in range(2000):
        fd = os.open(os.path.join(UID_LOCKS, str(block)),
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with contextlib.suppress(BlockingIOError):  # else another run's
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return SANDBOX_UID + block * UID_BLOCK, fd
        os.close(fd)
    raise RuntimeError(f"course: all 2,000 blocks of sandbox uids are held ({UID_LOCKS})")


CGROUP_FILES = {1: dict(limit="memory.limit_in_bytes", usage="memory.usage_in_bytes",
                        swap="memory.memsw.limit_in_bytes", events="memory.oom_control",
                        cpu="cpu.shares", cpuacct="cpuacct.usage", threads="tasks"),
                2: dict(limit="memory.max", usage="memory.current", swap="memory.swap.max",
                        events="memory.events", cpu="cpu.weight", cpuacct="cpu.stat",
                        threads="cgroup.threads")}


def find_cgroup(controller: str):
    """{"folder", "version"}: where this process may make cgroups with `controller` on (v1's
    hierarchy of it, or v2's where it is on for children), else None (docs/instructors.md)."""
    for line in read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        version = 1 if controller in controllers.split(",") else 2 if not controllers and (
            os.path.exists("/sys/fs/cgroup/cgroup.controllers")) else None
        if version is None:
            continue
        cgroup = dict(folder=os.path.realpath(  # v1's cpu and cpuacct: often links to one
            (f"/sys/fs/cgroup/{controller}" if version == 1 else "/sys/fs/cgroup") + path),
            version=version)
        probe = os.path.join(cgroup["folder"], f"course-probe-{os.getpid()}")
        try:  # what start_box and Driver.warm do: a limit, and a process started in it
            os.mkdir(probe)
            if controller == "memory":
                cap(cgroup, probe, 1 << 30)
            elif not os.path.exists(cgroup_file(cgroup, probe, controller)):
                continue  # v2 with cpu off for its children
            subprocess.run(["true"], check=True, timeout=60, preexec_fn=joining(probe))
            return cgroup
        except (OSError, subprocess.SubprocessError):
            continue  # the next hierarchy, if any
        finally:
            with contextlib.suppress(OSError):  # else left empty: harmless
                os.rmdir(probe)
    return None


def joining(*folders):
    """A preexec_fn: the new process joins the cgroups `folders` before it runs anything."""
    return lambda: [write_to(os.path.join(f, "cgroup.procs"), os.getpid()) for f in folders]


def cgroup_file(cgroup: dict, folder: str, which: str) -> str:
    return os.path.join(folder, CGROUP_FILES[cgroup["version"]][which])


def cap(cgroup: dict, folder: str, limit: int) -> None:
    """The memory cgroup `folder` may hold limit bytes, and no swap (v1's counts both in one)."""
    write_to(cgroup_file(cgroup, folder, "limit"), limit)
    if os.path.exists(cgroup_file(cgroup, folder, "swap")):
        write_to(cgroup_file(cgroup, folder, "swap"), limit if cgroup["version"] == 1 else 0)


def clean(x):
    """A worker's message with every string safe to print (`printable`)."""
    return (printable(x) if isinstance(x, str) else
            [clean(v) for v in x] if isinstance(x, list) else
            {clean(k): clean(v) for k, v in x.items()} if isinstance(x, dict) else x)


class Driver:
    """The judge workers, the students' sandboxes and the one-submission-at-a-time loop."""

    def __init__(self, tests: dict, seed: int, consts: dict, function_names, limits=None,
                 workers=None, jobs=None, reuse=False):
        self.limits = dict(LIMITS, **(limits or {}))
        self.stale = []  # the cgroups of dropped sandboxes, until `reap` removes them
        self.sandbox = find_sandbox()
        self.uids = claim_uids() if self.sandbox and self.sandbox["uid"] else None
        self.private = tempfile.mkdtemp(prefix="course-judge-")
        os.chmod(self.private, 0o711)  # a sandbox's own uid reaches its zygote's code, no more
        self.code = os.path.join(self.private, "zygote")  # the child's two files, /course in a box
        os.makedirs(self.code, mode=0o755)
        for name in ("child.py", "protocol.py"):
            shutil.copy(os.path.join(HERE, name), self.code)
        # sandboxes warm ahead, about 150 MB each (`give_box`); jobs: how many at most (None: no
        # end known); reuse (the map's jobs, the reference's code): a worker's box serves them all
        self.left, self.started, self.ids = math.inf if jobs is None else jobs, 0, 0
        self.reuse = reuse
        self.boxes = [self.start_box() for _ in range(min(self.left, 4))]
        tests_dir = os.path.join(self.private, "tests")  # no sandbox sees it
        os.makedirs(tests_dir, mode=0o700)
        for name, path in tests.items():  # the tests, read once, before any submission
            shutil.copy(path, os.path.join(tests_dir, name))
        self.config = dict(private=self.private, tests_dir=tests_dir,
                           files=[n for n in tests if n.endswith(".py")], seed=seed,
                           constants=consts, functions=list(function_names), limits=self.limits)
        self.tests = None
        self.pool = self.start_workers(workers or 2)

    def start_box(self) -> dict:
        """A fresh sandbox (bwrap's, when there is one) with a zygote (course/child.py) in it that
        loads torch: its process, and the control line the judge gets with its first job."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message each
        uid = self.uids and self.uids[0] + self.started % UID_BLOCK
        box = [] if self.sandbox is None else sandbox_argv(self.code, self.limits["disk_mb"], uid)
        code, work = ("/course", "/tmp") if box else (self.code, self.code)
        env = dict(PATH="/usr/bin:/bin", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   LANG="C.UTF-8", HOME=work, PYTHONHASHSEED="0")  # all it gets (no -E)
        self.started += 1
        name, cgroups, counts = f"course-{os.getpid()}-{time.time_ns()}", [], None
        for which in ("cgroup", "cpu", "cpuacct") if box else ():  # its memory's, cpu's, count's
            folder = self.sandbox[which] and os.path.join(self.sandbox[which]["folder"], name)
            if folder and folder not in cgroups:  # v2: one for all (v1: cpu, cpuacct often)
                os.mkdir(folder)
                cgroups.append(folder)
            if folder and which == "cpuacct":  # what judge.Session.clock reads
                counts = {k: cgroup_file(self.sandbox[which], folder, k)
                         for k in ("cpuacct", "threads")}
        process = subprocess.Popen(  # as uid: sandbox_argv's first program sees to it
            box + [sys.executable, "-s", os.path.join(code, "child.py"),
                   str(theirs.fileno()), work], pass_fds=[theirs.fileno()], cwd=self.code,
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, preexec_fn=joining(*cgroups) if cgroups else None)
        theirs.close()  # all the sandbox's processes are in its cgroups: bwrap starts there
        return dict(process=process, control=ours, cgroups=cgroups, counts=counts,
                    cgroup=cgroups[0] if self.sandbox and self.sandbox["cgroup"] else None)

    def warm(self, box) -> None:
        """Wait for the sandbox's zygote to load torch (its line "ready"); then its cgroup may hold
        that plus the memory limit: the job's processes and its files in /tmp, together."""
        ready, _, _ = select.select([box["process"].stdout], [], [], 300)
        said = os.read(box["process"].stdout.fileno(), 6) if ready else b""
        box["process"].stdout.close()
        if said != b"ready\n":
            raise RuntimeError("its Python did not start")
        if box["cgroup"]:
            usage = int(read(cgroup_file(self.sandbox["cgroup"], box["cgroup"], "usage")))
            cap(self.sandbox["cgroup"], box["cgroup"], usage + (self.limits["memory_mb"] << 20))

    def give_box(self, worker) -> None:
        """A sandbox for the worker's job: a warm one no job has used (unless reuse; a dead one
        fails `warm`); another starts while the jobs to come outnumber the warm ones (4 at most)."""
        if worker["box"] is None:
            worker["box"] = self.boxes.pop(0) if self.boxes else self.start_box()
            self.left -= 1
            if len(self.boxes) < min(self.left, 4):
                self.boxes.append(self.start_box())
            self.warm(worker["box"])
        socket.send_fds(worker["channel"], [b'{"zygote": true}\n'],
                        [worker["box"]["control"].fileno()])
        if not self.reuse:
            worker["box"]["control"].close()  # the judge's now

    def drop(self, box) -> None:
        """Killing bwrap kills its sandbox whole (--die-with-parent, its own PID namespace); its
        cgroup goes once its processes have exited (`reap`)."""
        if box is not None:
            box["control"].close()
            box["process"].stdout.close()
            box["process"].kill()
            box["process"].wait()
            self.stale += box["cgroups"]
            self.reap()

    def reap(self, wait_s=0.0) -> None:
        """Remove the dropped sandboxes' cgroups whose processes have all exited (within wait_s)."""
        deadline = time.monotonic() + wait_s
        while True:
            for folder in list(self.stale):
                with contextlib.suppress(OSError):  # not yet: its processes are still exiting
                    os.rmdir(folder)
                    self.stale.remove(folder)
            if not self.stale or time.monotonic() >= deadline:
                return
            time.sleep(0.02)

    def start_workers(self, n: int) -> list:
        """n judge workers: one judge process collects the tests (seconds: torch, pytest, the
        test files), then forks the others, each with a line of its own to this process."""
        pairs = [socket.socketpair() for _ in range(n)]
        env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
        env.pop("TOKENCREDIT_SEED", None)
        log = open(os.path.join(self.private, f"judge-{time.time_ns()}.log"), "w")
        process = subprocess.Popen(
            [sys.executable, "-m", "course.judge"] + [str(t.fileno()) for _, t in pairs],
            pass_fds=[t.fileno() for _, t in pairs], cwd=self.private, env=env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        for _, theirs in pairs:
            theirs.close()
        pairs[0][0].sendall(json.dumps(self.config).encode() + b"\n")
        workers = [dict(process=process, channel=ours, buffer=b"", job=None, log=log, box=None,
                        closed=False) for ours, _ in pairs]
        for worker in workers:
            message = self.next_message(worker, time.monotonic() + 300)
            if not message or not message.get("ready"):
                log.flush()
                raise SystemExit("course: the judge did not start: "
                                 + (message or {}).get("error", read(log.name)[-3000:]))
            self.tests, worker["pid"] = message["tests"], message["pid"]
            if worker["pid"] != process.pid:  # a fork: a pidfd now, before its pid can be reused
                worker["pidfd"] = os.pidfd_open(worker["pid"])
        return workers

    def next_message(self, worker, deadline):
        """The worker's next line as a dict, or None by the deadline (or if it is not one)."""
        while b"\n" not in worker["buffer"]:
            ready, _, _ = select.select([worker["channel"]], [], [],
                                        max(deadline - time.monotonic(), 0))
            if not ready or len(worker["buffer"]) > 1 << 28:
                return None
            data = worker["channel"].recv(1 << 20)
            if not data:
                worker["closed"] = True
                return None
            worker["buffer"] += data
        line, worker["buffer"] = worker["buffer"].split(b"\n", 1)
        try:
            message = clean(json.loads(line))
        except (ValueError, RecursionError):
            return None
        return message if isinstance(message, dict) else None

    def kill_worker(self, worker) -> None:
        """Killed, and gone before this returns: the first worker is this process's child, the
        others are its forks, waited for by their pidfd."""
        self.drop(worker["box"])
        worker["box"] = None
        if "pidfd" not in worker:
            worker["process"].kill()
            worker["process"].wait()
        else:
            with contextlib.suppress(OSError):  # gone already
                signal.pidfd_send_signal(worker["pidfd"], signal.SIGKILL)
                select.select([worker["pidfd"]], [], [], 10)
            os.close(worker.pop("pidfd"))
        worker["channel"].close()

    def run(self, jobs: list) -> list:
        """Each job's result, in order: the jobs of one submission (or the map's)."""
        for job in jobs:  # ids never reused: a late line answers no later job
            job["id"], self.ids = self.ids, self.ids + 1
        # job n on worker n mod the workers: the same jobs share a judge, in order, on every grade
        todo, results = [jobs[i::len(self.pool)] for i in range(len(self.pool))], {}
        while len(results) < len(jobs):
            for i, worker in enumerate(self.pool):
                if worker["job"] is None and todo[i]:
                    job = worker["job"] = todo[i].pop(0)
                    try:
                        self.give_box(worker)
                        line = json.dumps(dict(job, counts=worker["box"]["counts"]))
                        worker["channel"].sendall(line.encode() + b"\n")
                    except (OSError, RuntimeError) as error:  # its sandbox, or its judge
                        self.restart(i, todo[i], results, f"a sandbox or a judge failed: {error}")
                        continue
                    # a job still running 4 limits on (of Session.clock) is the grader's failure
                    worker["deadline"] = time.monotonic() + 4 * job["limit"] + 60
            busy = [w for w in self.pool if w["job"] is not None]
            select.select([w["channel"] for w in busy], [], [], 0.2)  # until one says something
            for worker in busy:
                i = self.pool.index(worker)
                message = self.next_message(worker, time.monotonic())  # a whole line, if one came
                if message is not None:
                    if message.get("id") == worker["job"]["id"]:  # any other line is no answer
                        self.done(worker, message, todo[i], results)
                elif worker["closed"] or time.monotonic() > worker["deadline"]:
                    self.restart(i, todo[i], results, "the grader's judge process stopped")
        return [results[job["id"]] for job in jobs]

    def restart(self, i: int, queue: list, results: dict, why: str) -> None:
        """Worker i, whose job the grader failed (`done`), killed, and a fresh one in its place."""
        worker = self.pool[i]
        self.kill_worker(worker)
        self.done(worker, dict(id=worker["job"]["id"], grader=why), queue, results)
        self.pool[i], = self.start_workers(1)

    def done(self, worker, message: dict, queue: list, results: dict) -> None:
        """The worker's job's result; but a job the grader failed (`grader`, docs/instructors.md
        says when) runs once more, next, in a fresh sandbox."""
        job, box, worker["job"] = worker["job"], worker["box"], None
        if message.get("limit") == "died" and box["cgroup"]:  # this job's alone: out of memory?
            events = read(cgroup_file(self.sandbox["cgroup"], box["cgroup"], "events")).split()
            if "oom_kill" in events and int(events[events.index("oom_kill") + 1]):
                message.update(limit="memory", stopped="the kernel killed it", grader=None)
        if not self.reuse or message.get("grader"):  # with all the job left in it: no later job
            self.drop(box)  # of the submission finds what this one wrote
            worker["box"] = None
        if message.get("grader") and "first" not in job:
            queue.insert(0, dict(job, id=self.ids, first=job["id"]))
            self.ids += 1
        else:
            results[job.get("first", job["id"])] = dict(
                results={}, error=None, limit=None, stopped=None, calls={}, snapshots={},
                grader=None) | message

    def close(self) -> None:
        """The judges and the sandboxes killed, not asked (a Python with torch takes 1 s to go)."""
        for worker in self.pool[::-1]:  # the forks before the worker they came from
            self.kill_worker(worker)
            worker["log"].close()
        for box in self.boxes:
            self.drop(box)
        self.reap(wait_s=5)
        shutil.rmtree(self.private, ignore_errors=True)
        if self.uids:
            os.close(self.uids[1])  # the block, free for another run


# -----------------------------------------------------------------------------
# the test map: which tests fail when one function is blank; computed once, kept in the cache

def test_files(root=ROOT) -> dict:
    """{name in the judge's folder: path}: the tests, the hidden set, a handout's loops' outputs."""
    return {os.path.basename(name): os.path.join(root, name) for name in (TESTS, HIDDEN, SNAPSHOTS)
            if name == TESTS or os.path.exists(os.path.join(root, name))}


def map_key(reference: str, tests: dict) -> str:
    return sha(str(MAP_VERSION), reference, *[read(p) for p in tests.values()],
               json.dumps(EXERCISES))


def kind(test: str, snapshots: dict) -> str:
    """"fresh" (the hidden set: inputs drawn from the grade's seed), "hand" (a hand-worked case),
    "loop" (compares with a plain-loop reference), or "other" (an invariant)."""
    if test.startswith("test_hidden_"):
        return "fresh"
    if "hand_worked" in test:
        return "hand"
    if any(key.startswith(test + "::ref_") for key in snapshots):
        return "loop"
    return "other"


def compute_map(reference: str, tests: dict) -> dict:
    started = time.monotonic()
    names, fn_names = list(EXERCISE_OF), list(functions(reference))
    driver = Driver(tests, 0, constants(reference), fn_names, jobs=2, reuse=True)
    try:
        everything = list(driver.tests)
        whole, = driver.run([dict(student=reference, label="tokencredit.py", reference=None,
                                  names=names, tests=everything, trace=names, record=True,
                                  limit=LIMITS["time_s"] * 8)])
        failing = [t for t, failure in whole["results"].items() if failure]
        if whole["error"] or whole["grader"] or failing or whole["stopped"]:
            raise SystemExit(f"course: the reference fails {len(failing)} tests: {failing[:5]} "
                             f"{whole['error'] or whole['grader'] or whole['stopped'] or ''}\n"
                             + "\n".join(whole["results"][t] for t in failing[:2]))
        calls = {t: set(c) for t, c in whole["calls"].items()}
        jobs = [dict(student=blank(reference, names=[name]), label="tokencredit.py",
                     reference=None, names=names, limit=LIMITS["time_s"] * 4,
                     tests=sorted(t for t in everything if name in calls.get(t, ())))
                for name in names]
        results = driver.run(jobs)
    finally:
        driver.close()
    stopped = [r["error"] or r["grader"] or r["stopped"] for r in results
               if r["error"] or r["limit"] or r["grader"]]
    if stopped:  # a blanked copy that did not run its tests: its fails would be wrong
        raise SystemExit(f"course: a run of the blanked reference for the map stopped: "
                         f"{stopped[0]}")
    fails = {name: sorted(t for t, failure in result["results"].items() if failure)
             for name, result in zip(names, results)}
    mapping = dict(tests=sorted(everything), fails=fails, snapshots=whole["snapshots"],
                   kinds={t: kind(t, whole["snapshots"]) for t in everything},
                   constants=constants(reference), functions=fn_names)
    print(f"course: computed the test map in {time.monotonic() - started:.1f} s "
          f"({len(names) + 1} runs)", file=sys.stderr)
    return mapping


def test_map(reference: str, tests=None) -> dict:
    """The map, from the cache when nothing changed and its hash checks; read before any grade."""
    tests = tests or test_files()
    key = map_key(reference, tests)
    path = os.path.join(CACHE, f"map-{key[:16]}.json")
    if os.path.exists(path):
        saved = json.loads(read(path))
        body = saved.get("map")
        if saved.get("key") == key and saved.get("sha") == sha(json.dumps(body, sort_keys=True)):
            return body
        print(f"course: {path} does not match its hash; computing the map again", file=sys.stderr)
    mapping = compute_map(reference, tests)
    os.makedirs(CACHE, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=CACHE)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(key=key, sha=sha(json.dumps(mapping, sort_keys=True)), map=mapping), f)
    os.chmod(tmp, 0o400)
    os.replace(tmp, path)
    return mapping


def by_test(tests_of: dict) -> dict:
    """{test: the names whose tests hold it}, from {name: its tests}; tests in first-seen order."""
    out = {}
    for name, tests in tests_of.items():
        for test in tests:
            out.setdefault(test, set()).add(name)
    return out


def needs(mapping: dict) -> dict:
    """{test: the exercises it fails without}."""
    return {test: {EXERCISE_OF[name] for name in names}
            for test, names in by_test(mapping["fails"]).items()}


def scheme(mapping: dict, exercises, in_order: bool) -> dict:
    """{k: {"functions": {name: its tests}, "later": {test: later exercises of the set it
    needs}}}. In order (a handout), a test that needs a later exercise still blank waits."""
    need, out = needs(mapping), {}
    for k in exercises:
        tests = {name: list(mapping["fails"].get(name, [])) for name in exercise_names(k)}
        later = {t: sorted(j for j in need[t] if j > k and j in exercises)
                 for ts in tests.values() for t in ts} if in_order else {}
        out[k] = dict(functions=tests, later={t: js for t, js in later.items() if js})
    return out


# -----------------------------------------------------------------------------
# points

def blocker(failure):
    """The exercise whose NotImplementedError stopped a test, if one did."""
    found = re.search(r"NotImplementedError: exercise (\d+):", failure or "")
    return int(found.group(1)) if found else None


def score(plan: dict, k: int, result: dict, kinds: dict, limits: dict) -> dict:
    """Exercise k's row: each function's share by its tests (docs/course.md, "Points")."""
    row = dict(k=k, max=exercise_points(k), failed={}, waiting={}, per_function={},
               blank=[name for name in plan["functions"] if name in result.get("blank", ())],
               limit=result.get("limit"), error=result.get("error"), notes=[],
               grader=result.get("grader"))
    if row["limit"]:
        named = LIMIT_NAMES.get(row["limit"], row["limit"]).format(**limits)
        row["error"] = f"0 points: {named} ({result.get('stopped')})"
    if row["grader"]:  # no points, and the file no total (`report.total`)
        row.update(limit="grader", error=f"grader error ({row['grader']}): grade the file again")
    total_points, functions = 0.0, plan["functions"]
    uses = by_test(functions)  # test: the functions of exercise k it needs
    not_run = f"not run: {result.get('stopped') or 'the test did not run'}"
    outcomes = {t: result.get("error") or result["results"].get(t, not_run)  # None: passed
                for t in uses}
    waiting = {t: blocker(f) for t, f in outcomes.items()
               if f and blocker(f) in plan["later"].get(t, ())}
    failed = {t: f for t, f in outcomes.items() if f and t not in waiting}
    for t in failed:  # never by what else failed: a second mistake never lowers the first's
        uses[t] = {name for name in uses[t] if name in t} or uses[t]
    for name, tests in functions.items():
        share = EXERCISES[k][1][name]
        counted = [t for t in tests if t not in waiting and (t not in failed or name in uses[t])]
        bad = [t for t in counted if t in failed]
        got = share * (len(counted) - len(bad)) / len(counted) if counted else 0.0
        if any(kinds.get(t) in ("hand", "loop") for t in bad):
            got = min(got, share / 4)
        if any(kinds.get(t) == "fresh" for t in bad):
            got = 0.0
        row["per_function"][name] = (len(counted) - len(bad), len(counted), round(got, 2), share)
        total_points += got
    row["failed"], row["waiting"], row["total"] = failed, waiting, len(uses) - len(waiting)
    row["points"] = 0.0 if row["limit"] else round(total_points, 2)
    row["passed"] = 0 if row["limit"] else row["total"] - len(failed)
    return row


def not_written(source: str, names) -> list:
    """The functions of `names` still as a handout gives them: checks, then raise
    NotImplementedError. source compiles (`worked` checked it)."""
    defs = functions(source)
    return [name for name in names if (node := defs.get(name)) is not None
            and kept_statements(node) == len(node.body) - 1 and isinstance(node.body[-1], ast.Raise)
            and "NotImplementedError" in ast.unparse(node.body[-1])]


def copies(source: str, reference: str) -> set:
    """The exercises' functions that source holds statement for statement as the reference does."""
    mine, theirs = functions(source), functions(reference)
    return {name for name in EXERCISE_OF if name in mine and name in theirs
            and ast.dump(mine[name]) == ast.dump(theirs[name])}


def cross_notes(rows: list, mapping: dict, blank_elsewhere=()) -> None:
    """In a handout: a failing test of k that uses another exercise j that also fails says so; j
    fails when its row does or is in blank_elsewhere (grade -e: the set's others not written)."""
    need = needs(mapping)
    failing = {r["k"] for r in rows if r["failed"] or r["blank"]} | set(blank_elsewhere)
    for row in rows:
        for test in row["failed"]:
            others = sorted(j for j in need.get(test, ()) if j != row["k"] and j in failing)
            if others:
                row.setdefault("may_come_from", {})[test] = others


def flag_row(rows: list, flags: list, strict: bool) -> None:
    if strict and flags:
        for row in rows:
            row["points"] = 0.0
            row["notes"].append("0 until reviewed (--strict): the submission is flagged")


# -----------------------------------------------------------------------------
# one grading setup: a driver, a map, a set, a secret (or a seed); then any number of submissions

def course_secret() -> str:
    """The instructor's secret: COURSE_SECRET, else one made once and kept in the cache."""
    if os.environ.get("COURSE_SECRET"):
        return os.environ["COURSE_SECRET"]
    path = os.path.join(CACHE, "secret")
    if not os.path.exists(path):
        os.makedirs(CACHE, mode=0o700, exist_ok=True)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(16))
    return read(path).strip()


class Grader:
    """reference None: a handout's grade (the student's file runs whole, exercises in order); else
    the official grade (docs/course.md, "The student's code computes; the grader judges")."""

    def __init__(self, reference, mapping, exercises, seed=0, limits=None, tests=None, secret=None):
        self.reference, self.mapping, self.exercises = reference, mapping, list(exercises)
        self.in_order, self.seed, self.secret = reference is None, seed, secret
        self.limits = dict(LIMITS, **(limits or {}))
        self.tests = tests or test_files()
        self.driver, self.found = None, ()  # found: the last driver's sandbox, () before one
        self.plan = scheme(mapping, self.exercises, self.in_order)

    def start(self, workers=None, jobs=None) -> None:
        """The judges, with their copy of the tests, and sandboxes warm for `jobs` jobs to come."""
        if self.driver is None:
            self.driver = Driver(self.tests, self.seed or 0, self.mapping["constants"],
                                 self.mapping["functions"], self.limits, workers, jobs)
            self.found = self.driver.sandbox

    def tests_of(self, k) -> list:
        return sorted({t for ts in self.plan[k]["functions"].values() for t in ts})

    def seed_for(self, source: str) -> int:
        """--seed's (a handout's 0), else the file's own: docs/course.md, "One file, one score"."""
        if self.seed is not None:
            return self.seed
        return int(sha(self.secret, source)[:15], 16) % 10 ** 9

    def grade(self, source: str, label="tokencredit.py", only=None, exam=None) -> list:
        """One row per exercise (of `only`, else of the set), each graded in the submission's own
        sandboxes; exam: examine()'s answer for source, when the caller has it."""
        exercises = [k for k in self.exercises if not only or k in only]
        if not exercises:  # nothing to run: no judge starts
            return []
        exam = exam or examine(source, label, self.reference)
        if exam["error"]:
            return [score(self.plan[k], k, dict(results={}, error=exam["error"]),
                          self.mapping["kinds"], self.limits) for k in exercises]
        seed = self.seed_for(source)
        # the module is tokencredit.py on every route, whatever the file's name
        jobs = [dict(student=source, label="tokencredit.py", names=list(exercise_names(k)),
                     tests=self.tests_of(k), limit=self.limits["time_s"], seed=seed,
                     reference=self.reference and blank(self.reference, [k]),
                     given=self.mapping["functions"]) for k in exercises]
        self.start(min(2, len(jobs)), len(jobs))  # one grade's, if not started; a class's keeps
        self.driver.left = max(self.driver.left, len(jobs))  # sandboxes warm for the jobs to come
        try:
            ran = self.driver.run(jobs)
        except BaseException:  # the grader's own failure: the next file gets fresh judges
            self.close()
            raise
        rows, unwritten = [], lambda j: [n for n in exercise_names(j) if n in exam["blank"]]
        for k, result in zip(exercises, ran):
            result["blank"] = unwritten(k)
            rows.append(score(self.plan[k], k, result, self.mapping["kinds"], self.limits))
            if set(exercise_names(k)) <= set(exam["copied"]):  # the public repository holds it
                rows[-1]["notes"].append(SAME_NOTE)
        if self.in_order:
            cross_notes(rows, self.mapping, [j for j in self.exercises if j not in exercises
                                             and unwritten(j)])
        return rows

    def sandbox(self):
        """The sandbox the students' code runs (or ran) in (find_sandbox's answer), or None."""
        return find_sandbox() if self.found == () else self.found

    def sandbox_line(self) -> str:
        box = self.sandbox()
        if box is None:
            return "NO SANDBOX: " + NO_SANDBOX
        return ("sandbox: bubblewrap, each exercise alone (its own PID, mount, network and user "
                "namespaces" + (", its own uid" if box["uid"] else "")
                + (", its memory counted whole" if box["cgroup"] else
                   ", memory limited per process") + ")")

    def close(self) -> None:
        if self.driver is not None:
            self.driver, driver = None, self.driver
            driver.close()


def zero_rows(exercises, why: str, grader=False) -> list:
    """0 points, and why (a file not read, say), or a grader error: score's rows for no tests."""
    return [score(dict(functions={}, later={}), k, {"results": {}, "grader" if grader else "error":
                                                    why}, {}, LIMITS) for k in exercises]


WORK = dict(cpu_s=5, memory_mb=1024, wall_s=60)  # the driver's own work on one file, at most


def worked(source: str, label: str, reference, extras) -> dict:
    """examine's answer, worked out in this process (its child, limited)."""
    try:
        flags = scan(source, extras)  # of a file that does not compile too
        compile(source, label, "exec", dont_inherit=True)
        return dict(error=None, flags=flags, blank=not_written(source, EXERCISE_OF),
                    copied=sorted(copies(source, reference)) if reference else [])
    except (SyntaxError, ValueError) as error:  # graded: every exercise says the error
        return dict(error=f"{type(error).__name__}: {error}", flags=flags, blank=[], copied=[])
    except (RecursionError, MemoryError):  # the parser's, the compiler's or the scan's
        return dict(refused="its code nests too deep for the grader to read")


EXAMINE = ("import json, sys; sys.path[:0] = sys.argv[1:]; from course.grading import worked; "
           "print(json.dumps(worked(**json.load(sys.stdin))))")


def examine(source: str, label="tokencredit.py", reference=None, extras=()) -> dict:
    """The driver's own work on a submission's text before any sandbox (parse, compile, flag scan,
    which functions are written or the reference's), in a process of its own under WORK: {"error":
    its SyntaxError or None, "flags", "blank", "copied"}; ValueError: past a limit, or too deep."""
    def limited():
        resource.setrlimit(resource.RLIMIT_CPU, (WORK["cpu_s"],) * 2)
        resource.setrlimit(resource.RLIMIT_AS, (WORK["memory_mb"] << 20,) * 2)
    try:
        done = subprocess.run([sys.executable, "-I", "-c", EXAMINE, ROOT], preexec_fn=limited,
                              input=json.dumps(dict(source=source, label=label, extras=list(
                                  extras), reference=reference)), capture_output=True, text=True,
                              timeout=WORK["wall_s"])
        answer = json.loads(done.stdout)
    except (subprocess.TimeoutExpired, ValueError):  # killed, or said nothing
        answer = dict(refused="the grader's own work on it (parse, compile, flag scan) passed "
                      f"its limits ({WORK['cpu_s']} s of CPU, {WORK['memory_mb']} MB, "
                      f"{WORK['wall_s']} s)")
    if "refused" in answer:
        raise ValueError(f"{label} is not graded: {answer['refused']}")
    return answer


def grade_submission(grader, submission: dict, only=None, strict=False) -> tuple:
    """(rows, flags) of a submission as course/submission.py read it, the same on every route:
    examined, then graded; 0, and why, where it was not read or examine refused it."""
    try:
        if "why" in submission:
            raise ValueError(submission["why"])
        exam = examine(submission["source"], submission["label"], grader.reference,
                       submission["extras"])
    except ValueError as error:
        return zero_rows(only or grader.exercises, str(error)), []
    rows = grader.grade(submission["source"], submission["label"], only, exam)
    flag_row(rows, exam["flags"], strict)
    return rows, exam["flags"]
