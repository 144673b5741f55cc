"""The bounds of a run's settings that no constant gives: the train split's size, the model's
width and context, and this machine's memory. Checked at set-up, once the task, the model and
the prompts are known and before anything is generated; a refusal is one line naming the field.

Why memory: a setting can ask for more than the machine holds (``partial_extra_prompts`` at
100000 with the slots engine and no micro-group started 1.6M samples at once: 23 GB resident,
then the kernel's OOM killer ended the run without a word, and on a shared machine it may end
another job instead). The estimate is :func:`podsrl.rollout.memory.generation_memory_bytes` of
the sequences decoded at once at their full length (the worst case, which a long tail reaches),
against the memory available now.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from podsrl.rollout.memory import generation_memory_bytes
from podsrl.tasks import completion_budget

GIB = 2**30


def available_bytes(device: torch.device) -> int:
    """Memory a run can still take on ``device``: the GPU's free memory, else the machine's
    MemAvailable (Linux), else its physical memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class Decoding:
    """What one engine call decodes at once: ``rows`` sequences of up to ``seq_len`` tokens
    (and, for the slots engine, ``prompts`` stored prefills of ``prompt_len`` tokens, as the
    engine's own cap counts them: podsrl.rollout.base.rows_within), set by the ``field`` named."""

    rows: int
    seq_len: int
    prompts: int
    field: str
    why: str
    prompt_len: int = 0
    prompts_field: str = ""  # the field that sets ``prompts``, named where their prefills take most

    def bytes(self, model_config) -> int:
        return generation_memory_bytes(model_config, self.rows, self.seq_len, self.prompts, self.prompt_len)

    def refusal(self, model_config, need: int, available: int, field: str) -> str:
        """The one line refusing it: it names ``field`` (the rows' setting, or another the caller
        found), or :attr:`prompts_field` where the stored prefills take most of ``need``."""
        stored = generation_memory_bytes(model_config, 0, self.seq_len, self.prompts, self.prompt_len)
        memory = (f"an estimated {need / GIB:.1f} GiB of KV cache and logits at full length, more than the "
                  f"{available / GIB:.1f} GiB available")
        if self.prompts_field and 2 * stored > need:
            return (f"{self.prompts_field}: {self.prompts} prompts' prefills of up to {self.prompt_len} "
                    f"tokens would be stored at once beside {self.rows} decoding sequences ({self.why}), "
                    f"{memory}; lower {self.prompts_field}")
        return (f"{field}: {self.rows} sequences of up to {self.seq_len} tokens would decode at once "
                f"({self.why}), {memory}; lower {field}, or cap the memory with generation_memory_mb")


def agreed(procs, check):
    """``check()``'s result, or its refusal raised on every process (one process's memory may
    refuse where another's does not: none is left waiting for the others)."""
    try:
        result, refusal = check(), ""
    except ValueError as err:
        result, refusal = None, str(err)
    others = [message for message in procs.gather_objects(refusal) if message]
    if others:
        raise ValueError(refusal or others[0])
    return result


def check_fits(cfg, engine_options, model_config, longest_prompt: int, train_prompts: int, world_size: int,
               available: int) -> list[str]:
    """Refuse (ValueError naming the field) a run whose settings exceed what the data, the model or
    ``available`` bytes of memory hold; return warnings for settings past what the model was
    trained on (the run goes on)."""
    if cfg.prompts_per_step > train_prompts:  # a step takes distinct prompts: more repeat some, to no end
        raise ValueError(f"prompts_per_step: {cfg.prompts_per_step} prompts a step, and the train split has "
                         f"{train_prompts} usable prompts; use at most {train_prompts}")
    share = max(1, cfg.prompts_per_step // world_size)  # this process's prompt groups a step
    extra = cfg.partial_extra_prompts if cfg.partial_rollouts else 0
    if extra and share + extra > train_prompts:
        raise ValueError(f"partial_extra_prompts: {extra} groups in flight beyond this process's {share} "
                         f"would need {share + extra} distinct train prompts at once; the train split has "
                         f"{train_prompts} (at most {max(0, train_prompts - share)})")
    text = model_config.get_text_config(decoder=True)
    width = getattr(text, "hidden_size", None)
    if cfg.lora_rank and width and cfg.lora_rank > width:
        raise ValueError(f"lora_rank: {cfg.lora_rank} exceeds the model's hidden size {width}: a rank above "
                         f"it adds parameters, not capacity; use at most {width}, or 0 to train every "
                         "parameter")
    budget = completion_budget(cfg.task)
    for decoding in _decodings(cfg, engine_options, longest_prompt, share, extra):
        need = decoding.bytes(model_config)
        if need <= available:
            continue
        field = decoding.field
        at_budget = dataclasses.replace(decoding, seq_len=longest_prompt + budget)
        if cfg.max_completion_length > budget and at_budget.bytes(model_config) <= available:
            field = "max_completion_length"  # the task's own budget would fit: the length is what does not
        raise ValueError(decoding.refusal(model_config, need, available, field))
    context = getattr(text, "max_position_embeddings", None)
    if context and longest_prompt + cfg.max_completion_length > context:
        return [f"max_completion_length: the longest prompt ({longest_prompt} tokens) plus "
                f"max_completion_length {cfg.max_completion_length} pass the model's {context} positions "
                "(max_position_embeddings): positions beyond them were never trained"]
    return []


def _decodings(cfg, options, longest_prompt: int, share: int, extra: int) -> list[Decoding]:
    """The most a training call and an evaluation call decode at once on the run's engine; none
    for an engine that sizes its own memory (vllm) or under generation_memory_mb (the engines
    then decode what fits it, or refuse)."""
    if not hasattr(options, "memory_mb") or options.memory_mb:
        return []
    seq_len = longest_prompt + cfg.max_completion_length
    n = cfg.num_generations_max if cfg.adaptive_n else cfg.generated_per_prompt
    samples = (share + extra) * n
    lead = "num_generations" if n >= share else "prompts_per_step"  # the larger factor of the rows
    slots = getattr(options, "micro_group", None)
    if slots is not None:  # the slots engine: g slots, or every sample in flight; its prefills stored
        lead = "partial_extra_prompts" if extra > share else lead
        prompts = "partial_extra_prompts" if extra > share else "prompts_per_step"
        train = (Decoding(slots, seq_len, share + extra, "generation_micro_group",
                          f"generation_micro_group {slots}", longest_prompt, prompts)
                 if slots and slots < samples else
                 Decoding(samples, seq_len, share + extra, lead,
                          f"generation_micro_group 0: every sample in flight, ({share} prompts a "
                          f"step{f' + {extra} partial_extra_prompts' if extra else ''}) x {n}",
                          longest_prompt, prompts))
    else:  # whole prompt groups, generation_batch_size sequences a call (0 = all)
        rows = min(samples, max(n, cfg.generation_batch_size or samples))
        train = Decoding(rows, seq_len, 0, "generation_batch_size" if rows < samples else lead,
                         f"{rows // n} prompt groups x {n} a call")
    samples_per_prompt = 1 if cfg.eval_temperature == 0 else cfg.eval_samples
    evaluation = min(cfg.eval_batch_size, cfg.eval_prompts * samples_per_prompt)
    return [train, Decoding(evaluation, seq_len, 0, "eval_batch_size", f"evaluation: eval_batch_size "
                                                                        f"{cfg.eval_batch_size}")]
