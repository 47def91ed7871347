"""The lecture's figures and the numbers it quotes from them (docs/lecture.md says how they are
drawn and checked): one panel each, as SVG with fixed bytes (STYLE's hash salt, no date or
version, text kept as text)."""

import json
import os
import time

import torch

import tiny_task
import tokencredit as tc
from lab import compare, credit, plots, records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results")

# one group of answers to 6+9+8=, one per habit of the demonstrator (docs/lab.md), as
# tiny_task.demonstrate writes them: (habit, text, finished with <eos>)
PROMPT = [6, 9, 8]
GROUP = (("no habit", "6+9=15,15+8=23>23", True),
         ("misconception", "6+9=5,5+8=13>13", True),
         ("re-check", "6+9=15,6+9=15,15+8=23>23", True),
         ("loop", ",".join(["6+9=15"] * 7)[:48], False))  # cut at the 48-token budget
# the paired runs (python -m lab compare): (label, BASE, OTHER) in results/, and the measure drawn
PAIRS = (("default task", "paired-sample", "paired-token"),
         ("--loop-rate 0.3", "paired-loops-sample", "paired-loops-token"),
         ("--warmup-seed 7", "paired-ws7-sample", "paired-ws7-token"))
PAIRED_MEASURE = ("wrong-answer length", "whole")
CSCR_STRENGTHS = (1, 4, 8)  # the preset, the one-knob run, the sweep's strongest
STYLE = {"svg.hashsalt": "tokencredit-lecture", "svg.fonttype": "none", "font.size": 14,
         "axes.titlesize": 14, "axes.labelsize": 14, "legend.fontsize": 12}


