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
* early stop (a ``stop_groups`` watcher, :class:`~podsrl.rollout.base.Watcher`): finished
  samples are scored as they end; once a group is saturated (:mod:`podsrl.algorithms.early_stop`:
  more samples cannot raise the variance PODS keeps), its samples that have not started are
  cancelled, and the slots they would have taken go to other prompts. Those samples are
  absent from the result (``generated``).

Sampling semantics are those of ``transformers`` ``generate`` (:mod:`podsrl.rollout.sampling`).
Which random draw goes to which sample depends on the schedule, so samples differ from
full-group generation draw by draw while following the same distribution; greedy decoding
gives the same completions.

Cache layout: one batch row per slot (:mod:`podsrl.rollout.kv_rows`). On podsrl's decode step
(:mod:`podsrl.rollout.decode_step`, the models it covers) a row holds its prompt's keys and
values at columns [0, Lp) and its completion's after them, written in place, in a cache
allocated once per call at g x (longest prompt + max_completion_length). On the model's own forward
all rows share the cache's column axis: a sample that starts at column W gets its prompt's keys
and values right-aligned at [W - Lp, W) and its earlier columns masked out, exactly like left
padding; columns no live row needs any more are trimmed from the left (compaction), so the cache
never grows beyond that same bound.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from podsrl.options import NON_NEGATIVE, Range, option
from podsrl.registry import Spec
from podsrl.rollout.base import (
    PRUNE_RUNNING,
    STOP_GROUPS,
    Capabilities,
    MemoryCapOptions,
    Sampling,
    Watcher,
    longest_prompt,
    refuse_watchers,
    rows_within,
    to_rollouts,
)
from podsrl.rollout.kv_rows import DECODE_PATHS
from podsrl.rollout.partial import CarriedGroup, PartialCall, PartialGeneration, token_tensors
from podsrl.rollout.registries import ENGINES
from podsrl.rollout.schedule import (
    SCHEDULES,
    LengthPredictor,
    PendingSamples,
    PrefixLengthPredictor,
    check_options,
    plan_lanes,
    predict_remaining,
    predictor_for,
)
from podsrl.rollout.slot_decoder import SlotDecoder, decode, prefill
from podsrl.types import Rollouts


@dataclass(frozen=True)
class SlotsOptions(MemoryCapOptions):
    """The ``slots`` engine's options (their flat config names: podsrl.options.flat_names)."""

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
    decode_path: str = option("auto", "slots engine: the decode step: 'auto' = podsrl's own (a KV cache written in "
                                      "place, docs/generation.md) for the models it covers (Llama, Qwen2, Mistral "
                                      "families, full attention, no LoRA) and the model's forward for others "
                                      "(one note says why), replayed as CUDA graphs on a GPU; 'podsrl' refuses a "
                                      "model it does not cover; 'compiled' is podsrl's step under torch.compile "
                                      "(once per process, ~25 s on a 2-core CPU; for long runs); 'eager' is "
                                      "podsrl's step never captured; 'model' always decodes with the model's "
                                      "forward.")

    def check(self) -> None:
        check_options(self.refill, SCHEDULES.resolve(self.schedule), self.probe_tokens)
        if self.decode_path not in DECODE_PATHS:
            raise ValueError(f"generation_decode_path: unknown {self.decode_path!r}; use one of "
                             f"{', '.join(DECODE_PATHS)}")

    def watch_refusal(self, kind: str) -> str:
        if kind == PRUNE_RUNNING and SCHEDULES.resolve(self.schedule).plans_lanes:
            return ("generation_schedule length_aware parks every sample after its probe, and a watcher of running "
                    "samples pools a sample's states over one stretch of decoding: use round_robin")
        if kind != STOP_GROUPS:
            return ""
        refusal = SCHEDULES.resolve(self.schedule).stop_groups_refusal
        if refusal:
            return refusal
        if not (self.micro_group or self.memory_mb):
            return ("with generation_micro_group 0 and no generation_memory_mb every sample starts at once, leaving "
                    "nothing to cancel; set generation_micro_group below prompts_per_step x num_generations")
        return ""

    def partial_rollouts_refusal(self) -> str:
        """Why partial_rollouts cannot run with these options ('' = it can)."""
        if SCHEDULES.resolve(self.schedule).plans_lanes:
            return ("generation_schedule length_aware plans every sample of a call at once (probe, then lanes); "
                    "a call that stops at a quota and resumes samples next step does not fit it: use round_robin")
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
def generate_in_slots(model, tokenizer, prompts: list[str], num_samples: int, options: SlotsOptions, *,
                      predictor: LengthPredictor | PrefixLengthPredictor | None = None,
                      watchers: tuple[Watcher, ...] = ()) -> Rollouts:
    """Sample ``num_samples`` completions per prompt, decoding at most ``options.micro_group`` at
    once (0: every sample at once; the memory cap is the engine's to resolve, not read here).

    ``watchers``: the call's, of kind ``stop_groups`` (early stop of saturated groups, see the
    module docstring). Schedule "length_aware" (continuous refill only) first decodes
    ``options.probe_tokens`` tokens of every sample (round robin), predicts each one's remaining
    length from its prompt and those tokens (``predictor``; a new one when None), balances the
    samples into the slots' lanes and resumes them shortest first within each lane. Returns
    :class:`Rollouts` [P, n, Lc] like the ``hf`` engine, with ``stats``: decode_steps (model
    calls after the prefill), generated_tokens, slots, slot_steps and live_slot_steps (rows
    decoding a sample, summed over decode steps; length_aware adds probe_steps and length_mae,
    the mean absolute error of the predicted remaining lengths); and ``generated`` [P, n] when a
    watcher was given. ``options.decode_path``: :func:`podsrl.rollout.kv_rows.cache_rows`.
    """
    run = SlotRun(model, tokenizer, prompts, num_samples, options, predictor=predictor, watchers=watchers)
    run.decode()
    watched = run.decoder.watcher is not None or run.decoder.watch is not None
    return run.rollouts(list(range(len(prompts))), with_generated=watched)


