"""tokencredit_trl/grpo_config.py: tokencredit's choices beside GRPOConfig's, checked when made.

TokenCreditGRPOConfig is GRPOConfig plus tokencredit's choices, each a plain field that TrlParser
and a YAML file fill, as TRL writes a variant's config (e.g. trl.experimental.gmpo.GMPOConfig).
Credit holds the same choices in Python, beside a plain GRPOConfig; the one choice that is code,
token_weights_fn, is Credit's and the trainer's alone. resolve_credit fills the choices left None
from GRPOConfig's settings and checks every setting that needs no model: each choice (by
tokencredit.py's own checks), each agreement with TRL's settings, what tokencredit's loss has no
place for, the batch shapes its modes need. A bad setting is one ValueError naming its YAML key,
the value and what is allowed, when the config is made: before any model or dataset loads.
"""

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch
from trl import GRPOConfig

import tokencredit as tc


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
        resolve_credit(self.to_credit(), self, self.world_size)  # a bad setting fails now

    def to_credit(self, token_weights_fn: Optional[Callable] = None) -> "Credit":
        """tokencredit's choices as a Credit (still to be resolved against this GRPOConfig)."""
        return Credit(token_weights_fn=token_weights_fn, **{
            f.name: getattr(self, f.name) for f in dataclasses.fields(Credit)
            if f.name != "token_weights_fn"})


@dataclass(frozen=True)
class Credit:
    """tokencredit's choices in Python: TokenCreditGRPOConfig's fields (their help says what each
    means), and token_weights_fn, (inputs, logp, entropies, mask) -> (N, T) weights >= 0. None:
    as GRPOConfig says (resolve_credit). The clip range and beta are always GRPOConfig's epsilon,
    epsilon_high and beta."""
    loss_mode: Optional[str] = None
    surrogate: Optional[str] = None
    ratio_level: Optional[str] = None
    adv_scale: Optional[str] = None
    baseline: Optional[str] = None
    adv_eps: Optional[float] = None
    token_count: Optional[str] = None
    max_len: Optional[int] = None
    token_weights_fn: Optional[Callable] = None
    fix_positions: bool = True
    dynamic_sampling: bool = False
    max_rounds: int = 3
    filter_reward: Optional[str] = None
    cscr_strength: Optional[float] = None
    cscr_threshold: float = 0.0
    cond_pos: Optional[str] = None
    cond_neg: Optional[str] = None


# GRPOConfig -> Credit. Each loss_type tokencredit expresses, as the Credit fields it decides
# ("max_completion_length": GRPOConfig's); every other field is decided by one setting or none.
LOSS_TYPES = {
    "grpo": dict(loss_mode="sample", surrogate="clip"),
    "dapo": dict(loss_mode="token", token_count="global", surrogate="clip"),
    "bnpo": dict(loss_mode="token", token_count="local", surrogate="clip"),
    "dr_grpo": dict(loss_mode="constant", max_len="max_completion_length", surrogate="clip"),
    "luspo": dict(loss_mode="constant", max_len=1, surrogate="clip"),  # sum over tokens / rows
}
NOT_EXPRESSIBLE = {
    "cispo": "its surrogate is -A * log-prob weighted by the detached ratio capped at epsilon_high "
             "(5.0 recommended), not a PPO clip over [1 - epsilon, 1 + epsilon_high]; "
             "policy_loss has no such surrogate",
    "sapo": "a sigmoid gate of the ratio (sapo_temperature_pos/neg) replaces the clip; "
            "policy_loss has no such surrogate",
    "vespo": "its gamma weight of the summed log-ratio (vespo_k_*, vespo_lambda_*) is not in "
             "tokencredit",
}
SCALE_REWARDS = {"group": "std", "batch": "batch", "none": "none"}
RATIO_LEVELS = {"token": "token", "sequence": "sequence"}
TRL_EPS = 1e-4  # TRL divides by std + 1e-4 (no setting)
# GRPOConfig settings that would change a loss tokencredit computes instead: the value each must
# keep, and what it would add
NOT_SUPPORTED = dict(off_policy_mask_threshold=(None, "off-policy sequence masking"),
                     delta=(None, "two-sided clipping"), entropy_coef=(0.0, "entropy bonus"),
                     use_adaptive_entropy=(False, "an adaptive entropy bonus"),
                     multi_objective_aggregation=("sum_then_normalize",
                                                  "rewards normalised one by one"))
VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
# tokencredit.py's parameters by the keys that set them, for its error messages
KEYS = dict(mode="loss_mode", scale="adv_scale", eps="adv_eps", strength="cscr_strength",
            threshold="cscr_threshold", eps_low="epsilon", eps_high="epsilon_high")


def _trl_says(config) -> dict:
    """Each Credit field -> (the value GRPOConfig implies, the GRPOConfig setting deciding it)."""
    if config.loss_type not in LOSS_TYPES:
        reason = NOT_EXPRESSIBLE.get(config.loss_type, "not a loss type tokencredit expresses")
        raise ValueError(f"loss_type must be one of {sorted(LOSS_TYPES)}, got "
                         f"{config.loss_type!r}: {reason}")
    for setting, known in (("importance_sampling_level", RATIO_LEVELS),
                           ("scale_rewards", SCALE_REWARDS)):
        _require(setting, getattr(config, setting) in known, f"one of {sorted(known)}",
                 getattr(config, setting))
    says = dict(adv_eps=(TRL_EPS, None), baseline=("mean", None),
                max_len=(config.max_completion_length, None), token_count=("global", None),
                adv_scale=(SCALE_REWARDS[config.scale_rewards], "scale_rewards"),
                ratio_level=(RATIO_LEVELS[config.importance_sampling_level],
                             "importance_sampling_level"))
    for key, value in LOSS_TYPES[config.loss_type].items():
        value = config.max_completion_length if value == "max_completion_length" else value
        says[key] = (value, "loss_type")
    return says


def _is_default(config, setting: str) -> bool:
    """A GRPOConfig setting equal to its default in this TRL (equal to it counts as unchanged:
    GRPOConfig does not record which fields were passed)."""
    default = next(f for f in dataclasses.fields(GRPOConfig) if f.name == setting).default
    return getattr(config, setting) == default


def resolve_credit(credit: Optional[Credit], config, num_processes: int = 1) -> Credit:
    """The Credit that runs: each field None takes GRPOConfig's value; a field given must agree
    with the GRPOConfig setting that decides it unless that setting is TRL's default. Then every
    other check that needs no model (check_settings). Raises ValueError naming the key."""
    credit = credit or Credit()
    values = {}
    for key, (theirs, setting) in _trl_says(config).items():
        ours = getattr(credit, key)
        if ours is None:
            values[key] = theirs
        elif ours == theirs or setting is None or _is_default(config, setting):
            values[key] = ours
        else:
            raise ValueError(f"{key} must be {theirs!r}, as {setting} {getattr(config, setting)!r} "
                             f"says, or unset, got {ours!r} (or change {setting})")
    weights, q = credit.token_weights_fn, config.top_entropy_quantile
    if q < 1:
        _require("top_entropy_quantile", num_processes == 1, f"1.0 on {num_processes} processes "
                 "(TRL takes its quantile over every process's tokens, high_entropy_weights over "
                 "this process's micro-batch: for the per-process quantile, set it to 1.0 and pass "
                 f"token_weights_fn=high_entropy_weights({q}))", q)
        if weights is None:
            weights = high_entropy_weights(q)  # exact on one process: TRL's entropies and rule
        _require("token_weights_fn", getattr(weights, "top_fraction", None) == q,
                 f"unset or high_entropy_weights({q}), as top_entropy_quantile {q} says",
                 getattr(weights, "__name__", weights))
    resolved = dataclasses.replace(credit, token_weights_fn=weights, **values)
    check_settings(resolved, config)
    return resolved


