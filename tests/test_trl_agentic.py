"""PODSTrainer with TRL's tools, environments (environment-owned rewards, several
environments, malformed tool calls) and custom rollout functions, on CPU.

Each test scripts the model's turns (as TRL's own tests do, by patching ``generate``), lets
PODSTrainer select, and checks against an independent oracle: the kept rows are the ones
the rule picks from the final rewards, and every per-row value TRL continues with (token
ids, tool masks, completions, environment instances and their state, the rollout
function's fields) is the generated row's own. Evaluation does not select."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from unittest.mock import patch

import pytest
import torch
import transformers
from datasets import Dataset
from trl import GRPOTrainer

from podsrl.algorithms import select
from podsrl.build.chat_standins import chat_tokenizer, tiny_config, tiny_llava
from podsrl.trl import PODSConfig, PODSTrainer

TOKENIZER = chat_tokenizer()
TRL_GENERATE = GRPOTrainer._generate  # TRL's own generation, recorded by Witness
N, M = 5, 3  # generated and kept rollouts per prompt


def tiny_chat_model():
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(tiny_config("Qwen2", TOKENIZER))


def tool_call(name: str, arguments) -> str:
    body = arguments if isinstance(arguments, str) else json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call><|im_end|>"


def scripted_generate(first_turns: list[str]):
    """A stand-in for ``model.generate``: row i of a first turn answers ``first_turns[i % k]``;
    a row whose prompt already holds a tool response answers "Done!"."""
    response = TOKENIZER.convert_tokens_to_ids("<tool_response>")

    def generate(input_ids, **kwargs):
        texts = ["Done!<|im_end|>" if (row == response).any() else first_turns[i % len(first_turns)]
                 for i, row in enumerate(input_ids)]
        ids = [TOKENIZER.encode(text, add_special_tokens=False) for text in texts]
        width = max(map(len, ids))
        padded = torch.tensor([row + [TOKENIZER.pad_token_id] * (width - len(row)) for row in ids])
        return torch.cat([input_ids, padded.to(input_ids.device)], dim=1)

    return generate


def config(tmp_path, **overrides) -> PODSConfig:
    values = dict(output_dir=str(tmp_path / "out"), max_steps=2, learning_rate=0.1, use_cpu=True, report_to="none",
                  save_strategy="no", disable_tqdm=True, seed=0, bf16=False, max_completion_length=160, beta=0.0,
                  num_generations=N, num_kept=M, per_device_train_batch_size=2 * N, logging_steps=1)
    return PODSConfig(**{**values, **overrides})


def conversations(rows: int, **columns) -> Dataset:
    prompts = [[{"role": "user", "content": f"What is {i} times {i + 1}?"}] for i in range(rows)]
    return Dataset.from_dict({"prompt": prompts, **columns})


class Witness(PODSTrainer):
    """Records, per training generation batch, every generated row (TRL's own generation
    output, with each row's environment), the selection and what TRL continues with."""

    def __init__(self, *args, **kwargs):
        self.batches = []
        super().__init__(*args, **kwargs)

    def _generate(self, prompts):
        if self._pods_inputs is None:  # evaluation
            return super()._generate(prompts)
        with patch.object(GRPOTrainer, "_generate", Witness._record_generated):
            kept = super()._generate(prompts)
        self.batches[-1].update(kept=kept, selection=dict(self.last_selection), kept_inputs=list(self._pods_inputs),
                                kept_environments=list(self.environments or []),
                                kept_rewards=self._pods_kept_rewards.clone(), kept_prompts=list(prompts))
        return kept

    def _record_generated(self, prompts):
        out = TRL_GENERATE(self, prompts)
        environments = list(self.environments or [])
        self.batches.append({"generated": out, "environments": environments, "inputs": list(self._pods_inputs),
                             "prompts": list(prompts),
                             "environment_state": [dict(vars(env)) for env in environments]})
        return out


def check_batches(trainer: Witness, oracle_rewards) -> None:
    """Every batch: kept rows = the rule's choice on the oracle's rewards, and every per-row
    value TRL continues with belongs to its generated row."""
    assert trainer.batches, "no training batch was generated"
    for batch in trainer.batches:
        rewards = torch.tensor(oracle_rewards(batch), dtype=torch.float32).view(-1, N)  # [G, n]
        assert torch.equal(batch["selection"]["rewards"], rewards)
        keep = select(trainer.args.downsampling_rule, rewards, M).sort(dim=1).values  # [G, m]
        assert torch.equal(batch["selection"]["kept"], keep)
        rows = (torch.arange(rewards.shape[0]).unsqueeze(1) * N + keep).flatten().tolist()
        generated, kept = batch["generated"], batch["kept"]
        for field in (0, 1, 2, 3, 4, 6):  # prompt and completion ids, tool mask, completions, log-probs, images
            expected = None if generated[field] is None else [generated[field][i] for i in rows]
            assert kept[field] == expected, f"field {field} of the kept rows is not the generated rows'"
        for key, values in generated[5].items():  # the rollout function's fields
            assert kept[5][key] == ([values[i] for i in rows] if isinstance(values, list) else values)
        assert batch["kept_inputs"] == [batch["inputs"][i] for i in rows]
        assert batch["kept_prompts"] == [batch["prompts"][i] for i in rows]
        if batch["environments"]:  # the very instances that ran the kept rollouts
            assert len(batch["kept_environments"]) == len(rows)
            assert all(kept is batch["environments"][i] for kept, i in zip(batch["kept_environments"], rows))
        assert torch.equal(batch["kept_rewards"].nansum(dim=1), rewards.flatten()[rows])


def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


def tool_result(completion) -> str:
    return " ".join(str(message.get("content")) for message in completion if message["role"] == "tool")


@pytest.mark.slow
def test_tools_with_malformed_calls_select_on_the_final_reward_and_carry_the_tool_masks(tmp_path):
    turns = [tool_call("multiply", {"a": 3, "b": 4}), tool_call("multiply", {"a": 3, "c": 4}),
             "I do not know.<|im_end|>", tool_call("multiply", '{"name": "multiply", "arguments": {"a": 2'),
             tool_call("multiply", {"a": 2, "b": 2})]

    def answer(completions, **kwargs):  # the final reward: what the tool returned, after the model's last turn
        return [1.0 if "12" in tool_result(c) else 0.5 if "4" in tool_result(c) else 0.0 for c in completions]

    trainer = Witness(model=tiny_chat_model(), processing_class=TOKENIZER, reward_funcs=answer,
                      args=config(tmp_path), train_dataset=conversations(8), tools=[multiply])
    with patch.object(trainer.model, "generate", side_effect=scripted_generate(turns)):
        trainer.train()
    check_batches(trainer, lambda batch: answer(batch["generated"][3]))
    for batch in trainer.batches:
        masks = batch["kept"][2]
        assert any(0 in mask for mask in masks), "a kept tool call's result tokens are masked out of the loss"
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] == pytest.approx(3 / 5)  # over all n generated rows, as GRPOTrainer
    assert logged["pods/kept_reward_std"] >= logged["pods/generated_reward_std"]


