"""Saved runs as the lab reads them: runs/NAME folders (results.json and metrics.jsonl) or their
compact copies results/NAME.json, and one method and seed's records in them."""

import dataclasses
import json
import os
from typing import List

import train_tiny as tt
from lab.stats import compact, mean_of, number

DEFAULTS = {f.name: f.default for f in dataclasses.fields(tt.Args)}
UPDATE_KEYS = ("step", "reward", "accuracy", "entropy", "kept_frac", "groups", "rounds",
               "length", "length_correct", "length_wrong", "truncated_frac", "recheck_frac",
               "clip_frac_low", "clip_frac_high", "fix_short", "fix_long",
               "fix_long_misconception")
EVAL_KEYS = ("accuracy", "sampled_accuracy", "length", "accuracy_misconception",
             "accuracy_other", "sampled_accuracy_misconception")
LONG_EVAL_KEYS = ("accuracy_long", "sampled_accuracy_long", "sampled_accuracy_short",
                  "accuracy_long_misconception", "sampled_accuracy_long_misconception")  # if run


def load_run(path: str) -> dict:
    """A run as the reports read it, from runs/NAME (results.json and metrics.jsonl) or from its
    compact copy results/NAME.json: config, start, one_step, diagnosis, and per method and seed
    the per-update series ("updates") and held-out evaluations ("evals", by update)."""
    if path.endswith(".json"):
        with open(path) as f:
            return json.load(f)
    with open(os.path.join(path, "results.json")) as f:
        results = json.load(f)
    with open(os.path.join(path, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    runs = []
    for r in results["runs"]:
        mine = [x for x in records if x["method"] == r["method"] and x["seed"] == r["seed"]]
        runs.append(dict(method=r["method"], seed=r["seed"], wall_s=round(r["wall_s"], 1),
                         updates={k: [compact(x.get(k)) for x in mine] for k in UPDATE_KEYS},
                         evals={str(x["step"]): {k: compact(x[f"eval_{k}"])
                                                 for k in EVAL_KEYS + LONG_EVAL_KEYS
                                                 if f"eval_{k}" in x}
                                for x in mine if "eval_accuracy" in x}))
    methods = {label: {k: v for k, v in args.items() if v != results["config"].get(k)}
               for label, args in results.get("methods", {}).items()}  # what a preset changed
    return dict(name=os.path.basename(os.path.normpath(path)), config=results["config"],
                methods=methods,
                start={k: compact(v) for k, v in {**results["start"],
                                                  **results.get("pass_at_group", {})}.items()},
                runs=runs,
                **{k: results[k] for k in ("one_step", "diagnosis") if k in results})


def summarise_run(run: dict, start: dict) -> dict:
    """One method and seed: held-out accuracy at the last evaluation (the start if none), and
    rollout statistics over the first and the last ten updates."""
    u = run["updates"]
    final = run["evals"][max(run["evals"], key=int)] if run["evals"] else start
    trained = [i for i, e in enumerate(u["entropy"]) if e is not None]  # not skipped

    def over(key, updates):
        return mean_of([u[key][i] for i in updates])
    return dict({k: number(final[k]) for k in EVAL_KEYS}, entropy=over("entropy", trained[-5:]),
                truncated_first10=over("truncated_frac", trained[:10]),
                truncated_last10=over("truncated_frac", trained[-10:]),
                length_wrong_last10=over("length_wrong", trained[-10:]))


def methods_of(run: dict) -> List[str]:
    return list(dict.fromkeys(r["method"] for r in run["runs"]))


def load_side(spec: str) -> tuple:
    """PATH or PATH:METHOD (a run folder or results/NAME.json) -> (run, method)."""
    path, _, method = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if not os.path.exists(path if path.endswith(".json") else os.path.join(path, "results.json")):
        raise ValueError(f"compare: no saved run at {path!r}; expected runs/NAME or "
                         "results/NAME.json, optionally followed by :METHOD")
    run = load_run(path)
    methods = methods_of(run)
    if not method and len(methods) == 1:
        method = methods[0]
    if method not in methods:
        raise ValueError(f"compare: {path} holds the methods {', '.join(methods)}; name one, "
                         f"as {path}:{methods[0]}, got {repr(method) if method else 'none'}")
    return run, method


def method_args(run: dict, method: str) -> dict:
    """The arguments method trained with: the run's config and what its preset changed; an
    argument a run saved before it existed takes its default."""
    return {**DEFAULTS, **run["config"], **run.get("methods", {}).get(method, {})}


def seed_run(side: tuple, seed: int) -> dict:
    """The record of side's method trained with seed."""
    run, method = side
    return next(r for r in run["runs"] if r["method"] == method and r["seed"] == seed)
