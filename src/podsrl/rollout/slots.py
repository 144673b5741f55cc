"""The ``slots`` engine (:class:`SlotsEngine`): generation in a bounded number of decoding
slots, large n on bounded memory (its decoder: :mod:`podsrl.rollout.slot_decoder`).

PODS draws many rollouts per prompt (n = 64 to 256 in the paper), and decoding a whole
group at once needs KV-cache and logits memory that grows with n. Following Infinite
Sampling (Wang et al., arXiv 2506.22950), this engine decouples the group size from the
generation memory:

* micro-groups: at most ``slots`` (g) sequences are decoded at once;
* shared prefill: each prompt is run through the model once; its KV cache is copied into
  a slot whenever one of its samples starts, never recomputed (admission);
* continuous refill (``refill="continuous"``): when a sample ends, its slot takes the next
  pending sample (of the same prompt or the next) at the following decode step, instead of
  idling until the whole micro-group is done (``refill="group"``, naive micro-groups);
* length-aware scheduling (``schedule``): pending samples are taken shortest- or
  longest-predicted-first, or (``length_aware``, the paper's plan) every sample first
  decodes a short probe and leaves its slot (``pause_at``: its prefix's keys and values are
  kept and placed back after its prompt's when it resumes), then samples resume in lanes
  balanced by the length predicted from their prefix (:mod:`podsrl.rollout.schedule`);
* early stop (``stopper``): finished samples are scored as they end; once a group is
  saturated (:mod:`podsrl.algorithms.early_stop`: more samples cannot raise the variance
  PODS keeps), its samples that have not started are cancelled, and the slots they would
  have taken go to other prompts. Those samples are absent from the result (``generated``).

Sampling semantics are those of ``transformers`` ``generate`` (:mod:`podsrl.rollout.sampling`).
Which random draw goes to which sample depends on the schedule, so samples differ from
full-group generation draw by draw while following the same distribution; greedy decoding
gives the same completions.

Cache layout: one batch row per slot, all rows sharing the cache's column axis. A sample
that starts at column W gets its prompt's keys and values right-aligned at [W - Lp, W) and
its earlier columns masked out, exactly like left padding; columns no live row needs any
more are trimmed from the left (compaction), so the cache never grows beyond
g x (longest prompt + max_new_tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from podsrl.options import NON_NEGATIVE, Range, option
from podsrl.registry import Spec
from podsrl.rollout.base import EngineOptions, Stopper, longest_prompt, rows_within, to_rollouts
from podsrl.rollout.schedule import (
    SCHEDULES,
    LengthPredictor,
    PendingSamples,
    PrefixLengthPredictor,
    Schedule,
    check_options,
    plan_lanes,
    predict_remaining,
    predictor_for,
)
from podsrl.rollout.slot_decoder import SlotDecoder, decode, prefill
from podsrl.types import Rollouts


@dataclass(frozen=True)
class SlotsOptions(EngineOptions):
    """The ``slots`` engine's options (their flat config names: podsrl.rollout.FLAT_OPTIONS)."""

    memory_mb: float = option(0.0, "Cap on the estimated memory of what is decoded at once: bounds the slots "
                                   "(0 = none).", NON_NEGATIVE)
    micro_group: int = option(0, "slots engine: sequences decoded at once (g); 0 = as many as generation_memory_mb "
                                 "allows, or all P*n without a cap.", NON_NEGATIVE)
    refill: str = option("continuous", "slots engine: 'continuous' gives a finished sample's slot to the next pending"
                                       " sample at once; 'group' waits for the whole micro-group (naive "
                                       "micro-groups).")
    schedule: Spec = option("fifo", "slots engine: order of pending samples: 'fifo' (prompt by prompt), 'round_robin'"
                                    " (one sample of each prompt in turn), 'shortest_first' or 'longest_first' by a "
                                    "prompt-level length predictor learned online, 'length_aware' (Infinite "
                                    "Sampling's plan: probe, token-conditioned length prediction, lanes balanced by "
                                    "predicted length, shortest first within a lane; continuous refill only).")
    probe_tokens: int = option(4, "generation_schedule length_aware: tokens every sample decodes before its remaining"
                                  " length is predicted from them (>= 2); their keys and values wait outside the "
                                  "slots until the sample resumes.",
                                  Range(2, why="the length_aware probe decodes at least 2 tokens"))

    def check(self) -> None:
        check_options(self.refill, SCHEDULES.resolve(self.schedule), self.probe_tokens)

    def early_stop_refusal(self) -> str:
        refusal = SCHEDULES.resolve(self.schedule).early_stop_refusal
        if refusal:
            return refusal
        if not (self.micro_group or self.memory_mb):
            return ("with generation_micro_group 0 and no generation_memory_mb every sample starts at once, leaving "
                    "nothing to cancel; set generation_micro_group below prompts_per_step x num_generations")
        return ""


