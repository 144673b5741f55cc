"""Build the built-in offline ``tiny-chain`` model: the reasoning regime's model (#58), a
Qwen2-shaped causal LM with its own digit-split tokenizer, warm-started on the ``chain`` task
(multi-step arithmetic worked one step per line, podsrl.tasks.chain).

The recipe is ``tiny``'s (podsrl.build.tiny): clean SFT on worked solutions, then a short
*spread* continuation whose targets slip: each line's result is written off by +-1 or +-10
with probability 0.15 and the following lines carry on from it. The slips leave sampled
completions spread around right chains, so RL has a distribution to sharpen, and since every
line may slip, long chains fail more often than short ones, as long chains of thought do.

Why a polish phase and p = 0.15 (measured on the 2-core AVX2 EPYC, 200 held-out chains): after
2,000 clean steps greedy accuracy was 68.5%, and two thirds of the errors, greedy or sampled,
were lookups (the line of step k wrote another step's operation), which RL does not fix in
minutes: a spread of p = 0.05 on that model left sampled accuracy (T = 0.9) at 55%, 13 points
under greedy, and RL at lr 2e-4 to 1e-3 did not raise it (flat, or fell). 800 more clean steps
at lr 1e-3 took greedy to 79.5% (lookups now mostly at steps 9-11); a spread of p = 0.15 on it
gives sampled 46.75% against greedy 77%: its errors are mostly slips (149 of 213), the room RL
has to sharpen.

The result ships in ``podsrl/assets/tiny-chain``; ``scripts/build_tiny_chain.py`` rebuilds it.
Training never imports this module.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from podsrl.build.tiny import check_build_output, held_out_accuracy, make_model, save_build, sft_steps, train_tokenizer
from podsrl.models import TINY_CHAIN_DIR, ModelBundle
from podsrl.tasks.base import Example
from podsrl.tasks.chain import build_chain, worked_solution

ASSET_DIR = TINY_CHAIN_DIR
MAX_NEW_TOKENS = 256  # level 3's longest worked solution is about 240 tokens


def steps_of(example: Example) -> int:
    return example.columns["steps"]


def chain_target(slip_probability: float):
    """SFT target: the worked solution, each line's result slipping by +-1 / +-10 with
    probability ``slip_probability`` (0: the clean solution, no random draw)."""
    def target(example: Example, rng: random.Random) -> str:
        if not slip_probability:
            return worked_solution(example.columns["chain"])
        return worked_solution(example.columns["chain"], slip=lambda c: c + rng.choice([-10, -1, 1, 10])
                               if rng.random() < slip_probability else c)
    return target


def build(output_dir: Path = ASSET_DIR, level: int = 3, clean_steps: int = 2000, polish_steps: int = 800,
          spread_steps: int = 200, slip_probability: float = 0.15, batch_size: int = 64, seed: int = 0,
          hidden_size: int = 128, num_layers: int = 4) -> Path:
    """Build tokenizer + model + warm start (clean SFT, clean polish at a lower rate, spread)
    and save them as an HF model folder."""
    check_build_output(output_dir)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    task = build_chain(level=level, seed=seed)
    corpus = [ex.prompt + worked_solution(ex.columns["chain"]) for ex in task.train[:5000]]
    corpus += [str(i) for i in range(-2000, 2000)]
    tokenizer = train_tokenizer(corpus, vocab_size=384)
    model = make_model(tokenizer, hidden_size=hidden_size, num_layers=num_layers, seed=seed,
                       max_positions=512)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tiny-chain model: {n_params / 1e6:.2f}M params, vocab {len(tokenizer)}", flush=True)
    bundle = ModelBundle(model=model, tokenizer=tokenizer, name="tiny-chain")

    def probe_accuracy(samples: int, temperature: float) -> float:
        return held_out_accuracy(bundle, task, samples, temperature, max_completion_length=MAX_NEW_TOKENS,
                                 seed=seed)

    start = time.time()
    print("phase 1: clean SFT", flush=True)
    sft_steps(model, tokenizer, task.train, clean_steps, 3e-3, batch_size, chain_target(0.0), rng,
              group_by=steps_of)
    clean = probe_accuracy(1, 0.0)
    print(f"  greedy held-out accuracy after clean SFT: {clean:.3f} ({time.time() - start:.0f}s)", flush=True)
    print("phase 2: clean polish", flush=True)
    sft_steps(model, tokenizer, task.train, polish_steps, 1e-3, batch_size, chain_target(0.0), rng,
              group_by=steps_of)
    polished = probe_accuracy(1, 0.0)
    print(f"  greedy held-out accuracy after the polish: {polished:.3f} ({time.time() - start:.0f}s)",
          flush=True)
    print("phase 3: spread SFT (slipped lines)", flush=True)
    sft_steps(model, tokenizer, task.train, spread_steps, 1e-3, batch_size, chain_target(slip_probability),
              rng, group_by=steps_of)
    greedy = probe_accuracy(1, 0.0)
    sampled = probe_accuracy(4, 0.9)
    print(f"  held-out accuracy after spread SFT: greedy {greedy:.3f}, sampled(T=0.9) {sampled:.3f}",
          flush=True)
    return save_build(output_dir, bundle, {
        "task": "chain", "level": level, "clean_steps": clean_steps, "polish_steps": polish_steps,
        "spread_steps": spread_steps, "slip_probability": slip_probability, "batch_size": batch_size,
        "seed": seed, "params": n_params, "greedy_after_clean": clean, "greedy_after_polish": polished,
        "greedy_after_spread": greedy, "sampled_t0.9_after_spread": sampled,
        "build_seconds": round(time.time() - start, 1),
    })