class Counter:
    """Owns its reward: the sum of the steps the model asked for."""

    def reset(self, **kwargs):
        self.total = 0
        self.prompt = kwargs.get("prompt")

    def increment(self, step: int) -> int:
        """
        Increment the counter.

        Args:
            step: Value to add.

        Returns:
            The new total.
        """
        self.total += step
        return self.total

    def get_reward(self) -> float:
        return float(self.total)


class Echo:
    def reset(self, **kwargs):
        self.said = ""

    def shout(self, text: str) -> str:
        """
        Shout the text back.

        Args:
            text: What to shout.

        Returns:
            The text in capitals.
        """
        self.said = text.upper()
        return self.said


@pytest.mark.slow
def test_environment_owned_rewards_keep_each_rows_environment_and_state(tmp_path):
    turns = [tool_call("increment", {"step": step}) for step in (1, 5, 2, 5, 3)]
    trainer = Witness(model=tiny_chat_model(), processing_class=TOKENIZER, args=config(tmp_path),
                      train_dataset=conversations(8), environment_factory=Counter)
    with patch.object(trainer.model, "generate", side_effect=scripted_generate(turns)):
        trainer.train()
    check_batches(trainer, lambda batch: [state["total"] for state in batch["environment_state"]])
    for batch in trainer.batches:  # the kept environments hold the state their own rollouts left
        kept_state = [env.total for env in batch["kept_environments"]]
        assert kept_state == batch["kept_rewards"][:, -1].tolist() or not batch["kept_environments"]


