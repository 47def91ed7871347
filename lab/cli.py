"""The lab (python -m lab): runs train_tiny.py's RL loop and measures it, one question at a time,
each in its own module of lab/:

0. Is the right answer within reach of sampling?     reach.py: pass_at_group
1. Does RL fix the warm-up's mistakes?               learning.py: the results table, the knobs
2. What does one step do under each weighting?       onestep.py: one_step, its table, onestep.png
3. Where does CSCR move credit?                      credit.py: diagnose, its table, credit.png
4. Does one knob change what happens, seed by seed?  compare.py: two saved runs, paired by seed
5. Do CSCR's own claims hold here, seed by seed?     cscr.py: sweep and cscr-diagnose
6. Are long right answers underlearned, and long     failures.py: failure 1 in pairs, and both
   wrong ones under-penalised? (the two failures)    failures side by side
Questions 0, 2 and 3 are asked of the starting policy, on the first held-out prompts, from fixed
random streams. Statistics are in stats.py, saved runs in records.py, every picture in plots.py,
the lecture's figures in lecture.py; every table title printed can be searched for in lab/.

    python -m lab --quick                       # train_tiny.py --quick, then every measurement
    python -m lab --seeds 0,1,2 --name readme   # the results table (any train_tiny argument)
    python -m lab knobs --seeds 0,1,2           # the one-knob runs, each knob on its own
    python -m lab report results/*.json         # every table again, from saved results
    python -m lab report runs/NAME --save results/    # a run's results, compacted for keeping
    python -m lab compare results/A.json results/B.json     # B - A, seed by seed, and a picture
    python -m lab sweep results/cscr-*.json --plot docs/cscr-sweep.png   # CSCR's claims
    python -m lab failures SAMPLE.json TOKEN.json ... --plot PATH   # the two length failures
    python -m lab merge results/NAME.json runs/NAME-s0 runs/NAME-s1   # seeds run one by one
    python -m lab lecture-figures docs/lecture  # docs/lecture.md's figures, from results/
"""

import argparse
import json
import os
import sys
from typing import List

import tiny_task
import train_tiny as tt
from lab import compare, credit, cscr, failures, learning, onestep, plots, reach
from lab.records import load_run

PROG = "python -m lab"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lab_options(argv: List[str]) -> tuple:
    """The lab's own option, --one-step-lr, and the rest: train_tiny's arguments."""
    parser = argparse.ArgumentParser(prog=PROG, add_help=False, allow_abbrev=False)
    parser.add_argument("--one-step-lr", type=float, default=0.01)
    options, rest = parser.parse_known_args(argv)
    tiny_task.check_fields(options, lambda v: v > 0, "> 0", "one_step_lr")
    return options, rest


def save(results: dict, options) -> None:
    """results.json again: what the lab measured, and its own option beside train_tiny's, in the
    run's arguments and in each method's, where the lab's runs have always recorded it."""
    for args in (results["config"], *results["methods"].values()):
        args["one_step_lr"] = options.one_step_lr
    with open(os.path.join("runs", results["config"]["name"], "results.json"), "w") as f:
        json.dump(results, f, indent=1)


