"""The data that flows between the stages of one training step, with its shapes.

P prompts per step, n rollouts generated per prompt, m kept (trained on) per prompt,
Lp prompt tokens, Lc completion tokens, B = P*m sequences in the update::

    prompts [P] -generate-> Rollouts [P, n, Lc] -reward-> Scores [P, n]
        -select-> kept indices [P, m] -advantages-> [P, m] -flatten-> UpdateBatch [B, ...]

The group axis stays explicit from generation to selection: rewards are never flattened
across prompts before selecting (variance is a within-group quantity).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch


def completion_mask_from_eos(completion_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1 up to and including the first EOS of each row, 0 after it; all 1 when no EOS.

    completion_ids [..., Lc] -> mask [..., Lc] (long)
    """
    is_eos = completion_ids == eos_token_id
    # number of EOS strictly before each position; a position is kept while that count is 0
    eos_before = torch.cumsum(is_eos.long(), dim=-1) - is_eos.long()
    return (eos_before == 0).long()


@dataclass
class Rollouts:
    """n completions for each of P prompts.

    prompt_ids       [P, Lp]     left-padded prompt tokens
    prompt_mask      [P, Lp]     1 on real prompt tokens
    completion_ids   [P, n, Lc]  generated tokens; positions after the first EOS are padding
    completion_mask  [P, n, Lc]  1 on generated tokens up to and including the first EOS
    texts            P lists of n decoded completions (special tokens removed)
    stats            engine counters: generated_tokens, decode_steps (model calls after the
                     prefill), and the engine's own (e.g. slots)
    generated        [P, n] bool: False where a sample was never generated (early stop skipped
                     it: its completion is empty, its mask 0, its text ""); None = all were
    sampling_logp    [P, n, Lc] float32: the log-prob of each generated token under the engine
                     that sampled it, when that engine is not the policy itself (vllm); None
                     otherwise (hf and slots sample from the policy's own forward pass)
    early_scores     Scores [P, n]: what early stop scored samples as they finished (reward NaN
                     where it scored none; the reward stage scores those); None without early stop
    token_versions   [P, n, Lc] long: the step whose weights generated each token (partial
                     rollouts: a sample carried over holds tokens of earlier steps); None = every
                     token is the current step's
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    texts: list[list[str]]
    stats: dict = field(default_factory=dict)
    generated: torch.Tensor | None = None
    sampling_logp: torch.Tensor | None = None
    early_scores: Scores | None = None
    token_versions: torch.Tensor | None = None

    @property
    def group_size(self) -> int:
        return self.completion_ids.shape[1]

    @property
    def generated_mask(self) -> torch.Tensor:
        """[P, n] bool, True where the sample exists (all True without early stop)."""
        if self.generated is None:
            return torch.ones(self.completion_ids.shape[:2], dtype=torch.bool)
        return self.generated

    def completion_id_lists(self) -> list[list[int]]:
        """[P*n] each completion's token ids without padding (up to and including its first
        EOS), prompt-major: TRL's ``completion_ids`` argument of reward functions."""
        width = self.completion_ids.shape[-1]
        rows = zip(self.completion_ids.reshape(-1, width).tolist(),
                   self.completion_mask.reshape(-1, width).tolist())
        return [[token for token, keep in zip(ids, mask) if keep] for ids, mask in rows]

    def kept(self, keep: torch.Tensor) -> "Rollouts":
        """The rollouts at ``keep`` [P, m] (indices into the group axis, what selection kept),
        prompt axis unchanged."""
        rows = torch.arange(keep.shape[0]).unsqueeze(1)  # [P, 1]
        return Rollouts(
            prompt_ids=self.prompt_ids,
            prompt_mask=self.prompt_mask,
            completion_ids=self.completion_ids[rows, keep],  # [P, m, Lc]
            completion_mask=self.completion_mask[rows, keep],
            texts=[[self.texts[p][j] for j in row] for p, row in enumerate(keep.tolist())],
            stats=self.stats,
            generated=None if self.generated is None else self.generated.gather(1, keep),
            sampling_logp=None if self.sampling_logp is None else self.sampling_logp[rows, keep],
            early_scores=None if self.early_scores is None else self.early_scores.kept(keep),
            token_versions=None if self.token_versions is None else self.token_versions[rows, keep],
        )

    def at_prompts(self, indices: list[int]) -> "Rollouts":
        """The prompt groups at ``indices`` (along P), in that order; ``stats`` stay the
        whole batch's (what generating it cost)."""
        rows = torch.tensor(indices, dtype=torch.long)
        return dataclasses.replace(self, prompt_ids=self.prompt_ids[rows], prompt_mask=self.prompt_mask[rows],
                                   completion_ids=self.completion_ids[rows],
                                   completion_mask=self.completion_mask[rows],
                                   texts=[self.texts[i] for i in indices],
                                   generated=None if self.generated is None else self.generated[rows],
                                   sampling_logp=None if self.sampling_logp is None
                                   else self.sampling_logp[rows],
                                   early_scores=None if self.early_scores is None
                                   else self.early_scores.at_prompts(indices),
                                   token_versions=None if self.token_versions is None
                                   else self.token_versions[rows])

    @staticmethod
    def none(group_size: int) -> "Rollouts":
        """No prompt's rollouts: [0, group_size, 1] (one padding column: a width of 0 leaves
        reshapes ambiguous), as partial rollouts' (token versions and sampling log-probs known)."""
        tokens = torch.zeros(0, group_size, 1, dtype=torch.long)
        return Rollouts(torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, 1, dtype=torch.long), tokens,
                        tokens.clone(), [], {"generated_tokens": 0, "decode_steps": 0},
                        sampling_logp=torch.zeros(0, group_size, 1), token_versions=tokens.clone())

    @staticmethod
    def concat(chunks: list["Rollouts"], pad_token_id: int) -> "Rollouts":
        """Rollouts of consecutive prompt chunks as one batch: prompts re-padded on the left,
        completions on the right (masks padded with 0), group axis kept."""
        if len(chunks) == 1:
            return chunks[0]
        prompt_width = max(r.prompt_ids.shape[1] for r in chunks)
        completion_width = max(r.completion_ids.shape[2] for r in chunks)
        pad = torch.nn.functional.pad

        def left(t, value):
            return pad(t, (prompt_width - t.shape[1], 0), value=value)

        def right(t, value):
            return pad(t, (0, completion_width - t.shape[2]), value=value)

        # those every chunk has (a prune_running watcher's counters, when each chunk ran one)
        summed = ("generated_tokens", "decode_steps", "slot_steps", "live_slot_steps", "watched_samples",
                  "pruned_samples", "pruned_tokens")
        stats = {k: sum(r.stats[k] for r in chunks) for k in summed if all(k in r.stats for r in chunks)}
        generated = (None if all(r.generated is None for r in chunks)
                     else torch.cat([r.generated_mask for r in chunks]))
        sampling_logp = None if any(r.sampling_logp is None for r in chunks) else torch.cat(
            [right(r.sampling_logp, 0.0) for r in chunks])  # [P, n, Lc]
        early_scores = None if any(r.early_scores is None for r in chunks) else Scores.concat(
            [r.early_scores for r in chunks])  # [P, n]
        if len({r.token_versions is None for r in chunks}) > 1:
            raise ValueError("Rollouts.concat: chunks with and without token versions (partial rollouts)")
        token_versions = None if chunks[0].token_versions is None else torch.cat(
            [right(r.token_versions, 0) for r in chunks])  # [P, n, Lc]
        return Rollouts(prompt_ids=torch.cat([left(r.prompt_ids, pad_token_id) for r in chunks]),  # [P, Lp]
                        prompt_mask=torch.cat([left(r.prompt_mask, 0) for r in chunks]),
                        completion_ids=torch.cat([right(r.completion_ids, pad_token_id) for r in chunks]),
                        # [P, n, Lc]
                        completion_mask=torch.cat([right(r.completion_mask, 0) for r in chunks]),
                        texts=[group for r in chunks for group in r.texts], stats=stats, generated=generated,
                        sampling_logp=sampling_logp, early_scores=early_scores, token_versions=token_versions)


