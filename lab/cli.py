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
random streams. Statistics are in stats.py, saved runs in records.py, every picture in plots.py;
every table title printed can be searched for in lab/.

    python -m lab --quick                       # train_tiny.py --quick, then every measurement
    python -m lab --seeds 0,1,2 --name readme   # the results table (any train_tiny argument)
    python -m lab knobs --seeds 0,1,2           # the one-knob runs, each knob on its own
    python -m lab report results/*.json         # every table again, from saved results
    python -m lab report runs/NAME --save results/    # a run's results, compacted for keeping
    python -m lab compare results/A.json results/B.json     # B - A, seed by seed, and a picture
    python -m lab sweep results/cscr-*.json --plot docs/cscr-sweep.png   # CSCR's claims
    python -m lab failures SAMPLE.json TOKEN.json ... --plot PATH   # the two length failures
    python -m lab merge results/NAME.json runs/NAME-s0 runs/NAME-s1   # seeds run one by one
"""

import argparse
import json
import os
import sys
from typing import List

import tiny_task
import train_tiny as tt  # its tokencredit is tt.tc: a student's, with --impl
from lab import compare, credit, cscr, failures, learning, onestep, plots, reach
from lab.records import load_run

PROG = "python -m lab"


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    if "-h" in argv or "--help" in argv:  # the lab's commands, then the training arguments
        print(__doc__.strip() + "\n\nEach command has its own --help (python -m lab compare "
              "--help).\nThe training arguments, which python -m lab passes to train_tiny.py:\n")
    results = tt.main(argv, prog=PROG)  # the RL runs: progress, accuracy before and after
    out_dir = os.path.join("runs", results["config"]["name"])
    args = tt.Args(**results["config"])
    model, tokenizer, _ = tiny_task.load_or_warm_up(args, results["device"], "runs")  # the start
    problems = tt.held_out_problems(args)
    strength = next((a["cscr_strength"] for a in results["methods"].values()
                     if a["cscr_strength"] > 0), 1.0)  # the first CSCR strength asked for, else 1
    device = results["device"]
    measurements = (
        ("pass_at_group", lambda: reach.report_pass_at_group(model, tokenizer, args, problems,
                                                             device)),
        ("one_step", lambda: onestep.report_one_step(model, tokenizer, args, problems, strength,
                                                     device, out_dir)),
        ("diagnosis", lambda: credit.report_diagnosis(model, tokenizer, args, problems, strength,
                                                      device, out_dir)))
    for name, measure in measurements:
        try:
            results[name] = measure()
        except NotImplementedError as missing:  # course mode: a student's unfinished exercise
            print(f"\n{name} skipped: your tokencredit.py has not implemented {missing}")
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    run = load_run(out_dir)
    print("\n" + learning.format_results(run))
    print("\n" + learning.format_rollouts([run]))
    plots.plot_curves(run, os.path.join(out_dir, "curves.png"))
    print(f"\nwrote {out_dir}/results.json, curves.png, onestep.png, credit.png")
    return results


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


COMMANDS = {"report": report, "knobs": learning.run_knobs, "compare": compare.compare,
            "sweep": cscr.sweep, "cscr-diagnose": cscr.diagnose_trained,
            "failures": failures.failures, "merge": failures.merge}
