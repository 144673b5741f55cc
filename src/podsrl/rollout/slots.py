"""Generation in a bounded number of decoding slots: large n on bounded memory.

PODS draws many rollouts per prompt (n = 64 to 256 in the paper), and decoding a whole
group at once needs KV-cache and logits memory that grows with n. Following Infinite
Sampling (Wang et al., arXiv 2506.22950), this engine decouples the group size from the
generation memory:

* micro-groups: at most ``slots`` (g) sequences are decoded at once;
* shared prefill: each prompt is run through the model once; its KV cache is copied into
  a slot whenever one of its samples starts, never recomputed;
* continuous refill (``refill="continuous"``): when a sample ends, its slot takes the next
  pending sample (of the same prompt or the next) at the following decode step, instead of
  idling until the whole micro-group is done (``refill="group"``, naive micro-groups);
* length-aware scheduling (``schedule``): pending samples are taken shortest- or
  longest-predicted-first, using a completion-length predictor learned online from the
  run's own completions (:class:`LengthPredictor`).

Sampling semantics are those of ``transformers`` ``generate``: logits in float32,
temperature then top-p (:func:`warp_logits`, tested against transformers' warpers), one
multinomial draw per token, greedy when ``temperature == 0``, a sample ends at its first
EOS or after ``max_new_tokens``. Which random draw goes to which sample depends on the
schedule, so samples differ from full-group generation draw by draw while following the
same distribution; greedy decoding gives the same completions.

Cache layout: one batch row per slot, all rows sharing the cache's column axis. A sample
that starts at column W gets its prompt's keys and values right-aligned at [W - Lp, W) and
its earlier columns masked out, exactly like left padding; columns no live row needs any
more are trimmed from the left, so the cache never grows beyond
g x (longest prompt + max_new_tokens).
"""

from __future__ import annotations

from collections import deque

import torch

from podsrl.rollout.hf import Rollouts, to_rollouts

REFILLS = ("continuous", "group")
SCHEDULES = ("fifo", "shortest_first", "longest_first")


