"""tokencredit's loss, dynamic sampling and CSCR inside TRL's GRPOTrainer (docs/trl.md).

    grpo_config.py   TokenCreditGRPOConfig: GRPOConfig plus tokencredit's choices, plain fields,
                     each setting checked when it is made; Credit, the same choices in Python
    grpo_trainer.py  TokenCreditGRPOTrainer, mask_positions
    train.py         python -m tokencredit_trl.train: TRL's GRPO script with this trainer, for any
                     model and dataset (TrlParser, a YAML file)
    rewards.py       the script's reward functions: exact verifiers of final answers
    tiny.py          python -m tokencredit_trl.tiny: the tiny task's model and data for train.py;
                     examples/ holds its YAML files
"""

from importlib import metadata

TESTED_TRL = ("1.16.0", "1.17")  # TRL >= 1.16.0, < 1.17: tested on 1.16.0


def check_trl_version(version: str) -> None:
    """ImportError unless TESTED_TRL[0] <= version < TESTED_TRL[1]."""
    from packaging.version import Version
    low, high = TESTED_TRL
    if not Version(low) <= Version(version) < Version(high):
        raise ImportError(f"tokencredit_trl was tested on TRL >= {low}, < {high} (it overrides "
                          f"private methods of GRPOTrainer, which change between releases); "
                          f"TRL {version} is installed: pip install 'tokencredit[trl]'")


try:
    check_trl_version(metadata.version("trl"))
except metadata.PackageNotFoundError as error:
    raise ImportError("tokencredit_trl needs TRL: pip install 'tokencredit[trl]' (from a clone: "
                      "pip install '.[trl]')") from error

from tokencredit_trl.grpo_config import (Credit, TokenCreditGRPOConfig,  # noqa: E402
                                         high_entropy_weights)

TRAINER = ("TokenCreditGRPOTrainer", "mask_positions")
__all__ = ["Credit", "TokenCreditGRPOConfig", "high_entropy_weights", "check_trl_version",
           *TRAINER]


def __getattr__(name: str):
    """The trainer on first use: importing TRL's GRPOTrainer takes seconds, which the training
    script's check of its settings should not wait for."""
    if name in TRAINER:
        from tokencredit_trl import grpo_trainer
        return getattr(grpo_trainer, name)
    raise AttributeError(f"module 'tokencredit_trl' has no attribute {name!r}")
