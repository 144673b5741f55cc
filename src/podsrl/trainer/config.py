"""The run configuration: one frozen dataclass, the single source of truth.

Defaults are the main job (``podsrl train`` with no arguments): the built-in tiny model on
the arithmetic task with PODS. Values come from the defaults, then a YAML file, then
``--field value`` overrides; ``validate`` rejects bad values before any work, naming the
field.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from podsrl.algorithms.select import RULES
from podsrl.config_checks import parse_component, require, validate
from podsrl.config_layouts import current_layout
from podsrl.config_yaml import as_text, check_reward_weights, read_yaml, split_list
from podsrl.generation.partial_rollouts import PartialRolloutOptions
from podsrl.generation.pruning import PruningOptions
from podsrl.methods import METHODS
from podsrl.options import FRACTION, NON_NEGATIVE, POSITIVE, SEED, Range, bind, flat_names, flat_option, option
from podsrl.prompt_selection import PromptSelectionOptions
from podsrl.registry import Spec
from podsrl.rollout import (
    ENGINES,
    EngineOptions,
    HFOptions,
    MemoryCapOptions,
    SlotsOptions,
    VLLMOptions,
    engine_options,
)
from podsrl.scoring import ScoringOptions
from podsrl.tasks import DEFAULT_COMPLETION_BUDGET, TaskOptions, completion_budget
from podsrl.trainer.checkpoints import CheckpointOptions
from podsrl.trainer.cores import ThreadOptions
from podsrl.trainer.evaluate import EvalOptions
from podsrl.trainer.limits import StopOptions
from podsrl.trainer.logging import LogOptions
from podsrl.update import OptimizerOptions, UpdateOptions

__all__ = ["BOOKKEEPING_FIELDS", "Config", "FIELDS", "RESUME_AUTO", "load_yaml", "make_config",
           "parse_value", "split_list", "validate"]


_f = option  # the ~100 fields below: default, help, range

@dataclass(frozen=True)
class ConfigFields:
    """The fields of :class:`Config` that no stage or job declares in its own module (yet): the
    task (podsrl.tasks.TaskOptions), the scoring (podsrl.scoring.ScoringOptions) and the
    update step (podsrl.update.UpdateOptions) declare theirs beside the code that reads them."""

    # --- what to train -------------------------------------------------------------------
    model: str = _f("tiny", "Built-in model name ('tiny', 'tiny-chain', 'smollm2-135m-instruct'), a local folder, or a "
                           "Hugging Face hub id.")
    system_prompt: str = _f("auto", "System prompt; 'auto' = the task's own (the <think>/<answer> "
                                    "instruction for gsm8k/math), '' = none.")
    chat_template: bool = _f(True, "Render prompts with the tokenizer's chat template when it has one.")
    max_prompt_tokens: int = _f(512, "Prompts longer than this many tokens are dropped (and counted). Not "
                                     "TRL's old max_prompt_length, which truncated prompts (TRL 1.16 has none).",
                                     POSITIVE)
    # --- method --------------------------------------------------------------------------
    method: str = _f("pods", "'pods': generate n, train on m picked by `rule`; 'grpo': generate and "
                             "train m; 'grpo-ga': generate n, train on all n with gradient accumulation.")
    num_generations: int = _f(16, "n: rollouts generated per prompt (pods, grpo-ga, where it is >= 2; TRL's name). "
                                  "Ignored by grpo. With adaptive_n, the n of the first step.", POSITIVE)
    adaptive_n: bool = _f(False, "pods: choose n every step, between num_kept and num_generations_max, for the "
                                 "most non-constant groups per second, from the run's own timings and reward "
                                 "statistics (podsrl.algorithms.rollout_budget); its decisions are logged.")
    num_generations_max: int = _f(64, "adaptive_n: the largest n it may choose.", POSITIVE)
    num_kept: int = _f(4, "m: rollouts kept per prompt and trained on (pods, grpo; >= 2: advantages are "
                          "normalised over the group). Ignored by grpo-ga.", POSITIVE)
    downsampling_rule: Spec = _f("max_variance", "Which m of the n rollouts pods keeps "
                                                f"(podsrl.algorithms.select.RULES): {' | '.join(RULES)}.")
    prompts_per_step: int = _f(16, "Prompts per generation batch (P); one optimizer step per batch.",
                               POSITIVE)
    prompt_selector: Spec = _f("shuffled", "Which train prompts each step generates for (podsrl.prompt_selection."
                                          "PROMPT_SELECTORS): 'shuffled' = a shuffled pass over the train split; "
                                          "'pass_rate' = prompts drawn by the predicted chance that their group is "
                                          "not constant, from each prompt's pass-rate history. Evaluation uses the "
                                          "whole test set.")
    dynamic_sampling: bool = _f(False, "DAPO's dynamic sampling, with any prompt_selector: groups whose rewards are "
                                       "all equal are set aside and the selector asked for more prompts until the "
                                       "step has prompts_per_step informative groups.")
    dynamic_sampling_rounds: int = _f(3, "dynamic_sampling: extra generation rounds per step at most; past them, "
                                         "constant groups fill the batch.",
                                         Range(1, 100, why="0 extra rounds would be no dynamic sampling"))
    pass_rate_half_life: float = flat_option(PromptSelectionOptions, "half_life")
    pass_rate_prior_strength: float = flat_option(PromptSelectionOptions, "prior_strength")
    pass_rate_exploration: float = flat_option(PromptSelectionOptions, "exploration")
    max_train_prompts: int = _f(0, "Train on the first this-many prompts of the train split (0 = all), e.g. a "
                                    "small pool that training revisits epoch after epoch.",
                                    Range(0, why="0 = all"))
    # --- the update (the step: podsrl.update.UpdateOptions; the optimizer: OptimizerOptions) --
    num_iterations: int = _f(1, "Optimizer steps per generation batch; >1 reuses the batch with "
                                "PPO clipping against the generating policy's log-probs.", POSITIVE)
    scale_rewards: bool = _f(True, "Divide advantages by the kept group's reward std: true or TRL's 'group'; false "
                                   "or 'none' only centres them (Dr. GRPO). TRL's 'batch' is refused.")
    advantage_estimator: Spec = _f("group", "How kept rewards become advantages: 'group' = (r - group mean) / "
                                           "(group std + 1e-4) over each prompt's kept m (the paper; scale_rewards "
                                           "false only centres), or your own as 'module:function' "
                                           "(podsrl.algorithms.advantages.ADVANTAGES).")
    # --- generation ----------------------------------------------------------------------
    temperature: float = _f(1.0, "Sampling temperature of training rollouts (> 0: they are sampled).",
                            Range(0, low_closed=False, why="training rollouts are sampled"))
    top_p: float = _f(1.0, "Nucleus sampling threshold of training rollouts, in (0, 1].",
                      Range(0, 1, low_closed=False))
    max_completion_length: int = _f(0, "Maximum completion length in tokens (TRL's field); 0 = the task's own "
                                       "budget (podsrl.tasks.budget: arithmetic 8, chain 256, gsm8k and math 512 "
                                       "as in the paper, others 256, TRL's default), resolved when the config is "
                                       "made and recorded in config.json.", Range(0, why="0 = the task's budget"))
    generation_engine: Spec = _f("hf", "Generation engine (podsrl.rollout.ENGINES): 'hf' = transformers generate "
                                      "on whole prompt groups; 'slots' = decoding slots refilled sample by sample "
                                      "(n bounded by time, not memory); 'vllm' = a vLLM engine in the training "
                                      "process, the policy's weights pushed to it after every optimizer step, also "
                                      "used for evaluation (needs vLLM: docs/generation.md).")
    generation_batch_size: int = _f(0, "Max sequences per engine call, in whole prompt groups, for every engine "
                                       "(0 = the whole batch in one call). Not TRL's generation_batch_size.",
                                       NON_NEGATIVE)
    generation_dtype: str = flat_option(HFOptions, "copy_dtype")
    generation_static_cache: bool = flat_option(HFOptions, "static_cache")
    generation_micro_group: int = flat_option(SlotsOptions, "micro_group")
    generation_refill: str = flat_option(SlotsOptions, "refill")
    generation_schedule: Spec = flat_option(SlotsOptions, "schedule")
    generation_probe_tokens: int = flat_option(SlotsOptions, "probe_tokens")
    generation_decode_path: str = flat_option(SlotsOptions, "decode_path")
    group_early_stop: bool = _f(False, "pods + max_variance on the slots engine: stop sampling a prompt once "
                                       "the m rollouts PODS would keep already have the largest variance the "
                                       "reward's declared bounds allow (lossless for the kept variance); its "
                                       "slots go to other prompts. Needs bounded reward functions "
                                       "(podsrl.rewards.bounded), generation_schedule round_robin (or "
                                       "shortest/longest_first) and fewer slots than P*n.")
    generation_watchers: str | list[Spec] = _f("", "Comma-separated watchers of generation by your own rule, "
                                                   "'module:Class' / 'file.py:Class': built per engine call as "
                                                   "Class(prompts, tokenizer, step), of a kind the engine's "
                                                   "capabilities declare (on the slots engine: 'stop_groups', "
                                                   "shown samples as they finish, names groups whose unstarted "
                                                   "samples are cancelled; 'prune_running', shown running samples "
                                                   "at the lengths its lengths(prompt) gives, names samples to "
                                                   "stop; podsrl.rollout.Watcher, docs/generation.md).")
    generation_memory_mb: float = flat_option(MemoryCapOptions, "memory_mb")
    share_prefill: bool = flat_option(HFOptions, "share_prefill")
    # --- vLLM engine (generation_engine vllm; TRL's names where TRL has the field) -------------
    vllm_gpu_memory_utilization: float = flat_option(VLLMOptions, "gpu_memory_utilization")
    vllm_kv_cache_memory_mb: float = flat_option(VLLMOptions, "kv_cache_memory_mb")
    vllm_max_model_length: int = flat_option(VLLMOptions, "max_model_length")
    vllm_enable_sleep_mode: bool = flat_option(VLLMOptions, "enable_sleep_mode")
    vllm_enforce_eager: bool = flat_option(VLLMOptions, "enforce_eager")
    vllm_importance_sampling_correction: bool = _f(True, "Correct the update for the difference between vLLM's "
                                                         "sampling log-probs and the policy's (TRL's field and "
                                                         "default): weights per vllm_importance_sampling_mode.")
    vllm_importance_sampling_mode: str = _f("sequence_mask", "TRL's values: 'token_truncate' / 'token_mask' (each "
                                                             "token's ratio clipped to / masked outside [clip_min, "
                                                             "clip_max]) or 'sequence_truncate' / 'sequence_mask' "
                                                             "(the sequence's ratio, the product over its tokens).")
    vllm_importance_sampling_clip_max: float = _f(3.0, "Upper bound C_max of the importance ratio (TRL's field; "
                                                       "was vllm_importance_sampling_cap).", POSITIVE)
    vllm_importance_sampling_clip_min: float = _f(0.0, "Lower bound C_min of the importance ratio (TRL's field; 0 = "
                                                       "none).", NON_NEGATIVE)
    # --- LoRA (rank 0 = full fine-tuning) ------------------------------------------------
    lora_rank: int = _f(0, "LoRA rank; 0 trains every parameter.", NON_NEGATIVE)
    lora_alpha: float = _f(16.0, "LoRA alpha.", POSITIVE)
    lora_dropout: float = _f(0.0, "LoRA dropout probability, in [0, 1).", FRACTION)
    lora_target_modules: str = _f("", "Comma-separated module names for LoRA; empty = all linear layers.")
    dtype: str = _f("float32", "Model weights dtype: float32 or bfloat16. For low-precision speed keep float32 and "
                               "set bf16: small updates vanish in bfloat16 weights. float16 is refused: without "
                               "loss scaling training turns float16 weights to NaN (on the CPU at once).")
    bf16: bool = _f(False, "Mixed precision (TRL's field): forward passes under torch.autocast in bfloat16, "
                           "weights, gradients and optimizer state in float32 (needs dtype float32).")
    fp16: bool = _f(False, "float16 mixed precision (TRL's field): not supported yet (it needs loss scaling); "
                           "use bf16.")
    device: str = _f("auto", "Where the policy runs: 'auto' (the launcher's GPU for this process, else the "
                             "first CUDA GPU, else the CPU), 'cpu', 'cuda' or 'cuda:N'. Rollouts, rewards and "
                             "selection stay on the CPU; generation and the update run on the device.")
    # --- run bookkeeping ----------------------------------------------------------------
    seed: int = _f(0, "Seed of every random stream of the run (python, numpy, torch), in [0, 2**32 - 1].",
                   SEED)
    output_dir: str = _f("runs/podsrl", "Run directory: config, metrics.jsonl, checkpoints, plot.")
    resume: bool | str = _f(False, "Resume from the latest checkpoint in output_dir: true, false, or auto (resume "
                                   "where output_dir holds a checkpoint, else start the run afresh there as false "
                                   "does, for job scripts that always pass it; says in one line which it did).")


@dataclass(frozen=True)
class Config(ThreadOptions, PruningOptions, PartialRolloutOptions, LogOptions, EvalOptions, CheckpointOptions,
             StopOptions, OptimizerOptions, UpdateOptions, ScoringOptions, TaskOptions, ConfigFields):
    """The run's configuration: the stages' options (``TaskOptions``, ``ScoringOptions``,
    ``UpdateOptions``), :class:`ConfigFields`, then each job's options (``OptimizerOptions``,
    ``StopOptions``, ``CheckpointOptions``, ``EvalOptions``, ``LogOptions``,
    ``PartialRolloutOptions``, ``PruningOptions``, ``ThreadOptions``), each declared in the module that
    reads it, under the same names
    from the YAML file and the command line to their reader (podsrl.options.bind). Every setting
    is declared once (tests/test_structure.py)."""

    def __post_init__(self) -> None:
        # 0 = the task's budget, resolved once, so every reader (engine, evaluation, config.json) sees tokens
        if type(self.max_completion_length) is int and self.max_completion_length == 0:
            try:
                tokens = completion_budget(self.task)
            except ValueError:  # a task validate() refuses, naming it; the budget must not fail first
                tokens = DEFAULT_COMPLETION_BUDGET
            object.__setattr__(self, "max_completion_length", tokens)

    @property
    def generated_per_prompt(self) -> int:
        """Rollouts generated per prompt (podsrl.methods: m for grpo, n otherwise)."""
        return METHODS[self.method].generated_per_prompt(self.num_generations, self.num_kept)

    @property
    def trained_per_prompt(self) -> int:
        """Rollouts trained on per prompt (podsrl.methods: n for grpo-ga, m otherwise)."""
        return METHODS[self.method].trained_per_prompt(self.num_generations, self.num_kept)

    @property
    def computes_in_bfloat16(self) -> bool:
        """The policy's forward passes run in bfloat16: mixed precision (bf16) or bfloat16 weights."""
        return self.bf16 or self.dtype == "bfloat16"

    def prompt_selection_options(self) -> PromptSelectionOptions:
        """The prompt selector's options: the run's, and pass_rate's from their flat fields (a spec's
        arguments replace them when the selector is built: podsrl.registry.bind_options)."""
        return bind(PromptSelectionOptions, self, **{option: getattr(self, name) for name, option
                                                     in flat_names(self, PromptSelectionOptions).items()})

    def generation_options(self, processes: int = 1, sharded: bool = False, engine=None) -> EngineOptions:
        """The options the run's engine is built with (its own class, podsrl.rollout.engine_options):
        the flat generation_* / vllm_* fields, the run's own values, then the spec's arguments
        (``engine``: the spec resolved already, where the caller holds it)."""
        run = dict(max_completion_length=self.max_completion_length, temperature=self.temperature, top_p=self.top_p,
                   compute_dtype="bfloat16" if self.computes_in_bfloat16 else "float32", sharded=sharded,
                   seed=self.seed, processes=processes, device=self.device, max_prompt_tokens=self.max_prompt_tokens)
        flat = {option: getattr(self, name) for name, option in flat_names(self, EngineOptions).items()}
        return engine_options(engine or ENGINES.resolve(self.generation_engine), flat, run)

    @property
    def reward_specs(self) -> list[str]:
        """``reward_funcs`` as a list of names / ``module:function`` specs (and mappings with arguments)."""
        return split_list(self.reward_funcs) if isinstance(self.reward_funcs, str) else list(self.reward_funcs)

    @property
    def watcher_specs(self) -> list[Spec]:
        """``generation_watchers`` as a list of ``module:Class`` specs (and mappings with arguments)."""
        return (split_list(self.generation_watchers) if isinstance(self.generation_watchers, str)
                else list(self.generation_watchers))

    @property
    def reward_weight_values(self) -> list[float]:
        """``reward_weights`` as finite floats (1 per function when empty)."""
        if not self.reward_weights:
            return [1.0] * len(self.reward_specs)
        return check_reward_weights(split_list(self.reward_weights), self.reward_weights)

    @property
    def lora_targets(self) -> tuple[str, ...]:
        return tuple(split_list(self.lora_target_modules))

    def system_prompt_for(self, task) -> str:
        """The system prompt to use with ``task``: its own when ``system_prompt`` is 'auto'."""
        return task.system_prompt if self.system_prompt == "auto" else self.system_prompt

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELDS = {f.name: f for f in fields(Config)}
RESUME_AUTO = "auto"  # resume where output_dir holds a checkpoint, else afresh (podsrl.run_folder.claim)
# Where and how a run is written, logged and checkpointed, not what it trains: a resume may
# change these (podsrl.run_folder.claim), and seeds of one arm may differ in them
# (podsrl.experiments.seeds)
BOOKKEEPING_FIELDS = frozenset({"output_dir", "resume", "progress", "report_to", "log_rollouts", "save_steps",
                                "checkpoint_minutes", "save_total_limit", "device", "torch_threads"})


