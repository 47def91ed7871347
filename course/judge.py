"""The judge's side: a pytest session that never imports or runs a student's code (docs/course.md,
"The student's code computes; the grader judges", says what crosses and why). The tests'
`tokencredit` is a proxy: the instructor's constants, and each function a call to the student's
process (course/child.py); an exception of ALLOWED is raised as itself, any other as StudentError.

    python -m course.judge FD...   workers, one a line FD: jobs come from course/grading.py's driver
"""

import contextlib
import json
import os
import re
import resource
import select
import signal
import socket
import sys
import time
import traceback
import types
import weakref

import torch

from . import child, protocol
from .source import snapshot_value

ALLOWED = {e.__name__: e for e in (
    ValueError, TypeError, NotImplementedError, IndexError, KeyError, RuntimeError,
    ZeroDivisionError, AttributeError, OverflowError, ArithmeticError, LookupError, NameError,
    UnboundLocalError, RecursionError, FloatingPointError)}
REPLY_LIMIT = 256 * 2 ** 20  # bytes one answer of the child may take (the output size limit)
SEES_WRITES = "test_inputs_unchanged"  # the one test that sees the child's writes into its inputs
FAILURE_LIMIT = 8000  # characters of one test's failure kept
JUDGE_MB = 384  # memory a job's fork of the judge may add: a test on a huge answer fails


def schedstat(thread) -> tuple:
    """(seconds on a CPU, seconds waiting for one) of a thread, or zeros (exited, or not kept)."""
    try:
        with open(f"/proc/{thread}/schedstat") as f:
            return tuple(int(n) / 1e9 for n in f.read().split()[:2])
    except (OSError, ValueError):
        return 0.0, 0.0


class StudentError(Exception):
    """An exception of the student's code whose type the judge does not raise as itself."""


class GraderLimit(Exception):
    """The student's process is gone (a limit, a crash, a malformed answer): each later call too."""


