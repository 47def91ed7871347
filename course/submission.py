"""A submission read once, where it stands, the same on every route: folders walked through
descriptors, no link followed at any level, each file's bytes read once from the inode looked at
(docs/instructors.md, "What the grader protects against")."""

import contextlib
import errno
import importlib.util
import itertools
import os
import stat
import time

from .written import FORM, NO_FORM, shown

SOURCE_LIMIT, FORM_LIMIT = 2 ** 20, 2 ** 16  # bytes of tokencredit.py, of written.txt, at most
WALK_LIMIT = (8, 2000)  # a submission's folder: levels and entries looked at, at most
FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
AS_IT_STANDS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def refused(name, error: OSError) -> ValueError:
    said = {errno.ELOOP: "a symbolic link", errno.ENOTDIR: "not a folder (a link, or changed?)",
            errno.EWOULDBLOCK: "held by another process (a lease)"}
    return ValueError(f"{shown(name)} is not read: {said.get(error.errno, error.strerror)}")


def open_at(top, parts, flags=FOLDER) -> int:
    """top/parts opened with flags, each folder relative to its parent's descriptor, no link
    followed (ValueError: one is a link now, or gone); top None: parts is the instructor's path."""
    fd = os.open(".", FOLDER if not parts else os.O_PATH | os.O_DIRECTORY, dir_fd=top)
    for i, part in enumerate(parts):
        try:
            inner = os.open(part, flags if i == len(parts) - 1 else FOLDER, dir_fd=fd)
        except OSError as error:
            raise refused("/".join(parts[:i + 1]), error) from None
        finally:
            os.close(fd)
        fd = inner
    return fd


def reopened(fd: int) -> int:
    """The inode of fd opened to read, through /proc. A lease on it (its owner's process, a file
    server's) is asked back and waited on 1 s at most, never the kernel's 45 s."""
    for wait in (0.05, 0.2, 0.75, None):
        try:
            return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except BlockingIOError:
            if wait is None:
                raise
            time.sleep(wait)


def read_fd(fd: int, name: str, limit: int) -> tuple:
    """(the bytes, (device, inode)) of the regular file fd (AS_IT_STANDS), read once from that
    very inode (reopened), whatever its name holds now."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        kind = "not a regular file (a FIFO, a device, a folder, a socket)"
        raise ValueError(f"{shown(name)} is "
                         f"{'a symbolic link' if stat.S_ISLNK(info.st_mode) else kind}: not read")
    try:
        with open(reopened(fd), "rb") as f:
            data = f.read(limit + 1)
    except OSError as error:
        raise refused(name, error) from None
    if len(data) > limit:
        raise ValueError(f"{shown(name)} holds {info.st_size} bytes, over {limit}: not read")
    return data, (info.st_dev, info.st_ino)


def read_at(top, parts, limit: int) -> tuple:  # read_fd's, of top/parts
    fd = open_at(top, parts, AS_IT_STANDS)
    try:
        return read_fd(fd, "/".join(parts), limit)
    finally:
        os.close(fd)


def walk(top: int, name: str) -> list:
    """Every entry below the folder top, as (its path's parts, whether a folder), shallowest first
    and in name order; ValueError past WALK_LIMIT, or for a folder it may not read (a tar's)."""
    (levels, most), out, todo = WALK_LIMIT, [], [()]
    for parts in todo:  # breadth first: todo grows as it is read
        fd = open_at(top, parts)
        try:
            with os.scandir(fd) as entries:  # no more of a crowd than the limit is read
                found = sorted((e.name, e.is_dir(follow_symlinks=False))
                               for e in itertools.islice(entries, most + 1 - len(out)))
        except OSError as error:
            raise refused(os.path.join(name, *parts), error) from None
        finally:
            os.close(fd)
        out += [(parts + (entry,), folder) for entry, folder in found]
        todo += [parts + (entry,) for entry, folder in found if folder]
        if len(out) > most or len(todo[-1]) >= levels:
            raise ValueError(f"{shown(name)} is more than {levels} folders deep or holds more "
                             f"than {most} entries: not read")
    return out


def read_form(top, parts) -> tuple:
    """(the written form's text, None), or (None, why not): decoded as Notepad saves it (UTF-8,
    with a BOM or not, or UTF-16, whose BOM it has)."""
    try:
        data, _ = read_at(top, parts, FORM_LIMIT)
    except ValueError as error:
        return None, f"{error}: 0 written points"
    utf16 = data.startswith((b"\xff\xfe", b"\xfe\xff"))
    return data.decode("utf-16" if utf16 else "utf-8-sig", errors="replace"), None


def read_student(top, entry: str, form_beside=False) -> dict:
    """The submission `entry` of the folder top, a file or a folder holding one (its shallowest
    tokencredit.py, and written.txt): {"label", "source", "extras": the other files' names, "form":
    read_form's, "inode"}, else {"why": not read, "form"}. top None: entry is grade PATH's or the
    bundle's path; with form_beside, a file tokencredit.py has the form beside it."""
    form = (None, NO_FORM)
    try:
        fd = open_at(top, (entry,), AS_IT_STANDS)
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                if form_beside and os.path.basename(entry) == "tokencredit.py":
                    form = read_form(top, (os.path.join(os.path.dirname(entry), FORM),))
                label, extras = shown(os.path.basename(entry)), []
                data, inode = read_fd(fd, label, SOURCE_LIMIT)
            else:
                found = walk(fd, entry)
                form = next((read_form(fd, p) for p, _ in found if p[-1] == FORM), form)
                code = [p for p, _ in found if p[-1] == "tokencredit.py"][:1]
                if not code:
                    raise ValueError(f"{shown(entry)} holds no tokencredit.py")
                (data, inode), label = read_at(fd, code[0], SOURCE_LIMIT), "tokencredit.py"
                extras = [shown("/".join(p)) for p, dir_ in found if not dir_ and p != code[0]]
        finally:
            os.close(fd)
        try:
            source = importlib.util.decode_source(data)
        except (ValueError, SyntaxError, LookupError) as error:  # LookupError: a bad coding line
            raise ValueError(f"{label} is not read: {error}") from None
    except ValueError as error:
        return dict(why=str(error), form=form)
    return dict(label=label, source=source, extras=extras, form=form, inode=inode)


def students_of(top: int) -> list:
    """[(name, entry, why not)] of the class folder top, one per student, named by the bytes of
    STUDENT.py or STUDENT/ (or a link: read_student refuses it); bob.py beside bob/: refused."""
    found = {}
    for entry in sorted(os.listdir(top), key=os.fsencode):
        with contextlib.suppress(OSError):  # gone meanwhile
            kind, name = os.lstat(entry, dir_fd=top).st_mode, os.fsencode(entry)
            py = name.lower().endswith(b".py")  # carol.PY too
            if stat.S_ISLNK(kind) or stat.S_ISDIR(kind) or py:
                found.setdefault(name[:-3] if py else name, []).append(entry)
    return [(name, entries[0], " and ".join(map(shown, entries)) + " both handed in: neither is "
             "graded, say which counts" if entries[1:] else None)
            for name, entries in found.items()]
