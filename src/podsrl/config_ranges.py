"""The numeric fields of :class:`podsrl.config.Config`: the range of each, in one table, checked
by one function (:func:`check_numbers`) before any work.

Every number must be of its field's type (a bool is not a number) and finite: no float field
accepts NaN or infinity, since each "no limit" is spelled 0 (max_minutes,
generation_memory_mb, checkpoint_minutes, max_grad_norm). Each error is one line that names
the field: ``learning_rate: must be a finite number, got nan``.

``cfg`` is a :class:`podsrl.config.Config` (not imported: ``podsrl.config`` imports this
module through ``podsrl.config_checks``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

__all__ = ["RANGES", "UNCHECKED", "Range", "check_numbers", "check_reward_weights"]


class Range(NamedTuple):
    """An interval of allowed values; ``low_closed`` / ``high_closed`` say whether the bound
    itself is allowed. ``why`` is added to the error."""
    low: float = -math.inf
    high: float = math.inf
    low_closed: bool = True
    high_closed: bool = True
    why: str = ""

    def admits(self, value) -> bool:
        above = value >= self.low if self.low_closed else value > self.low
        below = value <= self.high if self.high_closed else value < self.high
        return above and below

    def describe(self) -> str:
        """'positive', '>= 0', 'in [0, 1)', ..."""
        if self.high == math.inf:
            if (self.low, self.low_closed) == (0, False):
                return "positive"
            return f"{'>=' if self.low_closed else '>'} {self.low}"
        return f"in {'[' if self.low_closed else '('}{self.low}, {self.high}{']' if self.high_closed else ')'}"


POSITIVE = Range(0, low_closed=False)
NON_NEGATIVE = Range(0)
FRACTION = Range(0, 1, high_closed=False)  # [0, 1)
SEED = Range(0, 2**32 - 1, why="numpy's seed range, which torch accepts too")

RANGES: dict[str, Range] = {
    # what to train
    "data_seed": SEED,
    "reasoning_gym_size": POSITIVE,
    "max_prompt_tokens": POSITIVE,
    # method: a group of one has no advantage; num_kept / num_generations of 1 are refused per
    # method (podsrl.config_checks), since each method ignores one of them
    "num_generations": POSITIVE,
    "num_generations_max": POSITIVE,
    "num_kept": POSITIVE,
    "prompts_per_step": POSITIVE,
    "dynamic_sampling_rounds": Range(1, 100, why="0 extra rounds would be no dynamic sampling"),
    "pass_rate_half_life": POSITIVE,
    "pass_rate_prior_strength": POSITIVE,
    "pass_rate_exploration": Range(0, 1, low_closed=False, why="0 could starve a prompt forever"),
    "max_train_prompts": Range(0, why="0 = all"),
    # optimisation
    "learning_rate": POSITIVE,
    "warmup_steps": NON_NEGATIVE,
    "adam_beta1": FRACTION,
    "adam_beta2": FRACTION,
    "weight_decay": NON_NEGATIVE,
    "max_grad_norm": Range(0, why="0 = no clipping"),
    "micro_batch_size": POSITIVE,
    "num_iterations": POSITIVE,
    "epsilon": FRACTION,  # the lower clip bound 1 - epsilon stays positive
    "epsilon_high": NON_NEGATIVE,
    "beta": NON_NEGATIVE,
    # reward
    "correct_weight": NON_NEGATIVE,
    "format_weight": NON_NEGATIVE,
    "reward_timeout": Range(0, why="0 = the default (300 s)"),
    # generation
    "temperature": Range(0, low_closed=False, why="training rollouts are sampled"),
    "top_p": Range(0, 1, low_closed=False),
    "max_completion_length": POSITIVE,
    "generation_batch_size": NON_NEGATIVE,
    "generation_micro_group": NON_NEGATIVE,
    "generation_probe_tokens": Range(2, why="the length_aware probe decodes at least 2 tokens"),
    "generation_memory_mb": Range(0, why="0 = no cap"),
    # vLLM engine
    "vllm_gpu_memory_utilization": Range(0, 1, low_closed=False),
    "vllm_kv_cache_memory_mb": Range(0, why="0 = chosen for the device"),
    "vllm_max_model_length": Range(0, why="0 = prompt and completion limits"),
    "vllm_importance_sampling_clip_max": POSITIVE,
    "vllm_importance_sampling_clip_min": NON_NEGATIVE,
    # LoRA
    "lora_rank": NON_NEGATIVE,
    "lora_alpha": POSITIVE,
    "lora_dropout": FRACTION,
    # length and evaluation
    "max_steps": POSITIVE,
    "max_minutes": Range(0, why="0 = no limit"),
    "eval_steps": NON_NEGATIVE,
    "eval_prompts": POSITIVE,
    "eval_samples": POSITIVE,
    "eval_temperature": Range(0, why="0 = greedy"),
    "eval_batch_size": POSITIVE,
    # run bookkeeping
    "seed": SEED,
    "save_steps": NON_NEGATIVE,
    "checkpoint_minutes": Range(0, why="0 = off"),
    "save_total_limit": POSITIVE,
    "max_consecutive_skips": POSITIVE,
    "log_rollouts": NON_NEGATIVE,
}
# numeric fields without a range here, and why (tests/test_config_numbers.py: every numeric
# field is in one of the two tables)
UNCHECKED: dict[str, str] = {
    "task_level": "checked against the arithmetic and chain tasks' levels (podsrl.config_checks); other tasks "
                  "ignore it",
}


def check_numbers(cfg) -> None:
    """Every int and float field: of its type, finite, and within its range (``RANGES``).
    ``reward_weights`` is text: ``Config.reward_weight_values`` parses it once, with
    :func:`check_reward_weights`."""
    for f in dataclasses.fields(cfg):
        kind = type(f.default)
        if kind not in (int, float):
            continue
        value = getattr(cfg, f.name)
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise ValueError(f"{f.name}: expected {kind.__name__}, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{f.name}: must be a finite number, got {value}")
        limits = RANGES.get(f.name)
        if limits is not None and not limits.admits(value):
            why = f" ({limits.why})" if limits.why else ""
            raise ValueError(f"{f.name}: must be {limits.describe()}{why}, got {value}")


def check_reward_weights(items: list[str], text: str) -> list[float]:
    """The items of ``reward_weights`` (``text``, split by ``podsrl.config.split_list``) as
    numbers, each finite (negative ones penalise)."""
    weights = []
    for item in items:
        try:
            weight = float(item)
        except ValueError:
            raise ValueError(f"reward_weights: expected comma-separated numbers, got {text!r}") from None
        if not math.isfinite(weight):
            raise ValueError(f"reward_weights: must be finite numbers, got {item} in {text!r}")
        weights.append(weight)
    return weights