@dataclass
class Scores:
    """What the reward stage says about every rollout, [P, n] each.

    reward        the training reward (a weighted sum; unverifiable samples score 0)
    correct       the task's own correctness, the accuracy metric (NaN where not verifiable)
    format        the task's format reward (NaN when user reward functions replace it)
    unverifiable  True where no reward function could judge the sample
    """

    reward: torch.Tensor
    correct: torch.Tensor
    format: torch.Tensor
    unverifiable: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The four tensors, in field order (``Scores(*tensors)`` rebuilds them)."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def kept(self, keep: torch.Tensor) -> "Scores":
        """The scores at ``keep`` [P, m] (indices into the group axis), prompt axis unchanged."""
        return Scores(*(tensor.gather(1, keep) for tensor in self.tensors()))

    def at_prompts(self, indices: list[int]) -> "Scores":
        """The scores of the prompt groups at ``indices`` (along P), in that order."""
        rows = torch.tensor(indices, dtype=torch.long)
        return Scores(*(tensor[rows] for tensor in self.tensors()))

    @staticmethod
    def concat(chunks: list["Scores"]) -> "Scores":
        """Scores of consecutive prompt chunks as one batch [sum P, n]."""
        return Scores(*(torch.cat(same) for same in zip(*(s.tensors() for s in chunks))))


@dataclass
class UpdateBatch:
    """The kept rollouts as sequences for the update, B = P*m rows (a group's rows adjacent).

    input_ids        [B, Lp + Lc]  prompt (left-padded) then completion (right-padded)
    attention_mask   [B, Lp + Lc]
    completion_mask  [B, Lc]       the tokens the loss is taken over
    advantages       [B]           one per sequence
    old_logp         [B, Lc]       the generating policy's log-probs (num_iterations > 1), or None
    ref_logp         [B, Lc]       the reference policy's log-probs (beta > 0), or None
    sampling_logp    [B, Lc]       the sampling engine's log-probs (Rollouts.sampling_logp), or None
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    advantages: torch.Tensor
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    sampling_logp: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.advantages.shape[0]

    @property
    def prompt_columns(self) -> int:
        return self.input_ids.shape[1] - self.completion_mask.shape[1]

    def rows(self, start: int, stop: int) -> "UpdateBatch":
        """Sequences start..stop-1, with every column."""
        return UpdateBatch(**{f.name: None if getattr(self, f.name) is None
                              else getattr(self, f.name)[start:stop] for f in dataclasses.fields(self)})

    def trimmed(self) -> "UpdateBatch":
        """The same rows without the columns that are padding in every row (on both sides)."""
        prompt_cols = self.prompt_columns
        completion_len = int(self.completion_mask.sum(1).max())
        first_real = int((self.attention_mask[:, :prompt_cols].sum(0) > 0).nonzero().min())
        end = prompt_cols + completion_len

        def completion(t):
            return None if t is None else t[:, :completion_len]

        return UpdateBatch(self.input_ids[:, first_real:end], self.attention_mask[:, first_real:end],
                           completion(self.completion_mask), self.advantages, completion(self.old_logp),
                           completion(self.ref_logp), completion(self.sampling_logp))

    def to(self, device) -> "UpdateBatch":
        return UpdateBatch(**{f.name: None if getattr(self, f.name) is None
                              else getattr(self, f.name).to(device) for f in dataclasses.fields(self)})
