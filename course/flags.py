"""The flag scan: what in a submission reaches past the exercises, read from its ast (nothing is
run; docs/course.md, "Flags", says what is flagged and what --strict does). A correct solution
written the ordinary way has none: the doors' given `_check_inputs(locals())` is not locals."""

import ast
import re

IMPORTS = {"math", "typing", "torch", "functools", "itertools", "collections", "dataclasses",
           "numbers", "operator", "__future__", "numpy"}  # what an exercise may need
NAMES = {"open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars",
         "breakpoint", "__builtins__", "setattr", "delattr", "__loader__", "__spec__", "__file__"}
MODULES = {"sys", "os", "importlib", "inspect", "builtins", "ctypes", "subprocess", "signal",
           "atexit", "gc", "threading", "multiprocessing", "_thread", "socket", "pickle",
           "marshal", "shutil", "pathlib", "io", "resource", "pty", "mmap", "_pytest", "pytest",
           "tempfile", "linecache", "traceback", "types", "weakref", "runpy", "pkgutil", "posix",
           "_posixsubprocess", "concurrent", "asyncio", "fcntl"}  # (select: Tensor.select)
NATIVE = {"load_library", "ctypeslib", "cpp_extension", "load_inline", "from_file", "fromfile",
          "fromregex", "tofile", "memmap", "open_memmap", "DataSource", "npyio", "dump", "package",
          "save", "load", "loadtxt", "savetxt", "genfromtxt", "open",  # files, native code,
          "get_type_hints", "ForwardRef", "benchmark", "timeit"}  # and text run as code
FRAMES = {"f_globals", "f_locals", "f_back", "f_builtins", "gi_frame", "tb_frame", "cr_frame",
          "co_code", "tb_next"}
DUNDERS_OK = {"__name__", "__doc__", "__main__", "__class__"}
ENTROPY = {"seed", "default_rng", "RandomState", "SeedSequence", "BitGenerator", "PCG64",
           "PCG64DXSM", "MT19937", "Philox", "SFC64"}  # called with no seed: the system's entropy
BY_NAME = {"getattr", "setattr", "delattr", "hasattr", "attrgetter", "methodcaller"}  # (x, name)
EXTRA_FILES = (".py", ".json", ".pth", ".so", ".pyc", ".cfg", ".ini", ".toml", ".pt")
BIG_LITERAL = 2000  # characters of a string, or elements of a literal: stored answers


def reaches(name: str) -> bool:
    """Whether an attribute name (or a dotted path of them) reaches past the exercises: a module
    above, files or native code, a frame's insides, a dunder."""
    return any(part in MODULES or part in NATIVE or part in FRAMES or part.startswith("__")
               and part.endswith("__") and part not in DUNDERS_OK for part in name.split("."))


def named_in(text: str) -> list:
    """The dotted names a string spells that reach past the exercises: itself, or its format
    fields ("{0.os.environ}")."""
    return [name for name in [text] * (" " not in text) + re.findall(r"\{([^{}:!]+)", text)
            if reaches(name.replace("[", ".").replace("]", ""))]


def root_of(node):
    """The name an attribute or subscript chain starts from (torch in torch.x[0].y), or None."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return getattr(node, "id", None)


def draws(node, bound: set, compared: set):
    """The name by which node draws what no seed fixes, or None: the entropy of a generator made
    with no seed, an object's address (the builtins id and hash, unless the file binds the name
    itself or compares what they give, as id(a) == id(b); the hash of a str is fixed, of an
    object not; Tensor.data_ptr), the clock."""
    if isinstance(node, ast.Name) and node.id in ("id", "hash") and node.id not in bound and \
            id(node) not in compared:
        return node.id
    if isinstance(node, ast.Attribute) and node.attr in ("data_ptr", "datetime64"):
        return node.attr
    if isinstance(node, ast.Call) and called(node) in ENTROPY and not node.keywords and all(
            isinstance(a, ast.Constant) and a.value is None for a in node.args):  # (None) too
        return called(node)
    return None


def called(node: ast.Call):
    """The name a call calls: f(...) or x.f(...)."""
    return getattr(node.func, "id", None) or getattr(node.func, "attr", None)


def text_of(node):
    """A string the ast spells out (a constant, or constants joined by +), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = text_of(node.left), text_of(node.right)
        return None if left is None or right is None else left + right
    return None


def in_string(text: str) -> list:
    """The flags of a string's text when it parses as code, else none (scan's own answer)."""
    if len(text) > BIG_LITERAL:  # flagged as a literal
        return []
    try:
        return scan(text)
    except (RecursionError, MemoryError):
        return []


