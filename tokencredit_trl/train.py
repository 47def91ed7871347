"""tokencredit_trl/train.py: train from a YAML file, as TRL's own scripts do (TrlParser).

    python -m tokencredit_trl.train --config tokencredit_trl/examples/dapo.yaml
    python -m tokencredit_trl.train --config tokencredit_trl/examples/cscr.yaml --max_steps 8
    accelerate launch --num_processes 2 --cpu -m tokencredit_trl.train --config FILE.yaml

The file holds TokenCreditGRPOConfig's fields (every GRPOConfig field, then tokencredit's) and
TaskArguments' below; a flag given on the command line overrides the file. The task is
train_tiny's (its warm-up checkpoint, prompts, verifier and held-out evaluation, built in code:
nothing is downloaded); one rollout batch is num_iterations x steps_per_generation optimizer steps.
"""

import dataclasses
from dataclasses import dataclass, field

from trl import TrlParser

from tokencredit_trl.grpo_config import TokenCreditGRPOConfig
from tokencredit_trl.tiny import steps_per_rollout, tiny_data, train_on_tiny_task


@dataclass
class TaskArguments:
    """train_tiny's task: what GRPOConfig has no field for."""
    num_problems: int = field(default=2048, metadata={
        "help": "training prompts: train_tiny's problem stream (seed: GRPOConfig's), in order"})
    reward_correct: float = field(default=1.0, metadata={"help": "reward of a verified answer"})
    reward_wrong: float = field(default=0.0, metadata={
        "help": "reward of a wrong, malformed or truncated answer (DAPO: -1)"})
    overlong_shaping: bool = field(default=False, metadata={
        "help": "DAPO's soft overlong penalty, a second reward function ('overlong')"})
    overlong_cache: int = field(default=6, metadata={
        "help": "L_cache: the soft zone is (max_completion_length - L_cache, "
                "max_completion_length]"})
    eval_size: int = field(default=200, metadata={
        "help": "held-out problems scored before and after (greedy and sampled)"})
    log_every: int = field(default=5, metadata={"help": "rollout batches between progress lines"})


def parse_args(argv=None):
    """Returns (TaskArguments, TokenCreditGRPOConfig, train_tiny's Args for the task)."""
    import train_tiny as tt
    parser = TrlParser((TaskArguments, TokenCreditGRPOConfig),
                       prog="python -m tokencredit_trl.train")
    task, config = parser.parse_args_and_config(argv)
    # train_tiny's Args for the task and its evaluation, in GRPOConfig's words where both have one
    shared = {k: v for k, v in dataclasses.asdict(task).items() if k != "num_problems"}
    args = dataclasses.replace(tt.Args(), max_new_tokens=config.max_completion_length,
                               temperature=config.temperature, group_size=config.num_generations,
                               **shared)
    return task, config, args


def main(argv=None) -> dict:
    import tiny_task
    task, config, args = parse_args(argv)
    dataset, reward_funcs = tiny_data(args, config.seed, task.num_problems,
                                      tiny_task.build_tokenizer().eos_token_id)
    updates = max(1, config.max_steps // steps_per_rollout(config))
    return train_on_tiny_task(args, config, dataset, reward_funcs, updates)


if __name__ == "__main__":
    main()
