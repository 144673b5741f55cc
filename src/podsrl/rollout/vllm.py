"""The ``vllm`` engine: a vLLM ``LLM`` colocated in the training process, as TRL's colocate
mode and verl's hybrid engine run it, fed the policy's weights whenever they changed.

* **Built once per run**, at the first generation, from the policy's own config (the
  architecture only: ``load_format="dummy"``), then given the policy's weights, so any model
  podsrl trains (a hub name, a local folder, a LoRA adapter, a resumed checkpoint) reaches
  vLLM as the policy holds it. ``skip_tokenizer_init``: podsrl tokenizes the prompts and
  decodes the completions itself, exactly as for the hf engine.
* **Weights**: before each call the engine compares the policy's parameter versions (torch
  bumps a tensor's version on every in-place change: the optimizer's step, a checkpoint
  restore) with those it last pushed, and pushes the weights through vLLM's
  ``reload_weights`` when they differ. LoRA is merged into what is pushed (out of place: the
  policy's weights stay as they are; :func:`podsrl.rollout.weights.inference_weights`), which was
  faster than vLLM's own adapters here (docs/generation.md). On the CPU, vLLM repacks each
  linear layer for oneDNN when it loads it; a language-model head tied to the embedding
  loads nothing of its own, so it is repacked here after every push.
* **Log-probs**: vLLM reports each sampled token's log-prob under its own numerics
  (``raw_logprobs``: the model's distribution at temperature 1, as the update's loss uses
  it); they go into ``Rollouts.sampling_logp`` for the update's importance correction and
  the per-step difference log (:mod:`podsrl.algorithms.importance`).
* **Randomness**: the engine runs in process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so its
  sampler draws from torch's global generator, which the trainer seeds before every chunk:
  a seeded run repeats on the same machine and software.

vLLM is imported when the engine is built; without it, building says which extra to install.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Iterable

import numpy as np
import torch

from podsrl.options import Range, option
from podsrl.rollout.base import (
    MB,
    Capabilities,
    EngineOptions,
    Sampling,
    Stateless,
    Watcher,
    refuse_watchers,
    to_rollouts,
)
from podsrl.rollout.partial import PartialCall, PartialGeneration
from podsrl.rollout.registries import ENGINES
from podsrl.rollout.vllm_folders import CONFIG_FOLDER_PREFIX, remove_stale_config_folders, write_owner
from podsrl.rollout.vllm_logs import hide_expected_warnings
from podsrl.rollout.vllm_partial import stepped_until_quota
from podsrl.rollout.weights import inference_weights, weights_version
from podsrl.types import Rollouts

CPU_KV_CACHE_CAP_MB = 4096  # the CPU default's ceiling: allocating the cache is paid at start-up
CPU_MAX_NUM_SEQS = 256  # vLLM's default max_num_seqs for an LLM on the CPU (its engine/arg_utils.py)
# The n samples of a prompt share its KV cache only in full blocks, and the CPU backend's default
# block of 128 tokens is longer than most prompts: each sample prefilled the prompt again. 32 (the
# CPU kernels want multiples of 32) measured faster (benchmarks/RESULTS.md, "The vllm engine
# (#37)"). GPUs keep vLLM's default (16).
CPU_BLOCK_SIZE = 32
# vLLM's CPU build pins its own transformers and pulls torchvision / torchaudio builds that break
# imports beside the CPU torch: on a CPU it gets an environment of its own, never this one
INSTALL_HINT = ("generation_engine: 'vllm' needs vLLM, which is not installed here: on a GPU `pip install "
                "\"podsrl[vllm] @ file://$PWD\"` from a podsrl clone; on an x86 CPU vLLM's CPU build goes in its own "
                "environment, `bash scripts/test_vllm.sh` builds it (.venv-vllm; docs/generation.md#vllm)")


@dataclass(frozen=True)
class VLLMOptions(EngineOptions):
    """How the vLLM engine is built (their flat config names, TRL's: podsrl.options.flat_names)."""

    run_fields: ClassVar[frozenset[str]] = EngineOptions.run_fields | {
        "compute_dtype", "seed", "processes", "device", "max_prompt_tokens"}

    gpu_memory_utilization: float = option(0.3, "Share of the GPU's memory vLLM may take for weights and KV cache "
                                                "(TRL's field and default for colocate mode); GPU only.",
                                                Range(0, 1, low_closed=False))
    kv_cache_memory_mb: float = option(0.0, "KV-cache size of the vLLM engine in MiB, on any device (0 = on a GPU "
                                            "from vllm_gpu_memory_utilization; on the CPU, room for vLLM's most "
                                            "sequences at once (256) at full length, at most 4096 MiB). vLLM decodes "
                                            "fewer rows at once when they do not fit.",
                                       Range(0, why="0 = chosen for the device"))
    max_model_length: int = option(0, "Longest sequence (prompt + completion) vLLM plans for (TRL's field); 0 = "
                                      "max_prompt_tokens + max_completion_length, capped at the model's maximum.",
                                      Range(0, why="0 = prompt and completion limits"))
    enable_sleep_mode: bool = option(False, "Free vLLM's GPU memory (weights and KV cache) during the update and "
                                            "restore it before generating (TRL's field); CUDA only, refused on the "
                                            "CPU.")
    enforce_eager: bool = option(False, "Run vLLM without compilation or CUDA graphs (vLLM's enforce_eager). false "
                                        "(vLLM's and TRL's default) compiles at start-up, for CUDA graphs on a GPU; "
                                        "on the CPU that cost 200 s for no measured speed: set true there.")
    compute_dtype: str = "float32"  # the policy's forward passes' dtype, vLLM's too (bfloat16 under bf16)
    seed: int = 0
    processes: int = 1  # data-parallel training processes, each with its own engine
    device: str = "auto"  # the run's device setting
    max_prompt_tokens: int = 0  # the run's prompt cap: with max_completion_length, the length planned for by default

    def planned_length(self) -> int:
        """The configured length, else max_prompt_tokens + max_completion_length (0 when neither is known)."""
        return self.max_model_length or (self.max_prompt_tokens and self.max_prompt_tokens + self.max_completion_length)

    def check(self) -> None:
        require_vllm(ValueError)
        if self.enable_sleep_mode:
            import torch

            if self.device == "cpu" or not torch.cuda.is_available():
                raise ValueError("vllm_enable_sleep_mode: vLLM's sleep mode frees CUDA memory; it is refused on the "
                                 "CPU (no GPU here or device cpu)")


def vllm_available() -> bool:
    # vLLM logs to stdout by default, which carries podsrl's results: its log goes to stderr, as
    # podsrl's own messages do (read once, when vLLM is first imported; a user's setting wins)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def require_vllm(error: type[Exception] = ImportError) -> None:
    """``error`` with the one-line install hint when vLLM is not installed."""
    if not vllm_available():
        raise error(INSTALL_HINT)


def kv_bytes_per_token(config, dtype: str) -> int:
    """Bytes of keys and values one token holds in the cache over every layer."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * (4 if dtype == "float32" else 2)


@ENGINES.register("vllm")
class VLLMEngine(Stateless):
    """Generation on a colocated vLLM engine (see the module docstring); learns nothing across
    steps. ``generate`` has the signature of :func:`podsrl.rollout.generate`, so evaluation
    runs on the same engine."""

    name = "vllm"
    # vLLM schedules its own samples (none to cancel); each process's engine is fed whole weights
    capabilities = Capabilities(partial_rollouts=True, needs_whole_weights=True, reports_sampling_logp=True)
    options_type = VLLMOptions

    def __init__(self, options: VLLMOptions) -> None:
        require_vllm()
        self.options = options
        self.llm = None
        self.config_dir: str | None = None
        self.pushed_version: tuple | None = None  # parameter versions of the weights vLLM holds
        self.weights_asleep = False
        self.push_seconds = 0.0  # time spent pushing weights since the last step_record

    @staticmethod
    def check_prompts(options: VLLMOptions, model_config, longest_prompt: int) -> None:
        """At set-up, every prompt: not the first long one some steps in (:func:`check_fits`)."""
        check_fits(options, model_config, longest_prompt, options.max_completion_length)

    @torch.no_grad()
    def __call__(self, model, tokenizer, prompts: list[str], num_samples: int,
                 watchers: tuple[Watcher, ...] = (),
                 partial: PartialCall | None = None) -> Rollouts | PartialGeneration:
        """Every prompt's group (:meth:`generate`); with ``partial`` (partial rollouts,
        :mod:`podsrl.rollout.vllm_partial`), the prompts' samples as vLLM requests, the carried
        cut-off ones first, until ``partial.quota`` groups are complete, the rest aborted and
        handed back to carry on."""
        refuse_watchers(self, watchers)
        options = self.options
        if partial is None:
            return self.generate(model, tokenizer, prompts, num_samples, options.sampling())
        prompt_ids, prompt_mask = self._encode(model, tokenizer, prompts, options.max_completion_length)
        with self._serving(model) as llm:
            return stepped_until_quota(llm, tokenizer, (prompt_ids, prompt_mask), num_samples, partial,
                                       options.sampling())

    @torch.no_grad()
    def generate(self, model, tokenizer, prompts: list[str], num_samples: int, sampling: Sampling) -> Rollouts:
        """``num_samples`` completions per prompt from the policy's current weights, sampled as
        ``sampling`` says (greedy at temperature 0), the group axis kept. Its ``batch_size`` is
        ignored: vLLM schedules its own batch (at most max_num_seqs sequences at once)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompt_ids, prompt_mask = self._encode(model, tokenizer, prompts, sampling.max_completion_length)
        requests = [TokensPrompt(prompt_token_ids=ids[mask.bool()].tolist())
                    for ids, mask in zip(prompt_ids, prompt_mask)]
        params = SamplingParams(n=num_samples, temperature=sampling.temperature,
                                top_p=sampling.top_p if sampling.temperature else 1.0, top_k=0,
                                max_tokens=sampling.max_completion_length, min_tokens=sampling.min_completion_length,
                                stop_token_ids=[tokenizer.eos_token_id], logprobs=0, flat_logprobs=True,
                                detokenize=False)
        with self._serving(model) as llm:
            outputs = llm.generate(requests, params, use_tqdm=False)
        return self._rollouts(tokenizer, prompt_ids, prompt_mask, outputs, num_samples)

    def _encode(self, model, tokenizer, prompts: list[str],
                max_completion_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompts' ids and mask [P, Lp] (left-padded), checked to fit (:func:`check_fits`)."""
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        prompt_ids, prompt_mask = enc["input_ids"], enc["attention_mask"]
        check_fits(self.options, _base_config(model), int(prompt_mask.sum(1).max()), max_completion_length)
        return prompt_ids, prompt_mask

    @contextmanager
    def _serving(self, model):
        """The engine with the policy's weights for one call, outside the trainer's autocast (vLLM
        has its own dtype); asleep after it with sleep mode (the update gets the memory back)."""
        with torch.autocast(model.device.type, enabled=False):
            llm = self._ready(model)
            yield llm
            if self.options.enable_sleep_mode:
                llm.sleep(level=2)
                self.weights_asleep = True

    def _rollouts(self, tokenizer, prompt_ids, prompt_mask, outputs, num_samples: int) -> Rollouts:
        samples = [sorted(out.outputs, key=lambda c: c.index) for out in outputs]  # P lists of n, in order
        width = max(1, max(len(c.token_ids) for group in samples for c in group))
        completion_ids = torch.full((len(samples), num_samples, width), tokenizer.pad_token_id, dtype=torch.long)
        sampling_logp = torch.zeros(len(samples), num_samples, width)  # [P, n, Lc]
        for p, group in enumerate(samples):
            for j, sample in enumerate(group):
                length = len(sample.token_ids)
                completion_ids[p, j, :length] = torch.tensor(sample.token_ids, dtype=torch.long)
                sampling_logp[p, j, :length] = torch.tensor(sample.logprobs.logprobs[:length])
        rollouts = to_rollouts(tokenizer, prompt_ids, prompt_mask, completion_ids)
        rollouts.sampling_logp = sampling_logp * rollouts.completion_mask
        # the batch decodes until its longest completion ends (when it fits in max_num_seqs)
        rollouts.stats["decode_steps"] = width - 1
        return rollouts

    # --- the engine and its weights -------------------------------------------------------
    def _ready(self, model):
        """The engine, built on first use, holding the policy's current weights."""
        if self.llm is None:
            # vLLM seeds python's, numpy's and torch's global generators (and draws dummy weights)
            # while it starts: the trainer's random streams must not depend on when it was built
            python_state, numpy_state = random.getstate(), np.random.get_state()
            with torch.random.fork_rng(devices=[model.device] if model.device.type == "cuda" else []):
                self.llm = self._build(model)
            random.setstate(python_state)
            np.random.set_state(numpy_state)
        if self.weights_asleep:
            self.llm.wake_up(tags=["weights"])
        version = weights_version(model)
        if self.weights_asleep or version != self.pushed_version:
            self.push_weights(model)
            self.pushed_version = version
        if self.weights_asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.weights_asleep = False
        return self.llm

    def push_weights(self, model) -> None:
        """The policy's weights (LoRA merged) into the engine."""
        start = time.perf_counter()
        load_weights_into(self.llm, inference_weights(model))
        self.push_seconds += time.perf_counter() - start

    def _build(self, model):
        from vllm import LLM

        config = _base_config(model)
        hide_expected_warnings(config)
        remove_stale_config_folders()
        self.config_dir = tempfile.mkdtemp(prefix=CONFIG_FOLDER_PREFIX)
        write_owner(Path(self.config_dir))
        config.save_pretrained(self.config_dir)  # the architecture only: the weights come from the policy
        # in this process: weights by reference, no orphans
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        cpu = vllm_runs_on_cpu()
        if cpu:  # the engine runs in the trainer's process: it needs no core of its own
            os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        options = self.options
        max_model_len = model_length(options, config)
        kwargs = dict(model=self.config_dir, skip_tokenizer_init=True, load_format="dummy", dtype=options.compute_dtype,
                      seed=options.seed, max_model_len=max_model_len, enforce_eager=options.enforce_eager,
                      logprobs_mode="raw_logprobs", generation_config="vllm",
                      enable_sleep_mode=options.enable_sleep_mode)
        if cpu:
            kwargs["block_size"] = CPU_BLOCK_SIZE
        if options.kv_cache_memory_mb or cpu:
            kwargs["kv_cache_memory_bytes"] = int(self._kv_cache_mb(config, max_model_len) * MB)
        else:
            kwargs["gpu_memory_utilization"] = options.gpu_memory_utilization
        if options.processes > 1:  # each process its own engine, beside torch.distributed (as TRL does)
            kwargs["distributed_executor_backend"] = "external_launcher"
        try:
            return LLM(**kwargs)
        except (ValueError, RuntimeError) as err:  # vLLM's advice names its own arguments, not podsrl's
            advice = kv_cache_advice(err, options, max_model_len)
            if advice is None:
                raise
            raise ValueError(advice) from None

    def _kv_cache_mb(self, config, max_model_len: int) -> float:
        """The configured size, else on the CPU room for vLLM's most sequences at once at full
        length, at most CPU_KV_CACHE_CAP_MB, and at least one full-length sequence."""
        if self.options.kv_cache_memory_mb:
            return self.options.kv_cache_memory_mb
        per_token = kv_bytes_per_token(config, self.options.compute_dtype)
        wanted = CPU_MAX_NUM_SEQS * max_model_len * per_token / MB
        return max(min(wanted, CPU_KV_CACHE_CAP_MB), max_model_len * per_token / MB)

    def step_record(self) -> dict[str, float]:
        """Seconds spent pushing the policy's weights since the last record (part of the
        step's time_generate, or of the evaluation's time when it came first)."""
        record, self.push_seconds = {"weight_sync_seconds": self.push_seconds}, 0.0
        return record

    def close(self) -> None:
        """Release the engine (its memory, its config folder); a later call builds it again."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            self.pushed_version = None
        if self.config_dir:
            shutil.rmtree(self.config_dir, ignore_errors=True)
            self.config_dir = None


def _base_config(model):
    """The policy's architecture: its own config, or under a LoRA adapter the base model's."""
    return getattr(model, "get_base_model", lambda: model)().config


def kv_cache_advice(err: BaseException, options: VLLMOptions, max_model_len: int) -> str | None:
    """vLLM's KV-cache refusal ("... KV cache is needed, which is larger than the available KV cache
    memory ... Try increasing `gpu_memory_utilization` or decreasing `max_model_len`", "No available
    memory for the cache blocks") in podsrl's settings; None for any other error."""
    text = str(err)
    if "KV cache" not in text and "cache blocks" not in text:
        return None
    size = (f"vllm_kv_cache_memory_mb (now {options.kv_cache_memory_mb:g})" if options.kv_cache_memory_mb else
            f"vllm_gpu_memory_utilization (now {options.gpu_memory_utilization:g}) or vllm_kv_cache_memory_mb")
    return (f"vllm_kv_cache_memory_mb: vLLM's KV cache does not fit ({text.strip().splitlines()[0][:200]}); raise "
            f"{size}, or lower vllm_max_model_length (now {max_model_len}: prompt plus max_completion_length)")


def model_length(options: VLLMOptions, config) -> int:
    """The longest sequence (prompt + completion) the engine plans for: the configured length,
    capped at the model's own maximum (``max_position_embeddings``)."""
    limit = getattr(config, "max_position_embeddings", None) or options.planned_length()
    return min(options.planned_length() or limit, limit)


def check_fits(options: VLLMOptions, config, longest_prompt: int, max_completion_length: int) -> None:
    """ValueError (one line) when the longest prompt plus a full completion does not fit in the
    engine's sequence length: vLLM would cut every completion at that length, silently (a run
    whose completions are all 4 tokens long learns nothing), or refuse a longer prompt."""
    limit, need = model_length(options, config), longest_prompt + max_completion_length
    if need <= limit:
        return
    cap = getattr(config, "max_position_embeddings", None)
    why = (f"the model's maximum (max_position_embeddings) is {cap}" if cap == limit and
           options.planned_length() != cap else f"vllm_max_model_length is {options.planned_length()}")
    raise ValueError(f"vllm_max_model_length: the longest prompt ({longest_prompt} tokens) plus max_completion_length "
                     f"({max_completion_length}) needs {need} tokens, but {why}; vLLM would cut completions short: "
                     f"raise vllm_max_model_length to at least {need} (0 = max_prompt_tokens + "
                     f"max_completion_length), or lower max_prompt_tokens / max_completion_length")


def load_weights_into(llm, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load (name, tensor) pairs in checkpoint format into a live in-process ``LLM`` and drop
    its prefix cache (computed with the old weights). vLLM's ``reload_weights`` processes each
    layer as its checkpoint loader does (on the CPU: the oneDNN repacking that TRL's direct
    ``load_weights`` call misses), so the same call serves GPUs and CPUs."""
    llm.collective_rpc("reload_weights",
                       kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True})
    if vllm_runs_on_cpu():
        llm.apply_model(_repack_tied_head)
    llm.reset_prefix_cache()


def vllm_runs_on_cpu() -> bool:
    """Whether vLLM runs on its CPU backend here (the one test of it: the engine and TRL's
    colocated path both ask it)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _repack_tied_head(model) -> None:
    """vLLM's CPU backend packs each linear layer's weight for oneDNN after loading it. A head
    tied to the embedding is loaded through the embedding, so its packed copy would keep the
    weights the engine was built with: pack it again from the shared weight."""
    head = getattr(model, "lm_head", None)
    if head is not None and getattr(model.config, "tie_word_embeddings", False) and hasattr(head, "quant_method"):
        head.quant_method.process_weights_after_loading(head)