class Session:
    """One child: one submission and one exercise."""

    def __init__(self, zygote, spec: dict, limit_s: float, counts=None):
        self.zygote, self.calls, self.dead, self.limit = zygote, 0, None, None
        self.running = False  # the student's code has been called (`load`)
        self.returned = {}  # id: weakref of each tensor that came from the child ("got")
        self.where, self.called = [], set()
        self.sees_writes = False  # else the judge's tensors stay as sent, whatever the child does
        self.counts = counts  # its sandbox's cgroup files (grading.Driver.start_box), or None
        self.sock, self.pid = zygote.fork(spec)
        self.start = self.used()  # from the fork: a sandbox's start is ours
        self.deadline = self.test_deadline = limit_s  # in seconds of `clock`

    def used(self) -> tuple:
        """(wall, CPU, waiting) seconds so far: the wall clock; the judge's thread's and the
        sandbox's CPU time (its cpuacct cgroup's, exited processes' too); their threads' waits."""
        ran, waited = schedstat("thread-self")
        if self.counts:
            with open(self.counts["cpuacct"]) as f:  # v1's cpuacct.usage (ns), v2's cpu.stat (µs)
                usage = f.read().split()
            ran += int(usage[0]) / 1e9 if len(usage) == 1 else int(usage[1]) / 1e6
            with open(self.counts["threads"]) as f:
                waited += sum(schedstat(int(tid))[1] for tid in f.read().split())
        return time.monotonic(), ran, waited

    def clock(self) -> float:
        """Seconds of this exercise as its limits count them: the wall time since the fork less
        the waits for a CPU, never less than the CPU time (docs/instructors.md says why)."""
        (wall, ran, waited), (wall0, ran0, waited0) = self.used(), self.start
        return min(wall - wall0, max(wall - wall0 - max(waited - waited0, 0.0), ran - ran0))

    def left(self) -> float:
        """Seconds of `clock` to the nearer deadline (the wall clock's, while that is nearer)."""
        end, wall = min(self.deadline, self.test_deadline), time.monotonic() - self.start[0]
        return end - wall if wall < end else end - self.clock()

    # -- the line to the child

    def receive(self) -> tuple:
        """The child's next message, whole by the deadline (not only each read by it); a child
        that has ended before (killed, say, while a process it forked holds its line open) stops
        at once."""
        while True:  # until its line has data or the deadline is past
            left = self.left()
            ready, _, _ = select.select([self.sock, self.zygote.control], [], [], max(left, 0.05))
            if self.sock in ready or left <= 0:  # an answer (or the deadline): read below
                break
            try:
                self.zygote.lines(0.01)
            except (OSError, EOFError):  # the sandbox's first process: all in it are gone
                self.stop("died", "its sandbox ended")
            if self.pid in self.zygote.exits:
                self.stop(*self.zygote.why(self.pid))
        try:  # a deadline already past times out before any read
            header, blobs = protocol.receive(self.sock, REPLY_LIMIT, self.left)
        except socket.timeout:
            which = "time" if self.clock() >= self.deadline else "test time"
            self.stop(which, "it ran past the time limit")
        except protocol.TooLarge as error:
            self.stop("output size", f"an answer of {error}")
        except protocol.Malformed as error:
            self.stop("malformed", f"it answered malformed data ({error})")
        except (EOFError, OSError):
            self.stop(*self.zygote.why(self.pid))
        if header.get("op") == "limit":
            self.stop("memory" if header.get("which") == "memory" else "malformed",
                      "it reached the limit")  # the only limit a child reports itself
        if header.get("op") == "raise":  # the student's exception, as a value
            raise self.exception(header)
        return header, blobs

    def send(self, header, blobs=()) -> None:
        if self.dead:  # every later call of the same exercise
            raise GraderLimit(f"the student's process stopped: {self.dead}")
        try:
            protocol.send(self.sock, header, blobs)
        except OSError:
            self.stop(*self.zygote.why(self.pid))

    def stop(self, limit: str, why: str):
        """The child is done for: kill it (and its process group), raise GraderLimit."""
        if self.dead is None:
            self.limit, self.dead = limit, why
            self.kill()
        raise GraderLimit(f"the student's process stopped: {self.dead}")

    def kill(self) -> None:
        self.zygote.kill(self.pid)
        with contextlib.suppress(OSError):
            self.sock.close()

    def load(self, job: dict) -> None:
        """The child loads the reference, says "running", then runs the student's file: a child
        that stops before it said so stopped for the grader's reason, never the student's."""
        self.send(dict(op="load", student=job["student"], label=job["label"],
                       reference=job.get("reference"), names=job["names"],
                       given=job.get("given", []), trace=job.get("trace")))
        for op in ("running", "loaded"):
            if self.receive()[0].get("op") != op:
                self.stop("malformed", "it answered malformed data")
            self.running = True

    # -- calls

    def call(self, name: str, args, kwargs):
        self.calls += 1
        call_id, callables = self.calls, []
        self.called.add(name)
        value, table, blobs, sent = protocol.encode([list(args), kwargs], callables)
        self.send(dict(op="call", id=call_id, name=name, args=value["v"][0],
                       kwargs=value["v"][1], tensors=table), blobs)
        header, blobs = self.receive()
        while header.get("op") == "callback":  # a callable the test passed, called back here
            self.answer_callback(header, blobs, callables)
            header, blobs = self.receive()
        if header.get("op") != "return":
            self.stop("malformed", f"it answered {str(header.get('op'))[:30]!r} to a call")
        try:
            return self.returned_value(header, blobs, sent, call_id)
        except protocol.Malformed as error:
            self.stop("malformed", f"it answered malformed data ({error})")

    def returned_value(self, header, blobs, sent, call_id):
        tensors = protocol.decode_tensors(header.get("tensors", []), blobs)
        for i, blob in header.get("mutated", []):  # the student changed an input in place
            if not (0 <= i < len(sent) and 0 <= blob < len(blobs)):
                raise protocol.Malformed("a changed input that was not sent")
            changed = protocol.decode_tensors([dict(dtype=str(sent[i].dtype)[6:],
                                                    shape=list(sent[i].shape), blob=0)],
                                              [blobs[blob]])[0]
            if self.sees_writes:
                with torch.no_grad():
                    sent[i].copy_(changed)
        self.called.update(n for n in header.get("called", []) if isinstance(n, str))
        outs = [i for i, t in enumerate(tensors) if t.requires_grad]
        ins = [t for t in sent if t.requires_grad]
        plain = [t.detach().requires_grad_(t.requires_grad) for t in tensors]  # leaves, not views
        if outs and ins:  # then linked to the inputs through the child's graph
            linked = Remote.apply((self, call_id, [plain[i] for i in outs]), *ins)
            for i, t in zip(outs, linked if isinstance(linked, tuple) else (linked,)):
                plain[i] = t
        self.returned.update((id(t), weakref.ref(t)) for t in plain)
        return protocol.decode(header["value"], plain)

    def answer_callback(self, header, blobs, callables) -> None:
        try:
            tensors = protocol.decode_tensors(header.get("tensors", []), blobs)
            args, kwargs = protocol.decode(header["args"], tensors)
            function = callables[int(header["i"])]
        except (protocol.Malformed, KeyError, IndexError, TypeError, ValueError) as error:
            self.stop("malformed", f"it answered malformed data ({error})")
        try:
            out = function(*args, **kwargs)
            value, table, out_blobs, _ = protocol.encode(out)
            self.send(dict(op="callback_return", value=value, tensors=table), out_blobs)
        except Exception as error:  # noqa: BLE001 -- the test's callable failed: tell the child
            self.send(dict(op="callback_raise", type=type(error).__name__, message=str(error)))

    def backward(self, call_id, grad_outputs, n_inputs):
        value, table, blobs, _ = protocol.encode(list(grad_outputs))  # None: no gradient
        self.send(dict(op="backward", id=call_id, grads=value, tensors=table), blobs)
        header, blobs = self.receive()
        try:
            grads = protocol.decode(header["value"], protocol.decode_tensors(header["tensors"],
                                                                             blobs))
        except (protocol.Malformed, KeyError) as error:
            self.stop("malformed", f"it answered malformed data ({error})")
        if not isinstance(grads, list) or len(grads) != n_inputs:
            self.stop("malformed", "it answered the wrong number of gradients")
        return [g.detach() if isinstance(g, torch.Tensor) else None for g in grads]

    def exception(self, header: dict) -> Exception:
        kind = ALLOWED.get(header.get("type"), None)
        message = str(header.get("message", ""))[:4000]  # escaped by the driver, as all it gets
        where = header.get("where")
        self.where = [[str(x)[:200] for x in w] for w in (where if isinstance(where, list) else [])
                      if isinstance(w, list) and len(w) == 4][-6:]
        error = kind(message) if kind else StudentError(f"{str(header.get('type'))[:100]}: "
                                                        f"{message}")
        error.student_where = self.where
        return error


