"""Reward functions get what TRL's GRPOTrainer passes them (``_calculate_rewards`` in
trl/trainer/grpo_trainer.py): ``prompts``, ``completions`` (message lists for
conversations), ``completion_ids``, ``trainer_state``, ``log_extra`` / ``log_metric`` and
every dataset column under its own name. Python callables go through ``train``; every
function of ``trl.rewards`` runs unchanged in a podsrl run."""

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import podsrl
from podsrl.metrics import read_metrics
from podsrl.rewards import in_process
from podsrl.scoring import Scorer, ScoringOptions, TrainerProgress, reward_inputs
from podsrl.tasks import Example, PreparedSplit, Task
from podsrl.tasks.jsonl import build_jsonl
from podsrl.trainer import train
from podsrl.trainer.config import make_config
from podsrl.types import Rollouts, completion_mask_from_eos

EOS, PAD = 9, 0
CONVERSATIONS = [[{"role": "system", "content": "Answer in LaTeX."}, {"role": "user", "content": "Half of 1?"}],
                 [{"role": "user", "content": "Two halves?"}]]
ROWS = [{"prompt": CONVERSATIONS[0], "solution": r"\frac{1}{2}", "difficulty": "easy"},
        {"prompt": CONVERSATIONS[1], "solution": "1", "difficulty": "hard"}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def rollouts(texts: list[list[str]], ids: list[list[list[int]]]) -> Rollouts:
    """Rollouts [P, n, Lc] as an engine returns them: EOS then padding after each completion."""
    width = max(len(c) for group in ids for c in group)
    completion_ids = torch.tensor([[c + [PAD] * (width - len(c)) for c in group] for group in ids])
    return Rollouts(prompt_ids=torch.ones(len(ids), 1, dtype=torch.long),
                    prompt_mask=torch.ones(len(ids), 1, dtype=torch.long), completion_ids=completion_ids,
                    completion_mask=completion_mask_from_eos(completion_ids, EOS), texts=texts)


TEXTS = [[r"<think>x</think> \boxed{\frac{1}{2}}", "1/3"], [r"\boxed{1}", "two"]]
IDS = [[[5, 6, EOS], [7, EOS]], [[3, 3, 3, 3], [4, EOS]]]  # the third one ran out of tokens: no EOS


def trl_reward_kwargs(inputs: list[dict], prompts, completions, completion_ids) -> dict:
    """What TRL's own _calculate_rewards passes a reward function (called on a stand-in trainer)."""
    from trl import GRPOTrainer

    seen = {}

    def record(**kwargs):
        seen.update(kwargs)
        return [0.0] * len(kwargs["prompts"])

    trainer = SimpleNamespace(accelerator=SimpleNamespace(device="cpu", is_main_process=True), reward_funcs=[record],
                              reward_processing_classes=[None], reward_func_names=["record"],
                              state=SimpleNamespace(global_step=0), args=SimpleNamespace(report_to=[]),
                              _log_completion_extra=print, _log_metric=print, environments=None)
    GRPOTrainer._calculate_rewards(trainer, inputs, prompts, completions, completion_ids)
    return seen


def podsrl_reward_kwargs(split: PreparedSplit, batch: Rollouts, trainer_state=None) -> dict:
    seen = {}

    @in_process  # it records into this process's memory; a worker's would be lost
    def record(**kwargs):
        seen.update(kwargs)
        return [0.0] * len(kwargs["prompts"])

    Scorer.build(split_task(split), ScoringOptions(reward_funcs=(record,), reward_weights=(1.0,)))(
        split, batch, trainer_state)
    return seen


def split_task(split: PreparedSplit) -> Task:
    zero = lambda prompts, completions, **kw: [0.0] * len(completions)  # noqa: E731
    return Task("t", split.examples, split.examples, correct_fn=zero, format_fn=zero, extract_fn=str)


@pytest.mark.parametrize("conversational", [True, False])
def test_reward_functions_get_exactly_what_trl_passes(tmp_path, conversational):
    pytest.importorskip("trl", reason="TRL is the reference these inputs are compared with")
    rows = ROWS if conversational else [{**row, "prompt": row["prompt"][-1]["content"]} for row in ROWS]
    task = build_jsonl(write_jsonl(tmp_path / "d.jsonl", rows), "", answer_column="solution")
    split = PreparedSplit(task.train, ["rendered"] * 2, chat=conversational)
    ours = podsrl_reward_kwargs(split, rollouts(TEXTS, IDS), TrainerProgress(global_step=3, max_steps=5))
    texts = [t for group in TEXTS for t in group]
    theirs = trl_reward_kwargs(inputs=[row for row in rows for _ in range(2)],
                               prompts=[row["prompt"] for row in rows for _ in range(2)],
                               completions=[[{"role": "assistant", "content": t}] for t in texts] if conversational
                               else texts, completion_ids=[c[:c.index(EOS) + 1] if EOS in c else c
                                                           for group in IDS for c in group])
    # the same arguments, plus `answer` (the gold answer of answer_column, as the data has no `answer`)
    assert set(ours) == set(theirs) | {"answer"}
    for name in set(theirs) - {"trainer_state", "log_extra", "log_metric"}:
        assert ours[name] == theirs[name], name
    assert ours["answer"] == [r"\frac{1}{2}"] * 2 + ["1"] * 2
    assert ours["trainer_state"].global_step == 3 and ours["trainer_state"].max_steps == 5
    assert ours["log_extra"]("column", [1]) is None and ours["log_metric"]("name", 1.0) is None


def test_a_text_prompt_rendered_with_the_chat_template_reaches_rewards_as_messages():
    split = PreparedSplit([Example("What is 1 + 1?\n", "2")], ["rendered"], chat=True, system_prompt="Be brief.")
    inputs = reward_inputs(split, rollouts([["Answer: 2"]], [[[4, EOS]]]))
    assert inputs.prompts == [[{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "What is 1 + 1?"}]]
    assert inputs.completions == [[{"role": "assistant", "content": "Answer: 2"}]]
    assert isinstance(inputs.shared["trainer_state"], TrainerProgress)


def test_unverifiable_samples_score_zero_and_are_counted():
    nan = float("nan")
    first = lambda prompts, completions, **kw: [None, nan, 1.0, nan]  # noqa: E731
    second = lambda prompts, completions, **kw: [nan, None, 2.0, 3.0]  # noqa: E731
    examples = [Example(f"q{i}", "1") for i in range(2)]
    split = PreparedSplit(examples, ["q0", "q1"])
    scorer = Scorer.build(split_task(split), ScoringOptions(reward_funcs=(first, second), reward_weights=(1.0, 0.5)))
    scores = scorer(split, rollouts([["a", "b"], ["c", "d"]], [[[1, EOS], [2, EOS]], [[3, EOS], [4, EOS]]]))
    assert scores.reward.tolist() == [[0.0, 0.0], [2.0, 1.5]]
    assert scores.unverifiable.tolist() == [[True, True], [False, False]]


def small_run(tmp_path, **overrides):
    values = {"max_steps": "2", "prompts_per_step": "2", "num_generations": "4", "num_kept": "2", "eval_prompts": "4",
              "eval_samples": "1", "progress": "false", "output_dir": str(tmp_path / "run"), **overrides}
    return make_config(overrides=values)


@pytest.mark.slow
def test_python_callables_are_reward_functions(random_model_dir, tmp_path):
    steps_seen = []

    @in_process  # records into this process's memory
    def progress_aware(prompts, completions, completion_ids, trainer_state, answer, **columns):
        steps_seen.append((trainer_state.global_step, trainer_state.max_steps, len(completion_ids)))
        return [float(c.strip().endswith(a)) for c, a in zip(completions, answer)]

    cfg = small_run(tmp_path, model=random_model_dir, reward_weights="1,0.5")
    result = podsrl.train(cfg, reward_funcs=[progress_aware, "arithmetic_format"])
    assert podsrl.train is train and result.steps == 2
    assert steps_seen == [(0, 2, 8), (1, 2, 8)]  # steps completed when scored, as TRL's trainer_state
    assert read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]["reward_failures"] == 0


