"""The update stage: kept groups [P, m, ...] -> an UpdateBatch [B = P*m, ...] -> micro-batches
trimmed of padding -> one optimizer step with gradients accumulated over them.

The training loop calls ``flatten_for_update``, then ``batch_logprobs`` for the old and
reference log-probs when it needs them (on the kept rollouts only), then
``update_policy``. Options are explicit dataclasses; nothing here reads the run config.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Iterator

import torch
from transformers import get_scheduler

from podsrl.algorithms.importance import (
    SamplerCorrection,
    importance_ratios,
    sampler_importance_weights,
    sampler_logp_difference,
)
from podsrl.algorithms.loss import LossType, policy_loss
from podsrl.distributed import Processes
from podsrl.models.logprobs import shared_prompt_token_logprobs, token_logprobs
from podsrl.models.memory import UpdateMemory
from podsrl.models.precision import activation_checkpointing
from podsrl.options import FRACTION, NON_NEGATIVE, POSITIVE, Range, option
from podsrl.registry import Spec
from podsrl.types import Rollouts, UpdateBatch


@dataclass(frozen=True)
class UpdateOptions:
    """How one optimizer step is taken over a batch (the config's fields of these names: the config
    composes this class; ``loss_type`` reaches the update resolved, podsrl.algorithms.loss.LOSSES)."""

    max_grad_norm: float = option(0.1, "Gradient clipping by global norm (paper: 0.1; 0 = off).",
                                  Range(0, why="0 = no clipping"))
    micro_batch_size: int = option(32, "Sequences per forward/backward pass; gradients accumulate over "
                                        "micro-batches into one optimizer step.", POSITIVE)
    epsilon: float = option(0.2, "Lower clip range of the importance ratio: 1 - epsilon (TRL's field).",
                            FRACTION)
    epsilon_high: float = option(0.2, "Upper clip range of the importance ratio: 1 + epsilon_high (TRL's "
                                      "field; TRL's default follows epsilon, this one does not: set both; "
                                      "DAPO uses 0.28).",
                                      NON_NEGATIVE)
    beta: float = option(0.0, "Weight of the k3 KL penalty to the reference (initial) policy; 0 = none.",
                         NON_NEGATIVE)
    loss_type: Spec | LossType = option("grpo", "TRL's field and values: 'grpo' = token mean per sequence, "
                                                "then mean (the paper); 'dapo' = mean over all tokens of the "
                                                "step (DAPO; TRL's default); your own as 'module:function' "
                                                "(podsrl.algorithms.loss.LOSSES); TRL's others refused.")
    share_prompt_in_update: bool = option(True, "In the update's forward/backward, run each prompt once per "
                                                "group and reuse its KV cache for the group's completions "
                                                "(same log-probs and gradient, fewer tokens).")
    gradient_checkpointing: bool = option(False, "Recompute activations in the update's backward instead of "
                                                 "storing them (TRL's field): less memory, ~1 more forward. "
                                                 "The update then runs whole rows (share_prompt_in_update is "
                                                 "ignored).")


# transformers.get_scheduler's schedules that need nothing beyond warm-up and total steps
SCHEDULERS = ("constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial",
              "inverse_sqrt")


OPTIMIZERS = ("adamw_torch", "sgd")


@dataclass(frozen=True)
class OptimizerOptions:
    """The optimizer and its learning-rate schedule (the config's fields of these names: the
    paper's defaults except learning_rate, which suits the tiny model)."""

    optim: str = option(
        "adamw_torch", "Optimizer (TRL's field name): 'adamw_torch' = AdamW with adam_beta1, adam_beta2 and "
                       "weight_decay (the paper); 'sgd' = plain SGD, no momentum (its update shows the "
                       "gradient's scale; the tests use it).")
    learning_rate: float = option(
        2e-4, "Learning rate (TRL's field; the paper used 5e-6 for LoRA on 3B models).", POSITIVE)
    lr_scheduler_type: str = option(
        "constant_with_warmup", "Learning-rate schedule (TRL's field; any name of "
                                "transformers.get_scheduler: constant_with_warmup, linear, cosine, ...), "
                                "over `max_steps` optimizer steps.")
    warmup_steps: float = option(
        10.0, "Warm-up of the schedule, from lr 0 at the first step (TRL's field): a number >= 1 of "
              "optimizer steps, or a fraction < 1 of `max_steps`.", NON_NEGATIVE)
    adam_beta1: float = option(0.9, "AdamW beta1.", FRACTION)
    adam_beta2: float = option(0.99, "AdamW beta2 (paper: 0.99).", FRACTION)
    weight_decay: float = option(
        0.1, "Weight decay: decoupled with AdamW, L2 with SGD (paper: 0.1).", NON_NEGATIVE)

    def check(self) -> None:
        """The names this module knows, before any model loads."""
        if self.lr_scheduler_type not in SCHEDULERS:
            raise ValueError(f"lr_scheduler_type: unknown schedule {self.lr_scheduler_type!r}; known: "
                             f"{', '.join(SCHEDULERS)}")
        if self.optim not in OPTIMIZERS:
            raise ValueError(f"optim: unknown optimizer {self.optim!r}; known: {', '.join(OPTIMIZERS)}")


def make_optimizer(parameters, options: OptimizerOptions, total_steps: int = 150) \
        -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """The optimizer over ``parameters`` and its schedule over ``total_steps`` optimizer steps
    (the run's max_steps: decaying schedules end there), from ``transformers.get_scheduler`` as
    TRL's trainers build it (warm-up from lr 0 at the first step)."""
    parameters = list(parameters)
    if options.optim == "sgd":
        optimizer = torch.optim.SGD(parameters, lr=options.learning_rate, weight_decay=options.weight_decay)
    else:
        optimizer = torch.optim.AdamW(parameters, lr=options.learning_rate,
                                      betas=(options.adam_beta1, options.adam_beta2),
                                      weight_decay=options.weight_decay)
    warmup = options.warmup_steps
    warmup = int(warmup) if warmup >= 1 else math.ceil(total_steps * warmup)  # transformers' rule
    scheduler = get_scheduler(options.lr_scheduler_type, optimizer, num_warmup_steps=warmup,
                              num_training_steps=total_steps)
    return optimizer, scheduler


def flatten_for_update(kept: Rollouts, advantages: torch.Tensor) -> UpdateBatch:
    """Group axis [P, m, ...] -> sequence axis [B = P*m, ...], a group's rows adjacent."""
    num_prompts, m, _ = kept.completion_ids.shape
    prompt_ids = kept.prompt_ids.repeat_interleave(m, dim=0)  # [B, Lp]
    prompt_mask = kept.prompt_mask.repeat_interleave(m, dim=0)
    completion_ids = kept.completion_ids.reshape(num_prompts * m, -1)  # [B, Lc]
    completion_mask = kept.completion_mask.reshape(num_prompts * m, -1)
    sampling_logp = None if kept.sampling_logp is None else kept.sampling_logp.reshape(num_prompts * m, -1)
    return UpdateBatch(input_ids=torch.cat([prompt_ids, completion_ids], 1),  # [B, Lp + Lc]
                       attention_mask=torch.cat([prompt_mask, completion_mask], 1),
                       completion_mask=completion_mask, advantages=advantages.reshape(-1),
                       sampling_logp=sampling_logp)


def micro_batches(batch: UpdateBatch, size: int, device: torch.device | str = "cpu") -> Iterator[UpdateBatch]:
    """Slices of ``size`` sequences, trimmed of all-padding columns on both sides, on
    ``device`` (the model's: the batch itself stays on the CPU)."""
    for start in range(0, len(batch), size):
        yield batch.rows(start, start + size).trimmed().to(device)


@torch.no_grad()
def batch_logprobs(model, batch: UpdateBatch, size: int, share_prompt: bool = True) -> torch.Tensor:
    """Log-probs [B, Lc] of the completion tokens under ``model`` (no gradient)."""
    logprobs = shared_prompt_token_logprobs if share_prompt else token_logprobs
    out = torch.zeros(batch.completion_mask.shape)  # [B, Lc] on the CPU, like the batch
    row = 0
    for micro in micro_batches(batch, size, device=model.device):
        lc = micro.completion_mask.shape[1]
        out[row:row + len(micro), :lc] = logprobs(model, micro.input_ids, micro.attention_mask, lc).cpu()
        row += len(micro)
    return out


@dataclass(frozen=True)
class UpdateResult:
    """What one optimizer step reports (each a field of the step's metrics record)."""

    loss: float  # the whole batch's loss (micro-batch losses add up to it)
    grad_norm: float  # before clipping
    clip_fraction: float  # share of completion tokens whose ratio was clipped
    kl: float  # mean k3 KL to the reference (0 without beta)
    skipped_step: int  # 1 when a non-finite loss or gradient skipped the optimizer step
    lr: float  # the rate this step used (the scheduler moves it after)
    update_activation_mb: float  # largest micro-batch's activations saved for backward (models/memory.py)
    update_peak_cuda_mb: float  # CUDA allocator's peak during the update; NaN off CUDA
    # only for rollouts whose sampling log-probs are reported (by vllm; for stale tokens, by partial
    # rollouts): |policy - sampler| log-prob per token, mean and max, and the importance weights
    # applied (1 without the correction): mean, min, max over tokens, and the share of tokens whose
    # weight is not their ratio (truncated or masked)
    sampling_logp_difference_mean: float | None = None
    sampling_logp_difference_max: float | None = None
    importance_sampling_weight_mean: float | None = None
    importance_sampling_weight_min: float | None = None
    importance_sampling_weight_max: float | None = None
    importance_sampling_clipped_frac: float | None = None

    def as_record(self) -> dict[str, float]:
        """The fields as metrics; those that do not apply to the run (None) are left out."""
        return {key: value for key, value in dataclasses.asdict(self).items() if value is not None}


def update_policy(model, optimizer, scheduler, batch: UpdateBatch, options: UpdateOptions,
                  procs: Processes | None = None, num_tokens: float | None = None,
                  correction: SamplerCorrection | None = None) -> UpdateResult:
    """One optimizer step over the whole batch, accumulating gradients over micro-batches.

    Each micro-batch loss is normalised by the whole batch's sequence / token count, so
    the accumulated gradient equals the full-batch gradient. With several processes the
    gradient is the average over processes, so ``num_tokens`` is the global token count
    divided by the number of processes (every process holds the same number of
    sequences). A non-finite loss or gradient skips the step (logged) instead of
    corrupting the weights.
    """
    procs = procs or Processes()
    # a checkpointed layer drops the KV cache that sharing the prompt feeds it: whole rows then
    shared_prompt = options.share_prompt_in_update and not options.gradient_checkpointing
    logprobs = shared_prompt_token_logprobs if shared_prompt else token_logprobs
    num_sequences = len(batch)
    num_tokens = num_tokens or float(batch.completion_mask.sum())
    optimizer.zero_grad(set_to_none=True)
    total_loss, clip_fraction, kl = 0.0, 0.0, 0.0
    sampler = SamplerGap()
    device = procs.unwrap(model).device
    memory = UpdateMemory(model, device)
    micros = list(micro_batches(batch, options.micro_batch_size, device=device))
    for i, micro in enumerate(micros):
        lc = micro.completion_mask.shape[1]
        # gradients are averaged across processes once per step, after the last micro-batch
        with procs.no_sync(model, last=i == len(micros) - 1), \
                activation_checkpointing(procs.unwrap(model), options.gradient_checkpointing):
            with memory.micro_batch():
                logp = logprobs(model, micro.input_ids, micro.attention_mask, lc)  # [b, lc]
            old_logp = micro.old_logp if micro.old_logp is not None else logp.detach()
            loss, stats = policy_loss(
                logp, old_logp, micro.advantages, micro.completion_mask,
                epsilon=options.epsilon, epsilon_high=options.epsilon_high,
                ref_logp=micro.ref_logp, beta=options.beta, loss_type=options.loss_type,
                num_sequences=num_sequences, num_tokens=num_tokens,
                sampler_weights=sampler.weights(old_logp, micro, correction))
            procs.backward(loss)
        fraction = len(micro) / num_sequences  # of the step's sequences: each micro-batch's stats weigh this
        total_loss += loss.item()
        clip_fraction += stats["clip_fraction"] * fraction
        kl += stats.get("kl", 0.0) * fraction
    max_norm = options.max_grad_norm if options.max_grad_norm > 0 else float("inf")
    grad_norm = procs.clip_grad_norm(model, max_norm)
    lr = optimizer.param_groups[0]["lr"]  # the rate this step uses (the scheduler moves it after)
    skipped = not (math.isfinite(total_loss) and math.isfinite(grad_norm))
    if skipped:
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
        scheduler.step()
    return UpdateResult(loss=total_loss, grad_norm=grad_norm, clip_fraction=clip_fraction, kl=kl,
                        skipped_step=int(skipped), lr=lr, update_activation_mb=memory.activation_mb,
                        update_peak_cuda_mb=memory.peak_cuda_mb, **sampler.record())


class SamplerGap:
    """The sampling engine's log-probs against the policy's, over a step's micro-batches: the
    importance weights of each (when corrected) and the step's totals for the record. The
    policy's log-probs are those the update's loss uses as the generating policy's (its own
    forward pass with one iteration), so measuring costs no extra pass."""

    def __init__(self) -> None:
        self.difference_sum = self.tokens = self.difference_max = self.weight_sum = self.clipped = 0.0
        self.weight_min, self.weight_max = math.inf, -math.inf
        self.seen = False

    def weights(self, policy_logp: torch.Tensor, micro: UpdateBatch,
                correction: SamplerCorrection | None) -> torch.Tensor | None:
        """[b, lc] or [b, 1] importance weights for ``micro`` (None: nothing to correct)."""
        if micro.sampling_logp is None:
            return None
        mask = micro.completion_mask.to(policy_logp.dtype)
        total, tokens, largest = sampler_logp_difference(policy_logp, micro.sampling_logp, mask)
        self.seen = True
        self.difference_sum, self.tokens = self.difference_sum + total, self.tokens + tokens
        self.difference_max = max(self.difference_max, largest)
        if correction is None:
            self.weight_sum += tokens
            self.weight_min, self.weight_max = min(self.weight_min, 1.0), max(self.weight_max, 1.0)
            return None
        weights = sampler_importance_weights(policy_logp, micro.sampling_logp, mask, correction)
        ratios = importance_ratios(policy_logp, micro.sampling_logp, mask,
                                   per_sequence=correction.mode.startswith("sequence"))
        per_token, on = weights.expand_as(mask), mask > 0  # sequence weights broadcast over their tokens
        self.weight_sum += float((per_token * mask).sum())
        self.clipped += float(((weights != ratios).expand_as(mask) & on).sum())
        if on.any():
            self.weight_min = min(self.weight_min, float(per_token[on].min()))
            self.weight_max = max(self.weight_max, float(per_token[on].max()))
        return weights

    def record(self) -> dict[str, float]:
        if not self.seen:
            return {}
        tokens = max(self.tokens, 1.0)
        return dict(sampling_logp_difference_mean=self.difference_sum / tokens,
                    sampling_logp_difference_max=self.difference_max,
                    importance_sampling_weight_mean=self.weight_sum / tokens,
                    importance_sampling_weight_min=self.weight_min if self.tokens else 1.0,
                    importance_sampling_weight_max=self.weight_max if self.tokens else 1.0,
                    importance_sampling_clipped_frac=self.clipped / tokens)