class Remote(torch.autograd.Function):
    """The child's outputs as a function of the inputs that require grad: backward sends
    grad_output to the child, which differentiates the graph it kept for this call."""

    @staticmethod
    def forward(ctx, call, *inputs):  # call: (the session, the call's id, the child's outputs)
        ctx.call, ctx.n = call[:2], len(inputs)
        return tuple(o.clone() for o in call[2])

    @staticmethod
    def backward(ctx, *grad_outputs):
        session, call_id = ctx.call
        return (None, *session.backward(call_id, grad_outputs, ctx.n))


def proxy(constants: dict, functions) -> types.ModuleType:
    module = types.ModuleType("tokencredit", "the student's tokencredit, answered by its process")
    module._session = None
    for name, value in constants.items():
        setattr(module, name, tuple(value) if isinstance(value, list) else value)
    for name in functions:
        setattr(module, name, remote(module, name))
    return module


def remote(module, name: str):
    """tokencredit.NAME on the judge's side: a call to the student's process."""
    def call(*args, **kwargs):
        if module._session is None:
            raise RuntimeError("no submission is being graded")
        return module._session.call(name, args, kwargs)
    call.__name__ = call.__qualname__ = name
    call.__module__ = module.__name__  # "tokencredit", as the tests ask of a public function
    return call


# -----------------------------------------------------------------------------
# the zygote: a warm parent with torch loaded, started before any submission