def pack(completions: list[list[list[int]]], pad: int) -> torch.Tensor:
    """P x n token lists -> completion_ids [P, n, Lc], right-padded with ``pad``."""
    width = max(len(c) for group in completions for c in group)
    completion_ids = torch.full((len(completions), len(completions[0]), width), pad, dtype=torch.long)
    for p, group in enumerate(completions):
        for j, tokens in enumerate(group):
            completion_ids[p, j, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    return completion_ids


@torch.no_grad()
def generate_in_slots(model, tokenizer, prompts: list[str], num_samples: int, *, max_new_tokens: int,
                      temperature: float = 1.0, top_p: float = 1.0, slots: int = 0, refill: str = "continuous",
                      schedule: Schedule | str = "fifo",
                      predictor: LengthPredictor | PrefixLengthPredictor | None = None,
                      stopper: Stopper | None = None, probe_tokens: int = 4) -> Rollouts:
    """Sample ``num_samples`` completions per prompt, decoding at most ``slots`` at once.

    ``slots`` = 0 decodes every sample at once. ``stopper``: early stop of saturated groups
    (see the module docstring). ``schedule`` "length_aware" (continuous refill only) first
    decodes ``probe_tokens`` tokens of every sample (round robin), predicts each one's
    remaining length from its prompt and those tokens, balances the samples into ``slots``
    lanes and resumes them shortest first within each lane. Returns :class:`Rollouts`
    [P, n, Lc] like the ``hf`` engine, with ``stats``: decode_steps (model calls after the
    prefill), generated_tokens, slots (length_aware adds probe_steps and length_mae, the mean
    absolute error of the predicted remaining lengths); and ``generated`` [P, n] when a
    stopper was given.
    """
    # a spec, or the Schedule
    schedule = SCHEDULES.resolve(schedule) if isinstance(schedule, (str, dict)) else schedule
    check_options(refill, schedule, probe_tokens)
    predictor = predictor_for(schedule, predictor)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    prompt_ids, prompt_mask = enc["input_ids"], enc["attention_mask"]  # [P, Lp] on the CPU, like the result
    prompt_tokens = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask)]
    slots = min(slots or len(prompts) * num_samples, len(prompts) * num_samples)
    was_training = model.training
    model.eval()
    prompt_kv, prompt_logits = prefill(model, prompt_ids, prompt_mask, slots)
    prompt_level = isinstance(predictor, LengthPredictor)
    features = predictor.features(prompt_tokens) if prompt_level else None
    predicted = predictor.predict(features).tolist() if prompt_level else [0.0] * len(prompts)
    pending = PendingSamples(len(prompts), num_samples, schedule, predicted, predictor if prompt_level else None)
    decoder = SlotDecoder(model, prompt_kv, prompt_logits, pending, num_samples, eos=tokenizer.eos_token_id,
                          pad=tokenizer.pad_token_id, max_new_tokens=max_new_tokens, temperature=temperature,
                          top_p=top_p, stopper=stopper)
    stats = {}
    if schedule.plans_lanes:  # stage 0: the probe; stage 1: the plan
        decoder.pause_at = probe_tokens
        decode(decoder, slots, refill)
        stats["probe_steps"] = decoder.decode_steps
        samples = sorted(decoder.paused)
        features, predicted = predict_remaining(predictor, prompt_tokens, decoder.completions, samples,
                                                max_new_tokens - probe_tokens)
        decoder.pending = plan_lanes(samples, predicted, slots)
        decoder.pause_at = 0
    decode(decoder, slots, refill)  # stage 2: runtime refill
    model.train(was_training)
    completions = decoder.completions
    generated = decoder.generated()  # [P, n]: all True without a stopper
    if prompt_level:
        lengths = torch.tensor([[len(c) for c in group] for group in completions], dtype=torch.float64)
        predictor.update(features, lengths.masked_fill(~generated, float("nan")))  # skipped: no length to learn
    elif schedule.plans_lanes:
        remaining = torch.tensor([len(completions[p][s]) - probe_tokens if generated[p, s] else float("nan")
                                  for p, s in samples], dtype=torch.float64)  # [N]
        stats["length_mae"] = predictor.learn(features, predicted, remaining)
    rollouts = to_rollouts(tokenizer, prompt_ids, prompt_mask, pack(completions, tokenizer.pad_token_id),
                           generated=generated if stopper is not None else None)
    rollouts.stats.update(decode_steps=decoder.decode_steps, slots=slots, **stats)
    return rollouts


