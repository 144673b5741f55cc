"""Models: loading (built-in ``tiny``, ``tiny-chain``, ``smollm2-135m-instruct``, local folders, hub
names; LoRA through peft) and per-token log-probabilities.

- :mod:`~podsrl.models.loading`: built-in models, local folders, hub names, LoRA adapters
- :mod:`~podsrl.models.logprobs`: per-token log-probabilities of completions
- :mod:`~podsrl.models.precision`: mixed precision and activation checkpointing
- :mod:`~podsrl.models.memory`: what the update costs in memory
"""

from podsrl.models.loading import (
                                   BUILTIN_MODELS,
                                   SMOLLM2,
                                   TINY_CHAIN_DIR,
                                   TINY_DIR,
                                   ModelBundle,
                                   check_model_name,
                                   load_model,
                                   resolve_model_path,
)
from podsrl.models.logprobs import shared_prompt_token_logprobs, token_logprobs

__all__ = ["BUILTIN_MODELS", "SMOLLM2", "TINY_CHAIN_DIR", "TINY_DIR", "ModelBundle", "check_model_name",
           "load_model", "resolve_model_path", "shared_prompt_token_logprobs", "token_logprobs"]