class Zygote:
    """The line to the warm parent of a job's child: course/child.py, in the sandbox the driver
    gave that job (course/grading.py, Driver.give_box)."""

    def __init__(self, control):
        self.control, self.buffer, self.exits = control, b"", {}
        self.gone = False  # its sandbox ended: the kernel or the grader ended it (child.zygote)

    def lines(self, timeout: float):
        """The zygote's messages: it runs beside the student's code, so nothing it says is
        trusted beyond its own submission, nor may it say much."""
        self.control.settimeout(timeout)
        try:
            data = self.control.recv(1 << 16)
        except socket.timeout:
            return []
        if not data or len(self.buffer) > 1 << 20:
            self.gone = True
            raise EOFError("the zygote is gone")
        self.buffer += data
        *done, self.buffer = self.buffer.split(b"\n")
        out = []
        for line in done:
            with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError,
                                     RecursionError):  # not a message: dropped
                message = json.loads(line)
                if "exit" in message:
                    self.exits[int(message["exit"])] = int(message["status"])
                elif isinstance(message.get("pid"), int):
                    out.append(message)
        return out

    def fork(self, spec: dict):
        ours, theirs = socket.socketpair()
        with theirs, contextlib.suppress(OSError, EOFError):  # theirs: the child's, closed here
            socket.send_fds(self.control, [json.dumps(spec).encode()], [theirs.fileno()])
            deadline = time.monotonic() + 60  # a new sandbox first loads torch
            while time.monotonic() < deadline:
                for message in self.lines(1.0):
                    return ours, message["pid"]
        raise RuntimeError("the zygote did not fork a child")

    def kill(self, pid: int) -> None:
        """Child `pid` (a pid in the zygote's sandbox) and its process group, by its zygote."""
        with contextlib.suppress(OSError):
            self.control.sendall(json.dumps(dict(kill=pid)).encode())

    def why(self, pid: int) -> tuple:
        """(limit, why) for a child that closed its line: from its exit status."""
        deadline = time.monotonic() + 2
        with contextlib.suppress(OSError, EOFError):  # the zygote gone: no status to come
            while pid not in self.exits and time.monotonic() < deadline:
                self.lines(0.1)
        status = self.exits.pop(pid, None)
        if status is None:
            return "died", "its sandbox ended" if self.gone else "it closed its line to the grader"
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            named = {signal.SIGXFSZ: ("file size", "it wrote past the file size limit"),
                     signal.SIGXCPU: ("cpu time", "it ran past the CPU time limit"),
                     signal.SIGKILL: ("died", "it was killed (SIGKILL)")}
            return named.get(number, ("died", f"it died of signal {signal.Signals(number).name}"))
        return "died", f"it exited (status {os.WEXITSTATUS(status)}) in the middle of a test"


# -----------------------------------------------------------------------------
# the worker: one pytest session, collected once; jobs from the driver, one child each

def first_difference(a, b, got_first: bool) -> str:
    """Where two tensors first differ, expected against got."""
    try:
        a_, b_ = torch.as_tensor(a), torch.as_tensor(b)
        if a_.shape != b_.shape:
            got, want = (a_, b_) if got_first else (b_, a_)
            return f"shapes differ: got {tuple(got.shape)}, expected {tuple(want.shape)}"
        a64, b64 = a_.detach().double(), b_.detach().double()
        close = torch.isclose(a64, b64, equal_nan=True) if a64.is_floating_point() else a64 == b64
        bad = (~close).nonzero()
        if not len(bad):
            return f"dtypes differ: {a_.dtype} and {b_.dtype}" if a_.dtype != b_.dtype else ""
        at = tuple(bad[0].tolist())
        got, want = (a64, b64) if got_first else (b64, a64)
        return (f"first difference at index {at}: got {got[at].item():.6g}, expected "
                f"{want[at].item():.6g} ({len(bad)} of {a64.numel()} elements differ)")
    except Exception:  # noqa: BLE001 -- a note, never a failure of its own
        return ""


