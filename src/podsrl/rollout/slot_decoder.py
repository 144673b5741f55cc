"""The slots engine's decoder (:class:`SlotDecoder`): decoding slots over one shared KV cache,
with admission, refill, pausing and compaction; the algorithm and the cache layout are
described in :mod:`podsrl.rollout.slots`, which drives it."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from podsrl.rollout.base import Stopper
from podsrl.rollout.sampling import next_tokens
from podsrl.rollout.schedule import PendingSamples


def full_attention_layers(cache) -> list:
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise NotImplementedError(f"generation_engine 'slots' supports full-attention KV caches only; this model's "
                                  f"cache has layers of type {kinds}: use generation_engine 'hf'")
    return cache.layers


def prefill(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, chunk: int):
    """Run every prompt through the model once, in chunks of at most ``chunk`` rows.

    prompt_ids, prompt_mask [P, Lp] (left-padded) -> (per prompt, per layer, its keys and
    values [H, Lp_i, d] without padding; the logits of its last token [P, V] in float32)."""
    device = model.device
    lengths = prompt_mask.sum(dim=1).tolist()
    prompt_kv, last_logits = [], []
    for start in range(0, prompt_ids.shape[0], chunk):
        ids, mask = prompt_ids[start:start + chunk].to(device), prompt_mask[start:start + chunk].to(device)
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp_min(0),
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        last_logits.append(out.logits[:, -1, :].float())
        layers = full_attention_layers(cache)
        for row in range(ids.shape[0]):
            length = lengths[start + row]
            prompt_kv.append([(layer.keys[row, :, -length:].clone(), layer.values[row, :, -length:].clone())
                              for layer in layers])
        del out, cache
    return prompt_kv, torch.cat(last_logits)


class SlotDecoder:
    """The decoding state of a batch of prompts' samples in a bounded number of cache rows.

    Row r of the cache decodes sample ``row_sample[r]`` = (prompt, sample), or idles (None).
    ``column_mask`` [B, W] marks which cache columns belong to each row; ``last_token`` and
    ``position`` [B] are the token to feed next and its position id. The parts:
    admission (:meth:`open_rows`, :meth:`place`), refill (:meth:`fill`), row and column
    compaction (:meth:`keep_rows`, :meth:`trim_columns`) and :meth:`step`.
    """

    def __init__(self, model, prompt_kv: list, prompt_logits: torch.Tensor, pending: PendingSamples,
                 num_samples: int, *, eos: int, pad: int, max_new_tokens: int, temperature: float,
                 top_p: float, stopper: Stopper | None = None, version: int | None = None) -> None:
        self.model, self.prompt_kv, self.prompt_logits, self.pending = model, prompt_kv, prompt_logits, pending
        self.stopper = stopper
        # partial rollouts (``version``: the step whose weights decode now; None: off): per token, the
        # step that drew it and its log-prob then (at temperature 1, as the update's loss takes it),
        # for the importance correction of tokens the update finds stale
        self.version = version
        self.versions: list[list[list[int]]] = [[[] for _ in range(num_samples)] for _ in prompt_kv]
        self.logps: list[list[list[float]]] = [[[] for _ in range(num_samples)] for _ in prompt_kv]
        self.resuming: set[tuple[int, int]] = set()  # cut off in an earlier step: decoded to the end
        # partial rollouts stop decoding once ``quota`` groups are complete (0: never); ``group_left``
        # counts each group's samples neither finished nor skipped, ``completed`` lists the groups in
        # the order they completed
        self.quota = 0
        self.group_left = [num_samples] * len(prompt_kv)
        self.completed: list[int] = []
        self.unscored: list[tuple[int, int]] = []  # finished since the stopper last saw them
        self.finished: set[tuple[int, int]] = set()  # (prompt, sample) finished in this call
        self.finished_before: set[tuple[int, int]] = set()  # finished in an earlier step (partial rollouts)
        self.skipped: set[tuple[int, int]] = set()  # (prompt, sample) never generated (early stop)
        # the length-aware schedule's probe: a sample that reaches ``pause_at`` tokens leaves its
        # slot; ``paused`` keeps, per layer, the keys and values [H, pause_at - 1, d] of its
        # tokens fed so far (its last token is fed when it resumes)
        self.pause_at = 0
        self.paused: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.prompt_lengths = [kv[0][0].shape[1] for kv in prompt_kv]
        self.eos, self.pad, self.max_new_tokens = eos, pad, max_new_tokens
        self.temperature, self.top_p = temperature, top_p
        self.completions: list[list[list[int]]] = [[[] for _ in range(num_samples)] for _ in prompt_kv]
        device = model.device
        self.cache = DynamicCache(config=model.config)
        self.layers = None
        self.row_sample: list[tuple[int, int] | None] = []
        self.column_mask = torch.zeros(0, 0, dtype=torch.long, device=device)  # [B, W]
        self.last_token = torch.zeros(0, dtype=torch.long, device=device)  # [B]
        self.position = torch.zeros(0, dtype=torch.long, device=device)  # [B]
        self.decode_steps = 0
        self.live_slot_steps = 0  # rows decoding a sample, summed over decode steps

    @property
    def live(self) -> bool:
        return any(s is not None for s in self.row_sample)

    @property
    def quota_met(self) -> bool:
        return 0 < self.quota <= len(self.completed)

    def _append(self, prompt: int, sample: int, token: int, logp: float | None) -> None:
        self.completions[prompt][sample].append(token)
        if self.version is not None:
            self.versions[prompt][sample].append(self.version)
            self.logps[prompt][sample].append(logp)

    def _drew(self, logits: torch.Tensor, tokens: torch.Tensor) -> list[float | None]:
        """The log-probs [B] of ``tokens`` [B] under ``logits`` [B, V] at temperature 1 (partial
        rollouts only: nothing is computed otherwise)."""
        if self.version is None:
            return [None] * len(tokens)
        return logits.log_softmax(dim=-1).gather(1, tokens[:, None]).squeeze(1).tolist()

    def _complete(self, prompt: int) -> None:
        self.group_left[prompt] -= 1
        if not self.group_left[prompt]:
            self.completed.append(prompt)

    def _finish(self, prompt: int, sample: int) -> None:
        self.pending.record(prompt, sample, len(self.completions[prompt][sample]))
        self.finished.add((prompt, sample))
        self._complete(prompt)
        if self.stopper is not None:
            self.unscored.append((prompt, sample))

    def carry_in(self, groups: dict, prefixes: dict) -> None:
        """Partial rollouts: the groups (prompt -> :class:`~podsrl.rollout.partial.CarriedGroup`)
        continued from an earlier step. Their samples' tokens so far are taken over; finished ones
        are shown to the stopper again (this call's stopper has not seen them), skipped ones stay
        skipped, cut-off ones resume first with their ``prefixes`` (keys and values per layer)."""
        for prompt, group in groups.items():
            self.completions[prompt] = [list(tokens) for tokens in group.completions]
            self.versions[prompt] = [list(v) for v in group.versions]
            self.logps[prompt] = [list(lp) for lp in group.logps]
            for sample in group.done:
                if group.skipped[sample]:
                    self.skipped.add((prompt, sample))
                else:
                    self.finished_before.add((prompt, sample))
                    if self.stopper is not None:
                        self.unscored.append((prompt, sample))
                self._complete(prompt)
            self.pending.carry_in(prompt, group.done, group.cut_off)
            self.resuming.update((prompt, sample) for sample in group.cut_off)
        self.paused.update(prefixes)

    def finished_here(self) -> torch.Tensor:
        """[P, n] bool: the samples that finished in this call."""
        mask = torch.zeros(len(self.completions), len(self.completions[0]), dtype=torch.bool)
        for prompt, sample in self.finished:
            mask[prompt, sample] = True
        return mask

    # --- admission ----------------------------------------------------------------------------
    def open_rows(self, count: int) -> list[int]:
        """Append ``count`` idle rows (zero cache, masked) and return their indices."""
        first = len(self.row_sample)
        self.row_sample.extend([None] * count)
        width = self.column_mask.shape[1]
        self.column_mask = torch.cat([self.column_mask, self.column_mask.new_zeros(count, width)])
        self.last_token = torch.cat([self.last_token, self.last_token.new_full((count,), self.pad)])
        self.position = torch.cat([self.position, self.position.new_zeros(count)])
        if self.layers is None:  # first rows: initialise the cache with one empty column per layer
            for index, (keys, values) in enumerate(self.prompt_kv[0]):
                shape = (count, keys.shape[0], 0, keys.shape[-1])
                self.cache.update(keys.new_zeros(shape), values.new_zeros(shape), index)
            self.layers = full_attention_layers(self.cache)
        else:
            for layer in self.layers:
                layer.keys = torch.cat([layer.keys, layer.keys.new_zeros((count, *layer.keys.shape[1:]))])
                layer.values = torch.cat([layer.values, layer.values.new_zeros((count, *layer.values.shape[1:]))])
        return list(range(first, first + count))

    def start_samples(self, count: int) -> list[tuple[int, int, int]]:
        """Pop up to ``count`` samples that still need a slot, each with its first token
        drawn from its prompt's stored logits: (prompt, sample, first token). Samples that
        end on their first token finish here and take no slot."""
        started = []
        while len(started) < count and len(self.pending):
            batch = [self.pending.pop() for _ in range(min(count - len(started), len(self.pending)))]
            started += [(p, s, self.completions[p][s][-1]) for p, s in batch if (p, s) in self.paused]
            batch = [(p, s) for p, s in batch if (p, s) not in self.paused]
            if not batch:
                continue
            logits = self.prompt_logits[[p for p, _ in batch]]  # [b, V]
            firsts = next_tokens(logits, self.temperature, self.top_p)
            for (prompt, sample), token, logp in zip(batch, firsts.tolist(), self._drew(logits, firsts)):
                self._append(prompt, sample, token, logp)
                if token == self.eos or self.max_new_tokens == 1:
                    self._finish(prompt, sample)
                else:
                    started.append((prompt, sample, token))
        return started

    def context_length(self, prompt: int, sample: int) -> int:
        """Cache columns a starting sample needs: its prompt's, and those of a paused prefix."""
        prefix = self.paused.get((prompt, sample))
        return self.prompt_lengths[prompt] + (prefix[0][0].shape[1] if prefix else 0)

    def place(self, rows: list[int], started: list[tuple[int, int, int]]) -> None:
        """Put each started sample's prompt cache (and a resumed sample's own prefix after it)
        into its row, right-aligned at the current width."""
        need = max(self.context_length(p, s) for p, s, _ in started)
        width = self.column_mask.shape[1]
        if need > width:  # widen every row on the left; the new columns are masked out
            grow = need - width
            self.column_mask = torch.nn.functional.pad(self.column_mask, (grow, 0))
            for layer in self.layers:
                layer.keys = torch.nn.functional.pad(layer.keys, (0, 0, grow, 0))
                layer.values = torch.nn.functional.pad(layer.values, (0, 0, grow, 0))
            width = need
        for row, (prompt, sample, token) in zip(rows, started):
            length = self.context_length(prompt, sample)
            prefix = self.paused.pop((prompt, sample), None) or [(None, None)] * len(self.layers)
            self.column_mask[row] = 0
            self.column_mask[row, width - length:] = 1
            for layer, (keys, values), (prefix_keys, prefix_values) in zip(self.layers, self.prompt_kv[prompt], prefix):
                if prefix_keys is not None:
                    keys, values = torch.cat([keys, prefix_keys], dim=1), torch.cat([values, prefix_values], dim=1)
                layer.keys[row, :, :width - length] = 0
                layer.keys[row, :, width - length:] = keys
                layer.values[row, :, :width - length] = 0
                layer.values[row, :, width - length:] = values
            self.row_sample[row] = (prompt, sample)
            self.last_token[row] = token
            self.position[row] = length

    # --- refill -------------------------------------------------------------------------------
    def fill(self, rows: list[int]) -> None:
        """Start pending samples in ``rows`` (those left idle stay None)."""
        started = self.start_samples(len(rows))
        if started:
            self.place(rows[:len(started)], started)

    def start_group(self, slots: int) -> None:
        """Open up to ``slots`` rows for the next pending samples (a new micro-group)."""
        if len(self.pending):
            self.fill(self.open_rows(min(slots, len(self.pending))))
            self.drop_idle_rows()  # samples that ended on their first token

    # --- early stop ---------------------------------------------------------------------------
    def stop_saturated(self) -> None:
        """Show the samples finished since the last call to the stopper; for every group it
        reports saturated, cancel the samples that have not started.

        Samples already running are decoded to the end: stopping them too saved more decode
        steps but biased the kept set toward short completions (the first to finish; on
        SmolLM2 chat completions the kept ones were 22% shorter than plain PODS's, see
        benchmarks/RESULTS.md). Under fifo and round_robin which samples start does not
        depend on their lengths, so the generated set stays a fair draw. Under length_aware
        the parked samples resume shortest-predicted first, so those cancelled are the ones
        predicted long: a bias as large as the predictor's skill (measured in RESULTS.md)."""
        if not self.unscored:
            return
        finished, self.unscored = self.unscored, []
        saturated = self.stopper([p for p, _ in finished], [self.completions[p][s] for p, s in finished])
        for prompt in sorted(set(saturated)):
            # unstarted samples, and (length_aware) those parked after the probe, whose tokens are dropped
            cancelled = set(self.pending.cancel(prompt)) | {s for p, s in self.paused
                                                            if p == prompt and (p, s) not in self.resuming}
            for sample in sorted(cancelled):
                self.skipped.add((prompt, sample))
                self._complete(prompt)
                if self.paused.pop((prompt, sample), None) is not None:
                    self.completions[prompt][sample] = []

    def generated(self) -> torch.Tensor:
        """[P, n] bool: False for the samples early stop skipped."""
        mask = torch.ones(len(self.completions), len(self.completions[0]), dtype=torch.bool)
        for prompt, sample in self.skipped:
            mask[prompt, sample] = False
        return mask

    # --- compaction ---------------------------------------------------------------------------
    def keep_rows(self, keep: list[int]) -> None:
        index = torch.tensor(keep, dtype=torch.long, device=self.column_mask.device)
        self.column_mask, self.last_token, self.position = \
            self.column_mask[index], self.last_token[index], self.position[index]
        self.row_sample = [self.row_sample[i] for i in keep]
        for layer in self.layers:
            layer.keys, layer.values = layer.keys[index], layer.values[index]

    def drop_idle_rows(self) -> None:
        if any(s is None for s in self.row_sample):
            self.keep_rows([row for row, s in enumerate(self.row_sample) if s is not None])

    def trim_columns(self) -> None:
        """Drop the leading cache columns no live row uses."""
        if not self.row_sample:
            return
        live = self.column_mask.any(dim=0).nonzero()
        first = int(live.min()) if len(live) else self.column_mask.shape[1]
        if first:
            self.column_mask = self.column_mask[:, first:]
            for layer in self.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]

    # --- decoding -----------------------------------------------------------------------------
    def step(self) -> list[int]:
        """One decode step of every row; returns the rows whose sample ended."""
        attention_mask = torch.cat([self.column_mask, self.column_mask.new_ones(len(self.row_sample), 1)], dim=1)
        out = self.model(input_ids=self.last_token[:, None], attention_mask=attention_mask,
                         position_ids=self.position[:, None], past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1)
        self.decode_steps += 1
        self.live_slot_steps += sum(s is not None for s in self.row_sample)
        self.column_mask = attention_mask
        logits = out.logits[:, -1, :].float()  # [B, V]
        del out
        drawn = next_tokens(logits, self.temperature, self.top_p)  # [B]
        ended = []
        for row, (token, logp) in enumerate(zip(drawn.tolist(), self._drew(logits, drawn))):
            if self.row_sample[row] is None:
                continue
            prompt, sample = self.row_sample[row]
            self._append(prompt, sample, token, logp)
            self.last_token[row] = token
            self.position[row] += 1
            if token == self.eos or len(self.completions[prompt][sample]) == self.max_new_tokens:
                self._finish(prompt, sample)
                self.row_sample[row] = None
                ended.append(row)
            elif len(self.completions[prompt][sample]) == self.pause_at:
                fed = self.pause_at - 1  # this row's last columns hold its fed tokens
                self.paused[(prompt, sample)] = [
                    (layer.keys[row, :, -fed:].clone(), layer.values[row, :, -fed:].clone()) for layer in self.layers]
                self.row_sample[row] = None
                ended.append(row)
        return ended


def decode(decoder: SlotDecoder, slots: int, refill: str) -> None:
    """Decode until nothing is pending or running: refill freed slots at once (continuous)
    or micro-group by micro-group (group); with a quota (partial rollouts), stop as soon as
    that many groups are complete, leaving the rest where they are."""
    if decoder.stopper is not None:
        decoder.stop_saturated()  # samples finished in an earlier step (partial rollouts) may saturate a group
    if not decoder.quota_met:
        decoder.start_group(slots)
    while decoder.live:
        ended = decoder.step()
        if decoder.stopper is not None:
            decoder.stop_saturated()
        if decoder.quota_met:
            break  # the samples still running carry over: no more compute goes to them this step
        if refill == "continuous" and ended:
            decoder.fill([row for row, s in enumerate(decoder.row_sample) if s is None])
            decoder.drop_idle_rows()  # nothing left to start in them: stop decoding them
        elif refill == "group" and not decoder.live:  # the micro-group is done: the next one
            decoder.keep_rows([])
            decoder.start_group(slots)
        # (naive micro-groups keep decoding rows whose sample ended until the whole group is done)
        decoder.trim_columns()