def main(argv=None) -> dict:
    """python -m lab [train_tiny's arguments] [--one-step-lr LR]: train_tiny's runs, with
    failure 1's measures in their records, then questions 0, 2 and 3 on the starting policy,
    and every table; or one of COMMANDS."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    if "-h" in argv or "--help" in argv:
        print(HELP.format(commands=", ".join(COMMANDS), doc=__doc__.strip()))
        return {}
    options, argv = lab_options(argv)
    results = tt.main(argv, failures.MEASURES)  # the RL runs: progress, accuracy before and after
    out_dir = os.path.join("runs", results["config"]["name"])
    args = tt.Args(**results["config"])
    tc = tt.load_tokencredit(args)  # ours, or --impl's
    model, tokenizer, _ = tiny_task.load_or_warm_up(args, results["device"], "runs")  # the start
    problems = tt.held_out_problems(args)
    strength = next((a["cscr_strength"] for a in results["methods"].values()
                     if a["cscr_strength"] > 0), 1.0)  # the first CSCR strength asked for, else 1
    device = results["device"]
    measurements = (
        ("pass_at_group", lambda: reach.report_pass_at_group(model, tokenizer, args, problems,
                                                             device)),
        ("one_step", lambda: onestep.report_one_step(model, tokenizer, args, tc, problems,
                                                     strength, options.one_step_lr, device,
                                                     out_dir)),
        ("diagnosis", lambda: credit.report_diagnosis(model, tokenizer, args, tc, problems,
                                                      strength, device, out_dir)))
    for name, measure in measurements:
        try:
            results[name] = measure()
        except NotImplementedError as missing:  # course mode: a student's unfinished exercise
            print(f"\n{name} skipped: your tokencredit.py has not implemented {missing}")
    save(results, options)
    run = load_run(out_dir)
    print("\n" + learning.format_results(run))
    print("\n" + learning.format_rollouts([run]))
    plots.plot_curves(run, os.path.join(out_dir, "curves.png"))
    print(f"\nwrote {out_dir}/results.json, curves.png, onestep.png, credit.png")
    return results


def knobs(argv: List[str]) -> dict:
    """python -m lab knobs [train_tiny's arguments]: each knob's run (learning.KNOBS), with the
    arguments given (--seeds 0,1,2 for the committed ones)."""
    if "-h" in argv or "--help" in argv:
        print("usage: python -m lab knobs [train_tiny arguments, e.g. --seeds 0,1,2]\n\nTrains "
              "each run of the one-knob table into runs/NAME\n(python -m lab report runs/readme "
              "runs/knob-* prints the table):\n" + "\n".join(
                  f"  {name:<22} {knob}" for _, name, _, knob in learning.KNOBS if knob))
        return {}
    options, argv = lab_options(argv)
    for _, name, _, knob in learning.KNOBS:
        if knob is not None:
            save(tt.main(knob.split() + ["--name", name] + argv, failures.MEASURES), options)
    return {}


def lecture_figures(argv: List[str]) -> None:
    """python -m lab lecture-figures [DIR]: docs/lecture.md's figures (lecture.py)."""
    parser = argparse.ArgumentParser(prog="python -m lab lecture-figures", description="Draw "
                                     "docs/lecture.md's figures from results/ (SVG, the same "
                                     "bytes each time) and print the numbers they show.")
    parser.add_argument("dir", nargs="?", default=os.path.join(ROOT, "docs", "lecture"))
    options = parser.parse_args(argv)
    from lab import lecture  # here: it imports tokencredit.py (in a handout, the student's)
    lecture.cmd_lecture_figures(options.dir)


def report(argv: List[str]) -> dict:
    """python -m lab report PATH... [--save DIR] [--curves DIR]: every table again, from
    runs/NAME folders or their compact copies results/NAME.json; --save DIR writes those compact
    copies, --curves DIR draws each run's curves as DIR/NAME-curves.png."""
    parser = argparse.ArgumentParser(prog="python -m lab report", description="Print every table "
                                     "again from saved runs: runs/NAME folders or their compact "
                                     "copies results/NAME.json.")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="runs/NAME or results/NAME.json")
    parser.add_argument("--save", metavar="DIR", help="write each run's compact copy DIR/NAME.json")
    parser.add_argument("--curves", metavar="DIR", help="draw each run's DIR/NAME-curves.png")
    options = parser.parse_args(argv)
    paths, save = options.paths, options.save
    runs, printed = {run["name"]: run for run in map(load_run, paths)}, []

    def show(text):  # a table once, however many runs share it (the same warm-up, say)
        if text in printed and "\n" in text:  # its title, that the run has it too
            print(f"\n{text.splitlines()[0]}\n(the same table as above)")
        else:
            printed.append(text)
            print("\n" + text)
    for name, run in runs.items():
        if save:
            os.makedirs(save, exist_ok=True)
            with open(os.path.join(save, f"{name}.json"), "w") as f:
                json.dump(run, f, separators=(",", ":"))
        if not name.startswith("knob-"):
            if options.curves:
                plots.plot_curves(run, os.path.join(options.curves, f"{name}-curves.png"))
            print(f"\n## {name}")
            if "pass@1" in run["start"]:
                show(reach.format_reach(run["start"], run["config"]["group_size"]))
            show(learning.format_results(run))
            show(learning.format_rollouts([run]))
            for key, fmt in (("one_step", onestep.format_one_step),
                             ("diagnosis", credit.format_diagnosis)):
                if run.get(key):
                    show(fmt(run[key]))
    if all(name in runs for _, name, _, _ in learning.KNOBS):
        print("\n## one knob at a time")
        show(learning.format_knobs(runs))
        knob_runs = dict.fromkeys(name for _, name, _, knob in learning.KNOBS if knob)  # in order
        show(learning.format_rollouts([runs[name] for name in knob_runs]))
    return runs


COMMANDS = {"report": report, "knobs": knobs, "compare": compare.compare, "sweep": cscr.sweep,
            "cscr-diagnose": cscr.diagnose_trained, "failures": failures.failures,
            "merge": failures.merge, "lecture-figures": lecture_figures}
HELP = """usage: python -m lab [train_tiny.py's arguments] [--one-step-lr LR]
       python -m lab COMMAND [ARGUMENTS]
COMMAND: {commands}

{doc}

Without a command it trains as train_tiny.py does, with its arguments (python train_tiny.py
--help lists them) and failure 1's measures in each record, then asks questions 0, 2 and 3 of
the starting policy and prints every table; --one-step-lr LR (default 0.01) is the learning rate
of question 2's plain SGD step. Each COMMAND has its own --help."""
