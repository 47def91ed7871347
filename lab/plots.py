"""The lab's pictures, one function each, from what a question's module measured or loaded:
curves.png (question 1), onestep.png (2), credit.png (3), the paired picture (4), the CSCR sweep
(5) and the two length failures side by side (6). Search for a picture's title to find its code."""

import os
import re
import textwrap
from typing import List

import torch

from lab.records import method_args, methods_of, seed_run
from lab.stats import mean_of


def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    return plt


def plot_curves(run: dict, path: str) -> None:
    """curves.png: held-out accuracy, lengths of right and wrong answers, truncated and re-checked
    rollouts, entropy and the informative-group fraction against policy update, mean over seeds."""
    plt = pyplot()
    panels = [(("accuracy", "sampled_accuracy"), "held-out accuracy: greedy (solid), sampled "
                                                 "(dashed)"),
              (("length_correct", "length_wrong"), "rollout length (tokens): correct (solid), "
                                                   "wrong (dashed)"),
              (("truncated_frac",), "truncated rollouts (loops that hit the budget)"),
              (("recheck_frac",), "rollouts that finished with a re-checked step"),
              (("entropy",), "policy entropy (nats/token)"),
              (("kept_frac",), "informative groups (0 < #correct < G)")]
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (keys, title) in zip(axes.flat, panels):
        for k, method in enumerate(methods_of(run)):
            rs = [r for r in run["runs"] if r["method"] == method]
            for key, style in zip(keys, ("-", "--")):
                if keys[0] == "accuracy":  # held-out evaluations, from the start
                    steps = sorted({int(s) for r in rs for s in r["evals"]})
                    values = [run["start"][key]] + [mean_of([r["evals"].get(str(s), {}).get(key)
                                                             for r in rs]) for s in steps]
                    ax.plot([0] + steps, values, style, marker="o", markersize=3,
                            color=colours[k % len(colours)], label=method if style == "-" else None)
                    continue
                n = len(rs[0]["updates"][key])
                values = [mean_of([r["updates"][key][i] for r in rs]) for i in range(n)]
                smooth = [mean_of(values[max(0, i - 2):i + 3]) for i in range(n)]  # 5 updates
                ax.plot(rs[0]["updates"]["step"], smooth, style, alpha=0.85,
                        color=colours[k % len(colours)], label=method if style == "-" else None)
        ax.set_title(title + ("" if keys[0] == "accuracy" else ", 5-update mean"), fontsize=10)
        ax.set_xlabel("policy update")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    seeds = len({r["seed"] for r in run["runs"]})
    fig.suptitle(f"tiny-model RLVR, mean over {seeds} seed(s)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_one_step(step: dict, table: dict, ratios: tuple, tokenizer, path: str) -> None:
    """onestep.png: per-token change by bucket and weighting; sample/token against its
    prediction (ratios: onestep.sample_over_token's); Delta log pi along one response under GRPO
    and CSCR, sensitive tokens in red."""
    plt = pyplot()
    fig = plt.figure(figsize=(13, 8.5))
    ax_bars, ax_ratio = fig.add_subplot(2, 2, 1), fig.add_subplot(2, 2, 2)
    ax_tokens = fig.add_subplot(2, 1, 2)
    names = [n for n in step["delta"] if n != "sample, lr/2"]
    rows = table["rows"]
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        ax_bars.bar([i + k * width for i in range(len(rows))],
                    [1e3 * r["per_token"][name] for r in rows], width, label=name)
    ax_bars.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
    ax_bars.set_xticklabels([f"{r['outcome']}\n{r['bucket'].split(' ')[0]}\n({r['responses']})"
                             for r in rows], fontsize=8)
    ax_bars.axhline(0, color="black", linewidth=0.6)
    ax_bars.set_ylabel("mean change of log pi per token (x 1e-3)")
    ax_bars.set_title("one SGD step: how far each response's tokens move, by weighting",
                      fontsize=10)
    ax_bars.legend(fontsize=7)

    mask, adv = step["mask"], step["advantages"]
    lengths, moved, measured, predicted = ratios
    measured, predicted = measured[moved], predicted[moved]
    colours = ["tab:green" if c else "tab:red" for c in step["correct"][moved].tolist()]
    ax_ratio.scatter(lengths[moved], measured, c=colours, s=12, alpha=0.7,
                     label="measured (green right, red wrong)")
    order = lengths[moved].argsort()
    ax_ratio.plot(lengths[moved][order], predicted[order], color="black",
                  label="first order: mean length / |o_i|")
    ax_ratio.set_yscale("log")
    ax_ratio.set_xlabel("response length |o_i| (tokens)")
    ax_ratio.set_ylabel('change under "sample" / under "token"')
    ax_ratio.set_title("the weighting's own effect, response by response", fontsize=10)
    ax_ratio.legend(fontsize=7)

    # a well-formed wrong answer of 16 or more tokens (a slip or the misconception, not a loop):
    # of these, the one whose most sensitive token is most sensitive (what CSCR acts on)
    text = tokenizer.batch_decode(step["responses"].tolist(), skip_special_tokens=True)
    plain = torch.tensor([bool(re.fullmatch(r"(\d+\+\d=\d+,)*\d+\+\d=\d+>\d+", s)) for s in text])
    finished = (step["responses"] == tokenizer.eos_token_id).any(dim=1)
    candidates = moved & ~step["correct"] & finished & plain & (lengths >= 16)
    if not candidates.any():
        candidates = moved if moved.any() else torch.ones_like(moved)
    spread = torch.where(mask, step["sensitivity"], 0.0).amax(dim=1)
    row = int(spread.masked_fill(~candidates, -1).argmax())
    n_tok = int(lengths[row])
    tokens = token_labels(tokenizer, step["responses"][row, :n_tok])
    cscr_name = next(n for n in names if n.startswith("cscr"))
    for name, style in (("sample", "-o"), (cscr_name, "-s")):
        ax_tokens.plot(range(n_tok), 1e3 * step["delta"][name][row, :n_tok], style, markersize=3,
                       label=f"{name} (GRPO)" if name == "sample" else f"{name} on sample weights")
    sensitive = step["cscr_weights"][row, :n_tok] < 1
    ax_tokens.set_xticks(range(n_tok))
    ax_tokens.set_xticklabels(tokens, fontsize=8)
    for tick, is_sensitive in zip(ax_tokens.get_xticklabels(), sensitive.tolist()):
        tick.set_color("tab:red" if is_sensitive else "black")
    ax_tokens.axhline(0, color="black", linewidth=0.6)
    outcome = "correct" if bool(step["correct"][row]) else "wrong"
    ax_tokens.set_title(f"change of log pi along one {outcome} response (A = "
                        f"{float(adv[row]):+.2f}); red tokens: CSCR weight < 1 (downweighted: "
                        f"among the response's most sensitive)", fontsize=10)
    ax_tokens.set_ylabel("change of log pi (x 1e-3)")
    ax_tokens.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_credit(picture: dict, tokenizer, tc, strength: float, path: str) -> dict:
    """credit.png: each token of a short and a long sampled response, shaded by its share of the
    loss weight under "sample", "token" and CSCR (the credit is that share times A). Returns the
    two responses' lengths and each weighting's share of the loss weight per response."""
    plt = pyplot()
    mask, responses, weights = picture["mask"], picture["responses"], picture["weights"]
    N, lengths = mask.shape[0], mask.sum(dim=1)
    # the shortest and the longest correct response (any response if fewer than two are correct)
    candidates = (picture["correct"] if int(picture["correct"].sum()) >= 2
                  else torch.ones(N, dtype=torch.bool))
    rows = [int(lengths.masked_fill(~candidates, 10 ** 9).argmin()),
            int(lengths.masked_fill(~candidates, -1).argmax())]
    shares = {'"sample" (GRPO)': tc.token_weights(mask, "sample"),
              '"token" (DAPO / verl / TRL)': tc.token_weights(mask, "token"),
              f'CSCR, strength {strength:g} (on "sample")': tc.token_weights(mask, "sample")
              * weights}
    vmax = max(float(w[rows].max()) for w in shares.values())
    width = int(lengths.max())
    panels = [(row, name, w) for row in rows for name, w in shares.items()]
    fig, axes = plt.subplots(len(panels), 1,
                             figsize=(max(8, 0.32 * width + 2), 0.75 * len(panels) + 1.2))
    cmap = plt.get_cmap("Blues")
    for ax, (row, name, w) in zip(axes, panels):
        tokens = token_labels(tokenizer, responses[row, : int(lengths[row])])
        values = w[row, : len(tokens)]
        for t, (tok, v) in enumerate(zip(tokens, values.tolist())):
            ax.add_patch(plt.Rectangle((t, 0), 1, 1, color=cmap(0.1 + 0.9 * v / vmax)))
            ax.text(t + 0.5, 0.5, tok, ha="center", va="center", fontsize=8,
                    color="white" if v / vmax > 0.6 else "black")
        ax.set_xlim(0, width)
        ax.set_ylim(0, 1)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=8)
        ax.set_title(f"{len(tokens)}-token response: {float(values.sum()) * 100:.2f}% of the loss "
                     f"weight (batch of {N})", fontsize=8, loc="left", pad=2)
    fig.suptitle("Share of the loss weight each token receives (darker = more; its credit is this "
                 "share x A)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return dict(lengths=[int(lengths[row]) for row in rows],
                shares={name: [float(w[row].sum()) for row in rows] for name, w in shares.items()})