@pytest.mark.parametrize("overrides, funcs, message", [
    ({"reward_funcs": "arithmetic_format"}, [len], "reward_funcs: given both in the config"),
    ({"reward_weights": "1,2,3"}, ["arithmetic_format"], "reward_weights: 3 weights for 1 reward functions"),
    ({"reward_weights": "1,2"}, None, "reward_weights: 2 weights for 0 reward functions"),
    ({}, [42], "reward_funcs: 42 is not callable"),
])
def test_reward_function_mistakes_fail_before_any_work(tmp_path, overrides, funcs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        train(small_run(tmp_path, **overrides), reward_funcs=funcs)
    assert not (tmp_path / "run").exists()


@pytest.fixture
def chat_model_dir(random_model_dir, tmp_path):
    """The random model with a chat template, as an instruct model has."""
    from transformers import AutoTokenizer

    path = tmp_path / "chat_model"
    shutil.copytree(random_model_dir, path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant: {% endif %}")
    tokenizer.save_pretrained(path)
    return str(path)


def test_every_trl_reward_function_runs_unchanged_in_a_podsrl_run(chat_model_dir, tmp_path):
    trl_rewards = pytest.importorskip("trl.rewards", reason="TRL is not installed")
    from trl.rewards import get_cosine_scaled_reward, get_repetition_penalty_reward, get_soft_overlong_punishment

    names = ["accuracy_reward", "reasoning_accuracy_reward", "think_format_reward"]
    factories = [get_cosine_scaled_reward(max_len=8), get_repetition_penalty_reward(ngram_size=2),
                 get_soft_overlong_punishment(max_completion_len=8, soft_punish_cache=4)]
    listed = {fn for fns in trl_rewards._import_structure.values() for fn in fns}
    assert listed == set(names) | {"get_cosine_scaled_reward", "get_repetition_penalty_reward",
                                   "get_soft_overlong_punishment"}, "a new trl.rewards function: add it here"
    seen = []

    @in_process  # records into this process's memory
    def spy(prompts, completions, completion_ids, solution, **columns):
        seen.append((prompts[0], completions[0], completion_ids[0], solution[0]))
        return [None] * len(completions)  # applies to no sample: adds nothing

    data = write_jsonl(tmp_path / "d.jsonl", ROWS)
    cfg = small_run(tmp_path, model=chat_model_dir, task="jsonl", train_data=data, test_data=data,
                    answer_column="solution", max_completion_length="8", max_steps="1", eval_prompts="2",
                    reward_weights="1,1,1,1,1,1,1")
    assert make_config(overrides={"reward_funcs": ",".join(f"trl.rewards:{n}" for n in names)})  # by name, too
    train(cfg, reward_funcs=[f"trl.rewards:{n}" for n in names] + factories + [spy])
    prompt, completion, ids, solution = seen[0]
    assert prompt in CONVERSATIONS and solution in (ROWS[0]["solution"], ROWS[1]["solution"])
    assert completion[0]["role"] == "assistant" and isinstance(completion[0]["content"], str)
    assert 0 < len(ids) <= 8 and all(isinstance(t, int) for t in ids)
    record = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]
    assert record["reward_failures"] == 0 and math.isfinite(record["reward_mean"])


def test_the_example_reward_functions_take_text_and_message_completions():
    from podsrl.rewards import load_reward_fn

    example = Path(__file__).resolve().parents[1] / "examples" / "rewards.py"
    texts = ["Answer: 4", "Answer: 5"]
    chat = [[{"role": "assistant", "content": t}] for t in texts]
    state = TrainerProgress(global_step=1, max_steps=2)
    for completions in (texts, chat):
        kwargs = dict(prompts=["q", "q"], completions=completions, completion_ids=[[1] * 8, [1, EOS]],
                      trainer_state=state, answer=[4, 4], difficulty=["hard", "easy"])
        assert load_reward_fn(f"{example}:brevity")(**kwargs) == [-0.09, -0.09]
        assert load_reward_fn(f"{example}:harder_counts_more")(**kwargs) == [2.0, 0.0]
        assert load_reward_fn(f"{example}:overlong_later")(**kwargs) == [-0.5, 0.0]