def scan(source: str, extra_files=()) -> list:
    """The flags of a submission: "line N: what"."""
    flags = [f"the submission also holds {name}, which grading ignores" for name in extra_files
             if name.endswith(EXTRA_FILES) or "/" not in name and name.startswith("conftest")]
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return flags
    nodes = list(ast.walk(tree))  # walked once, read by each pass below
    docstrings = {id(node.value) for node in nodes  # and strings that are statements (code kept
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}  # in
    # one is dropped by the compiler: reading it needs open, __file__ or inspect)
    given = {id(node.args[0].func) for node in nodes  # the door's own line
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id == "_check_inputs" and node.args
             and isinstance(node.args[0], ast.Call) and isinstance(node.args[0].func, ast.Name)
             and node.args[0].func.id == "locals" and not node.args[0].args}
    modules = {alias.asname or alias.name.split(".")[0] for node in nodes
               if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    aliases, todo = {}, list(modules)  # a name: the names assigned from it (_t = torch.Tensor)
    for node in (node for node in nodes if isinstance(node, ast.Assign)):
        aliases.setdefault(root_of(node.value), []).extend(t.id for t in node.targets
                                                            if isinstance(t, ast.Name))
    while todo:  # each name's aliases read once: linear in the file (a chain of 30,000 is)
        todo += (more := set(aliases.pop(todo.pop(), ())) - modules)
        modules |= more
    bound = modules | {node.id for node in nodes  # the names the file gives itself
                       if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)} | {
        node.arg for node in nodes if isinstance(node, ast.arg)} | {
        node.name for node in nodes if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    compared = {id(c.func) for node in nodes if isinstance(node, ast.Compare)  # id(a) == id(b)
                for c in [node.left, *node.comparators] if isinstance(c, ast.Call)}
    calls = {id(node.func) for node in nodes if isinstance(node, ast.Call)}
    for node in nodes:
        line = getattr(node, "lineno", 0)
        said = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in \
                docstrings and (inner := in_string(node.value)):  # typing or eval could run it
            said = inner[0].split(": ", 1)[-1]
            said = said if said.startswith("holds code") else f"holds code in a string ({said})"
        elif isinstance(node, (ast.Name, ast.Attribute)) and id(node) not in calls and \
                (getattr(node, "id", None) or node.attr) in BY_NAME:  # reduce(getattr, ...)
            said = f"passes {getattr(node, 'id', None) or node.attr} as a value"
        elif name := draws(node, bound, compared):
            said = f"uses {name}, which no seed fixes: its points may change on a regrade"
        elif isinstance(node, ast.MatchClass) and (bad := [a for a in node.kwd_attrs
                                                           if reaches(a)]):
            said = f"reaches {', '.join(bad)} through a class pattern"  # case object(os=o)
        elif isinstance(node, ast.Import):
            bad = [a.name for a in node.names if a.name.split(".")[0] not in IMPORTS
                   or reaches(a.name)]  # import numpy.ctypeslib, torch.utils.cpp_extension
            said = f"imports {', '.join(bad)}" if bad else None
        elif isinstance(node, ast.ImportFrom):
            top = (node.module or "").split(".")[0]
            bad = [a.name for a in node.names if reaches(a.name)]  # from numpy import ctypeslib
            said = f"imports from {node.module or '.'}" if node.level or top not in IMPORTS \
                else f"imports {', '.join(bad)} from {node.module}" if bad else None
        elif isinstance(node, ast.Name) and (node.id in MODULES
                                             or node.id in NAMES and id(node) not in given):
            said = f"uses {node.id}"
        elif isinstance(node, ast.Call) and called(node) in BY_NAME:  # getattr(torch, "os")
            at = int(called(node).endswith("attr"))  # the name: attrgetter's first argument
            name = text_of(node.args[at]) if len(node.args) > at else None
            if name is None:
                said = "reaches an attribute by a name computed at run time"
            elif reaches(name):
                said = f"reaches {name} through an attribute"
        elif isinstance(node, (ast.Constant, ast.BinOp)) and isinstance(text_of(node), str) \
                and id(node) not in docstrings and (bad := named_in(text_of(node))):
            said = f"names {bad[0]!r} in a string"
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(
                node.ctx, (ast.Store, ast.Del)) and root_of(node) in modules:  # for torch.x in
            said = f"writes an attribute of the module {root_of(node)}"
        elif isinstance(node, ast.Attribute) and node.attr == "__class__" and isinstance(
                node.ctx, (ast.Store, ast.Del)):  # an input made another class (read: allowed)
            said = "writes __class__"
        elif isinstance(node, ast.Attribute) and root_of(node) in modules and \
                node.attr.startswith("_") and not node.attr.endswith("__"):
            said = f"uses {node.attr}, private to its module"  # dataclasses._create_fn
        elif isinstance(node, ast.Attribute):
            if node.attr in MODULES or node.attr in NATIVE:
                said = f"reaches {node.attr} through an attribute"
            elif reaches(node.attr):  # a frame's insides, a dunder
                said = f"uses the attribute {node.attr}"
        elif isinstance(node, ast.Constant) and id(node) not in docstrings and isinstance(
                node.value, (str, bytes)) and len(node.value) > BIG_LITERAL:
            said = f"holds a literal of {len(node.value)} characters (stored answers?)"
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
            size = len(node.keys if isinstance(node, ast.Dict) else node.elts)
            if size > BIG_LITERAL // 10:
                said = f"holds a literal of {size} elements (stored answers?)"
        if said:
            flags.append(f"line {line}: {said}")
    return sorted(set(flags), key=lambda f: (not f.startswith("line"), int(
        f.split(":")[0][5:]) if f.startswith("line") else 0, f))