class SlotRun:
    """One call of the slots engine: the prompts prefilled, the decoder set up, for partial
    rollouts the groups carried in (:meth:`resume`), :meth:`decode`, then :meth:`rollouts` of
    the groups asked (:meth:`partial` for partial rollouts)."""

    def __init__(self, model, tokenizer, prompts: list[str], num_samples: int, options: SlotsOptions, *,
                 predictor: LengthPredictor | PrefixLengthPredictor | None = None,
                 watchers: tuple[Watcher, ...] = ()) -> None:
        schedule = SCHEDULES.resolve(options.schedule)
        check_options(options.refill, schedule, options.probe_tokens)
        self.model, self.tokenizer, self.schedule, self.options = model, tokenizer, schedule, options
        self.predictor = predictor_for(schedule, predictor)
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        self.prompt_ids, self.prompt_mask = enc["input_ids"], enc["attention_mask"]  # [P, Lp] on the CPU
        self.prompt_tokens = [ids[m.bool()].tolist() for ids, m in zip(self.prompt_ids, self.prompt_mask)]
        self.slots = min(options.micro_group or len(prompts) * num_samples, len(prompts) * num_samples)
        self.was_training = model.training
        model.eval()
        prompt_kv, prompt_logits = prefill(model, self.prompt_ids, self.prompt_mask, self.slots)
        self.prompt_level = isinstance(self.predictor, LengthPredictor)
        self.features = self.predictor.features(self.prompt_tokens) if self.prompt_level else None
        predicted = self.predictor.predict(self.features).tolist() if self.prompt_level else [0.0] * len(prompts)
        pending = PendingSamples(len(prompts), num_samples, schedule, predicted,
                                 self.predictor if self.prompt_level else None)
        self.decoder = SlotDecoder(model, prompt_kv, prompt_logits, pending, num_samples, options, tokenizer,
                                   watchers=watchers)
        self.stats = {}

    def resume(self, carried: dict[int, CarriedGroup], quota: int, version: int) -> None:
        """Partial rollouts: decode with the weights of step ``version`` until ``quota`` groups are
        complete, the groups in ``carried`` (by prompt position) continued from an earlier step."""
        self.decoder.version, self.decoder.quota = version, quota
        if carried:
            self.decoder.carry_in(carried, self.cut_off_prefixes(carried))

    def partial(self, quota: int, version: int) -> PartialGeneration:
        """After :meth:`decode`: the first ``quota`` complete groups as rollouts (tokens of earlier
        steps with their versions and log-probs), the rest, by position, to carry on."""
        decoder = self.decoder
        complete = decoder.completed[:quota]
        rollouts = self.rollouts(complete, with_generated=True)
        rollouts.token_versions, rollouts.sampling_logp = token_tensors(
            [decoder.completions[p] for p in complete], [decoder.versions[p] for p in complete],
            [decoder.logps[p] for p in complete], version, rollouts.completion_ids.shape[-1])
        # the tokens this call drew, in every group (the complete ones hold earlier steps' too)
        rollouts.stats["generated_tokens"] = sum(v == version for group in decoder.versions for sample in group
                                                 for v in sample)
        done = set(complete)
        left = [p for p in range(len(decoder.completions)) if p not in done]
        return PartialGeneration(rollouts, complete, {p: self.carried_group(p) for p in left})

    def cut_off_prefixes(self, carried: dict[int, CarriedGroup]) -> dict:
        """The keys and values, per layer [H, k - 1, d], of each cut-off sample's first k - 1
        tokens after its prompt, under the current weights (its last token is fed when it resumes)."""
        rows = [(p, s) for p, group in carried.items() for s in group.cut_off]
        if not rows:
            return {}
        sequences = [self.prompt_tokens[p] + carried[p].completions[s][:-1] for p, s in rows]
        width = max(map(len, sequences))
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)  # [N, L] left-padded
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, tokens in enumerate(sequences):
            ids[i, width - len(tokens):], mask[i, width - len(tokens):] = torch.tensor(tokens), 1
        kv, _ = prefill(self.model, ids, mask, self.slots)
        self.stats["resumed_prefill_tokens"] = sum(map(len, sequences))
        return {(p, s): [(keys[:, len(self.prompt_tokens[p]):], values[:, len(self.prompt_tokens[p]):])
                         for keys, values in layers] for (p, s), layers in zip(rows, kv)}

    def decode(self) -> None:
        decoder = self.decoder
        probe_tokens, refill = self.options.probe_tokens, self.options.refill
        if self.schedule.plans_lanes:  # stage 0: the probe; stage 1: the plan
            decoder.pause_at = probe_tokens
            decode(decoder, self.slots, refill)
            self.stats["probe_steps"] = decoder.decode_steps
            self.probed = sorted(decoder.paused)
            self.probe_features, self.probe_predicted = predict_remaining(self.predictor, self.prompt_tokens,
                                                               decoder.completions, self.probed,
                                                               self.options.max_completion_length - probe_tokens)
            decoder.pending = plan_lanes(self.probed, self.probe_predicted, self.slots)
            decoder.pause_at = 0
        decode(decoder, self.slots, refill)  # stage 2: runtime refill
        self.model.train(self.was_training)
        self.learn_lengths()

    def learn_lengths(self) -> None:
        """The length predictor learns from the samples that finished in this call."""
        decoder, completions = self.decoder, self.decoder.completions
        finished = decoder.finished_here()  # [P, n]
        if self.prompt_level:
            lengths = torch.tensor([[len(c) for c in group] for group in completions], dtype=torch.float64)
            self.predictor.update(self.features, lengths.masked_fill(~finished, float("nan")))  # no length to learn
        elif self.schedule.plans_lanes:
            probe_tokens = self.options.probe_tokens
            remaining = torch.tensor([len(completions[p][s]) - probe_tokens if finished[p, s] else float("nan")
                                      for p, s in self.probed], dtype=torch.float64)  # [N]
            self.stats["length_mae"] = self.predictor.learn(self.probe_features, self.probe_predicted, remaining)

    def rollouts(self, groups: list[int], with_generated: bool) -> Rollouts:
        """Rollouts [G, n, Lc] of the prompts at ``groups``; ``generated`` [G, n] when asked."""
        decoder, rows = self.decoder, torch.tensor(groups, dtype=torch.long)
        completions = [decoder.completions[p] for p in groups]
        rollouts = to_rollouts(self.tokenizer, self.prompt_ids[rows], self.prompt_mask[rows],
                               pack(completions, self.tokenizer.pad_token_id),
                               generated=decoder.generated()[rows] if with_generated else None)
        rollouts.stats.update(decode_steps=decoder.decode_steps, slots=self.slots,
                              slot_steps=self.slots * decoder.decode_steps, live_slot_steps=decoder.live_slot_steps,
                              **self.stats)
        if decoder.watch is not None:  # what a prune_running watcher was shown and stopped
            watch = decoder.watch
            rollouts.stats.update(watched_samples=watch.shown, pruned_samples=watch.pruned_samples,
                                  pruned_tokens=watch.pruned_tokens)
        if decoder.rows.reports_compile:  # graphs captured or the step compiled in this call (in its generation time)
            rollouts.stats["compile_seconds"] = decoder.rows.compile_seconds
        return rollouts

    def carried_group(self, prompt: int) -> CarriedGroup:
        decoder = self.decoder
        samples, finished = range(len(decoder.completions[prompt])), decoder.finished | decoder.finished_before
        return CarriedGroup([list(c) for c in decoder.completions[prompt]], [list(v) for v in decoder.versions[prompt]],
                            [list(lp) for lp in decoder.logps[prompt]], [(prompt, s) in finished for s in samples],
                            [(prompt, s) in decoder.skipped for s in samples])