def sample_token_weights(ax) -> str:
    """a. The weight of each token of GROUP's answers under "sample" and "token"."""
    lengths = torch.tensor([len(text) + finished for _, text, finished in GROUP])  # chars, <eos>
    mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]  # (4, 48)
    correct = [tiny_task.verify(PROMPT, text, done) for _, text, done in GROUP]
    said = []
    for k, (mode, color, d_i) in enumerate((("sample", "tab:blue", "N |o_i|"),
                                            ("token", "tab:orange", "sum_j |o_j|"))):
        w = tc.token_weights(mask, mode)  # (4, 48)
        x = torch.arange(len(GROUP)) + (k - 0.5) * 0.38
        bars = ax.bar(x.tolist(), (w[:, 0] * 1e3).tolist(), width=0.38, color=color,
                      label=f'"{mode}": d_i = {d_i}')
        shares = w.sum(dim=1).tolist()
        ax.bar_label(bars, [f"{s:.2f}" for s in shares], fontsize=11)
        said.append(f"{mode}: per token " + ", ".join(f"{v:.5f}" for v in w[:, 0].tolist())
                    + "; share " + ", ".join(f"{s:.3f}" for s in shares))
    ax.set_xticks(range(len(GROUP)), [f"{habit}\n{int(n)} tokens, {'right' if ok else 'wrong'}"
                                      for (habit, _, _), n, ok in zip(GROUP, lengths, correct)])
    ax.set_ylabel("weight of each of its tokens (x 1e-3)")
    ax.set_title("One group of 4 answers to 6+9+8=: what one token weighs\n"
                 "(above each bar: the answer's share of the loss weight)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return "lengths " + " ".join(map(str, lengths.tolist())) + "; " + "; ".join(said)


def paired_effect(ax) -> str:
    """b. Token minus sample, seed by seed, with the mean's 95 % t-interval: the paired runs."""
    said = []
    for y, (label, base, other) in enumerate(PAIRS):
        p = compare.paired(*(records.load_side(os.path.join(RESULTS, name + ".json"))
                         for name in (base, other)))
        row = next(r for r in p["rows"] if r["key"] == PAIRED_MEASURE)
        n = len(row["diffs"])
        ax.scatter(row["diffs"], [y + 0.25 * (i / (n - 1) - 0.5) for i in range(n)],
                   color="tab:blue", alpha=0.6, s=40, label="one seed" if y == 0 else None)
        ax.errorbar([row["mean"]], [y], xerr=[[row["mean"] - row["low"]],
                                               [row["high"] - row["mean"]]],
                    fmt="D", color="black", markersize=9, capsize=8, linewidth=2.5,
                    label="mean, 95 % t-interval" if y == 0 else None)
        text = (f"{row['mean']:+.2f} [{row['low']:+.2f}, {row['high']:+.2f}], {row['minus']} "
                f"of {n} seeds lower")
        ax.annotate(text, (0.25, y), xytext=(0, -5), textcoords="offset points", fontsize=12)
        said.append(f"{label}: {text}")
    ax.axvline(0, color="black", linewidth=1)
    ax.set_yticks(range(len(PAIRS)), [label for label, _, _ in PAIRS])
    ax.set_ylim(len(PAIRS) - 0.5, -1)
    ax.set_xlim(-1.6, 2.2)
    ax.set_xlabel('wrong-answer length, updates 1-60: "token" minus "sample" (tokens)')
    ax.set_title('Two runs per seed, "sample" and "token": their difference\n'
                 "(below 0: shorter wrong answers under \"token\")")
    ax.legend(loc="upper right")
    ax.grid(axis="x", alpha=0.3)
    return "; ".join(said)


def cscr_answer_weights(ax) -> str:
    """c. CSCR's u~_t on one right answer, each token given its class's mean sensitivity on
    the starting policy (results/readme.json's diagnosis): a picture of the weighting, not of
    one sampled answer's shifts."""
    tokenizer = tiny_task.build_tokenizer()
    ids = torch.tensor(tokenizer(GROUP[0][1])["input_ids"] + [tokenizer.eos_token_id])
    classes = credit.token_classes(tokenizer, ids[None])[0]  # (T,) index into credit.CLASSES
    with open(os.path.join(RESULTS, "readme.json")) as f:
        by_class = json.load(f)["diagnosis"]["by_class"]
    mean_s = [by_class[name]["mean_sensitivity"] for name in credit.CLASSES]
    s = torch.tensor([mean_s[c] for c in classes.tolist()])[None]  # (1, T)
    mask = torch.ones_like(s, dtype=torch.bool)
    ax.axhline(1, color="black", linewidth=1.5, linestyle="--", label="strength 0 (GRPO)")
    said = ["mean sensitivity " + ", ".join(f"{n} {v:.3f}" for n, v in zip(credit.CLASSES, mean_s))]
    for strength, marker in zip(CSCR_STRENGTHS, "osD"):
        w = tc.cscr_weights(s, mask, float(strength))[0]  # (T,) mean 1
        ax.plot(range(len(w)), w.tolist(), marker=marker, markersize=8, linewidth=1.5,
                label=f"strength {strength}")
        said.append(f"strength {strength}: " + ", ".join(
            f"{n} {w[classes == k][0]:.3f}" for k, n in enumerate(credit.CLASSES)
            if (classes == k).any()))
    ax.set_xticks(range(len(ids)), [f"{t}\n{credit.CLASSES[c][0].upper()}" for t, c in
                                    zip(plots.token_labels(tokenizer, ids), classes.tolist())])
    ax.set_ylim(0, 2.6)
    ax.set_ylabel("CSCR weight of the token (mean 1)")
    ax.set_xlabel("token and class: I intermediate digit, O operator, F format, A answer digit")
    ax.set_title("CSCR (our reading) on 6+9=15,15+8=23>23, tau 0; each token's sensitivity is\n"
                 "its class's mean on the starting policy (results/readme.json)", fontsize=13)
    ax.legend(loc="upper left", ncol=4, fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    return "; ".join(said)


def dynamic_sampling(ax) -> str:
    """d. Groups sampled, informative and kept per update: the dapo preset, seed 0, as logged."""
    run = records.load_run(os.path.join(RESULTS, "readme.json"))
    u = records.seed_run((run, "dapo"), 0)["updates"]
    args = records.method_args(run, "dapo")
    B = args["prompts_per_step"]
    seen = [rounds * B for rounds in u["rounds"]]
    informative = [round(frac * n) for frac, n in zip(u["kept_frac"], seen)]
    for values, color, label in ((seen, "#c6dbef", "sampled (16 per round)"),
                                 (informative, "#6baed6", "informative: 0 < #correct < G"),
                                 (u["groups"], "#08519c", "kept in the batch")):
        ax.bar(u["step"], values, width=0.8, color=color, label=label)
    ax.axhline(B, color="black", linewidth=1)
    top = max(u["rounds"])
    ax.set_yticks([B * k for k in range(top + 1)],
                  ["0"] + [f"{B * k} = {k} round{'s' * (k > 1)}" for k in range(1, top + 1)])
    ax.set_ylim(0, B * top + 14)
    ax.set_xlim(0.3, len(u["step"]) + 0.7)
    ax.set_xlabel("policy update")
    ax.set_ylabel("groups of 8 answers")
    ax.set_title(f"DAPO's dynamic sampling, as logged: dapo preset, seed 0 (results/readme.json)"
                 f"\nkeep sampling rounds of {B} prompts until {B} informative groups, at most "
                 f"{args['max_sampling_rounds']} rounds", fontsize=13)
    ax.legend(loc="upper left", ncol=3, fontsize=11)
    half = len(seen) // 2
    return (f"rounds per update {sum(u['rounds']) / len(seen):.2f} (updates 1-{half} "
            f"{sum(u['rounds'][:half]) / half:.2f}, {half + 1}-{len(seen)} "
            f"{sum(u['rounds'][half:]) / (len(seen) - half):.2f}); updates with {B} groups "
            f"{sum(g == B for g in u['groups'])} of {len(seen)}; informative fraction of the "
            f"groups sampled, updates 1-10 {sum(informative[:10]) / sum(seen[:10]):.2f}, last 10 "
            f"{sum(informative[-10:]) / sum(seen[-10:]):.2f}")


def kl_k3_curve(ax) -> str:
    """e. GRPO's k3 KL estimate of one token against log r, beside the plain log-ratio."""
    log_r = torch.linspace(-2, 2, 201)
    k3 = tc.kl_k3(torch.zeros(1, len(log_r)), log_r[None])[0]  # logp 0, ref_logp log r
    ax.plot(log_r.tolist(), k3.tolist(), linewidth=2.5, label="k3 = r - log r - 1 (kl_k3)")
    ax.plot(log_r.tolist(), (-log_r).tolist(), linewidth=2, linestyle="--",
            label="-log r, the plain log-ratio")
    marks = tc.kl_k3(torch.zeros(1, 2), torch.tensor([[-0.5, 0.5]]))[0]
    ax.plot([-0.5, 0.5], marks.tolist(), "o", color="black", markersize=8)
    for x, v in zip((-0.5, 0.5), marks.tolist()):
        ax.annotate(f"{v:.4f}", (x, v), xytext=(0, 12), textcoords="offset points",
                    ha="center", fontsize=12)
    ax.axhline(0, color="black", linewidth=1)
    ax.axvline(0, color="black", linewidth=1)
    ax.set_xlabel("log r = log pi_ref(o_t) - log pi(o_t)")
    ax.set_ylabel("KL estimate of one sampled token")
    ax.set_title("GRPO's KL penalty per token, k3: never below 0, not symmetric in log r")
    ax.legend(loc="upper center")
    ax.grid(alpha=0.3)
    return f"k3 at log r = -0.5: {marks[0]:.4f}, at +0.5: {marks[1]:.4f}"


FIGURES = {"sample-token-weights.svg": sample_token_weights, "paired-effect.svg": paired_effect,
           "cscr-weights.svg": cscr_answer_weights, "dynamic-sampling.svg": dynamic_sampling,
           "kl-k3.svg": kl_k3_curve}


def cmd_lecture_figures(out_dir: str) -> None:
    """Each figure of FIGURES into out_dir, and the numbers it shows."""
    import matplotlib
    started = time.monotonic()
    plt = plots.pyplot()
    os.makedirs(out_dir, exist_ok=True)
    with matplotlib.rc_context(STYLE):
        for name, draw in FIGURES.items():
            fig, ax = plt.subplots(figsize=(10, 5.6))
            numbers = draw(ax)
            fig.tight_layout()
            fig.savefig(os.path.join(out_dir, name), format="svg",
                        metadata={"Date": None, "Creator": None})
            plt.close(fig)
            print(f"{os.path.join(out_dir, name)}: {numbers}")
    print(f"({time.monotonic() - started:.1f} s)")
