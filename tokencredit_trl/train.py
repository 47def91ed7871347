"""tokencredit_trl/train.py: TRL's GRPO script with TokenCreditGRPOTrainer, for any causal LM and
dataset.

    python -m tokencredit_trl.train --config my_run.yaml
    python -m tokencredit_trl.train --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \
        --dataset_name data.jsonl --reward_funcs final_answer --loss_type grpo --output_dir out
    accelerate launch -m tokencredit_trl.train --config my_run.yaml

Its arguments are those of TRL's GRPO script (trl/scripts/grpo.py, TRL 1.16): ScriptArguments
(dataset_name: a hub name, a local folder, or here also a local data file; dataset_config, the
splits), reward_funcs, GRPOConfig's fields, ModelConfig's and DatasetMixtureConfig's, through
TrlParser; TokenCreditGRPOConfig adds tokencredit's. A YAML file (--config) sets any of them and a
flag overrides it. Every setting is checked before any model or dataset loads, and a bad one is
one line naming its key (an unknown YAML key too, which TRL's script ignores). TRL's own logging
is kept; dynamic sampling's ds/* and CSCR's cscr/* metrics are logged beside TRL's. The tiny
task's model, data and YAML files: python -m tokencredit_trl.tiny.
"""

import importlib
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import List, Optional

from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, TrlParser

from tokencredit_trl.grpo_config import TokenCreditGRPOConfig, filter_column

REWARDS = ("final_answer", "tiny_verifier", "get_soft_overlong_punishment", "accuracy_reward",
           "reasoning_accuracy_reward", "think_format_reward")
# what TRL passes every reward function besides the dataset's columns
TRL_REWARD_KWARGS = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra",
                     "log_metric", "environments"}


@dataclass
class TokenCreditScriptArguments(ScriptArguments):
    """TRL's ScriptArguments, and the reward functions as TRL's GRPO script names them."""
    reward_funcs: Optional[List[str]] = field(default=None, metadata={
        "help": "reward functions: final_answer (the completion's final number against the "
                "`answer` column), tiny_verifier (the tiny task's exact check, `terms` column), "
                "get_soft_overlong_punishment (DAPO's, over the last soft_punish_cache of "
                "max_completion_length tokens), TRL's accuracy_reward, reasoning_accuracy_reward, "
                "think_format_reward, or a dotted import path (my_lib.rewards.my_reward)"})
    soft_punish_cache: int = field(default=256, metadata={
        "help": "get_soft_overlong_punishment's L_cache (TRL's script fixes 256 of 1280 tokens; "
                "here L_max is max_completion_length)"})


def parse_args(argv=None):
    """(script arguments, TokenCreditGRPOConfig, ModelConfig, DatasetMixtureConfig), each setting
    checked as it is made (TokenCreditGRPOConfig.__post_init__)."""
    parser = TrlParser((TokenCreditScriptArguments, TokenCreditGRPOConfig, ModelConfig,
                        DatasetMixtureConfig), prog="python -m tokencredit_trl.train",
                       description="TRL's GRPO script with TokenCreditGRPOTrainer: any causal "
                       "LM, any dataset (docs/trl.md). --config FILE.yaml sets any of the "
                       "arguments below, and a flag given overrides it. The tiny task's model, "
                       "data and YAML files: python -m tokencredit_trl.tiny")
    script, config, model_args, mixture = parser.parse_args_and_config(argv)
    if model_args.model_name_or_path is None:
        raise ValueError("model_name_or_path must name a model (a hub name or a local folder), "
                         "got None")
    if not script.reward_funcs:
        raise ValueError(f"reward_funcs must name at least one of {list(REWARDS)} or a dotted "
                         f"import path, got {script.reward_funcs!r}")
    if config.dynamic_sampling and (script.dataset_streaming or mixture.streaming):
        raise ValueError("dataset_streaming must be false with dynamic_sampling, which draws its "
                         "extra prompts by index, got true")
    return script, config, model_args, mixture


