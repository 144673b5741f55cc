"""Build the built-in offline ``tiny`` model: a Qwen2-shaped causal LM with a locally
trained tokenizer, warm-started by supervised training on the arithmetic task.

Why a *spread* warm start: in a prototype on the development machine (0.5M parameters,
character tokens), RL from a clean but under-trained SFT checkpoint lost accuracy in every
setting tried, while a checkpoint whose sampled answers are spread around the right one
(SFT continued on targets partly perturbed by +-1 / +-10) gave RL a distribution to
sharpen. So the build runs two phases: clean SFT, then a short continuation on perturbed
targets.

The result ships in ``podsrl/assets/tiny`` (a few MB); ``scripts/build_tiny.py`` rebuilds
it (about 10 CPU-minutes). The tests build small random models with
:func:`train_tokenizer` and :func:`make_model`. Training never imports this module.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path
from typing import Callable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from podsrl.models import TINY_DIR, ModelBundle
from podsrl.tasks.arithmetic import build_arithmetic
from podsrl.tasks.base import Example, PreparedSplit
from podsrl.trainer.evaluate import accuracy, generate_and_grade

ASSET_DIR = TINY_DIR
EOS = "<|endoftext|>"


def train_tokenizer(texts: list[str], vocab_size: int = 320):
    """Byte-level BPE (exact round trip of any text) with digits split one per token, so
    numbers are spelled digit by digit while the template's words become single tokens."""

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   bos_token=None, padding_side="left")


def make_model(tokenizer, hidden_size: int = 128, num_layers: int = 4, seed: int = 0,
               max_positions: int = 128):
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def _perturb(answer: int, rng: random.Random) -> int:
    return answer + rng.choice([-10, -1, 1, 10])


def sft_batch(tokenizer, examples: list[Example], targets: list[str]):
    """Right-padded prompt+target+EOS ids with a loss mask on the target tokens only."""
    rows, masks = [], []
    for ex, target in zip(examples, targets):
        p = tokenizer(ex.prompt, add_special_tokens=False)["input_ids"]
        c = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p + c)
        masks.append([0] * len(p) + [1] * len(c))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    loss_mask = torch.zeros(len(rows), width)
    attn = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, : len(r)] = torch.tensor(r)
        loss_mask[i, : len(m)] = torch.tensor(m, dtype=torch.float)
        attn[i, : len(r)] = 1
    return ids, attn, loss_mask


def answer_target(perturb_fraction: float):
    """The arithmetic task's SFT target: ``Answer: <gold>``, perturbed by +-1 / +-10 with
    probability ``perturb_fraction`` (the spread warm start)."""
    def target(example: Example, rng: random.Random) -> str:
        value = int(example.answer)
        if rng.random() < perturb_fraction:
            value = _perturb(value, rng)
        return f"Answer: {value}"
    return target


def sft_steps(model, tokenizer, train: list[Example], steps: int, lr: float, batch_size: int,
              target: Callable[[Example, random.Random], str], rng: random.Random, log_every: int = 200,
              group_by: Callable[[Example], int] | None = None):
    """AdamW with warm-up and cosine decay on ``target(example, rng)`` completions of random
    train prompts (loss on the completion's tokens only). ``group_by``: each batch is drawn
    from the group of one random example (e.g. chains of one length), so rows of very
    different lengths are not padded to the longest."""
    groups: dict[int, list[Example]] = {}
    for example in train if group_by else ():
        groups.setdefault(group_by(example), []).append(example)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    model.train()
    for step in range(steps):
        if group_by:
            pool = groups[group_by(rng.choice(train))]
            examples = [rng.choice(pool) for _ in range(batch_size)]
        else:
            examples = rng.sample(train, batch_size)
        targets = [target(ex, rng) for ex in examples]
        ids, attn, loss_mask = sft_batch(tokenizer, examples, targets)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]  # [B, L-1, V]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (nll * loss_mask[:, 1:]).sum() / loss_mask[:, 1:].sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % log_every == 0 or step == steps - 1:
            print(f"  sft step {step:5d}  loss {loss.item():.4f}", flush=True)