def warp_logits(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Temperature, then nucleus (top-p) filtering, as transformers' warpers do.

    logits [B, V] (float32) -> [B, V] with filtered tokens at -inf. Of the tokens sorted by
    probability, those whose ascending cumulative probability is <= 1 - top_p are removed;
    the most likely token is always kept.
    """
    logits = logits / temperature
    if top_p >= 1.0:
        return logits
    sorted_logits, sorted_indices = torch.sort(logits, descending=False)  # [B, V]
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - top_p)
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(1, sorted_indices, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def next_tokens(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """logits [B, V] -> tokens [B]: argmax when temperature == 0, else one multinomial draw each."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = warp_logits(logits.float(), temperature, top_p).softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(1)


class LengthPredictor:
    """Predicts a prompt's completion length, learned online from the run's completions.

    Start simple (the issue's advice): ridge regression of the length on features of the
    prompt, its token count and a hashed bag of its tokens, refit in closed form from
    running sums after every generation call. Within a call, the lengths of a prompt's
    samples that have already finished are folded in (their mean, weighted against the
    regression's guess as ``prior_weight`` pseudo-samples): samples of one prompt have
    correlated lengths, which the prompt features alone only partly capture. A sample's
    own first tokens are not used: without preemption its slot could not change anyway.
    """

    def __init__(self, buckets: int = 16, ridge: float = 1.0, prior_weight: float = 2.0) -> None:
        self.buckets, self.prior_weight = buckets, prior_weight
        dim = buckets + 2
        self.xtx = ridge * torch.eye(dim, dtype=torch.float64)  # [F, F]
        self.xty = torch.zeros(dim, dtype=torch.float64)  # [F]
        self.seen = 0

    def features(self, prompt_tokens: list[list[int]]) -> torch.Tensor:
        """P token lists -> [P, F]: bias, length / 64, normalised hashed bag of tokens."""
        rows = torch.zeros(len(prompt_tokens), self.buckets + 2, dtype=torch.float64)
        for i, tokens in enumerate(prompt_tokens):
            rows[i, 0], rows[i, 1] = 1.0, len(tokens) / 64
            for token in tokens:
                rows[i, 2 + token % self.buckets] += 1.0 / max(1, len(tokens))
        return rows

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """[P, F] -> predicted lengths [P] (0 before any completion has been seen)."""
        if self.seen == 0:
            return torch.zeros(features.shape[0], dtype=torch.float64)
        return features @ torch.linalg.solve(self.xtx, self.xty)

    def update(self, features: torch.Tensor, lengths: torch.Tensor) -> None:
        """features [P, F], lengths [P, n]: every sample is one observation of its prompt."""
        counts = torch.full((features.shape[0],), float(lengths.shape[1]), dtype=torch.float64)
        self.xtx += features.T @ (features * counts[:, None])
        self.xty += features.T @ lengths.double().sum(dim=1)
        self.seen += lengths.numel()

    def state_dict(self) -> dict:
        return {"xtx": self.xtx.clone(), "xty": self.xty.clone(), "seen": self.seen}

    def check_state(self, state: dict) -> None:
        if (set(state) != {"xtx", "xty", "seen"} or tuple(state["xtx"].shape) != tuple(self.xtx.shape)
                or tuple(state["xty"].shape) != tuple(self.xty.shape)):
            raise ValueError(f"length predictor state does not fit a predictor with {self.buckets} buckets")

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.xtx, self.xty, self.seen = state["xtx"].clone(), state["xty"].clone(), int(state["seen"])

    def blend(self, prior: float, finished_lengths: list[int]) -> float:
        """The prompt's prior guess updated with the lengths of its samples that already ended."""
        total = prior * self.prior_weight + sum(finished_lengths)
        return total / (self.prior_weight + len(finished_lengths))


class _PendingSamples:
    """Which sample starts next: prompt by prompt (fifo) or by predicted length."""

    def __init__(self, num_prompts: int, num_samples: int, schedule: str, predicted: list[float],
                 predictor: LengthPredictor | None) -> None:
        self.remaining = [deque(range(num_samples)) for _ in range(num_prompts)]
        self.schedule, self.predicted, self.predictor = schedule, predicted, predictor
        self.finished_lengths: list[list[int]] = [[] for _ in range(num_prompts)]
        self.left = num_prompts * num_samples

    def __len__(self) -> int:
        return self.left

    def record(self, prompt: int, length: int) -> None:
        self.finished_lengths[prompt].append(length)

    def pop(self) -> tuple[int, int]:
        candidates = [p for p, queue in enumerate(self.remaining) if queue]
        if self.schedule == "fifo":
            prompt = candidates[0]
        else:
            guess = {p: self.predictor.blend(self.predicted[p], self.finished_lengths[p]) for p in candidates}
            pick = min if self.schedule == "shortest_first" else max
            prompt = pick(candidates, key=lambda p: (guess[p], p))
        self.left -= 1
        return prompt, self.remaining[prompt].popleft()


def _full_attention_layers(cache) -> list:
    from transformers.cache_utils import DynamicLayer

    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise NotImplementedError(f"generation_engine 'slots' supports full-attention KV caches only; this model's "
                                  f"cache has layers of type {kinds}: use generation_engine 'hf'")
    return cache.layers


def kv_bytes_per_token(model_config) -> int:
    """Bytes of keys + values one token occupies in the cache, over all layers."""
    text = model_config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    dtype = getattr(text, "dtype", None) or torch.float32
    element = torch.finfo(getattr(torch, dtype) if isinstance(dtype, str) else dtype).bits // 8
    return text.num_hidden_layers * 2 * kv_heads * head_dim * element


def generation_memory_bytes(model_config, rows: int, seq_len: int, prompts: int = 0, prompt_len: int = 0) -> int:
    """Estimated peak of the memory that grows with what is decoded: the KV cache of ``rows``
    sequences of ``seq_len`` tokens, their float32 logits and sampling probabilities, and
    (slots engine) the stored prefills of ``prompts`` prompts with their last logits.
    Weights and activations of one decode step are not counted (they do not grow with n)."""
    vocab = model_config.get_text_config(decoder=True).vocab_size
    per_token = kv_bytes_per_token(model_config)
    return (rows * seq_len * per_token + rows * vocab * 4 * 2
            + prompts * prompt_len * per_token + prompts * vocab * 4)


@torch.no_grad()
def generate_in_slots(model, tokenizer, prompts: list[str], num_samples: int, *, max_new_tokens: int,
                      temperature: float = 1.0, top_p: float = 1.0, slots: int = 0, refill: str = "continuous",
                      schedule: str = "fifo", predictor: LengthPredictor | None = None) -> Rollouts:
    """Sample ``num_samples`` completions per prompt, decoding at most ``slots`` at once.

    ``slots`` = 0 decodes every sample at once. Returns :class:`Rollouts` [P, n, Lc] like
    the ``hf`` engine, with ``stats``: decode_steps (model calls after the prefill),
    generated_tokens, slots.
    """
    if refill not in REFILLS:
        raise ValueError(f"generation_refill: unknown {refill!r}; use one of {', '.join(REFILLS)}")
    if schedule not in SCHEDULES:
        raise ValueError(f"generation_schedule: unknown {schedule!r}; use one of {', '.join(SCHEDULES)}")
    if schedule != "fifo" and predictor is None:
        predictor = LengthPredictor()
    from transformers import DynamicCache

    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    prompt_ids, prompt_mask = enc["input_ids"], enc["attention_mask"]  # [P, Lp] on the CPU, like the result
    device = model.device  # decoding state lives with the model (GPU); completions come back to the CPU
    num_prompts, total = len(prompts), len(prompts) * num_samples
    slots = min(slots or total, total)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    was_training = model.training
    model.eval()

    # --- prefill every prompt once, in chunks of at most `slots` rows --------------------------
    prompt_lengths = prompt_mask.sum(dim=1).tolist()
    prompt_kv: list[list[tuple[torch.Tensor, torch.Tensor]]] = []  # per prompt, per layer ([H, Lp_i, d] x 2)
    prompt_logits = []  # per chunk [p, V] float32
    for start in range(0, num_prompts, slots):
        ids, mask = prompt_ids[start:start + slots].to(device), prompt_mask[start:start + slots].to(device)
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp_min(0),
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        prompt_logits.append(out.logits[:, -1, :].float())
        layers = _full_attention_layers(cache)
        for row in range(ids.shape[0]):
            length = prompt_lengths[start + row]
            prompt_kv.append([(layer.keys[row, :, -length:].clone(), layer.values[row, :, -length:].clone())
                              for layer in layers])
        del out, cache
    prompt_logits = torch.cat(prompt_logits)  # [P, V]

    features = predictor.features([ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask)]) \
        if predictor is not None else None
    predicted = predictor.predict(features).tolist() if predictor is not None else [0.0] * num_prompts
    pending = _PendingSamples(num_prompts, num_samples, schedule, predicted, predictor)
    completions: list[list[list[int]]] = [[[] for _ in range(num_samples)] for _ in range(num_prompts)]

    # --- decoding state: one row per live slot ------------------------------------------------
    cache = DynamicCache(config=model.config)
    layers = None
    row_sample: list[tuple[int, int] | None] = []  # (prompt, sample) decoded in each row; None = idle
    column_mask = torch.zeros(0, 0, dtype=torch.long, device=device)  # [B, W]: 1 where a row's cache column is its own
    last_token = torch.zeros(0, dtype=torch.long, device=device)  # [B]: the token to feed next
    position = torch.zeros(0, dtype=torch.long, device=device)  # [B]: its position id
    decode_steps = 0

    def finish(prompt: int, sample: int) -> None:
        pending.record(prompt, len(completions[prompt][sample]))

    def start_samples(count: int) -> list[tuple[int, int, int]]:
        """Pop up to `count` samples that still need a slot: (prompt, sample, first token)."""
        started = []
        while len(started) < count and len(pending):
            batch = [pending.pop() for _ in range(min(count - len(started), len(pending)))]
            firsts = next_tokens(prompt_logits[[p for p, _ in batch]], temperature, top_p).tolist()  # [k]
            for (prompt, sample), token in zip(batch, firsts):
                completions[prompt][sample].append(token)
                if token == eos or max_new_tokens == 1:
                    finish(prompt, sample)
                else:
                    started.append((prompt, sample, token))
        return started

    def place(rows: list[int], started: list[tuple[int, int, int]]) -> None:
        """Put each started sample's prompt cache into its row, right-aligned at the current width."""
        nonlocal column_mask, layers
        need = max(prompt_lengths[p] for p, _, _ in started)
        width = column_mask.shape[1]
        if need > width:  # widen every row on the left; the new columns are masked out
            grow = need - width
            column_mask = torch.nn.functional.pad(column_mask, (grow, 0))
            for layer in layers:
                layer.keys = torch.nn.functional.pad(layer.keys, (0, 0, grow, 0))
                layer.values = torch.nn.functional.pad(layer.values, (0, 0, grow, 0))
            width = need
        for row, (prompt, sample, token) in zip(rows, started):
            length = prompt_lengths[prompt]
            column_mask[row] = 0
            column_mask[row, width - length:] = 1
            for layer, (keys, values) in zip(layers, prompt_kv[prompt]):
                layer.keys[row, :, :width - length] = 0
                layer.keys[row, :, width - length:] = keys
                layer.values[row, :, :width - length] = 0
                layer.values[row, :, width - length:] = values
            row_sample[row] = (prompt, sample)
            last_token[row] = token
            position[row] = length

    def open_rows(count: int) -> list[int]:
        """Append `count` idle rows (zero cache, masked) and return their indices."""
        nonlocal column_mask, last_token, position, layers
        first = len(row_sample)
        row_sample.extend([None] * count)
        width = column_mask.shape[1]
        column_mask = torch.cat([column_mask, column_mask.new_zeros(count, width)])
        last_token = torch.cat([last_token, last_token.new_full((count,), pad)])
        position = torch.cat([position, position.new_zeros(count)])
        if layers is None:  # first rows: initialise the cache with one empty column per layer
            for index, (keys, values) in enumerate(prompt_kv[0]):
                shape = (count, keys.shape[0], 0, keys.shape[-1])
                cache.update(keys.new_zeros(shape), values.new_zeros(shape), index)
            layers = _full_attention_layers(cache)
        else:
            for layer in layers:
                layer.keys = torch.cat([layer.keys, layer.keys.new_zeros((count, *layer.keys.shape[1:]))])
                layer.values = torch.cat([layer.values, layer.values.new_zeros((count, *layer.values.shape[1:]))])
        return list(range(first, first + count))

    def keep_rows(keep: list[int]) -> None:
        nonlocal column_mask, last_token, position, row_sample
        index = torch.tensor(keep, dtype=torch.long, device=device)
        column_mask, last_token, position = column_mask[index], last_token[index], position[index]
        row_sample = [row_sample[i] for i in keep]
        for layer in layers:
            layer.keys, layer.values = layer.keys[index], layer.values[index]

    def fill(rows: list[int]) -> None:
        """Start pending samples in `rows` (those left idle stay None)."""
        started = start_samples(len(rows))
        if started:
            place(rows[:len(started)], started)

    def drop_idle_rows() -> None:
        if any(s is None for s in row_sample):
            keep_rows([row for row, s in enumerate(row_sample) if s is not None])

    def start_group() -> None:
        if len(pending):
            fill(open_rows(min(slots, len(pending))))
            drop_idle_rows()  # samples that ended on their first token

    start_group()
    while any(s is not None for s in row_sample):
        attention_mask = torch.cat([column_mask, column_mask.new_ones(len(row_sample), 1)], dim=1)
        out = model(input_ids=last_token[:, None], attention_mask=attention_mask, position_ids=position[:, None],
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        decode_steps += 1
        column_mask = attention_mask
        tokens = next_tokens(out.logits[:, -1, :].float(), temperature, top_p).tolist()  # [B]
        del out
        ended = []
        for row, token in enumerate(tokens):
            if row_sample[row] is None:
                continue
            prompt, sample = row_sample[row]
            completions[prompt][sample].append(token)
            last_token[row] = token
            position[row] += 1
            if token == eos or len(completions[prompt][sample]) == max_new_tokens:
                finish(prompt, sample)
                row_sample[row] = None
                ended.append(row)
        if refill == "continuous" and ended:
            fill([row for row, s in enumerate(row_sample) if s is None])
            drop_idle_rows()  # nothing left to start in them: stop decoding them
        elif refill == "group" and all(s is None for s in row_sample):  # the micro-group is done: next one
            keep_rows([])
            start_group()
        # (naive micro-groups keep decoding rows whose sample ended until the whole group is done)
        if row_sample:  # trim columns no live row uses
            live = column_mask.any(dim=0).nonzero()
            first = int(live.min()) if len(live) else column_mask.shape[1]
            if first:
                column_mask = column_mask[:, first:]
                for layer in layers:
                    layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]

    model.train(was_training)
    if predictor is not None:
        predictor.update(features, torch.tensor([[len(c) for c in group] for group in completions]))
    width = max(len(c) for group in completions for c in group)
    completion_ids = torch.full((num_prompts, num_samples, width), pad, dtype=torch.long)  # [P, n, Lc]
    for p, group in enumerate(completions):
        for j, tokens in enumerate(group):
            completion_ids[p, j, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    rollouts = to_rollouts(tokenizer, prompt_ids, prompt_mask, completion_ids)
    rollouts.stats.update(decode_steps=decode_steps, slots=slots)
    return rollouts
