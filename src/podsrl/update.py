"""The update stage: kept groups [P, m, ...] -> sequences [B = P*m, ...] -> micro-batches
trimmed of padding -> one optimizer step with gradients accumulated over them.

``train`` (trainer.py) calls ``flatten_for_update``, then ``batch_logprobs`` for the old and
reference log-probs when it needs them, then ``update_policy``.
"""

from __future__ import annotations

import math

import torch

from podsrl import algo
from podsrl.config import Config
from podsrl.distributed import Processes
from podsrl.rollout import Rollouts


def flatten_for_update(kept: Rollouts, advantages: torch.Tensor) -> dict[str, torch.Tensor]:
    """Group axis [P, m, ...] -> sequence axis [B = P*m, ...] for the update."""
    num_prompts, m, _ = kept.completion_ids.shape
    prompt_ids = kept.prompt_ids.repeat_interleave(m, dim=0)  # [B, Lp]
    prompt_mask = kept.prompt_mask.repeat_interleave(m, dim=0)
    completion_ids = kept.completion_ids.reshape(num_prompts * m, -1)  # [B, Lc]
    completion_mask = kept.completion_mask.reshape(num_prompts * m, -1)
    return {"input_ids": torch.cat([prompt_ids, completion_ids], 1),  # [B, Lp + Lc]
            "attention_mask": torch.cat([prompt_mask, completion_mask], 1),
            "completion_mask": completion_mask, "advantages": advantages.reshape(-1)}


def micro_batches(batch: dict[str, torch.Tensor], size: int, device: torch.device | str = "cpu"):
    """Slices of ``size`` sequences, trimmed of all-padding columns on both sides, on
    ``device`` (the model's: the batch itself stays on the CPU)."""
    total = batch["advantages"].shape[0]
    width = batch["completion_mask"].shape[1]
    for start in range(0, total, size):
        part = {k: v[start:start + size] if v is not None else None for k, v in batch.items()}
        completion_len = int(part["completion_mask"].sum(1).max())
        prompt_cols = batch["input_ids"].shape[1] - width
        first_real = int((part["attention_mask"][:, :prompt_cols].sum(0) > 0).nonzero().min())
        end = prompt_cols + completion_len
        part["input_ids"] = part["input_ids"][:, first_real:end]
        part["attention_mask"] = part["attention_mask"][:, first_real:end]
        for key in ("completion_mask", "old_logp", "ref_logp"):
            if part.get(key) is not None:
                part[key] = part[key][:, :completion_len]
        yield {k: v.to(device) if v is not None else None for k, v in part.items()}


def make_optimizer(parameters, cfg: Config) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """The optimizer over ``parameters`` and its schedule: linear warm-up over
    ``warmup_steps`` optimizer steps (from lr / warmup_steps), then constant."""
    parameters = list(parameters)
    if cfg.optim == "sgd":
        optimizer = torch.optim.SGD(parameters, lr=cfg.lr, weight_decay=cfg.weight_decay)
    else:
        optimizer = torch.optim.AdamW(parameters, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                      weight_decay=cfg.weight_decay)
    warmup = cfg.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    return optimizer, scheduler


@torch.no_grad()
def batch_logprobs(model, batch: dict[str, torch.Tensor], size: int, share_prompt: bool = True) -> torch.Tensor:
    """Log-probs [B, Lc] of the completion tokens under ``model`` (no gradient)."""
    logprobs = algo.shared_prompt_token_logprobs if share_prompt else algo.token_logprobs
    out = torch.zeros(batch["completion_mask"].shape)  # [B, Lc] on the CPU, like the batch
    row = 0
    for part in micro_batches(batch, size, device=model.device):
        lc = part["completion_mask"].shape[1]
        rows = part["input_ids"].shape[0]
        out[row:row + rows, :lc] = logprobs(model, part["input_ids"], part["attention_mask"], lc).cpu()
        row += rows
    return out


def update_policy(model, optimizer, scheduler, batch: dict[str, torch.Tensor], cfg: Config,
                  procs: Processes | None = None, num_tokens: float | None = None) -> dict[str, float]:
    """One optimizer step over the whole batch, accumulating gradients over micro-batches.

    Each micro-batch loss is normalised by the whole batch's sequence / token count, so
    the accumulated gradient equals the full-batch gradient. With several processes the
    gradient is the average over processes, so ``num_tokens`` is the global token count
    divided by the number of processes (every process holds the same number of
    sequences). A non-finite loss or gradient skips the step (logged) instead of
    corrupting the weights.
    """
    procs = procs or Processes()
    logprobs = algo.shared_prompt_token_logprobs if cfg.share_prompt_in_update else algo.token_logprobs
    num_sequences = batch["advantages"].shape[0]
    num_tokens = num_tokens or float(batch["completion_mask"].sum())
    optimizer.zero_grad(set_to_none=True)
    total_loss, clip_fraction, kl = 0.0, 0.0, 0.0
    parts = list(micro_batches(batch, cfg.micro_batch_size, device=procs.unwrap(model).device))
    for i, part in enumerate(parts):
        lc = part["completion_mask"].shape[1]
        # gradients are averaged across processes once per step, after the last micro-batch
        with procs.no_sync(model, last=i == len(parts) - 1):
            logp = logprobs(model, part["input_ids"], part["attention_mask"], lc)  # [b, lc]
            old_logp = part["old_logp"] if part.get("old_logp") is not None else logp.detach()
            loss, stats = algo.policy_loss(
                logp, old_logp, part["advantages"], part["completion_mask"],
                clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high,
                ref_logp=part.get("ref_logp"), beta=cfg.beta, aggregation=cfg.loss_aggregation,
                num_sequences=num_sequences, num_tokens=num_tokens)
            procs.backward(loss)
        share = part["advantages"].shape[0] / num_sequences
        total_loss += loss.item()
        clip_fraction += stats["clip_fraction"] * share
        kl += stats.get("kl", 0.0) * share
    max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
    grad_norm = procs.clip_grad_norm(model, max_norm)
    lr = optimizer.param_groups[0]["lr"]  # the rate this step uses (the scheduler moves it after)
    skipped = not (math.isfinite(total_loss) and math.isfinite(grad_norm))
    if skipped:
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
        scheduler.step()
    return {"loss": total_loss, "grad_norm": grad_norm, "clip_fraction": clip_fraction, "kl": kl,
            "skipped_step": int(skipped), "lr": lr}
