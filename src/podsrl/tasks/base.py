"""Task records shared by every task, and prompt rendering."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from podsrl.rewards.functions import extract_final_answer, think_answer_format_strict

REASONING_GYM_PREFIX = "reasoning_gym:"

# R1-style instruction for the <think>...</think><answer>...</answer> format that the
# paper's GSM8K / MATH rewards check.
THINK_ANSWER_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The Assistant first thinks about the reasoning process step by step and then "
    "gives the final answer. The reasoning process and the answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., "
    "<think> reasoning process here </think> <answer> final answer here </answer>."
)


@dataclass(frozen=True)
class Example:
    """One problem: the prompt text (the user's message) and its verifiable gold answer.

    ``columns`` carries any further dataset fields; they reach reward functions as
    keyword arguments, as in TRL.
    """

    prompt: str
    answer: str
    columns: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """A named task: a train split to sample prompts from, a disjoint held-out split, and
    its reward functions (TRL signature, see ``podsrl.rewards``):

    - ``correct_fn``: 1.0 when the final answer is right; also the accuracy metric.
    - ``format_fn``: 1.0 when the completion follows the requested format.
    - ``extract_fn``: completion -> the final answer it gives (for evaluation records).
    - ``system_prompt``: sent as the system message when the tokenizer has a chat template,
      prepended to the prompt otherwise ("" = none).
    """

    name: str
    train: list[Example]
    test: list[Example]
    correct_fn: Callable[..., list]
    format_fn: Callable[..., list]
    extract_fn: Callable[[str], str | None]
    system_prompt: str = ""


def think_answer_task(name: str, read_examples: Callable[[str, str, str], list[Example]], train_data: str,
                      test_data: str, defaults: tuple[str, str], with_train: bool,
                      correct_fn: Callable[..., list]) -> Task:
    """A math-word-problem task in the paper's style (GSM8K, MATH): the splits read by
    ``read_examples(spec, split, field_name)`` from the given data or the hub ``defaults``
    (train, test), answers graded by ``correct_fn``, prompts asking for
    ``<think>...</think><answer>...</answer>``."""
    train = read_examples(train_data or defaults[0], "train", "train_data") if with_train else []
    return Task(name=name, train=train, test=read_examples(test_data or defaults[1], "test", "test_data"),
                correct_fn=correct_fn, format_fn=think_answer_format_strict, extract_fn=extract_final_answer,
                system_prompt=THINK_ANSWER_SYSTEM_PROMPT)


def render_prompt(tokenizer, example: Example, system_prompt: str = "", use_chat_template: bool = True) -> str:
    """The exact text the model is conditioned on.

    With a chat template (instruct models): system + user messages and the generation
    prompt, as the model was tuned on. Without one (base models, the tiny model): the
    system prompt, a blank line, then the prompt, verbatim.
    """
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": example.prompt.strip()})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{system_prompt}\n\n{example.prompt}" if system_prompt else example.prompt


def reward_columns(examples: list[Example], repeat: int) -> dict[str, list]:
    """Dataset columns for reward functions, each value repeated once per completion."""
    columns = {"answer": [ex.answer for ex in examples for _ in range(repeat)]}
    for key in examples[0].columns if examples else ():
        columns[key] = [ex.columns[key] for ex in examples for _ in range(repeat)]
    return columns


@dataclass
class PreparedSplit:
    """A split's examples with their rendered prompts; over-long prompts removed, counted."""

    examples: list[Example]
    prompts: list[str]
    dropped: int


def prepare_split(examples: list[Example], tokenizer, *, system_prompt: str, use_chat_template: bool,
                  max_prompt_tokens: int) -> PreparedSplit:
    """Render every prompt once and drop those over ``max_prompt_tokens`` tokens."""
    rendered = [render_prompt(tokenizer, ex, system_prompt, use_chat_template) for ex in examples]
    lengths = [len(ids) for ids in tokenizer(rendered, add_special_tokens=False)["input_ids"]] if rendered else []
    keep = [i for i, n in enumerate(lengths) if n <= max_prompt_tokens]
    return PreparedSplit([examples[i] for i in keep], [rendered[i] for i in keep], len(examples) - len(keep))