def reward_functions(script, config) -> list:
    """Each of reward_funcs: a name in REWARDS, made for this run, or a dotted import path (the
    module is looked for in the working folder too, as TRL's script does)."""
    from trl import rewards
    from tokencredit_trl import rewards as ours
    funcs = []
    for name in script.reward_funcs:
        if name == "get_soft_overlong_punishment":
            if not 0 < script.soft_punish_cache <= config.max_completion_length:
                raise ValueError(f"soft_punish_cache must be an int in (0, max_completion_length "
                                 f"= {config.max_completion_length}], got "
                                 f"{script.soft_punish_cache!r}")
            funcs.append(rewards.get_soft_overlong_punishment(config.max_completion_length,
                                                              script.soft_punish_cache))
        elif name in REWARDS:
            funcs.append(getattr(ours, name, None) or getattr(rewards, name))
        elif "." in name:
            module, attribute = name.rsplit(".", 1)
            sys.path.insert(0, os.getcwd())
            try:
                funcs.append(getattr(importlib.import_module(module), attribute))
            except (ImportError, AttributeError) as error:
                raise ValueError(f"reward_funcs: {name!r} cannot be imported: {error}") from None
        else:
            raise ValueError(f"reward_funcs must be each one of {list(REWARDS)} or a dotted "
                             f"import path, got {name!r}")
    return funcs


def columns_needed(func) -> List[str]:
    """The dataset columns a reward function takes by name, without a default."""
    return [p.name for p in inspect.signature(func).parameters.values()
            if p.default is p.empty and p.name not in TRL_REWARD_KWARGS
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def load_splits(script, config, mixture, funcs):
    """(train, eval or None) as TRL's script loads them, a local data file too; each split checked
    for the columns TRL and the reward functions read."""
    from datasets import load_dataset
    from trl import get_dataset
    from trl.trainer.utils import get_callable_name  # TRL's name of a reward function
    name = script.dataset_name
    try:
        if mixture.datasets:
            dataset = get_dataset(mixture)
        elif name is None:
            raise ValueError("dataset_name must name a dataset (a hub name, a local folder or a "
                             "data file) or `datasets` a mixture, got None")
        elif os.path.isfile(name):  # its folder, with this one file: the split "train"
            folder, file = os.path.split(name)
            dataset = load_dataset(folder or ".", data_files=file,
                                   streaming=script.dataset_streaming)
        else:
            dataset = load_dataset(name, name=script.dataset_config,
                                   streaming=script.dataset_streaming)
    except OSError as error:  # not found locally nor on the hub, or no network
        raise ValueError(f"dataset_name {name!r} could not be loaded: {error}") from None
    wanted = {"dataset_train_split": script.dataset_train_split}
    if config.eval_strategy != "no":
        wanted["dataset_test_split"] = script.dataset_test_split
    splits = []
    for key, split in wanted.items():
        if split not in dataset:
            raise ValueError(f"{key} must be one of the dataset's splits {list(dataset)}, got "
                             f"{split!r}")
        columns = dataset[split].column_names
        readers = [("GRPOTrainer", ["prompt"])] + [(get_callable_name(f), columns_needed(f))
                                                   for f in funcs]
        for reader, needs in readers:
            missing = [c for c in needs if columns is not None and c not in columns]
            if missing:
                raise ValueError(f"{key} {split!r} must have the columns {reader} reads, "
                                 f"{missing}; it has {columns}")
        splits.append(dataset[split])
    return splits[0], (splits[1] if len(splits) > 1 else None)


def main(argv=None) -> None:
    try:  # a bad setting: one line, before any model or dataset loads
        script, config, model_args, mixture = parse_args(argv)
        funcs = reward_functions(script, config)
        if config.dynamic_sampling:
            from trl.trainer.utils import get_callable_name  # TRL's name of a reward function
            filter_column(config.to_credit(), [get_callable_name(f) for f in funcs])
        train_dataset, eval_dataset = load_splits(script, config, mixture, funcs)
    except ValueError as error:
        sys.exit(f"python -m tokencredit_trl.train: error: {error}")
    from trl import get_peft_config, get_quantization_config
    from tokencredit_trl.grpo_trainer import TokenCreditGRPOTrainer
    config.model_init_kwargs = {  # as TRL's script: ModelConfig's, then GRPOConfig's own
        "revision": model_args.model_revision, "trust_remote_code": config.trust_remote_code,
        "attn_implementation": model_args.attn_implementation, "dtype": model_args.dtype,
        **(config.model_init_kwargs or {})}
    trainer = TokenCreditGRPOTrainer(
        model=model_args.model_name_or_path, reward_funcs=funcs, args=config,
        train_dataset=train_dataset, eval_dataset=eval_dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args))
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    trainer.save_model(config.output_dir)
    trainer.accelerator.print(f"Model saved to {config.output_dir}.")
    if config.push_to_hub:
        trainer.push_to_hub(dataset_name=script.dataset_name)
    if hasattr(trainer, "end"):  # transformers >= 5.18: trackers finished, process group gone
        trainer.end()


if __name__ == "__main__":
    main()
