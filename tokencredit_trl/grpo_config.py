"""tokencredit_trl/grpo_config.py: GRPOConfig plus tokencredit's choices, each a plain field.

As TRL writes a variant's config (e.g. trl.experimental.gmpo.GMPOConfig): a GRPOConfig subclass
whose fields TrlParser and a YAML file fill. Each field is a field of grpo_trainer.Credit (only
`mode` is called `loss_mode` here, beside GRPOConfig's loss_type); None means "as GRPOConfig
says" (grpo_trainer.resolve_credit). The one choice that is code, token_weights_fn, is an
argument of TokenCreditGRPOTrainer.
"""

from dataclasses import dataclass, field
from typing import Callable, Optional

from trl import GRPOConfig

from tokencredit_trl.grpo_trainer import Credit


@dataclass
class TokenCreditGRPOConfig(GRPOConfig):
    """GRPOConfig for TokenCreditGRPOTrainer: every GRPOConfig field, then tokencredit's."""

    loss_mode: Optional[str] = field(default=None, metadata={
        "help": "token weights: sample, token, group_token (DAPO's printed per-group token "
                "mean) or constant; None: from loss_type"})
    surrogate: Optional[str] = field(default=None, metadata={
        "help": "per-token loss: clip (PPO-clip) or reinforce (-A log pi); None: clip"})
    ratio_level: Optional[str] = field(default=None, metadata={
        "help": "importance ratio: token, sequence (GSPO) or sequence_token; None: from "
                "importance_sampling_level"})
    adv_scale: Optional[str] = field(default=None, metadata={
        "help": "group advantage divided by the group's std, the batch's std, or none; None: from "
                "scale_rewards"})
    baseline: Optional[str] = field(default=None, metadata={
        "help": "group advantage: minus the group's mean or leave_one_out (RLOO); None: mean"})
    adv_eps: Optional[float] = field(default=None, metadata={
        "help": "added to the std that divides the advantages; None: 1e-4 (TRL's)"})
    token_count: Optional[str] = field(default=None, metadata={
        "help": "loss_mode token under gradient accumulation: global (TRL's dapo) or local "
                "(bnpo); None: from loss_type"})
    max_len: Optional[int] = field(default=None, metadata={
        "help": "loss_mode constant: the constant denominator; None: max_completion_length "
                "(dr_grpo), 1 (luspo)"})
    fix_positions: bool = field(default=True, metadata={
        "help": "position ids from the attention mask when TRL scores a left-padded batch"})
    dynamic_sampling: bool = field(default=False, metadata={
        "help": "DAPO's dynamic sampling: generate rounds until the batch holds informative "
                "groups (verdicts not all equal)"})
    max_rounds: int = field(default=3, metadata={
        "help": "dynamic sampling: generation rounds per generation batch at most"})
    filter_reward: Optional[str] = field(default=None, metadata={
        "help": "dynamic sampling: the reward function whose verdicts are filtered on; None: the "
                "only one"})
    cscr_strength: Optional[float] = field(default=None, metadata={
        "help": "CSCR's alpha; None: off (0 computes weights of exactly 1)"})
    cscr_threshold: float = field(default=0.0, metadata={"help": "CSCR's tau"})
    cond_pos: Optional[str] = field(default=None, metadata={
        "help": "CSCR: the text asserting 'correct', before the prompt (chat: before the last "
                "user message)"})
    cond_neg: Optional[str] = field(default=None, metadata={
        "help": "CSCR: the text asserting 'incorrect'"})

    def __post_init__(self):
        super().__post_init__()
        self.to_credit()  # a bad choice fails here, when the YAML file is read

    def to_credit(self, token_weights_fn: Optional[Callable] = None) -> Credit:
        """tokencredit's choices as a Credit (still to be resolved against this GRPOConfig)."""
        return Credit(mode=self.loss_mode, surrogate=self.surrogate, ratio_level=self.ratio_level,
                      adv_scale=self.adv_scale, baseline=self.baseline, adv_eps=self.adv_eps,
                      token_count=self.token_count, max_len=self.max_len,
                      token_weights_fn=token_weights_fn, fix_positions=self.fix_positions,
                      dynamic_sampling=self.dynamic_sampling, max_rounds=self.max_rounds,
                      filter_reward=self.filter_reward, cscr_strength=self.cscr_strength,
                      cscr_threshold=self.cscr_threshold, cond_pos=self.cond_pos,
                      cond_neg=self.cond_neg)
