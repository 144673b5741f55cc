"""The model card (README.md) of an exported run: Hugging Face metadata, how the model was
trained, held-out accuracy before and after, the code version, and how to load it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from podsrl.methods import METHODS
from podsrl.models.loading import HUB_ID, OFFLINE_FALLBACKS
from podsrl.registry import component_label
from podsrl.run_folder.run_info import CARD_KEYS, RunInfo, Source

TAGS = ("podsrl", "pods", "grpo", "reinforcement-learning")


def model_card(info: RunInfo, source: Source, output: Path, *, merged_lora: bool) -> str:
    return "\n".join([_front_matter(info), _overview(info, source, output, merged_lora), _settings(info),
                      _accuracy(info, source.step), _usage(info, output), _full_config(info)])


def base_model_id(name: str) -> str | None:
    """The hub id of the base model, or None when it has none (the built-in tiny model, a
    local folder): the hub's ``base_model`` metadata must name a hub repository."""
    hub_names = {builtin: hub for hub, builtin in OFFLINE_FALLBACKS.items()}  # smollm2 built-in -> its hub id
    name = hub_names.get(name, name)
    return name if HUB_ID.fullmatch(name) and not Path(name).expanduser().exists() else None


def _front_matter(info: RunInfo) -> str:
    base = base_model_id(str(info.value("model", "")))
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation"]
    lines += [f"base_model: {base}"] if base else []
    lines += ["tags:", *[f"- {tag}" for tag in TAGS], "---", ""]
    return "\n".join(lines)


def method_label(info: RunInfo) -> str:
    """'pods 16->4 max_variance: generate n, train on m picked by `rule`'."""
    name = info.value("method", "?")
    method = METHODS.get(name)
    if method is None:  # a method this podsrl does not know: name it as the run did
        return str(name)
    arm = method.arm_name(info.value("num_generations"), info.value("num_kept"),
                          info.value("downsampling_rule"))
    return f"{arm}: {method.description}"


def _overview(info: RunInfo, source: Source, output: Path, merged_lora: bool) -> str:
    env = info.environment
    commits = ", ".join(dict.fromkeys(e.get("commit", "unknown") for e in env)) or "unknown"
    version = env[-1].get("podsrl", "unknown") if env else "unknown"
    lora = (f" Trained as a LoRA adapter (rank {info.value('lora_rank')}, alpha {info.value('lora_alpha')}), "
            f"merged into the base weights here: the folder loads without peft.") if merged_lora else ""
    rows = [("base model", f"`{info.value('model')}`"), ("method", method_label(info)),
            ("task", f"`{component_label(info.value('task'))}`"),
            ("exported", f"{source.label} (step {source.step})"),
            ("training steps", f"{source.step} of {info.value('max_steps')}"),
            ("training time", f"{_duration(source.train_seconds)} (generation, reward and update; "
                              f"evaluation excluded)"),
            ("trained on", env[0].get("machine", "unknown") if env else "unknown"),
            ("started", env[0].get("date", "unknown") if env else "unknown"),
            ("podsrl", f"{version}, commit {commits}")]
    return "\n".join([f"# {output.resolve().name}", "",
                      f"`{info.value('model')}` trained with reinforcement learning from verifiable rewards "
                      "by podsrl (PODS: Policy Optimization with Down-Sampling, Xu et al., arXiv "
                      f"2504.13818).{lora}",
                      "", "## Training", "", "| | |", "| --- | --- |",
                      *[f"| {key} | {value} |" for key, value in rows], ""])


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _settings(info: RunInfo) -> str:
    rows = [(key, info.config[key]) for key in CARD_KEYS if key in info.config]
    return "\n".join(["Key settings (the whole config is at the end):", "", "| field | value |",
                      "| --- | --- |",
                      *[f"| `{name}` | `{json.dumps(value)}` |" for name, value in rows], ""])


def _task_option(task) -> str:
    """The run's task as ``--task`` takes it: a name, or a mapping with arguments as JSON."""
    return shlex.quote(json.dumps(task)) if isinstance(task, dict) else task


def _percent(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _accuracy(info: RunInfo, step: int) -> str:
    """Sampled (and greedy, when logged) held-out accuracy at the first evaluation and the
    last one up to ``step``."""
    evals = info.evals(up_to_step=step)
    lines = ["## Held-out accuracy", ""]
    if not evals:
        return "\n".join(lines + ["No evaluation was logged.", ""])
    first, last = evals[0], evals[-1]

    def row(label: str, key: str) -> str:
        return f"| {label} | {_percent(first.get(key))} | {_percent(last.get(key))} |"

    asked, held_out = info.value("eval_prompts"), info.data.get("test_prompts")
    prompts = min(asked, held_out) if isinstance(asked, int) and isinstance(held_out, int) else asked or "?"
    lines += [f"On {prompts} held-out prompts of the task (never trained on), as logged "
              f"in the run's metrics.jsonl:", "",
              f"| | step {first['step']} | step {last['step']} |", "| --- | --- | --- |",
              row(f"sampled (T = {info.value('eval_temperature', '?')}, samples per prompt: "
                  f"{info.value('eval_samples', '?')})", "eval_accuracy")]
    if "eval_greedy_accuracy" in last:
        lines.append(row("greedy", "eval_greedy_accuracy"))
    return "\n".join(lines + [""])


def _usage(info: RunInfo, output: Path) -> str:
    """A snippet that loads the folder with plain transformers and answers one prompt
    rendered exactly as in training (chat template and system prompt included)."""
    prompt = info.data.get("example_prompt", "What is 2 + 2?")
    return "\n".join([
        "## Usage", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
        f"model = AutoModelForCausalLM.from_pretrained({json.dumps(str(output))})  # or its hub id once "
        "uploaded",
        f"tokenizer = AutoTokenizer.from_pretrained({json.dumps(str(output))})",
        f"prompt = {json.dumps(prompt)}  # a held-out prompt, rendered as in training",
        'inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)',
        f"output = model.generate(**inputs, max_new_tokens={info.value('max_completion_length', 256)}, "
        f"do_sample=False)",
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        "```", "",
        f"`podsrl eval --model {output} --task {_task_option(info.value('task'))}` (with the run's data "
        "options) measures held-out accuracy again.", ""])


def _full_config(info: RunInfo) -> str:
    return "\n".join(["<details><summary>The run's podsrl config</summary>", "", "```json",
                      json.dumps(info.config, indent=2), "```", "", "</details>", ""])
