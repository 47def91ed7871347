"""The lecture (docs/lecture.md) held to the repository: its figures are what `python -m lab
lecture-figures` draws now from results/ and tokencredit.py, byte for byte; every figure it shows
exists; its sections add up to 75 minutes, each with a point, an equation, a figure, a question
and an answer the handout's instructors-only rule strips; and the figures show hand-worked numbers.
"""

import contextlib
import io
import math
import os
import re

import matplotlib
import pytest

import tiny_task
from lab.cli import main
from lab.lecture import FIGURES, GROUP, PROMPT

pytestmark = pytest.mark.slow  # python -m pytest -m slow

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the project root
DOCS = os.path.join(HERE, "docs")
PAGE = open(os.path.join(DOCS, "lecture.md")).read()
# what course/handout.py strips from docs/course.md: text for instructors only
INSTRUCTORS = re.compile(r"\n<!-- instructors -->\n.*?\n<!-- /instructors -->\n", re.S)

DRAWN_WITH = "3.11.2"  # the matplotlib that drew docs/lecture/*.svg


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """The one command, run into a fresh folder: (folder, {figure name: the numbers it prints})."""
    out = tmp_path_factory.mktemp("lecture")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(["lecture-figures", str(out)])
    said = dict(re.findall(r"^\S+/([\w-]+\.svg): (.*)$", printed.getvalue(), re.M))
    return out, said


def test_committed_figures_are_what_the_command_draws_now(drawn):
    out, _ = drawn
    committed = sorted(os.listdir(os.path.join(DOCS, "lecture")))
    assert committed == sorted(FIGURES), "docs/lecture/ holds other files than the figures"
    if matplotlib.__version__ != DRAWN_WITH:  # another matplotlib writes other bytes
        pytest.skip(f"the figures' bytes are matplotlib {DRAWN_WITH}'s; this is "
                    f"{matplotlib.__version__} (.ci/constraints.txt pins {DRAWN_WITH})")
    for name in FIGURES:
        with open(out / name, "rb") as new, open(os.path.join(DOCS, "lecture", name), "rb") as old:
            assert new.read() == old.read(), (
                f"docs/lecture/{name} is not what the results give now: run "
                "python -m lab lecture-figures docs/lecture and commit it")


def sections() -> list:
    """(number, title, minutes, body) of each '## k. Title (m min)' section."""
    found = list(re.finditer(r"^## (\d+)\. (.+) \((\d+) min\)\n", PAGE, re.M))
    ends = [m.start() for m in found[1:]] + [PAGE.index("\n## ", found[-1].end())]
    return [(int(m[1]), m[2], int(m[3]), PAGE[m.end():end]) for m, end in zip(found, ends)]


def test_the_outline_has_its_sections_and_75_minutes():
    outline = sections()
    assert [k for k, _, _, _ in outline] == list(range(1, len(outline) + 1))
    assert 10 <= len(outline) <= 14, f"about twelve sections, got {len(outline)}"
    assert sum(m for _, _, m, _ in outline) == 75, [(k, m) for k, _, m, _ in outline]
    for k, title, _, body in outline:
        for part in ("**Point.**", "**Equation.**", "**Figure.** ![", "**Ask the room.**"):
            assert body.count(part) == 1, f"section {k} ({title}): {part} {body.count(part)} times"
        stripped = INSTRUCTORS.sub("\n", body)
        assert body.count("<!-- instructors -->") == 1 and "<details>" in body, f"section {k}"
        assert "for instructors" not in stripped and "<details>" not in stripped, f"section {k}"
        assert "**Ask the room.**" in stripped  # the question stays for the room


def test_every_figure_the_lecture_shows_exists():
    shown = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", PAGE)
    missing = [path for path in shown if not os.path.isfile(os.path.join(DOCS, path))]
    assert not missing, missing
    assert {f"lecture/{name}" for name in FIGURES} <= set(shown), "a figure drawn but not shown"


def test_the_figures_show_hand_worked_numbers(drawn):
    _, said = drawn
    # a. one group of 4 answers of 18, 16, 25 and 48 tokens (N = 4): "sample" 1 / (4 |o_i|),
    # "token" 1 / 107 per token; shares 1/4 each, and |o_i| / 107
    a = said["sample-token-weights.svg"]
    assert a.startswith("lengths 18 16 25 48;")
    assert "sample: per token 0.01389, 0.01562, 0.01000, 0.00521; share 0.250" in a
    assert "token: per token 0.00935, 0.00935, 0.00935, 0.00935; share 0.168, 0.150, 0.234, 0.449" in a
    # b. docs/lab.md's paired table, wrong-answer length over updates 1-60
    assert said["paired-effect.svg"] == (
        "default task: -0.54 [-0.83, -0.26], 10 of 10 seeds lower; --loop-rate 0.3: -0.63 "
        "[-0.89, -0.37], 9 of 10 seeds lower; --warmup-seed 7: -0.72 [-0.91, -0.52], 6 of 6 "
        "seeds lower")
    # c. 6+9=15,15+8=23>23<eos>: 9 intermediate digits, 4 operators, 3 format tokens, 2 answer
    # digits, each at its class's mean sensitivity; u~ = 18 exp(-s) / sum over the 18 tokens
    s = dict(I=0.1753742, O=0.0077018, F=0.1067409, A=0.0236406)  # results/readme.json
    total = sum(n * math.exp(-s[c]) for c, n in dict(I=9, O=4, F=3, A=2).items())  # 16.171
    c = said["cscr-weights.svg"]
    assert f"strength 1: answer digit {18 * math.exp(-s['A']) / total:.3f}, intermediate digit " \
           f"{18 * math.exp(-s['I']) / total:.3f}, operator {18 * math.exp(-s['O']) / total:.3f}" in c
    assert "intermediate digit 0.934" in c  # 18 x 0.83915 / 16.171
    # d. as logged: the informative fraction falls as the policy improves
    d = re.search(r"updates 1-10 ([\d.]+), last 10 ([\d.]+)", said["dynamic-sampling.svg"])
    assert float(d[1]) > float(d[2])
    # e. k3 at log r = -0.5 and +0.5: e^-0.5 + 0.5 - 1 and e^0.5 - 0.5 - 1
    assert said["kl-k3.svg"] == "k3 at log r = -0.5: 0.1065, at +0.5: 0.1487"


class Draws:
    """A stand-in for random.Random: random() gives the values listed, randrange(n) gives 0."""

    def __init__(self, *values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)

    def randrange(self, n):
        return 0


def test_the_group_is_what_the_demonstrator_writes():
    """Each answer of the figures' group is tiny_task.demonstrate's, with the habit it is named
    for: draws below 0.6 forget the carry (6+9), below 0.08 slip, and the detour draw below 0.12
    loops, in [0.12, 0.37) re-checks the first step (the default task's rates)."""
    task = tiny_task.Task()
    draws = {"no habit": (0.9, 0.9, 0.9, 0.9), "misconception": (0.1, 0.9, 0.9),
             "re-check": (0.9, 0.9, 0.9, 0.2), "loop": (0.9, 0.9, 0.9, 0.05)}
    for habit, text, finished in GROUP:
        assert tiny_task.demonstrate(PROMPT, task, Draws(*draws[habit])) == (text, finished)
    assert [tiny_task.verify(PROMPT, text, done) for _, text, done in GROUP] == \
        [True, False, True, False]
