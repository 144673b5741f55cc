"""Model loading: the built-in ``tiny`` model, local folders, or Hugging Face hub names,
with optional LoRA adapters through ``peft``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from podsrl.tiny import ASSET_DIR as TINY_DIR

# Short names of models that ship with (or are built by) podsrl.
BUILTIN_MODELS = {"tiny": TINY_DIR}


@dataclass
class ModelBundle:
    model: torch.nn.Module
    tokenizer: object
    name: str

    @property
    def uses_lora(self) -> bool:
        return hasattr(self.model, "peft_config")


def resolve_model_path(name: str) -> str:
    """Map a model name to something ``from_pretrained`` accepts: a built-in short name ->
    its folder; an existing local folder -> itself; anything else is passed through as a
    hub id (users with network download it; offline, loading fails with a clear error)."""
    if name in BUILTIN_MODELS:
        path = BUILTIN_MODELS[name]
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"model: built-in model {name!r} is missing at {path}; rebuild it with "
                f"`python scripts/build_tiny.py`")
        return str(path)
    return name


# org/name as the Hugging Face hub spells repository ids
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_model_name(name: str) -> None:
    """Reject names that can be neither a built-in, a local folder nor a hub id."""
    if name in BUILTIN_MODELS or Path(name).expanduser().is_dir() or HUB_ID.fullmatch(name):
        return
    raise ValueError(f"model: unknown model {name!r}: not a built-in model ({', '.join(BUILTIN_MODELS)}), "
                     f"an existing local folder, nor a hub id like 'org/name'")


def load_model(name: str, *, lora_rank: int = 0, lora_alpha: float = 16.0,
               lora_dropout: float = 0.0, lora_target_modules: tuple[str, ...] = (),
               dtype: str = "float32") -> ModelBundle:
    """Load a causal LM and its tokenizer; wrap the model in a LoRA adapter when
    ``lora_rank > 0`` (otherwise every parameter is trained)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except OSError as err:
        raise OSError(f"model: could not load {name!r} ({err}). Offline, use a local folder or "
                      f"a built-in model ({sorted(BUILTIN_MODELS)}).") from err
    if tokenizer.pad_token is None:
        # Left padding only needs some id under the attention mask; EOS is the usual choice.
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if lora_rank > 0:
        from peft import LoraConfig, get_peft_model

        targets = list(lora_target_modules) or "all-linear"
        model = get_peft_model(model, LoraConfig(
            r=lora_rank, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
            target_modules=targets, task_type="CAUSAL_LM"))
    return ModelBundle(model=model, tokenizer=tokenizer, name=name)
