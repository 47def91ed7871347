"""`python -m course notebook`: course/notebook.ipynb from course/notebook.py, a script in
jupytext's "percent" format (docs/course.md, "A notebook for students"), with the standard library
only. A markdown cell's lines are comments ("# text" gives "text", "#" an empty line). The .ipynb
(nbformat 4.4) carries no output, no execution count and sorted keys: the same script, the same
bytes."""

import json
import pathlib

HERE = pathlib.Path(__file__).absolute().parent
SCRIPT, NOTEBOOK = HERE / "notebook.py", HERE / "notebook.ipynb"
KINDS = {"# %%": "code", "# %% [markdown]": "markdown"}
METADATA = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"}}


def cells(script: str) -> list:
    """[(kind, lines)] of a percent script, each cell's lines without the blank ones around it."""
    found = []
    for n, line in enumerate(script.splitlines(), 1):
        if line.startswith("# %%"):
            if line.rstrip() not in KINDS:
                raise ValueError(f"line {n}: expected '# %%' or '# %% [markdown]', got {line!r}")
            found.append((KINDS[line.rstrip()], []))
        elif found:
            found[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"line {n}: expected the script to start with a '# %%' line, got "
                             f"{line!r}")
    out = []
    for kind, lines in found:
        kept = [i for i, line in enumerate(lines) if line.strip()]
        lines = lines[kept[0]:kept[-1] + 1] if kept else []
        if kind == "markdown":
            for line in lines:
                if not (line == "#" or line.startswith("# ")):
                    raise ValueError(f"a markdown cell's lines are '# text' or '#', got {line!r}")
            lines = [line[2:] for line in lines]
        out.append((kind, lines))
    return out


def notebook(script: str) -> str:
    """The .ipynb text of a percent script."""
    code = dict(execution_count=None, outputs=[])  # what a code cell has beside the others' keys
    nb_cells = [dict(cell_type=kind, metadata={}, **(code if kind == "code" else {}),
                     source=[line + "\n" for line in lines[:-1]] + lines[-1:])
                for kind, lines in cells(script)]
    nb = dict(cells=nb_cells, metadata=METADATA, nbformat=4, nbformat_minor=4)
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def cmd_notebook() -> None:
    NOTEBOOK.write_text(notebook(SCRIPT.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {NOTEBOOK} from {SCRIPT}")
