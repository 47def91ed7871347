"""Source surgery, by ast (tokencredit.py carries no markers): a blank, a plant, a handout's
tests with the loops replaced by their recorded outputs, and the reference's constants."""

import ast
import contextlib

from .exercises import EXERCISE_OF, names as exercise_names


def functions(source: str) -> dict:
    return {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}


def constants(source: str) -> dict:
    """The module-level UPPER_CASE names bound to literals, read without running the file."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper():
            with contextlib.suppress(ValueError):  # not a literal
                out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


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
    for name in [n for k in exercises for n in exercise_names(k)] + list(names):
        body, keep = defs[name].body, kept_statements(defs[name])
        after = body[keep - 1].end_lineno if keep else body[0].lineno - 1
        indent = " " * body[keep].col_offset
        stub = f'{indent}raise NotImplementedError("exercise {EXERCISE_OF[name]}: {name}")\n'
        edits.append((after, body[-1].end_lineno, stub))
    for after, last, text in sorted(set(edits), reverse=True):
        lines[after:last] = [text]
    return "".join(lines)


def span(node) -> tuple:
    """(first line index, end line) of a function, its decorators included."""
    return min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1, node.end_lineno


def apply_edits(source: str, edits) -> str:
    """source with each (text, replacement) made once; the text must be there exactly once."""
    for text, replacement in edits:
        if source.count(text) != 1:
            raise ValueError(f"{text!r} is {source.count(text)} times in tokencredit.py, not once")
        source = source.replace(text, replacement)
    return source


def code_part(line: str) -> str:
    return line.split("  # ")[0].split(" # ")[0].strip()


def snapshot_value(x):
    """A JSON form of a loop's output: tensors (with their dtype), numbers, and containers."""
    import torch
    if isinstance(x, torch.Tensor):
        return dict(tensor=x.detach().cpu().double().flatten().tolist(), dtype=str(x.dtype)[6:],
                    shape=list(x.shape))
    if isinstance(x, (tuple, list)):
        return {type(x).__name__: [snapshot_value(v) for v in x]}
    if isinstance(x, dict):
        return dict(dict=[[k, snapshot_value(v)] for k, v in x.items()])
    return x


SNAPSHOT_STUB = '''

def _snapshot(name, args, kwargs):
    """What the plain-loop reference `name` returned on this call of this test, recorded by
    `python -m course handout` from the repository's loop on the same inputs: this copy holds no
    loop (it would be a solution). A loop whose output carries a gradient gets it back."""
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


def snapshot_tests(tests_source: str, snapshots: str) -> str:
    """The tests with each ref_* loop replaced by a lookup of its recorded outputs."""
    tree, lines = ast.parse(tests_source), tests_source.splitlines(keepends=True)
    loops = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("ref_")]
    for node in sorted(loops, key=lambda n: n.lineno, reverse=True):
        a, b = span(node)
        lines[a:b] = [f"def {node.name}(*args, **kwargs):  # the loop's recorded outputs\n",
                      f"    return _snapshot({node.name!r}, args, kwargs)\n"]
    if loops:
        at = span(min(loops, key=lambda n: n.lineno))[0]
        lines[at:at] = [SNAPSHOT_STUB.format(snapshots=snapshots).lstrip("\n") + "\n\n"]
    return "".join(lines)
