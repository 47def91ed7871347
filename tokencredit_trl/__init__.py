"""tokencredit's loss, dynamic sampling and CSCR inside TRL's GRPOTrainer (docs/trl.md).

    grpo_config.py   TokenCreditGRPOConfig: GRPOConfig plus tokencredit's choices, plain fields
    grpo_trainer.py  TokenCreditGRPOTrainer, Credit, high_entropy_weights, mask_positions
    train.py         python -m tokencredit_trl.train --config FILE.yaml (TrlParser)
    tiny.py          python -m tokencredit_trl: train_tiny's flags and presets through TRL
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
                          f"TRL {version} is installed: pip install -r "
                          f"tokencredit_trl/requirements.txt")


try:
    check_trl_version(metadata.version("trl"))
except metadata.PackageNotFoundError as error:
    raise ImportError("tokencredit_trl needs TRL: pip install -r tokencredit_trl/requirements.txt "
                      "(or the project's [trl] extra)") from error

from tokencredit_trl.grpo_config import TokenCreditGRPOConfig  # noqa: E402
from tokencredit_trl.grpo_trainer import (Credit, TokenCreditGRPOTrainer,  # noqa: E402
                                          high_entropy_weights, mask_positions)

__all__ = ["Credit", "TokenCreditGRPOConfig", "TokenCreditGRPOTrainer", "high_entropy_weights",
           "mask_positions", "check_trl_version"]
