"""The student's side: a warm parent (the zygote) that has loaded torch and nothing else, and the
children it forks, one per exercise, that run the student's code.

    python child.py FD WORK     the zygote; FD is its control socket to the judge, WORK the folder
                                its children write in (in a sandbox: /tmp, a size-limited tmpfs)

The driver starts each zygote in a bubblewrap sandbox of its own (course/grading.py says how), and
hands its control socket to a judge. For each fork request it receives a socket (the child's line to
the judge) and the child's limits; the child takes the limits, closes every other file, moves into a
new empty folder, and only then reads the student's file and runs it. It answers with values
(course/protocol.py), never with code. Pids here are the sandbox's: the judge asks the zygote to
kill a child.
"""

import contextlib
import ctypes
import json
import linecache
import os
import random
import resource
import select
import signal
import socket
import sys
import tempfile
import traceback
import types

if __package__:
    from . import protocol
else:  # run as a script from the judge's private copy
    import protocol

import numpy.random
import torch

MESSAGE_LIMIT = 1 << 30  # what the child accepts from the judge
EQUAL = torch.equal  # as torch has it, before a student's code may replace it


def zygote(fd: int, work: str) -> None:
    """Fork a child for each request of the judge. Nothing is loaded ahead but torch (and numpy's
    generator, to seed it): a child imports the rest itself, from the sandbox's read-only Python."""
    control = socket.socket(fileno=fd)
    torch.set_num_threads(1)
    # a pid 1 takes from inside its sandbox only the signals it handles (none: SIGINT's off), so
    # only the kernel (its cgroup out of memory) or the grader ends it (grading.Driver.done)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # out of memory, the kernel kills a sandbox's processes first, not the grader's (before the
    # prctl below: a process not dumpable may not write its own /proc files)
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    # In a sandbox its pid 1 (--as-pid-1): all in it die with it, and it with bwrap. Not dumpable
    # (its children inherit that), so no process of the student's (same uid) may ptrace it.
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    os.write(1, b"ready\n")  # the driver caps the sandbox's memory from here (course/grading.py)
    children = set()
    while True:
        ready, _, _ = select.select([control], [], [], 0.05)
        with contextlib.suppress(ChildProcessError):  # none left
            while True:  # each child's end, so the judge can say why; as pid 1, orphans' too
                pid, status = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    break
                if pid in children:
                    children.discard(pid)
                    control.sendall(json.dumps(dict(exit=pid, status=status)).encode() + b"\n")
        if not ready:
            continue
        message, fds, _, _ = socket.recv_fds(control, 1 << 16, 1)
        if not message:
            os._exit(0)
        spec = json.loads(message)
        if "kill" in spec:  # the judge is done with this child
            with contextlib.suppress(OSError, TypeError):
                os.killpg(spec["kill"], signal.SIGKILL)  # the child leads its own group
        else:
            pid = os.fork()
            if pid == 0:
                try:
                    control.close()
                    child(spec, fds[0], work)
                finally:
                    os._exit(70)
            children.add(pid)
            control.sendall(json.dumps(dict(pid=pid)).encode() + b"\n")
        for f in fds:  # the child's line, its own now (a kill comes with none)
            os.close(f)


def same_bits(a, b) -> bool:
    """The same dtype, shape and bytes (a NaN the same as itself; a meta tensor has none)."""
    if (a.dtype, a.shape, a.is_meta) != (b.dtype, b.shape, b.is_meta):
        return False
    return a.is_meta or EQUAL(a.contiguous().view(-1).view(torch.uint8),
                              b.contiguous().view(-1).view(torch.uint8))


def vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def child(spec: dict, fd: int, work: str) -> None:
    """Limits, an empty folder, then serve the judge on fd."""
    os.setsid()
    limits = spec["limits"]
    for which, value in ((resource.RLIMIT_AS, vm_size() + int(limits["memory_mb"]) * 2 ** 20),
                         (resource.RLIMIT_FSIZE, int(limits["file_mb"]) * 2 ** 20),
                         (resource.RLIMIT_CPU, int(limits["cpu_s"])),
                         (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_NPROC, int(limits["processes"]))):
        resource.setrlimit(which, (value, value))
    os.closerange(3, fd)  # every file the zygote had open, but the line to the judge
    os.closerange(fd + 1, 1 << 16)
    for number in (signal.SIGXFSZ, signal.SIGXCPU, signal.SIGPIPE, signal.SIGTERM,
                   signal.SIGINT, signal.SIGALRM):
        signal.signal(number, signal.SIG_DFL)
    work = tempfile.mkdtemp(dir=work)
    os.chdir(work)
    out = os.open("output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    random.seed(0)  # with the zygote's PYTHONHASHSEED, code that draws (or iterates a set of
    numpy.random.seed(0)  # strings) draws the same on every grade of the file
    torch.manual_seed(0)
    sys.argv = ["tokencredit"]
    sys.path[:] = [p for p in sys.path if "site-packages" in p or "dist-packages" in p
                   or p.startswith(sys.base_prefix)]
    Child(socket.socket(fileno=fd)).serve()


class Child:
    def __init__(self, sock):
        self.sock, self.module, self.graphs, self.label = sock, None, {}, "tokencredit.py"
        self.called = set()

    def send(self, header, blobs=()):
        protocol.send(self.sock, header, blobs)

    def serve(self) -> None:
        while True:
            try:
                header, blobs = protocol.receive(self.sock, MESSAGE_LIMIT)
            except (EOFError, OSError):
                os._exit(0)
            op = header.get("op")
            try:
                if op == "load":
                    self.load(header)
                elif op == "call":
                    self.call(header, blobs)
                elif op == "backward":
                    self.backward(header, blobs)
                else:
                    os._exit(0)
            except BaseException as error:  # noqa: B902 -- everything becomes a value
                self.raised(error)

    # -- load: the student's module as written; the reference's other functions beside it

    def load(self, job: dict) -> None:
        self.label = job["label"]
        reference = None if job.get("reference") is None else self.module_from(
            job["reference"], "reference.py", "tokencredit")
        self.send(dict(op="running"))  # the judge: what goes wrong from here on is the student's
        student = self.module_from(job["student"], self.label,
                                   "student_tokencredit" if reference else "tokencredit")
        names = job["names"]
        if reference is not None:
            missing = [n for n in names if not callable(getattr(student, n, None))]
            if missing:
                raise NameError(f"{self.label} defines no {', '.join(missing)}")
            for name in names:  # the reference's other functions call the student's
                setattr(reference, name, getattr(student, name))
            for name in job["given"]:  # and the student's call the reference's other functions
                if name not in names and hasattr(reference, name):
                    setattr(student, name, getattr(reference, name))
        self.module = student if reference is None else reference
        if job.get("trace"):
            for module in {id(m): m for m in (self.module, student)}.values():
                for name in job["trace"]:
                    if callable(getattr(module, name, None)):
                        setattr(module, name, self.traced(name, getattr(module, name)))
        self.send(dict(op="loaded"))

    def module_from(self, source: str, label: str, name: str):
        module = types.ModuleType(name)
        module.__file__ = label
        linecache.cache[label] = (len(source), None, source.splitlines(True), label)
        sys.modules[name] = module
        exec(compile(source, label, "exec", dont_inherit=True), module.__dict__)
        return module

    def traced(self, name, function):
        def traced(*args, **kwargs):
            self.called.add(name)
            return function(*args, **kwargs)
        traced.__wrapped__ = function
        return traced

    # -- calls, with gradients kept for the judge's backward

    def call(self, header: dict, blobs) -> None:
        tensors = protocol.decode_tensors(header["tensors"], blobs)
        before = [t.detach().clone() for t in tensors]  # a write through .data moves no _version
        args = protocol.decode(header["args"], tensors, self.callback)
        kwargs = protocol.decode(header["kwargs"], tensors, self.callback)
        function = getattr(self.module, header["name"], None)
        if not callable(function):
            raise AttributeError(f"{self.label} has no function {header['name']}")
        self.called = set()
        with torch.enable_grad():
            out = function(*args, **kwargs)
        value, table, out_blobs, sent = protocol.encode(out)
        grads_in = [t for t in tensors if t.requires_grad]
        grads_out = [t for t in sent if t.requires_grad]
        if grads_in and grads_out:
            self.graphs[header["id"]] = (grads_in, grads_out)
        changed = [i for i, t in enumerate(tensors) if not same_bits(t.detach(), before[i])]
        mutated = [[i, len(out_blobs) + n] for n, i in enumerate(changed)]  # [input, its blob]
        out_blobs += [protocol.encode(tensors[i])[2][0] for i in changed]  # its bytes
        self.send(dict(op="return", value=value, tensors=table, mutated=mutated,
                       called=sorted(self.called)), out_blobs)

    def backward(self, header: dict, blobs) -> None:
        inputs, outputs = self.graphs[header["id"]]
        grads = protocol.decode(header["grads"], protocol.decode_tensors(header["tensors"], blobs))
        given = [g if g is not None else torch.zeros_like(o) for g, o in zip(grads, outputs)]
        found = torch.autograd.grad(outputs, inputs, given, retain_graph=True, allow_unused=True)
        value, table, out_blobs, _ = protocol.encode([g for g in found])
        self.send(dict(op="grads", value=value, tensors=table), out_blobs)

    def callback(self, index: int):
        """A stub for the judge's callable `index` (fill_batch's sample_groups)."""
        def stub(*args, **kwargs):
            value, table, blobs, _ = protocol.encode([list(args), kwargs])
            self.send(dict(op="callback", i=index, args=value, tensors=table), blobs)
            header, blobs = protocol.receive(self.sock, MESSAGE_LIMIT)
            tensors = protocol.decode_tensors(header.get("tensors", []), blobs)
            if header.get("op") == "callback_raise":
                raise {"ValueError": ValueError, "TypeError": TypeError}.get(
                    header.get("type"), RuntimeError)(header.get("message", ""))
            return protocol.decode(header["value"], tensors)
        return stub

    # -- what went wrong, as values

    def raised(self, error: BaseException) -> None:
        if isinstance(error, MemoryError) or (
                isinstance(error, RuntimeError) and "alloc" in str(error).lower()
                and "memory" in str(error).lower()):
            self.send(dict(op="limit", which="memory"))
            os._exit(0)
        where = [[frame.filename, frame.lineno, frame.name, (frame.line or "")[:200]]
                 for frame in traceback.extract_tb(error.__traceback__)
                 if frame.filename in (self.label, "reference.py")]
        try:
            message = str(error)[:4000]
        except Exception:  # noqa: BLE001 -- a message that cannot be made
            message = "(no message)"
        self.send(dict(op="raise", type=type(error).__name__, message=message, where=where[-6:]))


if __name__ == "__main__":
    zygote(int(sys.argv[1]), sys.argv[2])