def parse_value(name: str, raw: Any, source: str = "") -> Any:
    """Convert a YAML or command-line value to the field's type, naming the field on error."""
    if name not in FIELDS:
        close = difflib.get_close_matches(name, FIELDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{source}unknown config field {name!r}{hint}")
    kind = type(FIELDS[name].default)
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        # and TRL's values
        if text in ("1", "true", "yes", "on") or (name, text) == ("scale_rewards", "group"):
            return True
        if text in ("0", "false", "no", "off") or (name, text) == ("scale_rewards", "none"):
            return False
        if (name, text) == ("resume", RESUME_AUTO):  # resume's third value: decided by the run folder
            return RESUME_AUTO
        require((name, text) != ("scale_rewards", "batch"),
                f"{source}scale_rewards: TRL's 'batch' is not implemented")
        raise ValueError(f"{source}{name}: expected true/false{'/auto' if name == 'resume' else ''}, "
                         f"got {raw!r}")
    if isinstance(raw, bool) and kind is not bool:
        raise ValueError(f"{source}{name}: expected {kind.__name__}, got {raw!r}")
    if kind is str:  # a component's mapping {name: ..., argument: value} is kept (podsrl.registry), else text
        return as_text(name, raw, source) if (spec := parse_component(name, raw, source)) is None else spec
    try:
        if kind is int and isinstance(raw, float) and not raw.is_integer():
            raise ValueError
        return kind(raw)  # int("1.5") raises too
    except (TypeError, ValueError, OverflowError):  # float(10**400) overflows
        raise ValueError(f"{source}{name}: expected {kind.__name__}, got {raw!r}") from None


def load_yaml(path: str | os.PathLike, sources: dict[str, str] | None = None) -> dict[str, Any]:
    """The fields of a YAML file, parsed; ``sources`` (when given) gets each field's
    ``"FILE line N: "``, the prefix of its errors."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config: file not found: {path}")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of config fields at the top level")
    # Report the line of each key so errors can point at it.
    lines = path.read_text(encoding="utf-8").splitlines()
    out = {}
    for key, raw in data.items():
        line = next((i + 1 for i, text in enumerate(lines) if text.lstrip().startswith(f"{key}:")), None)
        where = f"{path} line {line}: " if line else f"{path}: "
        out[key] = parse_value(str(key), raw, where)
        if sources is not None:
            sources[str(key)] = where
    return out


def make_config(yaml_path: str | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Defaults <- YAML file <- overrides, then validated. An error of ``validate`` that names a
    field set by the YAML file (first word of the message) gets its file and line, as the
    errors of ``parse_value`` do."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}  # field -> "FILE line N: " for the values the YAML file set
    if yaml_path:
        values.update(load_yaml(yaml_path, sources))
    for key, raw in (overrides or {}).items():
        values[key] = parse_value(key, raw, "")
        sources.pop(key, None)
    # a former spelling (an old run's own command) is today's
    values, notes = current_layout(values, {name: field.default for name, field in FIELDS.items()})
    for note in notes:  # with the YAML file and line that set it, as errors get theirs
        where = sources.get(re.match(r"\w*", note).group(), "")
        print(f"note: {where}{note}", file=sys.stderr, flush=True)
    cfg = Config(**values)
    try:
        validate(cfg)
    except (ValueError, FileNotFoundError) as err:
        name = re.match(r"\w*", str(err)).group()
        if name not in sources or type(err) not in (ValueError, FileNotFoundError):
            raise
        raise type(err)(f"{sources[name]}{err}") from None
    return cfg