def token_labels(tokenizer, ids: torch.Tensor) -> List[str]:
    """One label per token id for the pictures, "eos" for <eos>."""
    texts = [tokenizer.decode([i]) for i in ids.tolist()]
    return ["eos" if text in ("", tokenizer.eos_token) else text for text in texts]


def plot_compare(p: dict, series_keys: tuple, path: str) -> None:
    """The picture: each seed's difference OTHER - BASE per update (5-update mean, thin) and the
    mean over seeds (thick), one panel per rollout measure (series_keys: (key, label, digits)),
    and the held-out sampled accuracy."""
    plt = pyplot()
    base, other, seeds = p["base"], p["other"], p["seeds"]

    def series(side, seed, key):
        r = seed_run(side, seed)
        if key == "sampled_accuracy":  # held-out, from the shared start (difference 0)
            steps = sorted(map(int, r["evals"]))
            return [0] + steps, [side[0]["start"][key]] + [r["evals"][str(s)][key] for s in steps]
        return r["updates"]["step"], r["updates"][key]
    panels = [(key, label, 5) for key, label, _ in series_keys]
    panels.append(("sampled_accuracy", "held-out sampled accuracy", 1))
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    for ax, (key, label, window) in zip(axes.flat, panels):
        curves = []
        for seed in seeds:
            steps, b = series(base, seed, key)
            _, o = series(other, seed, key)
            diff = [None if x is None or y is None else y - x for x, y in zip(b, o)]
            curves.append([mean_of(diff[max(0, i - window // 2):i + window // 2 + 1])
                           for i in range(len(diff))])
            ax.plot(steps, curves[-1], color="tab:blue", alpha=0.3, linewidth=0.8)
        ax.plot(steps, [mean_of(c) for c in zip(*curves)], color="tab:blue", linewidth=2.5,
                label=f"mean of {len(seeds)} seeds")
        ax.axhline(0, color="black", linewidth=0.8)
        smoothing = ", 5-update mean" if window > 1 else " at each evaluation"
        ax.set_title(f"{label}{smoothing}", fontsize=10)
        ax.set_xlabel("policy update")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"{other[0]['name']}:{other[1]} minus {base[0]['name']}:{base[1]}, "
                 "seed by seed (thin: one seed; thick: their mean; below 0: OTHER is lower)",
                 fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_sweep(rows: list, labels: List[str], path: str) -> None:
    """One panel per measure: x the strength, each seed's difference from strength 0 as a dot,
    the mean with its 95 % interval as a line with bars, tau = 0 and tau > 0 side by side."""
    plt = pyplot()
    seeds_of = [r["warmup_seed"] for r in rows]
    ws = max(set(seeds_of), key=seeds_of.count)  # the warm-up swept over most strengths
    strengths = sorted({r["strength"] for r in rows if r["warmup_seed"] == ws})
    taus = sorted({r["tau"] for r in rows if r["warmup_seed"] == ws})
    colours = ("tab:blue", "tab:orange", "tab:green")
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    for ax, label in zip(axes.flat, labels):
        for j, (tau, colour) in enumerate(zip(taus, colours)):
            mine = sorted((r for r in rows if r["warmup_seed"] == ws and r["measure"] == label
                           and r["tau"] == tau), key=lambda r: r["strength"])
            x = [strengths.index(r["strength"]) + (j - (len(taus) - 1) / 2) * 0.25 for r in mine]
            for xi, r in zip(x, mine):
                n = len(r["diffs"])
                ax.scatter([xi + 0.1 * (i / max(n - 1, 1) - 0.5) for i in range(n)], r["diffs"],
                           s=9, color=colour, alpha=0.45)
            ax.errorbar(x, [r["mean"] for r in mine],
                        yerr=[[r["mean"] - r["low"] for r in mine],
                              [r["high"] - r["mean"] for r in mine]],
                        color=colour, linewidth=2, capsize=4, label=f"tau = {tau:g}")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(strengths)), [f"{s:g}" for s in strengths])
        ax.set_xlabel("CSCR strength (alpha)")
        ax.set_title(label, fontsize=9.5)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    axes.flat[-1].axis("off")
    axes.flat[-1].text(0, 0.5, "each panel: strength s minus strength 0 (GRPO),\nin the same "
                       "seed (same warm-up, problems,\nfirst batch). Dots: one seed each.\nLine "
                       "and bars: the mean over seeds\nand its 95 % t-interval. Above 0:\nhigher "
                       "than GRPO.", fontsize=11, va="center")
    fig.suptitle(f"CSCR's strength, seed by seed against GRPO (warm-up seed {ws}, "
                 f"{len(next(r for r in rows if r['warmup_seed'] == ws)['seeds'])} seeds)",
                 fontsize=12)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_failures(pairs: List[dict], rows: list, path: str) -> None:
    """The two length failures side by side: one panel per measure of the table, each pair's
    per-seed differences "token" - "sample" (dots) and their mean with its 95 % interval (bar);
    the last panel, how fast the misconceptions' fixes spread in the rollouts, per update."""
    plt = pyplot()
    labels = list(dict.fromkeys((r["failure"], r["label"]) for r in rows))
    names = list(dict.fromkeys(r["pair"] for r in rows))
    colours = dict(zip(names, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    fig, axes = plt.subplots(2, 4, figsize=(19, 8.5))
    for ax, (failure, label) in zip(axes.flat, labels):
        mine = [r for r in rows if (r["failure"], r["label"]) == (failure, label)]
        for x, r in enumerate(mine):
            n = len(r["diffs"])
            ax.scatter([x + 0.2 * (i / max(n - 1, 1) - 0.5) for i in range(n)], r["diffs"], s=12,
                       color=colours[r["pair"]], alpha=0.5)
            ax.errorbar([x], [r["mean"]], yerr=[[r["mean"] - r["low"]], [r["high"] - r["mean"]]],
                        color=colours[r["pair"]], linewidth=2.5, capsize=6, marker="o")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(mine)), [r["pair"].replace(" - ", "\n- ") for r in mine],
                      fontsize=7.5)
        ax.set_xlim(-0.6, len(mine) - 0.4)
        title = f"failure {failure}" if failure[0].isdigit() else failure
        ax.set_title(title + "\n" + "\n".join(textwrap.wrap(label, 48)), fontsize=9)
        ax.set_ylabel('"token" - "sample", per seed', fontsize=8)
        ax.grid(alpha=0.3)
    ax = axes.flat[len(labels)] if len(labels) < axes.size else None
    long_pairs = [p for p in pairs if p["base"][0]["config"].get("long_misconception_rate")]
    if ax is not None and long_pairs:
        p = long_pairs[0]
        for side, style in ((p["base"], "--"), (p["other"], "-")):  # "sample", "token"
            mode = method_args(*side)["loss_mode"]
            for key, colour, what in (("fix_long_misconception", "tab:red", "second (long only)"),
                                      ("fix_long", "tab:purple", "first, long problems"),
                                      ("fix_short", "tab:gray", "first, short problems")):
                per_seed = [seed_run(side, s)["updates"][key] for s in p["seeds"]]
                curve = [mean_of(values) for values in zip(*per_seed)]
                smooth = [mean_of(curve[max(0, i - 2):i + 3]) for i in range(len(curve))]
                ax.plot(range(1, len(curve) + 1), smooth, style, color=colour,
                        label=what if mode == "token" else None)
        ax.set_title("how fast each misconception's fix spreads: the fraction of\nits steps "
                     f"written right in the rollouts (mean of {len(p['seeds'])} seeds,\n"
                     "5-update mean; dashed \"sample\", solid \"token\")", fontsize=9)
        ax.set_xlabel("policy update")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for extra in axes.flat[len(labels) + bool(long_pairs):]:
        extra.axis("off")
    fig.suptitle('Sample-level averaging\'s two length failures, "token" against "sample" seed by '
                 "seed (same warm-up, problems and first batch; dots: one seed each, bars: the "
                 "mean and its 95 % interval)\nfailure 1: above 0, long right answers learned "
                 "better under \"token\"; failure 2: below 0, long wrong answers pushed down "
                 "harder under \"token\"", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