class Worker:
    """pytest plugin: takes over the run loop and grades the driver's jobs."""

    def __init__(self, channels, config):
        self.channels, self.channel, self.config = channels, None, config
        self.module = proxy(config["constants"], config["functions"])
        self.session, self.diff, self.snapshots, self.counts = None, [], {}, {}
        self.current, self.zygote = None, None  # the zygote: the next job's, from the driver
        self.patch_comparisons()

    def patch_comparisons(self) -> None:
        """torch.allclose and torch.equal here note where they first differ, and an empty tensor
        is close to no tensor that is not."""
        def noted(original):
            def compare(a, b, *args, **kwargs):
                result = original(a, b, *args, **kwargs)
                both = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                if both and (a.numel() == 0) != (b.numel() == 0):  # broadcast to nothing: an
                    result = False  # empty answer would be "close" to every expected value
                if not result and both:
                    session = self.session
                    def came(x):  # from the child (weakly: not a later tensor with its id)
                        return session.returned.get(id(x), lambda: None)() is x
                    got_first = session is None or came(a) or not came(b)
                    note = first_difference(a, b, got_first)
                    if note:
                        self.diff.append(f"{original.__name__}: {note}")
                return result
            compare.__name__ = original.__name__
            return compare
        torch.allclose = noted(torch.allclose)
        torch.equal = noted(torch.equal)

    def pytest_collection_modifyitems(self, session, config, items):
        self.items = {item.nodeid.split("::", 1)[1]: item for item in items}

    def pytest_runtestloop(self, session):
        import _pytest.runner
        if session.testsfailed:  # a collection error: say it and stop
            for channel in self.channels:
                send_line(channel, dict(ready=False, error="the tests do not collect"))
            return True
        self.channel = self.channels[0]
        for channel in self.channels[1:]:  # the other workers: forks of this one, collected once
            if os.fork() == 0:
                self.channel = channel
                break
        for channel in self.channels:
            if channel is not self.channel:
                channel.close()
        send_line(self.channel, dict(ready=True, pid=os.getpid(), tests=sorted(self.items)))
        fds = []
        for job in read_lines(self.channel, fds):
            if job.get("zygote"):  # a fresh sandbox's, for the next job; the driver kills the last
                if self.zygote:
                    self.zygote.control.close()
                self.zygote = Zygote(socket.socket(fileno=fds.pop(0)))
                continue
            # each job in a fork of this process, so that what a test leaves in its module (a
            # sampler's consumed iterator) is gone with it: every job sees the tests as collected
            pid = os.fork()
            if pid == 0:
                torch.set_num_threads(1)
                limit = child.vm_size() + (JUDGE_MB << 20)
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
                try:
                    send_line(self.channel, self.run_job(job, _pytest.runner))
                    os._exit(0)
                except BaseException:  # noqa: B902 -- the grader's own bug: the parent says it
                    traceback.print_exc()
                finally:  # whatever printing it raised
                    os._exit(1)
            _, status = os.waitpid(pid, 0)
            if status != 0:
                send_line(self.channel, dict(id=job["id"],
                                             grader=f"the grader's judge failed (status {status})"))
        return True

    def run_job(self, job: dict, runner) -> dict:
        os.environ["TOKENCREDIT_SEED"] = str(job.get("seed", self.config["seed"]))  # this fork's
        results, calls = {}, {}  # calls: test: the functions it called
        error = session = None
        limits = self.config["limits"]
        try:
            session = Session(self.zygote, dict(limits=limits), float(job["limit"]),
                              job.get("counts"))
            self.module._session = self.session = session
            session.load(job)
        except GraderLimit as stopped:
            error = str(stopped)
        except Exception as raised:  # noqa: BLE001 -- the module did not load: every test fails
            where = "".join(f"\n  {w[0]}:{w[1]} in {w[2]}: {w[3]}"
                            for w in getattr(raised, "student_where", []))
            error = f"{type(raised).__name__}: {raised}{where}"
        if error is None:
            if job.get("record"):
                self.record()
            for name in job["tests"]:
                item = self.items.get(name)
                if item is None:
                    results[name] = "this test is not in the grader's tests"
                    continue
                if session.dead:
                    results[name] = f"not run: the student's process stopped: {session.dead}"
                    continue
                self.current, self.diff, session.where, session.called = name, [], [], set()
                session.sees_writes = name.startswith(SEES_WRITES)
                session.test_deadline = session.clock() + float(limits["test_s"])
                reports = runner.runtestprotocol(item, nextitem=None, log=False)
                failed = [r for r in reports if r.failed]
                results[name] = self.failure(failed[0], session) if failed else None
                calls[name] = sorted(session.called)
        if session is not None:
            session.kill()
        if session is None or not session.running:  # the grader's failure: the driver retries
            return dict(id=job["id"], grader=(session and session.dead) or error)
        return dict(id=job["id"], results=results, error=error, limit=session.limit,
                    stopped=session.dead, calls=calls if job.get("trace") else {},
                    snapshots=self.snapshots if job.get("record") else {},
                    grader=session.dead if self.zygote.gone else None)  # unless out of memory

    def failure(self, report, session) -> str:
        """The failure as the report shows it: the test's line, the exception in full, where in
        the student's file it was raised, and the first differing values."""
        lines = (report.longreprtext or "failed").rstrip().splitlines()
        here = os.path.dirname(os.path.abspath(__file__))
        frames = [i for i, ln in enumerate(lines) if ln.startswith('  File "')
                  and not ln.startswith(f'  File "{here}')
                  and "/_pytest/" not in ln and "/torch/" not in ln]
        if frames:
            found = re.match(r'  File "(.*)", line (\d+), in (.*)', lines[frames[-1]])
            out = [f"{os.path.basename(found[1])}:{found[2]} ({found[3]})"] if found else []
            out += [ln.rstrip() for ln in lines[frames[-1] + 1:]
                    if ln.strip() and not ln.startswith(("  File", "    ", "Traceback",
                                                         "During handling", "The above"))
                    and not re.search(r"<(built-in method|function) \S+ (of|at) ", ln)]
        else:
            out = [ln.rstrip() for ln in lines[-8:]]
        first = next((i for i, ln in enumerate(out)
                      if re.match(r"\w+(Error|Exception|Limit)\b", ln)), len(out) - 1)
        out[first + 1:first + 1] = self.diff[:2]  # the first differing values, before the rest
        for w in session.where:  # the student's lines; the reference's by function only
            out.append(f"raised at {w[0]}:{w[1]} in {w[2]}: {w[3].strip()}"
                       if w[0] != "reference.py" else f"called from the reference's {w[2]}")
        return "\n".join(out)[:FAILURE_LIMIT]

    def record(self) -> None:
        """Wrap the tests' ref_* loops to record what each returns (a handout's snapshots)."""
        for module in [m for n, m in list(sys.modules.items()) if n.startswith("test_")]:
            for name in [n for n in vars(module) if n.startswith("ref_")]:
                setattr(module, name, self.recorder(name, getattr(module, name)))

    def recorder(self, name, loop):
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
                grads = {key: snapshot_value(g) for (key, _), g in zip(given, found)
                         if g is not None}
            self.snapshots[f"{self.current}::{name}::{count}"] = dict(
                value=snapshot_value(out), grads=grads)
            return out
        return recorded