def build(output_dir: Path = ASSET_DIR, level: int = 3, clean_steps: int = 3000,
          spread_steps: int = 300, perturb_fraction: float = 0.5, seed: int = 0,
          hidden_size: int = 128, num_layers: int = 4) -> Path:
    """Build tokenizer + model + two-phase warm start and save them as an HF model folder."""
    check_build_output(output_dir)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    task = build_arithmetic(level=level, seed=seed)
    corpus = [ex.prompt + f"Answer: {ex.answer}" for ex in task.train[:5000]]
    corpus += [str(i) for i in range(-2000, 2000)]
    tokenizer = train_tokenizer(corpus)
    model = make_model(tokenizer, hidden_size=hidden_size, num_layers=num_layers, seed=seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tiny model: {n_params / 1e6:.2f}M params, vocab {len(tokenizer)}", flush=True)
    bundle = ModelBundle(model=model, tokenizer=tokenizer, name="tiny")

    def probe_accuracy(samples: int, temperature: float) -> float:
        return held_out_accuracy(bundle, task, samples, temperature, max_completion_length=8, seed=seed)

    start = time.time()
    print("phase 1: clean SFT", flush=True)
    sft_steps(model, tokenizer, task.train, clean_steps, 3e-3, 128, answer_target(0.0), rng)
    clean = probe_accuracy(1, 0.0)
    print(f"  greedy held-out accuracy after clean SFT: {clean:.3f} ({time.time() - start:.0f}s)")
    print("phase 2: spread SFT (perturbed targets)", flush=True)
    sft_steps(model, tokenizer, task.train, spread_steps, 1e-3, 128, answer_target(perturb_fraction), rng)
    greedy = probe_accuracy(1, 0.0)
    sampled = probe_accuracy(4, 0.9)
    print(f"  held-out accuracy after spread SFT: greedy {greedy:.3f}, sampled(T=0.9) {sampled:.3f}")
    return save_build(output_dir, bundle, {
        "level": level, "clean_steps": clean_steps, "spread_steps": spread_steps,
        "perturb_fraction": perturb_fraction, "seed": seed, "params": n_params,
        "greedy_after_clean": clean, "greedy_after_spread": greedy,
        "sampled_t0.9_after_spread": sampled, "build_seconds": round(time.time() - start, 1),
    })


def held_out_accuracy(bundle: ModelBundle, task, samples: int, temperature: float, max_completion_length: int,
                      seed: int, probes: int = 200) -> float:
    """Accuracy on the first ``probes`` held-out prompts of ``task`` (the builds' progress probe)."""
    probe = task.test[:probes]
    return accuracy(generate_and_grade(bundle, PreparedSplit(probe, [ex.prompt for ex in probe]),
                                       samples=samples, temperature=temperature,
                                       max_completion_length=max_completion_length, seed=seed,
                                       correct_fn=task.correct_fn))


BUILD_FILES = frozenset({"build_info.json", "config.json", "generation_config.json", "model.safetensors",
                         "tokenizer.json", "tokenizer_config.json"})


def check_build_output(output_dir: Path) -> None:
    """Refuse, before any training, an output folder that holds anything but an earlier build:
    a build replaces only files it can prove a build wrote (the folder's build_info.json, whose
    ``params`` and ``build_seconds`` a build writes, and the model folder's own files beside it)."""
    # exists() follows links: a dangling one passed it, and the build failed at save, its hours lost
    for path in (output_dir, *output_dir.parents):
        if path.is_symlink() and not path.exists():
            where = "is" if path == output_dir else f"lies under {path},"
            raise SystemExit(f"--output {output_dir}: {where} a dangling link; choose another --output")
        if path.exists():
            break
    if output_dir.is_symlink():  # writing through a link would replace whatever it points to
        raise SystemExit(f"--output {output_dir}: is a link; a build writes only into a plain folder: "
                         "choose another --output")
    if not output_dir.exists():
        if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
            raise SystemExit(f"--output {output_dir}: cannot be created ({path} is not a writable folder); "
                             "choose another --output")
        return
    if not output_dir.is_dir():
        raise SystemExit(f"--output {output_dir}: exists and is not a folder; choose another --output")
    found = {p.name for p in output_dir.iterdir()}
    links = sorted(p.name for p in output_dir.iterdir() if p.is_symlink())
    if links:  # writing the build through a link would replace whatever it points to
        raise SystemExit(f"--output {output_dir}: holds links ({', '.join(links[:5])}); a build writes only "
                         "plain files it made: choose another --output")
    try:
        info = json.loads((output_dir / "build_info.json").read_text())
        proven = isinstance(info, dict) and {"params", "build_seconds"} <= info.keys()
    except (OSError, ValueError):
        proven = False
    if found and (not proven or found - BUILD_FILES):
        others = sorted(found - BUILD_FILES) or ["no build_info.json of a build"]
        raise SystemExit(f"--output {output_dir}: holds files a build did not write "
                         f"({', '.join(others[:5])}); a build writes only into an empty folder or over an "
                         "earlier build: choose another --output")


def save_build(output_dir: Path, bundle: ModelBundle, info: dict) -> Path:
    """The built model and tokenizer as an HF model folder, with ``info`` (and the torch version)
    in build_info.json."""
    output_dir.mkdir(parents=True, exist_ok=True)
    bundle.model.save_pretrained(output_dir, safe_serialization=True)
    bundle.tokenizer.save_pretrained(output_dir)
    (output_dir / "build_info.json").write_text(json.dumps({**info, "torch": torch.__version__}, indent=2)
                                                + "\n")
    return output_dir
