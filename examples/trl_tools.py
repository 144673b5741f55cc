"""PODS with tool calls in TRL's GRPOTrainer, offline on CPU with the built-in tiny model.

The tiny model was warm-started on arithmetic answers and has never seen a tool call. This
example gives it a calculator and trains it to use it:
1. its tokenizer gets the chat and tool-call tokens and a compact ChatML template that lists
   the tools in one line (TRL's Qwen3 template spends 650 tokens on the tool schema; the tiny
   model's context is 128, stretched to 256 here), and TRL's Qwen3 response parser;
2. a short supervised warm-up (--warmup_steps) shows it the shape of a call and an answer:
   user "What is 3 + 76?" -> <tool_call>{"name": "add", "arguments": {"a": 3, "b": 76}}</tool_call>
   -> tool "79" -> "Answer: 79";
3. PODSTrainer trains with the tool: n rollouts per prompt, TRL runs each call and masks the
   tool's output out of the loss, the final completion is scored (the right call, the right
   answer), and the m rollouts per prompt whose rewards vary most are trained on.

    python examples/trl_tools.py --output_dir runs/trl-tools-tiny

It prints how often the model calls the tool and the reward before and after. Runs in about
a minute on 2 CPU cores; the test suite runs a shorter version.
"""

import argparse
import random

import torch
from datasets import Dataset
from trl.chat_template_utils import qwen3_template

from podsrl.build.chat_standins import chat_tokenizer
from podsrl.models import load_model
from podsrl.trl import PODSConfig, PODSTrainer, trl_batch_arguments

# ChatML with Qwen's tool-call and tool-response markup, tools listed as name(arguments)
COMPACT_TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {% for tool in tools %}{{ tool.function.name }}("
    "{{ tool.function.parameters.properties | list | join(', ') }}){% if not loop.last %}, {% endif %}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "<|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ call.function.name }}\", \"arguments\": "
    "{% if call.function.arguments is string %}{{ call.function.arguments }}{% else %}"
    "{{ call.function.arguments | tojson }}{% endif %}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def add(a: int, b: int) -> int:
    """
    Add two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum.
    """
    return a + b


def problems(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "a": a, "b": b})
    return rows


def tool_use_reward(completions, a, b, **kwargs) -> list[float]:
    """0.25 for each of the question's numbers passed to add, 0.5 for a last turn that says
    "Answer: <a + b>"; the tool's output is in the completion, but only the model's turns score."""
    rewards = []
    for completion, x, y in zip(completions, a, b):
        calls = [call["function"] for turn in completion for call in turn.get("tool_calls") or []]
        arguments = max((0.25 * (call["arguments"].get("a") == x) + 0.25 * (call["arguments"].get("b") == y)
                         for call in calls if call["name"] == "add" and isinstance(call["arguments"], dict)),
                        default=0.0)
        answered = (completion[-1].get("content") or "").strip() == f"Answer: {x + y}"
        rewards.append(arguments + 0.5 * answered)
    return rewards


def warm_up(model, tokenizer, steps: int, seed: int) -> float:
    """Supervised steps on whole tool-using conversations; returns the last loss. The loss
    covers what follows the user turn (the call, the tool's reply and the answer)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        batch = problems(16, seed + 1000 + step)
        texts, prompt_lengths = [], []
        for row in batch:
            call = {"type": "function", "function": {"name": "add", "arguments": {"a": row["a"], "b": row["b"]}}}
            conversation = row["prompt"] + [{"role": "assistant", "content": "", "tool_calls": [call]},
                                            {"role": "tool", "name": "add", "content": str(row["a"] + row["b"])},
                                            {"role": "assistant", "content": f"Answer: {row['a'] + row['b']}"}]
            prompt = tokenizer.apply_chat_template(row["prompt"], tools=[add], tokenize=False,
                                                   add_generation_prompt=True)
            texts.append(tokenizer.apply_chat_template(conversation, tools=[add], tokenize=False))
            prompt_lengths.append(len(tokenizer(prompt)["input_ids"]))
        encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right")
        labels = encoded["input_ids"].clone()  # [B, T]
        labels[encoded["attention_mask"] == 0] = -100
        for i, length in enumerate(prompt_lengths):
            labels[i, :length] = -100
        loss = model(**encoded, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="runs/trl-tools-tiny")
    parser.add_argument("--warmup_steps", type=int, default=300)
    parser.add_argument("--max_steps", type=int, default=20)
    parser.add_argument("--num_generations", type=int, default=8)
    parser.add_argument("--num_kept", type=int, default=4)
    parser.add_argument("--prompts_per_step", type=int, default=4)
    parser.add_argument("--learning_rate", type=float, default=2e-4)
    parser.add_argument("--temperature", type=float, default=0.5,
                        help="sampling temperature: at 1.0 the briefly warmed-up model garbles most calls")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    bundle = load_model("tiny")
    tokenizer = chat_tokenizer()
    tokenizer.chat_template = COMPACT_TOOL_TEMPLATE
    tokenizer.response_template = qwen3_template  # TRL parses the completions' <tool_call> blocks with it
    model = bundle.model
    model.resize_token_embeddings(len(tokenizer))  # the chat and tool-call tokens
    model.config.max_position_embeddings = 256  # rotary positions: a longer context needs no new weights
    model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    loss = warm_up(model, tokenizer, args.warmup_steps, args.seed)
    print(f"warm-up: {args.warmup_steps} supervised steps, last loss {loss:.3f}")

    batch = trl_batch_arguments(args.prompts_per_step, args.num_generations, args.num_kept,
                                 micro_batch_size=args.prompts_per_step * args.num_kept)
    config = PODSConfig(output_dir=args.output_dir, max_steps=args.max_steps, learning_rate=args.learning_rate,
                        lr_scheduler_type="constant", use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                        logging_steps=1, disable_tqdm=True, seed=args.seed, max_completion_length=96,
                        temperature=args.temperature, beta=0.0, **batch)
    trainer = PODSTrainer(model=model, processing_class=tokenizer, reward_funcs=tool_use_reward, args=config,
                          train_dataset=Dataset.from_list(problems(512, args.seed)), tools=[add])
    trainer.train()
    steps = [row for row in trainer.state.log_history if "tools/call_frequency" in row]
    for key in ("tools/call_frequency", "tools/failure_frequency", "pods/generated_reward_mean",
                "pods/generated_reward_std", "pods/kept_reward_std"):
        print(f"{key:28s}", " ".join(f"{row[key]:.2f}" for row in steps))


if __name__ == "__main__":
    main()
