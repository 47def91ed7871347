"""The documentation held to the code: the worked examples of docs/methods.md are computed here,
no page links into the code by line, the README names only functions that exist, and every
result table is what `python -m lab report results/*.json` prints from the committed runs.
"""

import glob
import os
import re

import pytest
import torch

from lab import cli, compare, cscr
import tokencredit as tc

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the project root



def readme_examples():
    """The worked examples of docs/methods.md, computed by the code."""
    blocks = []
    row = lambda xs, fmt="{:+.2f}": "  ".join(fmt.format(x) for x in xs)  # noqa: E731
    # 1. advantages: GRPO, Dr. GRPO and RLOO on three groups
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    lines = ["rewards        GRPO (std)                  Dr. GRPO (none)             RLOO (leave_one_out, none)"]
    grpo, dr = tc.group_advantages(rewards), tc.group_advantages(rewards, scale="none")
    rloo = tc.group_advantages(rewards, scale="none", baseline="leave_one_out")
    for r, a, d, l in zip(rewards.tolist(), grpo.tolist(), dr.tolist(), rloo.tolist()):
        lines.append(f"{row(r, '{:.0f}'):<14} {row(a):<27} {row(d):<27} {row(l)}")
    blocks.append("\n".join(lines))
    # 1b. overlong
    lengths = torch.tensor([10, 12, 13, 14, 16, 17])
    pen = tc.overlong_penalty(lengths, max_len=16, cache_len=4)
    blocks.append("length   " + " ".join(f"{int(x):>6d}" for x in lengths) + "\npenalty  " +
                  " ".join(f"{x:>6.2f}" for x in pen.tolist()))
    # 3. REINFORCE -> PPO-clip -> Clip-Higher: the gradient each sends to log pi(o_t)
    rho = torch.tensor([[1.0, 1.1, 1.25, 1.5, 0.9, 0.5]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    lines = ["rho                               " + " ".join(f"{x:>6.2f}" for x in rho[0].tolist()),
             "A                                 " + " ".join(f"{x:>+6.0f}" for x in adv[0].tolist())]
    for name, fn in (("REINFORCE, -A log pi       grad", lambda lp: tc.policy_gradient_surrogate(lp, adv)),
                     ("clip, eps 0.2 / 0.2        grad", lambda lp: tc.clipped_surrogate(torch.exp(lp), adv)),
                     ("Clip-Higher, 0.2 / 0.28    grad", lambda lp: tc.clipped_surrogate(torch.exp(lp), adv, 0.2, 0.28))):
        logp = torch.log(rho).requires_grad_()
        fn(logp).sum().backward()
        lines.append(f"{name}  " + " ".join(f"{x:>+6.2f}" for x in logp.grad[0].tolist()))
    blocks.append("\n".join(lines))
    # 4. who gets credit for a long answer: one group (100 and 1000 tokens), then a second prompt (10 and 10)
    mask = torch.zeros(4, 1000)
    for i, length in enumerate((100, 1000, 10, 10)):
        mask[i, :length] = 1
    lines = ["mode          weight of one token (x 1e-4)       share of the loss weight",
             "              100    1000   |  10      10        100    1000   |  10     10"]
    for mode in tc.AGGREGATION_MODES:
        w = tc.token_weights(mask, mode, group_size=2, max_len=1000)
        one, share = w[:, 0] * 1e4, w.sum(dim=1)
        lines.append(f"{mode:<13} {one[0]:<6.2f} {one[1]:<6.2f} | {one[2]:<7.2f} {one[3]:<9.2f} "
                     f"{share[0]:<6.3f} {share[1]:<6.3f} | {share[2]:<6.3f} {share[3]:.3f}")
    blocks.append("\n".join(lines))
    # 5. CSCR weights on one four-token answer, A = 0.5
    s = torch.tensor([[0.05, 0.10, 1.50, 0.20, 0.0]])
    m = torch.tensor([[1, 1, 1, 1, 0]])
    lines = ["sensitivity s_t     " + " ".join(f"{x:>6.2f}" for x in s[0, :4].tolist()) + "   (padding: weight 0)"]
    for strength in (0.0, 1.0, 4.0):
        w = tc.cscr_weights(s, m, strength, threshold=0.1)
        a = torch.tensor([0.5])[:, None] * w  # A_{i,t} = A_i u~_t
        lines.append(f"strength {strength:<3} u~_t   " + " ".join(f"{x:>6.3f}" for x in w[0, :4].tolist()) +
                     f"   sum of A_t {a.sum().item():.3f} = 4 x 0.5")
    blocks.append("\n".join(lines))
    return blocks


def test_worked_examples_match_the_code():
    with open(os.path.join(HERE, "docs", "methods.md")) as f:
        page = f.read()
    unindent = lambda text: "\n".join(line.strip() for line in text.splitlines())  # noqa: E731
    for block in readme_examples():
        assert unindent(block) in unindent(page), "docs/methods.md is missing this block, as the code computes it now:\n" + block


def test_code_is_named_never_linked_by_line():
    """No page links into the code by line number (every edit above a link would break it), and
    every function the README's map names is a function of tokencredit.py."""
    pages = doc_pages()
    for page in pages:
        text = open(os.path.join(HERE, page)).read()
        assert not re.findall(r"\.py#L\d+", text), f"{page} links to a line number"
    readme = open(os.path.join(HERE, "README.md")).read()
    table = readme[readme.index("| idea | paper"):readme.index("Each is worked through")]
    named = {name for row in table.splitlines()[2:] for name in re.findall(r"`(\w+)(?:\(|`)", row.split(" | ")[-1])}
    assert len(named) >= 15 and all(callable(getattr(tc, name, None)) for name in named), \
        sorted(name for name in named if not callable(getattr(tc, name, None)))


def doc_pages() -> list:
    """README.md and every page of docs/, as paths from the project root."""
    return ["README.md"] + [os.path.join("docs", page)
                            for page in sorted(os.listdir(os.path.join(HERE, "docs"))) if page.endswith(".md")]


def quoted(pattern: str) -> tuple:
    """(the texts of README.md and docs/, the commands they quote: pattern's group, stripped)."""
    texts = [open(os.path.join(HERE, page)).read() for page in doc_pages()]
    return texts, {c.strip() for text in texts for c in re.findall(pattern, text)}


def tables(text: str) -> list:
    """The markdown tables of text, each as its lines."""
    found, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            found, current = found + [current], []
    return found


def test_result_tables_are_what_the_report_prints(capsys):
    """Every table of README.md and docs/ whose header is one of `python -m lab report
    results/*.json`'s is exactly a table that command prints from the committed results."""
    cli.report(sorted(glob.glob(os.path.join(HERE, "results", "*.json"))))
    out = capsys.readouterr().out
    printed = tables(out)
    headers = {table[0] for table in printed}
    pages = doc_pages()
    checked = 0
    for page in pages:
        for table in tables(open(os.path.join(HERE, page)).read()):
            if table[0] in headers:
                assert table in printed, f"{page}: this table is not what the report prints:\n" + \
                    "\n".join(table)
                checked += 1
    assert checked >= 6  # README: results, one knob; lab.md: rollouts x 2, diagnosis; onestep.md
    said = set(out.splitlines())  # and the report's own lines that the pages quote in ```
    in_blocks = [line for page in pages for block in re.findall(r"^```[^\n]*\n(.*?)^```", open(os.path.join(HERE, page)).read(), re.S | re.M)
                 for line in block.splitlines() if line.startswith(REPORT_LINES)]
    assert len(in_blocks) >= 3 and not [line for line in in_blocks if line not in said], in_blocks


REPORT_LINES = ("CSCR diagnosis on", "entropy against sensitivity", "credit.png, responses")


@pytest.mark.slow  # lab compare over every committed pair
def test_paired_tables_are_what_lab_compare_prints(capsys, tmp_path):
    """Every `python -m lab compare ...` command quoted in README.md or docs/ is run on the
    committed results; every paired table of those pages, and every line of theirs that starts
    like a paired table's title, is what one of those commands prints."""
    texts, commands = quoted(r"python -m lab compare ((?:results/\S+\.json(?::\w+)? ?)+(?:--primary)?)")
    out = ""
    for command in sorted(commands):
        plot = [] if "--primary" in command else ["--plot", str(tmp_path / "pair.png")]
        cli.main(["compare", *command.split(), *plot])
        out += capsys.readouterr().out
    printed, said = tables(out), set(out.splitlines())
    headers = (compare.COMPARE_HEADER, compare.PRIMARY_HEADER)
    paired = [table for text in texts for table in tables(text) if table[0] in headers]
    missing = [table for table in paired if table not in printed]
    assert paired, "no paired table in README.md or docs/"
    assert not missing, "not what python -m lab compare prints:\n" + "\n".join(missing[0])
    titles = [line for text in texts for line in text.splitlines()
              if line.startswith(("paired comparison, ", "paired comparisons, "))]
    assert titles and not [line for line in titles if line not in said], titles


def test_cscr_tables_are_what_lab_sweep_prints(capsys):
    """Every CSCR sweep or claim-4 table of README.md and docs/ is what `python -m lab sweep`
    prints from the committed runs and diagnoses (the command the pages quote, globs and all)."""
    texts, commands = quoted(r"python -m lab sweep ((?:results/[\w./*-]+ ?)+)")
    out = ""
    for command in sorted(commands):
        paths = [p for pattern in command.split() for p in sorted(glob.glob(os.path.join(HERE, pattern)))]
        cscr.sweep(paths)
        out += capsys.readouterr().out
    printed = tables(out)
    shown = [table for text in texts for table in tables(text)
             if table[0] == cscr.SWEEP_HEADER or table[0].startswith("| the summary says |")]
    assert shown, "no CSCR sweep table in README.md or docs/"
    missing = [table for table in shown if table not in printed]
    assert not missing, "not what python -m lab sweep prints:\n" + "\n".join(missing[0])


@pytest.mark.slow  # a process that imports the bench's stack
def test_bench_help_names_the_command_a_user_types():
    """`python -m bench --help` shows `python -m bench`, not the file argparse was run from."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=HERE, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m bench [-h]"), out


def test_readme_intervals_are_what_its_commands_print(capsys):
    """Every mean with its 95 % interval in the README's sentences ("-0.54 [-0.83, -0.26]") is
    printed by one of the lab commands the README names, run on the committed results: the long
    tables live in docs/lab.md, and the README's one-sentence answers quote them."""
    readme = open(os.path.join(HERE, "README.md")).read()
    commands = re.findall(r"^python -m lab (report|failures|sweep) (.+)$", readme, re.M)
    assert {name for name, _ in commands} == {"report", "failures", "sweep"}, commands
    for name, paths in commands:
        cli.main([name, *[p for pattern in paths.split()
                          for p in sorted(glob.glob(os.path.join(HERE, pattern)))]])
    printed = capsys.readouterr().out
    prose = "\n".join(line for line in readme.splitlines() if not line.startswith("|"))
    number = r"[+-]\d+\.\d+"
    quoted = re.findall(rf"{number} \[{number}, {number}\]", " ".join(prose.split()))
    assert len(quoted) >= 7, quoted
    assert not [q for q in quoted if q not in printed], [q for q in quoted if q not in printed]


def test_bench_loss_compares_equal_losses_and_says_which_baselines_it_skipped(capsys):
    """`python -m bench --loss` (docs/speed.md), here without TRL and verl: the loss it times is
    the bare formula's, value and gradient, and the baselines it could not import are named."""
    import re
    from bench import loss
    skipped = set()
    loss.compare(4, 8, "sample", 2, skipped)
    line, = [x for x in capsys.readouterr().out.splitlines() if "the bare formula" in x]
    differences = re.search(r"differ by (\S+), the gradients by at most (\S+)\)", line).groups()
    assert all(abs(float(x)) < 1e-6 for x in differences), line
    assert {why.split()[0] for why in skipped} == {"TRL", "verl"}
