"""podsrl's own decode step (:class:`DecodeModel`) over a KV cache written in place
(:class:`InPlaceCache`), for the decoder-only families with full attention that podsrl ships and
users bring most (Llama / SmolLM2, Qwen2, Mistral without a sliding window).

Why not the model's own forward: a one-token decode step of a small model is bound by
overheads, not arithmetic. transformers' DynamicCache concatenates every layer's keys and values
on every step (a copy of the whole cache per token), the attention mask is rebuilt per step, and
``scaled_dot_product_attention``'s CPU kernel spends about 6x its FLOPs' time on a one-token query
over a padded cache (benchmarks/RESULTS.md, decode-bound). Here, per generation call:

* the weights are read once from the model (q, k, v fused into one matrix, gate and up into
  another: 4 matrix multiplies a layer instead of 7), so an update between calls is seen;
* the cache is one tensor per layer, [rows, kv_heads, width, head_dim], row r's columns
  [0, position[r]) its prompt and completion so far, left-aligned; a step writes each row's new
  key and value at its own column in place and attends to the columns up to the longest live
  row, as two batched matrix multiplies per layer (one-token queries, grouped kv heads);
* rotary embeddings come from the model's own module (every rope variant it implements), the
  norms and activation are the model's arithmetic (RMSNorm in float32, SiLU).

Which models take it: :func:`decode_path_refusal` says why one does not ('' = it does); those
keep the model's own forward (the caller says which path ran).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

FAMILIES = ("llama", "qwen2", "mistral")  # config.model_type: full attention, RMSNorm, SiLU MLP


def unwrapped(model):
    """The model under DDP's wrapper (its replicas hold the whole weights), else ``model``."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def decode_path_refusal(model) -> str:
    """Why ``model`` cannot decode on :class:`DecodeModel` ('' = it can): one line."""
    model = unwrapped(model)
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in FAMILIES:
        return f"model type {kind!r} is not one of {', '.join(FAMILIES)}"
    if hasattr(model, "peft_config"):
        return "a LoRA adapter (peft) wraps its layers"
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        return f"it has attention layers other than full attention ({sorted(layer_types)})"
    if kind == "mistral" and getattr(config, "sliding_window", None):
        return f"its attention has a sliding window ({config.sliding_window} tokens)"
    if getattr(config, "hidden_act", None) != "silu" or getattr(config, "pretraining_tp", 1) != 1:
        return "its MLP is not a plain SiLU-gated one"
    body = getattr(model, "model", None)
    if body is None or not hasattr(body, "rotary_emb") or not hasattr(model, "lm_head"):
        return "it has no model.rotary_emb / lm_head"
    linears = [m for layer in body.layers for m in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                    layer.self_attn.v_proj, layer.self_attn.o_proj,
                                                    layer.mlp.gate_proj, layer.mlp.up_proj,
                                                    layer.mlp.down_proj)]
    if any(type(m) is not torch.nn.Linear for m in [*linears, model.lm_head]):
        return "a layer is not a plain nn.Linear (quantized or wrapped)"
    if any(_sharded(p) for p in model.parameters()):
        return "its parameters are sharded (FSDP): the model's own forward gathers them"
    return ""


