"""Generation engines, registered by name (config field ``generation_engine``).

An engine is ``fn(model, tokenizer, prompts, num_samples, *, max_new_tokens, temperature,
top_p, batch_size, share_prefill) -> Rollouts`` with the group axis kept ([P, n, ...]).
"""

from podsrl.rollout.hf import Rollouts, completion_mask_from_eos, generate

ENGINES = {"hf": generate}

__all__ = ["ENGINES", "Rollouts", "completion_mask_from_eos", "generate"]