class Quiz(Counter):
    """Owns its data too: reset returns the prompt, so there is no dataset."""

    def reset(self, **kwargs):
        super().reset(**kwargs)
        return "Count to seven with increment."


@pytest.mark.slow
def test_environment_owned_data_and_rewards_need_no_dataset(tmp_path):
    turns = [tool_call("increment", {"step": step}) for step in (7, 3, 7, 1, 4)]
    trainer = Witness(model=tiny_chat_model(), processing_class=TOKENIZER, args=config(tmp_path),
                      environment_factory=Quiz)
    with patch.object(trainer.model, "generate", side_effect=scripted_generate(turns)):
        trainer.train()
    check_batches(trainer, lambda batch: [state["total"] for state in batch["environment_state"]])
    for batch in trainer.batches:  # the prompt each kept row trained on is the environment's
        assert all("Count to seven" in prompt[-1]["content"] for prompt in batch["kept_prompts"])


@pytest.mark.slow
def test_several_environments_route_each_kept_row_to_its_own(tmp_path):
    turns = [tool_call("increment", {"step": 2}), tool_call("shout", {"text": "hi"}), "No tool.<|im_end|>",
             tool_call("increment", {"step": 7}), tool_call("shout", {"text": "yo"})]

    def progress(completions, environments, **kwargs):  # a reward that reads each row's environment
        return [float(getattr(env, "total", len(getattr(env, "said", "")))) for env in environments]

    dataset = conversations(8, environment=["counter", "echo"] * 4)
    trainer = Witness(model=tiny_chat_model(), processing_class=TOKENIZER, reward_funcs=progress,
                      args=config(tmp_path, shuffle_dataset=False),
                      train_dataset=dataset, environment_factory={"counter": Counter, "echo": Echo})
    with patch.object(trainer.model, "generate", side_effect=scripted_generate(turns)):
        trainer.train()
    # Counter also owns a reward (weight 1, None on Echo's rows): a counter row scores its total twice
    check_batches(trainer, lambda batch: [2.0 * s["total"] if "total" in s else float(len(s["said"]))
                                          for s in batch["environment_state"]])
    for batch in trainer.batches:
        names = [row["environment"] for row in batch["kept_inputs"]]
        assert names == [type(env).__name__.lower() for env in batch["kept_environments"]]


@pytest.mark.slow
def test_a_rollout_function_s_fields_and_env_mask_follow_the_kept_rows(tmp_path):
    def rollout(prompts, trainer):  # its own generation: scripted tokens, a judge score and an env mask per row
        completion_ids = [TOKENIZER.encode(f"answer {i}", add_special_tokens=False) + [TOKENIZER.eos_token_id]
                          for i in range(len(prompts))]
        return {"prompt_ids": [TOKENIZER.encode(p, add_special_tokens=False) for p in prompts],
                "completion_ids": completion_ids, "logprobs": [[-0.5] * len(ids) for ids in completion_ids],
                "env_mask": [[1, 1] + [0] * (len(ids) - 2) for ids in completion_ids],
                "judge": [float(i * 7 % 5) for i in range(len(prompts))], "backend": "scripted"}

    def judged(completions, judge, backend, **kwargs):  # reads the rollout function's fields, as TRL passes them
        assert set(backend) == {"scripted"}  # a shared field reaches every row
        return list(judge)

    dataset = Dataset.from_dict({"prompt": [f"What is {i} plus {i}?" for i in range(8)]})
    trainer = Witness(model=tiny_chat_model(), processing_class=TOKENIZER, reward_funcs=judged,
                      args=config(tmp_path), train_dataset=dataset, rollout_func=rollout)
    trainer.train()
    check_batches(trainer, lambda batch: batch["generated"][5]["judge"])
    assert all(batch["kept"][2] is not None for batch in trainer.batches)  # the env mask became the tool mask


