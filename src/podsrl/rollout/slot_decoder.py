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
                 top_p: float, stopper: Stopper | None = None) -> None:
        self.model, self.prompt_kv, self.prompt_logits, self.pending = model, prompt_kv, prompt_logits, pending
        self.stopper = stopper
        self.unscored: list[tuple[int, int]] = []  # finished since the stopper last saw them
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

    @property
    def live(self) -> bool:
        return any(s is not None for s in self.row_sample)

    def _finish(self, prompt: int, sample: int) -> None:
        self.pending.record(prompt, sample, len(self.completions[prompt][sample]))
        if self.stopper is not None:
            self.unscored.append((prompt, sample))

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
            firsts = next_tokens(self.prompt_logits[[p for p, _ in batch]], self.temperature, self.top_p).tolist()
            for (prompt, sample), token in zip(batch, firsts):
                self.completions[prompt][sample].append(token)
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
            cancelled = set(self.pending.cancel(prompt)) | {s for p, s in self.paused if p == prompt}
            for sample in sorted(cancelled):
                self.skipped.add((prompt, sample))
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
        self.column_mask = attention_mask
        tokens = next_tokens(out.logits[:, -1, :].float(), self.temperature, self.top_p).tolist()  # [B]
        del out
        ended = []
        for row, token in enumerate(tokens):
            if self.row_sample[row] is None:
                continue
            prompt, sample = self.row_sample[row]
            self.completions[prompt][sample].append(token)
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
    or micro-group by micro-group (group)."""
    decoder.start_group(slots)
    while decoder.live:
        ended = decoder.step()
        if decoder.stopper is not None:
            decoder.stop_saturated()
        if refill == "continuous" and ended:
            decoder.fill([row for row, s in enumerate(decoder.row_sample) if s is None])
            decoder.drop_idle_rows()  # nothing left to start in them: stop decoding them
        elif refill == "group" and not decoder.live:  # the micro-group is done: the next one
            decoder.keep_rows([])
            decoder.start_group(slots)
        # (naive micro-groups keep decoding rows whose sample ended until the whole group is done)
        decoder.trim_columns()
