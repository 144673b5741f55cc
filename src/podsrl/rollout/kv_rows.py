"""The slots engine's cache rows, two ways: :class:`InPlaceRows` (podsrl's decode step over a cache
written in place, :mod:`podsrl.rollout.decode_step`) for the models it covers, :class:`ShiftedRows`
(the model's own forward over a transformers DynamicCache) for every other. The decoder
(:mod:`podsrl.rollout.slot_decoder`) places, steps, reads and reorders rows through either; which
token and position each row feeds is the decoder's.

Per layer, each row's keys and values: [kv_heads, columns, head_dim]. A row of InPlaceRows holds
its prompt and completion left-aligned (column = position id); ShiftedRows right-aligns every row
at one shared width and masks the columns before a row's prompt, like left padding.
"""

from __future__ import annotations

import sys
import time

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from podsrl.rollout import decode_step
from podsrl.rollout.decode_step import DecodeModel, GraphedStep, decode_path_refusal

DECODE_PATHS = ("auto", "podsrl", "compiled", "eager", "model")
NOTED: set[str] = set()  # the notes already said
KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [kv_heads, columns, head_dim]


def note(message: str) -> None:
    """``message`` on stderr, once per process."""
    if message not in NOTED:
        NOTED.add(message)
        print(f"note: {message}", file=sys.stderr, flush=True)