class SlotsEngine:
    """Decoding slots refilled sample by sample (:func:`generate_in_slots`); with a
    length-aware schedule it carries a completion-length predictor learned across steps."""

    early_stop_refusal = ""  # it stops saturated groups (the stopper), as its options allow
    options_type = SlotsOptions

    def __init__(self, options: SlotsOptions) -> None:
        self.options = options
        self.schedule = SCHEDULES.resolve(options.schedule)
        self.predictor = self.schedule.new_predictor()

    def __call__(self, model, tokenizer, prompts: list[str], num_samples: int,
                 stopper: Stopper | None = None) -> Rollouts:
        options = self.options
        slots = options.micro_group
        if options.memory_mb:
            longest = longest_prompt(tokenizer, prompts)
            probe = options.probe_tokens - 1 if self.schedule.plans_lanes else 0
            rows = rows_within(options, model, longest, prompts=len(prompts), stored_prompt_len=longest,
                                stored_tokens=len(prompts) * num_samples * probe)
            if rows < 1 or (slots and slots > rows):
                raise MemoryError(
                    f"generation_memory_mb: {slots or 1} decoding slot(s) need more than the cap of "
                    f"{options.memory_mb:g} MB (fits {rows}); lower generation_micro_group or raise the cap")
            slots = slots or rows
        return generate_in_slots(model, tokenizer, prompts, num_samples, max_new_tokens=options.max_new_tokens,
                                 temperature=options.temperature, top_p=options.top_p, slots=slots,
                                 refill=options.refill, schedule=self.schedule, predictor=self.predictor,
                                 stopper=stopper, probe_tokens=options.probe_tokens)

    def generate(self, model, tokenizer, prompts: list[str], num_samples: int, *, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, batch_size: int | None = None) -> Rollouts:
        """Evaluation's sampler: ``num_samples`` completions per prompt (greedy at temperature 0)
        in ``batch_size`` slots refilled sample by sample, first come first served. Evaluation
        decodes long, variable-length completions too, where whole-batch decoding waits for the
        longest row; the training schedule and its learned length predictor stay untouched."""
        return generate_in_slots(model, tokenizer, prompts, num_samples, max_new_tokens=max_new_tokens,
                                 temperature=temperature, top_p=top_p, slots=batch_size or 0)

    def state_dict(self) -> dict:
        return {"length_predictor": self.predictor.state_dict()} if self.predictor is not None else {}

    def check_state(self, state: dict) -> None:
        if set(state) != set(self.state_dict()):
            raise ValueError(f"generation engine 'slots' with schedule {self.options.schedule!r} keeps "
                             f"{sorted(self.state_dict()) or 'no state'}, the checkpoint has {sorted(state) or 'none'}")
        if self.predictor is not None:
            self.predictor.check_state(state["length_predictor"])

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        if self.predictor is not None:
            self.predictor.load_state_dict(state["length_predictor"])
