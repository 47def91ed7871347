"""tokencredit_trl/tiny.py: the tiny task's model and data, for the training script.

    python -m tokencredit_trl.tiny                           # writes ./tiny/
    python -m tokencredit_trl.train --config tiny/dapo.yaml  # train_tiny's dapo preset, or cscr

Writes, in ./tiny: model/, tiny_task's starting policy (its 0.6 M-parameter GPT-2 after the
supervised warm-up: made in code on first use, a few minutes on a CPU, then cached beside it);
train.jsonl and test.jsonl, problems with their columns prompt, terms (for tiny_verifier) and
answer (for final_answer); and the YAML files of examples/. Nothing is downloaded. tiny_task.py
(installed beside tokencredit) holds the task; its flags here change it, but the YAML files are
written for its defaults.
"""

import json
import os
import shutil
import sys
from dataclasses import dataclass, field

FOLDER = "tiny"  # the YAML files name tiny/model and tiny/*.jsonl
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "examples")


@dataclass
class TinyArguments:
    num_problems: int = field(default=2048, metadata={
        "help": "training problems (train.jsonl): the task's stream with seed 0, train_tiny's"})
    eval_size: int = field(default=200, metadata={
        "help": "held-out problems (test.jsonl): the stream with seed 1"})
    device: str = field(default="auto", metadata={
        "help": "where the warm-up runs: auto (CUDA if present, else the CPU), cpu or cuda"})


def write_problems(path: str, problems: list) -> None:
    import tiny_task
    with open(path, "w") as f:
        for terms, prompt in zip(problems, tiny_task.prompt_texts(problems)):
            f.write(json.dumps(dict(prompt=prompt, terms=terms, answer=sum(terms))) + "\n")


def main(argv=None) -> None:
    import tiny_task
    import torch
    from transformers import HfArgumentParser
    parser = HfArgumentParser((TinyArguments, tiny_task.Task),
                              prog="python -m tokencredit_trl.tiny",
                              description=__doc__.split("\n\n")[2])
    args, task = parser.parse_args_into_dataclasses(argv)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = auto if args.device == "auto" else args.device
    try:
        tiny_task.check_task(task)
        for key in ("num_problems", "eval_size"):
            if getattr(args, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(args, key)}")
        if device not in ("cpu", auto):
            raise ValueError(f"device must be auto, cpu or cuda (where torch finds CUDA), got "
                             f"{args.device!r}")
    except ValueError as error:
        sys.exit(f"python -m tokencredit_trl.tiny: error: {error}")
    print(f"device: {device} (asked for {args.device})")
    os.makedirs(FOLDER, exist_ok=True)
    model, tokenizer, _ = tiny_task.load_or_warm_up(task, device, FOLDER)
    model.save_pretrained(os.path.join(FOLDER, "model"))
    tokenizer.save_pretrained(os.path.join(FOLDER, "model"))
    write_problems(os.path.join(FOLDER, "train.jsonl"),
                   tiny_task.ProblemStream(task, 0).next(args.num_problems))
    write_problems(os.path.join(FOLDER, "test.jsonl"),
                   tiny_task.ProblemStream(task, 1).next(args.eval_size))
    for name in sorted(os.listdir(EXAMPLES)):
        shutil.copy(os.path.join(EXAMPLES, name), FOLDER)
    print(f"wrote {FOLDER}/model, {FOLDER}/train.jsonl, {FOLDER}/test.jsonl and "
          + ", ".join(f"{FOLDER}/{name}" for name in sorted(os.listdir(EXAMPLES)))
          + f"; train with\n  python -m tokencredit_trl.train --config {FOLDER}/dapo.yaml")


if __name__ == "__main__":
    main()