def send_line(channel, message: dict) -> None:
    channel.sendall(json.dumps(message).encode() + b"\n")


def read_lines(channel, fds):
    """The driver's messages, one a line; a file descriptor sent with one goes to fds."""
    buffer = b""
    while True:
        data, got, _, _ = socket.recv_fds(channel, 1 << 20, 4)
        fds += got
        if not data:
            return
        buffer += data
        *done, buffer = buffer.split(b"\n")
        for line in done:
            yield json.loads(line)


def main(fds) -> None:
    """The workers, one a line: read the config, collect once, fork the others, serve jobs."""
    import pytest
    channels = [socket.socket(fileno=fd) for fd in fds]
    config = next(read_lines(channels[0], []))
    os.chdir(config["private"])
    torch.set_num_threads(1)
    os.environ["TOKENCREDIT_SEED"] = str(config["seed"])
    worker = Worker(channels, config)
    sys.modules["tokencredit"] = worker.module
    sys.path.insert(0, config["tests_dir"])
    sys.dont_write_bytecode = True
    pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--rootdir",
                 config["tests_dir"], "-o", "addopts=", "--tb=native", "-o",
                 "python_files=test_*.py", "--noconftest"]
                + [os.path.join(config["tests_dir"], n) for n in config["files"]],
                plugins=[worker])


if __name__ == "__main__":
    main([int(fd) for fd in sys.argv[1:]])