def first_line(err: BaseException) -> str:
    """An error's first line (its type's name when it has no message): what a one-line note shows."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def full_attention_layers(cache) -> list:
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise NotImplementedError("generation_engine 'slots' supports full-attention KV caches only; this "
                                  f"model's cache has layers of type {kinds}: use generation_engine 'hf'")
    return cache.layers


class InPlaceRows:
    """Rows of an :class:`~podsrl.rollout.decode_step.InPlaceCache`, decoded by a
    :class:`~podsrl.rollout.decode_step.DecodeModel` made from the model's current weights."""

    path = "podsrl"

    def __init__(self, model, columns: int, captured: bool = False, compiled: bool = False,
                 hidden: bool = False) -> None:
        self.step_model = DecodeModel(model)
        self.cache = self.step_model.new_cache(0, columns)
        self.count = 0
        self.graphed = GraphedStep(self.step_model, self.cache, hidden) if captured else None
        self.compiled = compiled
        # ``hidden``: each step also keeps the last hidden state its logits came from, [B, D] float32
        self.keeps_hidden, self.hidden = hidden, None
        # from the settings alone, so every process logs the same fields (a collective mean)
        self.reports_compile = compiled or captured
        # torch.compile's first call in this process, when it fell in this call
        self.torch_compile_seconds = 0.0

    def open(self, count: int) -> None:
        self.count += count
        self.cache.reserve(self.count)

    def place(self, rows: list[int], kvs: list[KV]) -> None:
        for row, kv in zip(rows, kvs):
            self.cache.write(row, kv)

    def step(self, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        output = self._step(tokens, position)
        if self.keeps_hidden:
            output, self.hidden = output
        return output

    def _step(self, tokens: torch.Tensor, position: torch.Tensor):
        if self.graphed is not None:
            try:
                return self.graphed(tokens, position)
            except RuntimeError as err:  # e.g. a rope variant that reads positions on the host mid-capture
                note("podsrl's decode step runs without CUDA graphs: capturing it failed "
                     f"({first_line(err)})")
                self.graphed = None
        if self.compiled:
            return self._compiled_step(tokens, position)
        return self.step_model.step(self.cache, tokens, position, hidden=self.keeps_hidden)

    def _compiled_step(self, tokens: torch.Tensor, position: torch.Tensor):
        first = not decode_step.COMPILED  # this call pays the process's compile
        start = time.perf_counter()
        try:
            output = self.step_model.step(self.cache, tokens, position, compiled=True,
                                          hidden=self.keeps_hidden)
        except Exception as err:  # no C++ compiler, an inductor failure: the eager step computes the same
            note(f"podsrl's decode step runs uncompiled: torch.compile failed ({type(err).__name__}: "
                 f"{first_line(err)})")
            self.compiled = False
            return self.step_model.step(self.cache, tokens, position, hidden=self.keeps_hidden)
        if first:
            self.torch_compile_seconds += time.perf_counter() - start
        return output

    @property
    def compile_seconds(self) -> float:
        """Seconds this call spent compiling the step or capturing its CUDA graphs (warm-up included)."""
        return ((self.graphed.capture_seconds if self.graphed is not None else 0.0)
                + self.torch_compile_seconds)

    def tail(self, row: int, count: int, position: int) -> KV:
        """Copies of the ``count`` columns before ``position`` (the row's newest)."""
        return self.cache.read(row, position - count, position)

    def reorder(self, order: list[int]) -> None:
        """Row i becomes old row ``order[i]`` (rows past the order are dropped); rows that stay
        where they are are not copied."""
        self.cache.move([(target, source) for target, source in enumerate(order) if target != source])
        self.count = len(order)

    def trim(self) -> None:
        """Nothing to trim: a row reads only the columns up to its position."""


class ShiftedRows:
    """Rows of a transformers DynamicCache at one shared width, decoded by the model's forward.
    ``column_mask`` [B, W] marks the columns each row attends to."""

    path = "model"
    compile_seconds, reports_compile = 0.0, False  # nothing is captured or compiled

    def __init__(self, model, prompt_kv: KV, hidden: bool = False) -> None:
        self.model = model
        self.keeps_hidden, self.hidden = hidden, None  # as InPlaceRows: the step's last hidden state [B, D]
        self.cache = DynamicCache(config=model.config)
        self.template = prompt_kv  # one prompt's keys and values: the cache's shapes and dtype
        self.layers = None
        self.column_mask = torch.zeros(0, 0, dtype=torch.long, device=model.device)

    def open(self, count: int) -> None:
        """Append ``count`` idle rows (zero cache, masked)."""
        self.column_mask = torch.cat([self.column_mask,
                                      self.column_mask.new_zeros(count, self.column_mask.shape[1])])
        if self.layers is None:  # first rows: initialise the cache with no column per layer
            for index, (keys, values) in enumerate(self.template):
                shape = (count, keys.shape[0], 0, keys.shape[-1])
                self.cache.update(keys.new_zeros(shape), values.new_zeros(shape), index)
            self.layers = full_attention_layers(self.cache)
        else:
            for layer in self.layers:
                layer.keys = torch.cat([layer.keys, layer.keys.new_zeros((count, *layer.keys.shape[1:]))])
                layer.values = torch.cat([layer.values,
                                          layer.values.new_zeros((count, *layer.values.shape[1:]))])

    def place(self, rows: list[int], kvs: list[KV]) -> None:
        """Each row's keys and values right-aligned at the current width (widened on the left
        first if one does not fit; the new columns are masked out)."""
        need = max(kv[0][0].shape[1] for kv in kvs)
        width = self.column_mask.shape[1]
        if need > width:
            grow = need - width
            self.column_mask = torch.nn.functional.pad(self.column_mask, (grow, 0))
            for layer in self.layers:
                layer.keys = torch.nn.functional.pad(layer.keys, (0, 0, grow, 0))
                layer.values = torch.nn.functional.pad(layer.values, (0, 0, grow, 0))
            width = need
        for row, kv in zip(rows, kvs):
            length = kv[0][0].shape[1]
            self.column_mask[row] = 0
            self.column_mask[row, width - length:] = 1
            for layer, (keys, values) in zip(self.layers, kv):
                layer.keys[row, :, :width - length] = 0
                layer.keys[row, :, width - length:] = keys
                layer.values[row, :, :width - length] = 0
                layer.values[row, :, width - length:] = values

    def step(self, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        attention_mask = torch.cat([self.column_mask, self.column_mask.new_ones(len(tokens), 1)], dim=1)
        out = self.model(input_ids=tokens[:, None], attention_mask=attention_mask,
                         position_ids=position[:, None], past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1, output_hidden_states=self.keeps_hidden)
        self.column_mask = attention_mask
        if self.keeps_hidden:  # transformers' last hidden state is the final norm's output
            self.hidden = out.hidden_states[-1][:, -1, :].float()
        return out.logits[:, -1, :].float()  # [B, V]

    def tail(self, row: int, count: int, position: int) -> KV:
        return [(layer.keys[row, :, -count:].clone(), layer.values[row, :, -count:].clone())
                for layer in self.layers]

    def reorder(self, order: list[int]) -> None:
        index = torch.tensor(order, dtype=torch.long, device=self.column_mask.device)
        self.column_mask = self.column_mask[index]
        for layer in self.layers:
            layer.keys, layer.values = layer.keys[index], layer.values[index]

    def trim(self) -> None:
        """Drop the leading columns no row uses."""
        if not len(self.column_mask):
            return
        live = self.column_mask.any(dim=0).nonzero()
        first = int(live.min()) if len(live) else self.column_mask.shape[1]
        if first:
            self.column_mask = self.column_mask[:, first:]
            for layer in self.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]


def cache_rows(model, prompt_kv: list[KV], max_completion_length: int, path: str = "auto",
               hidden: bool = False) -> tuple[object, str]:
    """The rows a call decodes in, and why it is not podsrl's decode step ('' when it is).
    ``path``: 'auto' (podsrl's where :func:`decode_path_refusal` allows, replayed as CUDA graphs
    on a GPU), 'podsrl' (the same, refused where it cannot run), 'compiled' (podsrl's under
    torch.compile), 'eager' (podsrl's, never captured) or 'model'; ``hidden``: each step keeps
    the last hidden state of its rows (``rows.hidden`` [B, D]), for watchers that read it."""
    refusal = decode_path_refusal(model) if path != "model" else "asked for the model's own forward"
    if path in ("podsrl", "compiled", "eager") and refusal:
        raise ValueError(f"podsrl's decode step cannot run this model: {refusal}")
    if refusal:
        if path == "auto":
            note("generation_engine slots decodes with the model's own forward (slower, docs/generation.md): "
                 f"{refusal}")
        return ShiftedRows(model, prompt_kv[0], hidden), refusal
    longest = max(kv[0][0].shape[1] for kv in prompt_kv)
    captured = path in ("auto", "podsrl") and next(model.parameters()).device.type == "cuda"
    return InPlaceRows(model, longest + max_completion_length + 1, captured, compiled=path == "compiled",
                       hidden=hidden), ""