def check_settings(c: Credit, config) -> None:
    """The resolved Credit c and the GRPOConfig settings it meets: tokencredit.py's checks of
    each choice on a one-group batch (in the config's keys), the bridge's own fields, what the
    loss has no place for, and the batch shapes the choices need."""
    G = config.num_generations
    with _in_config_keys():
        ones = torch.ones(G, 1)  # one group of one-token completions
        tc.group_advantages(torch.arange(G, dtype=torch.float32)[None], scale=c.adv_scale,
                            eps=c.adv_eps, baseline=c.baseline)
        tc.policy_loss(ones, ones, ones[:, 0], ones, mode=c.loss_mode, eps_low=config.epsilon,
                       eps_high=config.epsilon if config.epsilon_high is None
                       else config.epsilon_high, group_size=G, max_len=c.max_len,
                       ref_logp=ones, beta=config.beta, surrogate=c.surrogate,
                       ratio_level=c.ratio_level)
        if c.cscr_strength is not None:
            tc.cscr_weights(ones, ones, c.cscr_strength, c.cscr_threshold)
    _require("token_count", c.token_count in ("global", "local"), "'global' or 'local'",
             c.token_count)
    for key in ("fix_positions", "dynamic_sampling"):
        _require(key, isinstance(getattr(c, key), bool), "true or false", getattr(c, key))
    _require("max_rounds", type(c.max_rounds) is int and c.max_rounds >= 1, "an int >= 1",
             c.max_rounds)
    _require("filter_reward", c.filter_reward is None or isinstance(c.filter_reward, str),
             "a reward function's name", c.filter_reward)
    if c.cscr_strength is not None:
        for key in ("cond_pos", "cond_neg"):
            _require(key, isinstance(getattr(c, key), str) and getattr(c, key) != "",
                     "a non-empty string with cscr_strength", getattr(c, key))
        _require("cond_neg", c.cond_neg != c.cond_pos, "other than cond_pos", c.cond_neg)
    for key, (keep, what) in NOT_SUPPORTED.items():
        _require(key, getattr(config, key) == keep, f"{keep!r}: tokencredit's loss has no {what}",
                 getattr(config, key))
    if config.beta > 0:
        _require("use_bias_correction_kl", not config.use_bias_correction_kl, "false with beta > "
                 "0 (tokencredit's k3 KL has no importance ratio)", config.use_bias_correction_kl)
    if config.use_vllm and config.vllm_importance_sampling_correction:
        _require("vllm_importance_sampling_mode", config.vllm_importance_sampling_mode in
                 VLLM_IS_MODES, f"one of {list(VLLM_IS_MODES)}",
                 config.vllm_importance_sampling_mode)
    if c.loss_mode == "group_token":
        _require("per_device_train_batch_size", config.per_device_train_batch_size % G == 0,
                 f"a multiple of num_generations ({G}) with loss_mode 'group_token' (whole groups "
                 "in every micro-batch)", config.per_device_train_batch_size)
        if config.eval_strategy != "no":
            check_eval_batch(c, config)
    if c.dynamic_sampling:
        local = config.per_device_train_batch_size * config.steps_per_generation
        _require("per_device_train_batch_size", local % G == 0, f"such that it times "
                 f"steps_per_generation ({config.steps_per_generation}) is a multiple of "
                 f"num_generations ({G}) with dynamic_sampling (whole groups on every process)",
                 config.per_device_train_batch_size)


def check_eval_batch(c: Credit, config) -> None:
    """group_token's whole groups in every evaluation batch too."""
    G_eval = config.num_generations_eval or config.num_generations
    if c.loss_mode == "group_token":
        _require("per_device_eval_batch_size", config.per_device_eval_batch_size % G_eval == 0,
                 f"a multiple of num_generations_eval ({G_eval}) with loss_mode 'group_token'",
                 config.per_device_eval_batch_size)


def filter_column(c: Credit, names: List[str]) -> int:
    """Dynamic sampling's verdicts: the column of the reward function filter_reward names."""
    _require("filter_reward", c.filter_reward in names if c.filter_reward else len(names) == 1,
             f"the name of the verdict to filter on, one of the reward functions {names}",
             c.filter_reward)
    return names.index(c.filter_reward or names[0])


def high_entropy_weights(top_fraction: float = 0.2) -> Callable:
    """token_weights_fn keeping the policy gradient on the micro-batch's top_fraction
    highest-entropy tokens (tc.high_entropy_mask of the entropies TRL's scoring returns)."""
    tc.high_entropy_mask(torch.ones(1, 1), torch.ones(1, 1), top_fraction)  # fail now, not mid-run

    def weights(inputs, per_token_logps, entropies, mask):
        return tc.high_entropy_mask(entropies, mask, top_fraction)  # (N, T) 0/1
    weights.top_fraction = top_fraction  # resolve_credit compares it with top_entropy_quantile
    weights.__name__ = f"high_entropy_weights({top_fraction})"
    return weights


def _require(key: str, ok: bool, expected: str, got) -> None:
    if not ok:
        raise ValueError(f"{key} must be {expected}, got {got!r}")


@contextlib.contextmanager
def _in_config_keys():
    """tokencredit.py's ValueErrors ("strength must be ...") naming the keys that set them."""
    try:
        yield
    except ValueError as error:
        name, must, rest = str(error).partition(" must ")
        raise ValueError(f"{KEYS.get(name, name)}{must}{rest}") from None
