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


Messages = list[dict[str, Any]]  # [{"role": "user", "content": "..."}, ...]
# Keyword arguments of every reward call (TRL's): dataset columns of these names are not
# passed, since they would collide with them ("prompt" arrives as ``prompts``).
RESERVED_COLUMNS = ("prompt", "completion", "completion_ids", "prompts", "completions", "trainer_state",
                    "log_extra", "log_metric")


@dataclass(frozen=True)
class Example:
    """One problem: the prompt (text, or a conversation as TRL's conversational datasets
    hold it: a list of ``{"role", "content"}`` messages) and its verifiable gold answer.

    ``columns`` carries the dataset's columns under their own names (raw, as in the data);
    they reach reward functions as keyword arguments, as in TRL.
    """

    prompt: str | Messages
    answer: str
    columns: dict[str, Any] = field(default_factory=dict)


def dataset_columns(row: dict[str, Any]) -> dict[str, Any]:
    """A data row's columns as reward functions get them: all but the reserved names."""
    return {k: v for k, v in row.items() if k not in RESERVED_COLUMNS}


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


def is_conversational(example: Example) -> bool:
    return isinstance(example.prompt, list)


def prompt_messages(example: Example, system_prompt: str = "") -> Messages:
    """The conversation the chat template renders: the system prompt as a system message
    (unless the example's conversation brings its own, or it is ""), then the user's
    message or the example's conversation."""
    turns = (example.prompt if is_conversational(example)
             else [{"role": "user", "content": example.prompt.strip()}])
    has_system = any(m.get("role") == "system" for m in turns)
    return ([{"role": "system", "content": system_prompt}] if system_prompt and not has_system
            else []) + list(turns)


def render_prompt(tokenizer, example: Example, system_prompt: str = "",
                  use_chat_template: bool = True) -> str:
    """The exact text the model is conditioned on.

    With a chat template (instruct models): system + user messages (or the example's
    conversation) and the generation prompt, as the model was tuned on. Without one (base
    models, the tiny model): the system prompt, a blank line, then the prompt, verbatim; a
    conversation cannot be rendered without a template and is an error.
    """
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if use_chat_template and has_template:
        return tokenizer.apply_chat_template(prompt_messages(example, system_prompt), tokenize=False,
                                             add_generation_prompt=True)
    if is_conversational(example):
        why = "chat_template is false" if has_template else "the model's tokenizer has none"
        raise ValueError("chat_template: a prompt is a conversation (a list of messages), which is rendered "
                         f"with the tokenizer's chat template, but {why}")
    return f"{system_prompt}\n\n{example.prompt}" if system_prompt else example.prompt


def reward_columns(examples: list[Example], repeat: int) -> dict[str, list]:
    """Dataset columns for reward functions as TRL passes them: every column under its own
    name, each value repeated once per completion ([len(examples) * repeat]); ``answer`` is
    the gold answer unless the data has an ``answer`` column of its own (then it is that
    column, raw: e.g. GSM8K's whole solution ending in ``#### 42``)."""
    names = list(dict.fromkeys(name for ex in examples for name in ex.columns))
    columns = {} if "answer" in names else {"answer": [ex.answer for ex in examples for _ in range(repeat)]}
    for name in names:
        columns[name] = [ex.columns.get(name) for ex in examples for _ in range(repeat)]
    return columns


@dataclass
class PreparedSplit:
    """A split's examples with their rendered prompts; over-long prompts removed, counted.

    ``chat``: the prompts were rendered with the chat template, so reward functions get
    ``prompts`` and ``completions`` as message lists (TRL's conversational format), with
    ``system_prompt`` as the conversation's system message.
    """

    examples: list[Example]
    prompts: list[str]  # [N] the text the model is conditioned on
    dropped: int = 0
    chat: bool = False
    system_prompt: str = ""
    longest_prompt: int = 0  # tokens of the longest rendered prompt (0: not counted)

    @property
    def reward_prompts(self) -> list[str | Messages]:
        """[N] the prompts as reward functions get them: the conversation when rendered with
        the chat template, else the prompt text as in the data."""
        if self.chat:
            return [prompt_messages(ex, self.system_prompt) for ex in self.examples]
        return [ex.prompt for ex in self.examples]

    def at_prompts(self, indices: list[int]) -> "PreparedSplit":
        """The examples at ``indices``, in that order (``dropped`` not carried over)."""
        return PreparedSplit([self.examples[i] for i in indices], [self.prompts[i] for i in indices], 0,
                             self.chat, self.system_prompt)


def prepare_split(examples: list[Example], tokenizer, *, system_prompt: str, use_chat_template: bool,
                  max_prompt_tokens: int) -> PreparedSplit:
    """Render every prompt once and drop those over ``max_prompt_tokens`` tokens."""
    chat = use_chat_template and bool(getattr(tokenizer, "chat_template", None))
    rendered = [render_prompt(tokenizer, ex, system_prompt, use_chat_template) for ex in examples]
    lengths = ([len(ids) for ids in tokenizer(rendered, add_special_tokens=False)["input_ids"]] if rendered
               else [])
    keep = [i for i, n in enumerate(lengths) if n <= max_prompt_tokens]
    return PreparedSplit([examples[i] for i in keep], [rendered[i] for i in keep], len(examples) - len(keep),
                         chat, system_prompt, max((lengths[i] for i in keep), default=0))