def test_evaluation_generates_and_scores_every_rollout(tmp_path):
    turns = [tool_call("multiply", {"a": 3, "b": 4}), "No.<|im_end|>"]
    seen = []

    def answer(completions, **kwargs):
        seen.append(len(completions))
        return [float("12" in tool_result(c)) for c in completions]

    trainer = Witness(model=tiny_chat_model(), processing_class=TOKENIZER, reward_funcs=answer,
                      args=config(tmp_path, per_device_eval_batch_size=2 * N), train_dataset=conversations(8),
                      eval_dataset=conversations(2), tools=[multiply])
    with patch.object(trainer.model, "generate", side_effect=scripted_generate(turns)):
        metrics = trainer.evaluate()
    assert seen == [2 * N] and not trainer.batches  # all n rollouts of both prompts, no selection
    assert "eval_reward" in metrics


@pytest.mark.slow
def test_a_vision_language_model_trains_on_the_kept_rows_with_their_own_images(tmp_path):
    from PIL import Image

    model, processor = tiny_llava()
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]
    dataset = conversations(4, image=[Image.new("RGB", (32, 32), colour) for colour in colours])

    def length(completions, **kwargs):
        return [float(len(c[0]["content"]) % 4) for c in completions]

    trainer = Witness(model=model, processing_class=processor, reward_funcs=length,
                      args=config(tmp_path, max_completion_length=8), train_dataset=dataset)
    trainer.train()
    check_batches(trainer, lambda batch: length(batch["generated"][3]))
    for batch in trainer.batches:  # each kept row's image is its prompt's: the prompt text names the colour's row
        kept_images, kept_inputs = batch["kept"][6], batch["kept_inputs"]
        assert [images[0].getpixel((0, 0)) for images in kept_images] == [row["image"].getpixel((0, 0))
                                                                        for row in kept_inputs]
        assert len({row["prompt"][0]["content"] for row in kept_inputs}) == 2  # two prompts' groups


@pytest.mark.slow
def test_the_tool_using_example_runs_offline_with_the_tiny_model(tmp_path):
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "examples" / "trl_tools.py"), "--warmup_steps", "20",
                           "--max_steps", "2", "--output_dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()
             if line.startswith(("tools/", "pods/"))}
    assert len(lines["tools/call_frequency"]) == len(lines["pods/kept_reward_std"]) == 2  # one value per step


class Session:
    """An environment as real ones are: it holds a process-local resource (here a lock; a
    sandbox, socket or subprocess in practice)."""

    def reset(self, **kwargs):
        self.lock = threading.Lock()

    def ping(self) -> str:
        """
        Ping the session.

        Returns:
            pong
        """
        return "pong"


def test_environments_are_refused_where_kept_rows_would_have_to_move_between_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(PODSConfig, "groups_span_processes", property(lambda self: True))
    with pytest.raises(ValueError, match="environment_factory: .* an environment instance holds its rollout's state "
                                         "in the process that ran it and cannot move"):
        PODSTrainer(model=tiny_chat_model(), processing_class=TOKENIZER, reward_funcs=lambda completions, **k: [0.0],
                    args=config(tmp_path), train_dataset=conversations(8), environment_factory=Session)
    session = Session()
    session.reset()
    with pytest.raises(TypeError, match="cannot pickle"):  # moving a row between processes pickles it
        pickle.dumps(session)