def _sharded(parameter: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed: nothing is sharded
        return False
    return isinstance(parameter, DTensor)


def _fused(linears: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight [sum of outputs, in] and bias (None when no layer has one) for ``linears``."""
    weight = torch.cat([m.weight for m in linears]).detach()
    if all(m.bias is None for m in linears):
        return weight, None
    return weight, torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features)
                              for m in linears]).detach()


class InPlaceCache:
    """Keys and values of ``rows`` rows, per layer [rows, kv_heads, width, head_dim], written in
    place; ``width`` is the most columns a row can need (its prompt and every completion token), so
    nothing is reallocated while a call decodes. Columns past a row's position are masked out;
    zeros there keep 0 x value finite."""

    def __init__(self, layers: int, rows: int, kv_heads: int, head_dim: int, width: int, *,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (rows, kv_heads, width, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]

    @property
    def rows(self) -> int:
        return self.keys[0].shape[0]

    @property
    def width(self) -> int:
        return self.keys[0].shape[2]

    def reserve(self, rows: int) -> None:
        """Room for at least ``rows`` rows (a larger allocation, contents kept)."""
        if rows <= self.rows:
            return
        for tensors in (self.keys, self.values):
            for index, old in enumerate(tensors):
                grown = old.new_zeros((rows, *old.shape[1:]))
                grown[:old.shape[0]] = old
                tensors[index] = grown

    def write(self, row: int, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Row ``row`` holds ``kv`` (per layer, keys and values [kv_heads, L, head_dim]) at columns [0, L)."""
        length = kv[0][0].shape[1]
        self.reserve(row + 1)
        for keys, values, (k, v) in zip(self.keys, self.values, kv):
            keys[row, :, :length] = k
            values[row, :, :length] = v

    def read(self, row: int, start: int, stop: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of row ``row``'s columns [start, stop), per layer [kv_heads, stop - start, head_dim]."""
        return [(k[row, :, start:stop].clone(), v[row, :, start:stop].clone())
                for k, v in zip(self.keys, self.values)]

    def move(self, moves: list[tuple[int, int]]) -> None:
        """Copy row ``source`` into row ``target`` for each (target, source); no row is both."""
        if not moves:
            return
        targets, sources = (torch.tensor(side, device=self.keys[0].device) for side in zip(*moves))
        for tensors in (self.keys, self.values):
            for t in tensors:
                t[targets] = t[sources]


class DecodeModel:
    """One decode step of every row of an :class:`InPlaceCache` with ``model``'s current weights
    (read when this is made: make one per generation call)."""

    def __init__(self, model) -> None:
        model = unwrapped(model)
        body, config = model.model, model.config
        self.rotary = body.rotary_emb
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = self.head_dim ** -0.5
        self.embed = body.embed_tokens.weight
        self.final_norm = (body.norm.weight, body.norm.variance_epsilon)
        self.dtype, self.device = self.embed.dtype, self.embed.device
        # Under the trainer's autocast (bf16 runs) the model's linear layers compute in autocast's
        # dtype while the residual stream keeps the weights' dtype; the step does the same,
        # explicitly, and runs with autocast off (the cache keeps the weights' dtype).
        kind = self.device.type
        self.compute = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else self.dtype

        def cast(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.detach().to(self.compute)

        self.head = cast(model.lm_head.weight)
        self.layers = []
        for layer in body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv, gate_up = (_fused([attn.q_proj, attn.k_proj, attn.v_proj]),
                            _fused([mlp.gate_proj, mlp.up_proj]))
            self.layers.append((
                (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
                *map(cast, qkv), cast(attn.o_proj.weight), cast(attn.o_proj.bias),
                (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                *map(cast, gate_up), cast(mlp.down_proj.weight), cast(mlp.down_proj.bias)))

    def new_cache(self, rows: int, width: int) -> InPlaceCache:
        return InPlaceCache(len(self.layers), rows, self.kv_heads, self.head_dim, width,
                            dtype=self.dtype, device=self.device)

    @staticmethod
    def _norm(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
        weight, eps = norm  # RMSNorm as the model computes it: in float32, back to the model's dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x.to(self.compute), weight, bias)

    @torch.no_grad()
    def step(self, cache: InPlaceCache, tokens: torch.Tensor, position: torch.Tensor,
             width: int | None = None, compiled: bool = False, hidden: bool = False):
        """One step (:meth:`_step`); ``compiled``: through :func:`compiled_step` (the width read on
        the host first, so the compiled graph has no break), a lone row eagerly."""
        with torch.autocast(self.device.type, enabled=False):
            if compiled and tokens.shape[0] > 1:  # dynamo specialises a size of 1: one row would recompile
                return compiled_step()(self, cache, tokens, position,
                                       int(position.max()) + 1 if width is None else width, hidden)
            return self._step(cache, tokens, position, width, hidden)

    def _step(self, cache: InPlaceCache, tokens: torch.Tensor, position: torch.Tensor,
              width: int | None, hidden: bool = False):
        """Feed ``tokens`` [B] at columns ``position`` [B] of the cache's first B rows; returns
        the next-token logits [B, V] in float32, with ``hidden`` also the last hidden state they
        come from (after the final norm) [B, D] in float32. Each row attends to its columns
        [0, position], read from the first ``width`` columns (None: up to the longest row's,
        which costs one device-to-host read; a captured step passes the cache's whole width)."""
        rows = tokens.shape[0]
        width = int(position.max()) + 1 if width is None else width
        if rows > cache.rows or width > cache.width:
            raise ValueError(f"DecodeModel.step: {rows} rows to column {width - 1}; the cache holds "
                             f"{cache.rows} rows of {cache.width} columns")
        heads, kv_heads, d = self.heads, self.kv_heads, self.head_dim
        groups, half = heads // kv_heads, d // 2
        index = torch.arange(rows, device=tokens.device)
        # [B, W]: -inf past each row's newest column (shared by every layer)
        past = torch.arange(width, device=tokens.device)[None, :] > position[:, None]
        bias = torch.where(past, float("-inf"), 0.0).to(self.dtype)[:, None, None, :]  # [B, 1, 1, W]
        h = F.embedding(tokens, self.embed)  # [B, D]
        cos, sin = self.rotary(h[:, None, :], position[:, None])  # [B, 1, d]
        for (norm1, qkv_w, qkv_b, o_w, o_b, norm2, gate_up_w, gate_up_b, down_w, down_b), keys, values in zip(
                self.layers, cache.keys, cache.values):
            qkv = (self._linear(self._norm(h, norm1), qkv_w, qkv_b).to(self.dtype)
                   .view(rows, heads + 2 * kv_heads, d))
            qk, v = qkv[:, :heads + kv_heads], qkv[:, heads + kv_heads:]  # [B, H + Hkv, d], [B, Hkv, d]
            rotated = torch.cat([-qk[..., half:], qk[..., :half]], dim=-1)
            qk = qk * cos + rotated * sin
            q, k = qk[:, :heads], qk[:, heads:]
            keys[index, :, position] = k
            values[index, :, position] = v
            q = q.reshape(rows, kv_heads, groups, d)  # query head h reads kv head h // groups
            # [B, Hkv, g, W]
            scores = torch.matmul(q, keys[:rows, :, :width].transpose(-1, -2)) * self.scale + bias
            attended = torch.matmul(scores.float().softmax(dim=-1).to(self.dtype), values[:rows, :, :width])
            h = h + self._linear(attended.reshape(rows, heads * d), o_w, o_b)  # back to h's dtype
            gate, up = self._linear(self._norm(h, norm2), gate_up_w, gate_up_b).chunk(2, dim=-1)
            h = h + self._linear(F.silu(gate) * up, down_w, down_b)
        last = self._norm(h, self.final_norm)  # [B, D]
        logits = self._linear(last, self.head, None).float()
        return (logits, last.float()) if hidden else logits


COMPILED = []  # the one torch.compile of the step in this process, made on first use
BACKEND = "inductor"  # torch.compile's backend (tests trace with "eager": dynamo without code generation)


def compiled_step():
    """:meth:`DecodeModel._step` under ``torch.compile`` with dynamic shapes: compiled once per
    process and model layout (about 25 s for tiny-chain on the 2-core CPU), then reused by every
    call's new DecodeModel, rows and width without recompiling. Inductor fuses the step's small
    elementwise ops (norms, rotary, the mask, softmax, SiLU), whose per-op overhead dominates a
    small model's step: 1.03-2.8x faster than eager for tiny-chain at 16-256 rows x 64-256 KV in a
    throwaway measurement on the 2-core AVX-512 EPYC (benchmarks/RESULTS.md)."""
    if not COMPILED:  # fullgraph: a graph break would hide per-op overhead again; it fails instead
        COMPILED.append(torch.compile(DecodeModel._step, dynamic=True, fullgraph=True, backend=BACKEND))
    return COMPILED[0]


def row_bucket(rows: int) -> int:
    """The row count a captured step serves ``rows`` rows with: the next power of two, at least
    8, so a call's shrinking tail needs a handful of graphs, each padded by less than 2x."""
    return max(8, 1 << max(rows - 1, 0).bit_length())


class GraphedStep:
    """:meth:`DecodeModel.step` replayed as CUDA graphs, one per row bucket (:func:`row_bucket`)
    over the cache's whole width: one launch a step instead of one per kernel. A small model's
    decode step on a GPU is bound by kernel launches (the H200 took +18% for 4x the rows, #70),
    which a graph removes (torch.cuda.CUDAGraph; PyTorch's CUDA-graph recipe: warm up on a side
    stream, capture, replay with the inputs copied into the captured tensors).

    Rows past the ones stepped feed a pad token at the cache's last column, which no row reads
    (a row's newest column is at most its prompt plus its budget minus one). The graphs hold the
    cache's tensors by address: a cache that grows drops them. ``capture_seconds`` is the time
    spent capturing (warm-up included), reported apart from decoding."""

    def __init__(self, step_model: DecodeModel, cache: InPlaceCache, hidden: bool = False) -> None:
        self.step_model, self.cache, self.hidden = step_model, cache, hidden
        # bucket -> (graph, tokens [R], position [R], output: logits [R, V], with ``hidden`` and the
        # state [R, D])
        self.graphs: dict[int, tuple] = {}
        self.captured_on = None  # the cache tensor the graphs were captured over
        self.capture_seconds = 0.0

    def __call__(self, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        rows = tokens.shape[0]
        size = row_bucket(rows)
        self.cache.reserve(size)
        if self.captured_on is not self.cache.keys[0]:
            self.graphs.clear()
            self.captured_on = self.cache.keys[0]
        if size not in self.graphs:
            self.graphs[size] = self._capture(size)
        graph, fed, at, output = self.graphs[size]
        fed[:rows].copy_(tokens)
        fed[rows:] = 0
        at[:rows].copy_(position)
        at[rows:] = self.cache.width - 1
        graph.replay()
        if self.hidden:  # the graph's outputs are overwritten by its next replay
            return output[0][:rows].clone(), output[1][:rows].clone()
        return output[:rows].clone()

    def _capture(self, size: int) -> tuple:
        start = time.perf_counter()
        device = self.cache.keys[0].device
        # [R] tokens, [R] columns: the graph's inputs
        fed = torch.zeros(size, dtype=torch.long, device=device)
        at = torch.full((size,), self.cache.width - 1, dtype=torch.long, device=device)
        width = self.cache.width
        graph, output = capture(lambda: self.step_model.step(self.cache, fed, at, width, hidden=self.hidden),
                                device)
        self.capture_seconds += time.perf_counter() - start
        return graph, fed, at, output


def capture(run, device: torch.device) -> tuple[torch.cuda.CUDAGraph, object]:
    """``run()`` captured as a CUDA graph, and the tensor (or tensors) its replays write (PyTorch's recipe:
    two warm-up runs on a side stream, so allocations and lazy initialisation happen before
    capture)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = run()
    torch.cuda.synchronize(device)
    return graph, output