@ENGINES.register("slots")
class SlotsEngine:
    """Decoding slots refilled sample by sample (:func:`generate_in_slots`); with a
    length-aware schedule it carries a completion-length predictor learned across steps."""

    # it cancels the unstarted samples of groups a watcher names (as its options allow), and
    # stops at a quota of complete groups, resuming the rest next step
    capabilities = Capabilities(watches={STOP_GROUPS, PRUNE_RUNNING}, partial_rollouts=True)
    options_type = SlotsOptions

    def __init__(self, options: SlotsOptions) -> None:
        self.options = options
        self.schedule = SCHEDULES.resolve(options.schedule)
        self.predictor = self.schedule.new_predictor()

    @torch.no_grad()
    def __call__(self, model, tokenizer, prompts: list[str], num_samples: int,
                 watchers: tuple[Watcher, ...] = (),
                 partial: PartialCall | None = None) -> Rollouts | PartialGeneration:
        """Every prompt's group (:func:`generate_in_slots`); with ``partial`` (partial rollouts,
        :mod:`podsrl.rollout.partial`), the prompts at the positions in ``partial.carried``
        continue their groups from an earlier step (cut-off samples first, their keys and values
        recomputed under the current weights), decoded until ``partial.quota`` groups are complete
        (:meth:`SlotRun.partial`): nothing more is decoded once the quota is met."""
        refuse_watchers(self, watchers)
        options = self.call_options(model, tokenizer, prompts, num_samples)
        if partial is None:
            return generate_in_slots(model, tokenizer, prompts, num_samples, options,
                                     predictor=self.predictor, watchers=watchers)
        run = SlotRun(model, tokenizer, prompts, num_samples, options, predictor=self.predictor,
                      watchers=watchers)
        run.resume(partial.carried, partial.quota, partial.version)
        run.decode()
        return run.partial(partial.quota, partial.version)

    def call_options(self, model, tokenizer, prompts: list[str], num_samples: int) -> SlotsOptions:
        """The options of one call: ``micro_group`` the slots the memory cap allows for these
        prompts (the cap is resolved here, never read by the decoder)."""
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
        return dataclasses.replace(options, micro_group=slots)

    def generate(self, model, tokenizer, prompts: list[str], num_samples: int, sampling: Sampling) -> Rollouts:
        """Evaluation's sampler: ``num_samples`` completions per prompt sampled as ``sampling``
        says (greedy at temperature 0), in its ``batch_size`` slots refilled sample by sample,
        first come first served, on this engine's decode path. Evaluation decodes long,
        variable-length completions too, where whole-batch decoding waits for the longest row;
        the training schedule and its learned length predictor stay untouched."""
        options = dataclasses.replace(self.options.sampled(sampling), micro_group=sampling.batch_size, memory_mb=0.0,
                                      refill="continuous", schedule="fifo")
        return generate_in_slots(model, tokenizer, prompts, num_samples, options)

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
