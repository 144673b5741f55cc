"""The slots engine's decoder (:class:`SlotDecoder`): decoding slots over one shared KV cache,
with admission, refill, pausing and compaction; the algorithm and the cache layout are
described in :mod:`podsrl.rollout.slots`, which drives it."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from podsrl.rollout.base import EngineOptions, Watcher, group_stopper, running_watcher
from podsrl.rollout.kv_rows import cache_rows, full_attention_layers
from podsrl.rollout.running_watch import RunningWatch
from podsrl.rollout.sampling import next_tokens
from podsrl.rollout.schedule import PendingSamples


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

    Row r of the cache (``rows``: :mod:`podsrl.rollout.kv_rows`, podsrl's decode step or the
    model's forward) decodes sample ``row_sample[r]`` = (prompt, sample), or idles (None). Per row,
    as tensors [B]: ``last_token`` and ``position`` (the token to feed next and its position id),
    ``live_rows``, ``length`` (the sample's completion length so far); ``drawn`` [B, max_completion_length]
    holds the tokens a row drew at completion indices [row_base[r], length[r]) until the sample
    ends or pauses (then they join ``completions``): a step is whole-tensor work, and only rows
    that end or pause go through Python. The parts: admission (:meth:`open_rows`, :meth:`place`),
    refill (:meth:`fill`), row and column compaction (:meth:`keep_rows`, :meth:`trim_columns`) and
    :meth:`step`.
    """

    def __init__(self, model, prompt_kv: list, prompt_logits: torch.Tensor, pending: PendingSamples,
                 num_samples: int, options: EngineOptions, tokenizer,
                 watchers: tuple[Watcher, ...] = ()) -> None:
        self.model, self.prompt_kv, self.prompt_logits, self.pending = (model, prompt_kv, prompt_logits,
                                                                        pending)
        # the call's options (podsrl.rollout.slots.SlotsOptions: the engine's, or evaluation's
        # sampling over them); it reads max_completion_length, temperature, top_p and decode_path
        self.options = options
        self.watcher = group_stopper(watchers)  # of kind stop_groups (early stop), or None
        pruner = running_watcher(watchers)  # of kind prune_running, or None
        self.watch = (RunningWatch(pruner, model.config.get_text_config().hidden_size, model.device)
                      if pruner is not None else None)
        # partial rollouts (``version``: the step whose weights decode now, set by the call that
        # resumes groups; None: off): per token, the step that drew it and its log-prob then (at
        # temperature 1, as the update's loss takes it), for the importance correction of tokens
        # the update finds stale
        self.version: int | None = None
        self.versions: list[list[list[int]]] = [[[] for _ in range(num_samples)] for _ in prompt_kv]
        self.logps: list[list[list[float]]] = [[[] for _ in range(num_samples)] for _ in prompt_kv]
        self.resuming: set[tuple[int, int]] = set()  # cut off in an earlier step: decoded to the end
        # partial rollouts stop decoding once ``quota`` groups are complete (0: never); ``group_left``
        # counts each group's samples neither finished nor skipped, ``completed`` lists the groups in
        # the order they completed
        self.quota = 0
        self.group_left = [num_samples] * len(prompt_kv)
        self.completed: list[int] = []
        self.unscored: list[tuple[int, int]] = []  # finished since the watcher last saw them
        self.finished: set[tuple[int, int]] = set()  # (prompt, sample) finished in this call
        self.finished_before: set[tuple[int, int]] = set()  # finished in an earlier step (partial rollouts)
        # (prompt, sample) never generated: early stop cancelled it, or a prune_running watcher stopped it
        self.skipped: set[tuple[int, int]] = set()
        # the length-aware schedule's probe: a sample that reaches ``pause_at`` tokens leaves its
        # slot; ``paused`` keeps, per layer, the keys and values [H, pause_at - 1, d] of its
        # tokens fed so far (its last token is fed when it resumes)
        self.pause_at = 0
        self.paused: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.prompt_lengths = [kv[0][0].shape[1] for kv in prompt_kv]
        self.eos, self.pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.completions: list[list[list[int]]] = [[[] for _ in range(num_samples)] for _ in prompt_kv]
        device = model.device
        length = options.max_completion_length
        self.rows = cache_rows(model, prompt_kv, length, options.decode_path,
                               hidden=self.watch is not None)[0]
        self.row_sample: list[tuple[int, int] | None] = []
        self.row_base: list[int] = []  # completion tokens a row's sample had when it was placed
        self.last_token = torch.zeros(0, dtype=torch.long, device=device)  # [B]
        self.position = torch.zeros(0, dtype=torch.long, device=device)  # [B]
        self.live_rows = torch.zeros(0, dtype=torch.bool, device=device)  # [B]
        self.length = torch.zeros(0, dtype=torch.long, device=device)  # [B]
        self.drawn = torch.zeros(0, length, dtype=torch.long, device=device)  # [B, T]
        self.drawn_logp = torch.zeros(0, length, dtype=torch.float, device=device)  # [B, T]
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
        if self.watcher is not None:
            self.unscored.append((prompt, sample))

    def carry_in(self, groups: dict, prefixes: dict) -> None:
        """Partial rollouts: the groups (prompt -> :class:`~podsrl.rollout.partial.CarriedGroup`)
        continued from an earlier step. Their samples' tokens so far are taken over; finished ones
        are shown to the watcher again (this call's watcher has not seen them), skipped ones stay
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
                    if self.watcher is not None:
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
        """Append ``count`` idle rows and return their indices."""
        first = len(self.row_sample)
        self.row_sample.extend([None] * count)
        self.row_base.extend([0] * count)
        self.last_token = torch.cat([self.last_token, self.last_token.new_full((count,), self.pad)])
        self.position = torch.cat([self.position, self.position.new_zeros(count)])
        self.live_rows = torch.cat([self.live_rows, self.live_rows.new_zeros(count)])
        self.length = torch.cat([self.length, self.length.new_zeros(count)])
        self.drawn = torch.cat([self.drawn, self.drawn.new_zeros(count, self.drawn.shape[1])])
        self.drawn_logp = torch.cat([self.drawn_logp, self.drawn_logp.new_zeros(count, self.drawn.shape[1])])
        self.rows.open(count)
        if self.watch is not None:
            self.watch.open(count)
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
            firsts = next_tokens(logits, self.options.temperature, self.options.top_p)
            for (prompt, sample), token, logp in zip(batch, firsts.tolist(), self._drew(logits, firsts)):
                self._append(prompt, sample, token, logp)
                if token == self.eos or self.options.max_completion_length == 1:
                    self._finish(prompt, sample)
                else:
                    started.append((prompt, sample, token))
        return started

    def place(self, rows: list[int], started: list[tuple[int, int, int]]) -> None:
        """Put each started sample's prompt cache (and a resumed sample's own prefix after it)
        into its row."""
        kvs = []
        for prompt, sample, _ in started:
            prefix = self.paused.pop((prompt, sample), None)
            kvs.append(self.prompt_kv[prompt] if prefix is None else
                       [(torch.cat([k, pk], dim=1), torch.cat([v, pv], dim=1))
                        for (k, v), (pk, pv) in zip(self.prompt_kv[prompt], prefix)])
        self.rows.place(rows, kvs)
        for row, (prompt, sample, token), kv in zip(rows, started, kvs):
            self.row_sample[row] = (prompt, sample)
            self.row_base[row] = len(self.completions[prompt][sample])
            self.last_token[row] = token
            self.position[row] = kv[0][0].shape[1]
            self.live_rows[row] = True
            self.length[row] = self.row_base[row]
        if self.watch is not None:
            self.watch.place(rows, [(p, s, len(self.completions[p][s])) for p, s, _ in started])

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
        """Show the samples finished since the last call to the watcher; for every group it
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
        saturated = self.watcher([p for p, _ in finished], [self.completions[p][s] for p, s in finished])
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
        """Keep the rows ``keep`` (each row's state moves with it): the kept rows past the first
        len(keep) fill the first ones' holes, so rows that stay need no copy."""
        staying = [row for row in keep if row < len(keep)]
        holes = sorted(set(range(len(keep))) - set(staying))
        order = list(range(len(keep)))
        for hole, row in zip(holes, [row for row in keep if row >= len(keep)]):
            order[hole] = row
        index = torch.tensor(order, dtype=torch.long, device=self.position.device)
        for name in ("last_token", "position", "live_rows", "length", "drawn", "drawn_logp"):
            setattr(self, name, getattr(self, name)[index])
        self.row_sample = [self.row_sample[i] for i in order]
        self.row_base = [self.row_base[i] for i in order]
        self.rows.reorder(order)
        if self.watch is not None:
            self.watch.reorder(index)

    def drop_idle_rows(self) -> None:
        if any(s is None for s in self.row_sample):
            self.keep_rows([row for row, s in enumerate(self.row_sample) if s is not None])

    def trim_columns(self) -> None:
        """Drop the leading cache columns no live row uses (the model-forward rows)."""
        if self.row_sample:
            self.rows.trim()

    # --- decoding -----------------------------------------------------------------------------
    def step(self) -> list[int]:
        """One decode step of every row; returns the rows whose sample ended or paused."""
        logits = self.rows.step(self.last_token, self.position)  # [B, V]
        self.decode_steps += 1
        self.live_slot_steps += len(self.row_sample) - self.row_sample.count(None)
        drawn = next_tokens(logits, self.options.temperature, self.options.top_p)  # [B]
        index = torch.arange(len(drawn), device=drawn.device)
        # idle rows write where nothing is read
        column = self.length.clamp(max=self.options.max_completion_length - 1)
        self.drawn[index, column] = drawn
        if self.version is not None:  # log-probs at temperature 1, as the update's loss takes them
            self.drawn_logp[index, column] = logits.log_softmax(dim=-1).gather(1, drawn[:, None]).squeeze(1)
        live = self.live_rows
        self.length += live
        self.position += live
        self.last_token = torch.where(live, drawn, self.last_token)
        ended = live & ((drawn == self.eos) | (self.length == self.options.max_completion_length))
        stopping = ended | (live & (self.length == self.pause_at)) if self.pause_at else ended
        pruned = self._watch_running(live & ~stopping) if self.watch is not None else []
        if not bool(stopping.any()):
            return pruned
        rows = stopping.nonzero()[:, 0].tolist()
        for row, end in zip(rows, ended[rows].tolist()):
            prompt, sample = self.row_sample[row]
            self._take_drawn(row)
            if end:
                self._finish(prompt, sample)
            else:  # the probe's end: this row's columns before its position hold its fed tokens
                self.paused[(prompt, sample)] = self.rows.tail(row, self.pause_at - 1,
                                                               int(self.position[row]))
            self.row_sample[row] = None
            self.live_rows[row] = False
        return rows + pruned

    def _watch_running(self, running: torch.Tensor) -> list[int]:
        """Show the ``prune_running`` watcher the running rows [B] that reached a length it asked
        for; stop the samples it names (tokens dropped, not generated): running ones at once, and
        unstarted ones never start (a finished one named stays as it is). -> the rows freed."""
        named = set(self.watch.after_step(self.rows.hidden, running, self.length, self.row_sample))
        rows = [row for row, owner in enumerate(self.row_sample) if owner in named and bool(running[row])]
        for prompt, sample in sorted(named - {self.row_sample[row] for row in rows}):
            if self.pending.drop(prompt, sample):
                self.skipped.add((prompt, sample))
                self._complete(prompt)
                self.watch.pruned_samples += 1
        self.watch.pruned_samples += len(rows)
        for row in rows:
            prompt, sample = self.row_sample[row]
            drawn = len(self.completions[prompt][sample]) + int(self.length[row]) - self.row_base[row]
            self.watch.pruned_tokens += drawn
            (self.completions[prompt][sample], self.versions[prompt][sample],
             self.logps[prompt][sample]) = [], [], []
            self.skipped.add((prompt, sample))
            self._complete(prompt)
            self.row_sample[row] = None
            self.live_rows[row] = False
        return rows

    def _take_drawn(self, row: int) -> None:
        """The tokens row ``row`` drew join its sample's completion (with their versions and
        log-probs under partial rollouts)."""
        prompt, sample = self.row_sample[row]
        start, stop = self.row_base[row], int(self.length[row])
        self.completions[prompt][sample].extend(self.drawn[row, start:stop].tolist())
        if self.version is not None:
            self.versions[prompt][sample].extend([self.version] * (stop - start))
            self.logps[prompt][sample].extend(self.drawn_logp[row, start:stop].tolist())
        self.row_base[row] = stop

    def take_running(self) -> None:
        """The running samples' tokens so far join their completions (the call stops with them running)."""
        for row, owner in enumerate(self.row_sample):
            if owner is not None:
                self._take_drawn(row)


def decode(decoder: SlotDecoder, slots: int, refill: str) -> None:
    """Decode until nothing is pending or running: refill freed slots at once (continuous)
    or micro-group by micro-group (group); with a quota (partial rollouts), stop as soon as
    that many groups are complete, leaving the rest where they are."""
    if decoder.watcher is not None:
        # samples finished in an earlier step (partial rollouts) may saturate a group
        decoder.stop_saturated()
    if not decoder.quota_met:
        decoder.start_group(slots)
    while decoder.live:
        ended = decoder.step()
        if decoder.watcher is not None:
            decoder.stop_saturated()
        if decoder.quota_met:
            decoder.take_running()  # the samples still running carry over: no more compute goes to them
            break
        if refill == "continuous" and ended:
            decoder.fill([row for row, s in enumerate(decoder.row_sample) if s is None])
            decoder.drop_idle_rows()  # nothing left to start in them: stop decoding them
        elif refill == "group" and not decoder.live:  # the micro-group is done: the next one
            decoder.keep_rows([])
            decoder.start_group(slots)
        # (naive micro-groups keep decoding rows whose sample ended until the whole group is done)
        decoder.trim_columns()
