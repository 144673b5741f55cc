"""A short supervised format warm-up, the same for every arm of #29's comparison: the base
model (SmolLM2-135M-Instruct) is fine-tuned on a few hundred problems of an *easy*
arithmetic level, with their answers in the task's format ("Answer: <number>"), so that on a
harder level it answers in format and still has headroom for RL. The prompts are rendered
exactly as training and evaluation render them (system prompt, chat template).

    python benchmarks/format_warmup.py [--level 1] [--steps 120] [--batch 16] [--lr 3e-5]
        [--output_dir runs/smollm2-format]

Writes a Hugging Face model folder (``--model runs/smollm2-format`` for podsrl and
benchmarks/regime_candidates.py). Full fine-tuning, float32, on the task's train split; on
the GPU when there is one (``--device``), which draws the same batches but does not give
bit-identical weights to a CPU warm-up: measure the warmed model where it was made.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from podsrl.models import load_model
from podsrl.tasks import build_task, prepare_split
from podsrl.trainer.config import make_config
from podsrl.trainer.setup import task_options

CALCULATOR = "You are a calculator. Reply with exactly one line of the form 'Answer: <number>' and nothing else."


def batch(tokenizer, prompts: list[str], targets: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded prompt + target + EOS ids [B, L], attention [B, L] and a loss mask on the target [B, L]."""
    rows, masks = [], []
    for prompt, target in zip(prompts, targets):
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p + c)
        masks.append([0] * len(p) + [1] * len(c))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    attention, loss_mask = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width)
    for i, (row, mask) in enumerate(zip(rows, masks)):
        ids[i, :len(row)], attention[i, :len(row)] = torch.tensor(row), 1
        loss_mask[i, :len(mask)] = torch.tensor(mask, dtype=torch.float)
    return ids, attention, loss_mask


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--level", type=int, default=1, help="arithmetic level of the warm-up problems")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", type=Path, default=Path("runs/smollm2-format"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.output_dir.exists():
        raise SystemExit(f"--output_dir: {args.output_dir} exists; choose another folder")
    torch.manual_seed(args.seed)
    cfg = make_config(overrides={"model": args.model, "task": "arithmetic", "task_level": str(args.level),
                                 "system_prompt": CALCULATOR, "output_dir": str(args.output_dir)})
    bundle = load_model(cfg.model)
    task = build_task(task_options(cfg))
    split = prepare_split(task.train, bundle.tokenizer, system_prompt=cfg.system_prompt_for(task),
                          use_chat_template=cfg.chat_template, max_prompt_tokens=cfg.max_prompt_tokens)
    model, tokenizer, rng = bundle.model.to(args.device), bundle.tokenizer, random.Random(args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    model.train()
    start = time.perf_counter()
    for step in range(args.steps):
        rows = rng.sample(range(len(split.prompts)), args.batch)
        ids, attention, loss_mask = batch(tokenizer, [split.prompts[i] for i in rows],
                                          [f"Answer: {split.examples[i].answer}" for i in rows])
        ids, attention, loss_mask = ids.to(args.device), attention.to(args.device), loss_mask.to(args.device)
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]  # [B, L-1, V]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # [B, L-1]
        loss = (nll * loss_mask[:, 1:]).sum() / loss_mask[:, 1:].sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  {time.perf_counter() - start:.0f} s", flush=True)
    model.cpu().save_pretrained(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    print(f"wrote {args.output_dir} (level {args.level}, {args.steps} steps x {args.batch}, lr {args.lr:g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
