"""PODS inside TRL's GRPOTrainer (podsrl.trl), on CPU with the tiny model: equal to
GRPOTrainer when m = n, the kept rows and advantages of an independent oracle, the no-grad
passes on the kept rows only, TRL's reward functions unchanged, two processes."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
import transformers
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from podsrl.algorithms import group_advantages, select
from podsrl.models import load_model
from podsrl.rewards import arithmetic_correct, arithmetic_format
from podsrl.tasks.arithmetic import build_arithmetic
from podsrl.trl import PODSConfig, PODSTrainer, trl_batch_arguments

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = build_arithmetic(level=3, num_train=300, num_test=10, seed=0).train
REWARDS, WEIGHTS = [arithmetic_correct, arithmetic_format], [0.8, 0.2]


def dataset(rows: int = 64) -> Dataset:
    return Dataset.from_list([{"prompt": ex.prompt, "answer": ex.answer} for ex in EXAMPLES[:rows]])


def options(tmp_path, **overrides) -> dict:
    values = dict(output_dir=str(tmp_path / "out"), max_steps=2, learning_rate=1e-3, lr_scheduler_type="constant",
                  use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
                  max_completion_length=6, temperature=1.0, top_k=0, beta=0.0, reward_weights=WEIGHTS,
                  num_generations=4, per_device_train_batch_size=8, gradient_accumulation_steps=2)
    values.update(overrides)
    return values


def trainer(cls, config, **kwargs):
    bundle = load_model("tiny")
    torch.manual_seed(0)
    return cls(model=bundle.model, processing_class=bundle.tokenizer, reward_funcs=kwargs.pop("reward_funcs", REWARDS),
               args=config, train_dataset=kwargs.pop("train_dataset", dataset()), **kwargs)


def test_batch_arguments_and_the_errors_that_name_the_arithmetic(monkeypatch):
    assert trl_batch_arguments(16, 16, 4, 8, 2) == {"per_device_train_batch_size": 32,
                                                     "gradient_accumulation_steps": 4, "steps_per_generation": 4,
                                                     "num_generations": 16, "num_kept": 4}
    with pytest.raises(ValueError, match="prompts_per_step: 3 prompts do not split evenly over 2 processes"):
        trl_batch_arguments(3, 16, 4, 8, 2)
    with pytest.raises(ValueError, match="micro_batch_size: 8 prompts per process x num_kept 4 = 32 kept rows"):
        trl_batch_arguments(16, 16, 4, 12, 2)
    # #38: zero, negative, bool and float counts, m > n (zero steps divided by zero later)
    for args, field, value in [((0, 16, 4, 8), "prompts_per_step", "0"), ((16, 16, 4, 0), "micro_batch_size", "0"),
                               ((16, -2, 4, 8), "num_generations", "-2"), ((16, 16, True, 8), "num_kept", "True"),
                               ((16, 16, 4, 8, 1.0), "num_processes", "1.0")]:
        with pytest.raises(ValueError, match=f"{field}: must be a whole number >= 1, got {value}$"):
            trl_batch_arguments(*args)
    with pytest.raises(ValueError, match="num_kept: 8 is more than num_generations 4"):
        trl_batch_arguments(16, 4, 8, 8)
    with pytest.raises(ValueError, match="num_kept: must be between 2"):
        PODSConfig(**options(Path("/tmp"), num_kept=5))
    with pytest.raises(ValueError, match="num_kept: must be a whole number, got '4'"):
        PODSConfig(**options(Path("/tmp"), num_kept="4"))
    with pytest.raises(ValueError, match="downsampling_rule: unknown rule 'best'"):
        PODSConfig(**options(Path("/tmp"), num_kept=2, downsampling_rule="best"))
    with monkeypatch.context() as patch:  # two processes: 12 rows in all are 3 groups, 6 per process are not whole
        patch.setattr(PODSConfig, "world_size", property(lambda self: 2))
        split = options(Path("/tmp"), per_device_train_batch_size=6, gradient_accumulation_steps=1)
        assert PODSConfig(**split, num_kept=2).groups_span_processes  # 3 x 2 = 6 kept rows: 3 per process
        with pytest.raises(ValueError, match=r"num_kept: 3 prompt groups per generation x num_kept 3 = 9 kept rows do "
                                             r"not split evenly over 2 processes"):
            PODSConfig(**split, num_kept=3)
    assert not PODSConfig(**options(Path("/tmp")), num_kept=2).groups_span_processes
    with pytest.raises(ValueError, match=r"steps_per_generation: 3 kept rows per process \(1 groups x num_kept 3 / 1 "
                                         r"processes\) do not split into 2 equal micro-batches"):
        PODSConfig(**options(Path("/tmp"), per_device_train_batch_size=2, gradient_accumulation_steps=2), num_kept=3)
    # every combination the helper returns passes the config's own checks
    for args in [(8, 4, 2, 4, 1), (16, 16, 4, 8, 1), (16, 8, 4, 4, 2)]:
        batch = trl_batch_arguments(*args)
        PODSConfig(**{**options(Path("/tmp")), **batch})


def comparable(history: list[dict]) -> list[dict]:
    """TRL's own metrics (not podsrl's pods/*, nor timings)."""
    timing = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")
    return [{k: v for k, v in h.items() if not k.startswith("pods/") and k not in timing} for h in history]


@pytest.mark.slow
def test_with_m_equal_n_it_is_grpo_trainer(tmp_path):
    grpo = trainer(GRPOTrainer, GRPOConfig(**options(tmp_path / "grpo")))
    grpo.train()
    pods = trainer(PODSTrainer, PODSConfig(**options(tmp_path / "pods"), num_kept=4))
    pods.train()
    assert comparable(pods.state.log_history) == comparable(grpo.state.log_history)
    assert any(k.startswith("pods/") for k in pods.state.log_history[0])
    a, b = grpo.model.state_dict(), pods.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], v) for k, v in load_model("tiny").model.state_dict().items())  # it trained


class Recorder:
    """Spies on TRL: the rollouts before selection, the rows given to the no-grad passes,
    the trainer's output after selection."""

    def __init__(self, monkeypatch):
        self.generated, self.no_grad_rows, self.outputs, self.rows = [], [], [], []
        real_generate, real_logps = GRPOTrainer._generate, GRPOTrainer._get_per_token_logps_and_entropies
        real_score = GRPOTrainer._generate_and_score_completions

        def generate(trainer, prompts):
            out = real_generate(trainer, prompts)
            self.generated.append({"completions": list(out[3]), "ids": [list(ids) for ids in out[1]]})
            return out

        def logps(trainer, model, input_ids, *args, **kwargs):
            if not torch.is_grad_enabled():
                self.no_grad_rows.append(input_ids.shape[0])
            return real_logps(trainer, model, input_ids, *args, **kwargs)

        def score(trainer, inputs):
            self.rows.append([dict(row) for row in inputs])  # before selection trims the list
            out = real_score(trainer, inputs)
            self.outputs.append(out)
            return out

        monkeypatch.setattr(GRPOTrainer, "_generate", generate)
        monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", logps)
        monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", score)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["max_variance", "random"])
def test_kept_rows_and_advantages_match_an_independent_oracle(tmp_path, monkeypatch, rule):
    spy = Recorder(monkeypatch)
    pods = trainer(PODSTrainer, PODSConfig(**options(tmp_path, max_steps=3), num_kept=2, downsampling_rule=rule))
    oracle_generator = torch.Generator().manual_seed(0)  # the trainer's selection stream starts from args.seed
    pods.train()
    assert len(spy.generated) == 3
    spreads = []
    for generated, rows, out in zip(spy.generated, spy.rows, spy.outputs):
        answers = [row["answer"] for row in rows]
        rewards = (0.8 * torch.tensor(arithmetic_correct(None, generated["completions"], answers))
                   + 0.2 * torch.tensor(arithmetic_format(None, generated["completions"])))
        groups = rewards.view(-1, 4)  # [P, n]
        keep = select(rule, groups, 2, generator=oracle_generator)  # [P, m]
        expected = [generated["ids"][p * 4 + j] for p, kept in enumerate(keep.tolist()) for j in kept]
        trained = [ids[mask.bool()].tolist() for ids, mask in zip(out["completion_ids"], out["completion_mask"])]
        assert trained == expected
        advantages = group_advantages(groups.gather(1, keep)).flatten()
        assert torch.allclose(out["advantages"], advantages, atol=1e-5)
        spreads.append(float(groups.var(dim=1).sum()))
    assert max(spreads) > 0  # some groups had rewards to choose between


@pytest.mark.slow
@pytest.mark.parametrize("cls", ["grpo", "pods"])
def test_no_grad_passes_see_only_the_kept_rows(tmp_path, monkeypatch, cls):
    """beta > 0 (reference log-probs) and num_iterations = 2 (old log-probs): TRL's two
    no-grad passes run on P x n rows in GRPOTrainer, on P x m in PODSTrainer."""
    spy = Recorder(monkeypatch)
    settings = options(tmp_path, max_steps=1, beta=0.1, num_iterations=2, per_device_train_batch_size=16)
    run = (trainer(GRPOTrainer, GRPOConfig(**settings)) if cls == "grpo"
           else trainer(PODSTrainer, PODSConfig(**settings, num_kept=2)))
    run.train()
    prompts = 16 * 2 // 4  # generated rows per generation / n
    rows = prompts * (4 if cls == "grpo" else 2)
    assert len(spy.outputs) == 1 and "old_per_token_logps" in spy.outputs[0] and "ref_per_token_logps" in spy.outputs[0]
    assert sum(spy.no_grad_rows) == 2 * rows  # old + reference, each once over every trained row


@pytest.mark.slow
def test_trl_reward_functions_and_dataset_columns_run_unchanged(tmp_path):
    from trl.rewards import accuracy_reward, think_format_reward

    seen = []

    def harder_counts_more(completions, solution, difficulty, **kwargs):  # extra columns by name
        seen.append((len(completions), list(difficulty)))
        return [(2.0 if level == "hard" else 1.0) * (c[0]["content"].strip() == f"Answer: {s}")
                for c, s, level in zip(completions, solution, difficulty)]

    rows = [{"prompt": [{"role": "user", "content": ex.prompt}], "solution": ex.answer,
             "difficulty": "hard" if int(ex.answer) < 0 else "easy"} for ex in EXAMPLES[:64]]
    bundle = load_model("tiny")
    bundle.tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}")  # conversational data
    config = PODSConfig(**options(tmp_path, reward_weights=None, log_completions=True), num_kept=2)
    pods = PODSTrainer(model=bundle.model, processing_class=bundle.tokenizer, args=config,
                       reward_funcs=[accuracy_reward, think_format_reward, harder_counts_more],
                       train_dataset=Dataset.from_list(rows))
    pods.train()
    logged = pods.state.log_history[0]
    for name in ("accuracy_reward", "think_format_reward", "harder_counts_more"):
        assert f"rewards/{name}/mean" in logged, name
    assert seen and all(count == 16 for count, _ in seen)  # all n x P rollouts scored once, before selection
    assert all(level in ("hard", "easy") for _, levels in seen for level in levels)
    assert len(pods._logs["completion"]) > 0  # log_completions kept the trained rollouts


@pytest.mark.slow
def test_the_example_script_runs_offline(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "trl_pods.py"), "--offline", "--max_steps", "2",
                           "--prompts_per_step", "4", "--num_generations", "8", "--num_kept", "2",
                           "--micro_batch_size", "4", "--output_dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "model.safetensors").is_file()


@pytest.mark.slow  # a process that imports TRL: 8.7 s
@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_example_with_use_vllm_but_no_vllm_says_so_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "trl_pods.py"), "--offline", "--use_vllm",
                           "--output_dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "vLLM is not installed" in done.stderr
    assert not (tmp_path / "out").exists()


LAUNCHED = '''
import json, os, sys, zlib
import torch
import transformers
from datasets import Dataset
from podsrl.models import load_model
from podsrl.tasks.arithmetic import build_arithmetic
from podsrl.trl import PODSConfig, PODSTrainer, trl_batch_arguments

rank = int(os.environ["RANK"])


def reward(completions, **kwargs):  # process 0: constant (no signal); process 1: a coin from the text
    return [1.0 if rank == 0 else float(zlib.crc32(c.encode()) % 2) for c in completions]


class Recording(PODSTrainer):
    def _select(self, rewards_per_func, local_count):
        local, kept = super()._select(rewards_per_func, local_count)
        with open(f"{sys.argv[1]}/rank{rank}.jsonl", "a") as fh:
            fh.write(json.dumps({"rewards": self.last_selection["rewards"].tolist(),
                                 "kept": self.last_selection["kept"].tolist(), "local": local}) + "\\n")
        return local, kept


examples = build_arithmetic(level=3, num_train=200, num_test=10, seed=0).train
bundle = load_model("tiny")
batch = trl_batch_arguments(prompts_per_step=4, num_generations=4, num_kept=2, micro_batch_size=2, num_processes=2)
config = PODSConfig(output_dir=sys.argv[1] + "/out", max_steps=2, use_cpu=True, report_to="none", save_strategy="no",
                    disable_tqdm=True, seed=0, max_completion_length=6, top_k=0, ddp_backend="gloo",
                    downsampling_rule="random", **batch)
Recording(model=bundle.model, processing_class=bundle.tokenizer, reward_funcs=[reward], args=config,
          train_dataset=Dataset.from_list([{"prompt": ex.prompt} for ex in examples])).train()
# tear gloo down before the interpreter exits: with accelerate 1.10 (the lower bound) the
# exit otherwise sometimes aborts ("terminate called without an active exception")
torch.distributed.destroy_process_group()
'''


@pytest.mark.slow
def test_two_processes_select_the_same_rows_without_hanging(tmp_path):
    ranks = launch_two_processes(tmp_path, LAUNCHED)
    assert len(ranks[0]) == len(ranks[1]) == 2
    generator = torch.Generator().manual_seed(0)
    for step0, step1 in zip(*ranks):
        assert step0["rewards"] == step1["rewards"] and step0["kept"] == step1["kept"]  # one selection everywhere
        rewards = torch.tensor(step0["rewards"])  # [G_all, n], process 0's groups first
        assert rewards[0].var() == 0 and rewards[-1].var() > 0 or rewards[-1].var() == 0  # patterns differ by process
        expected = select("random", rewards, 2, generator=generator).sort(dim=1).values  # rows in generation order
        assert torch.equal(torch.tensor(step0["kept"]), expected)
        assert len(step0["local"]) == len(step1["local"]) == 4  # equal rows per process: 2 prompts x m


SPLIT_GROUPS = '''
import json, os, sys, zlib
import torch
from datasets import Dataset
from podsrl.models import load_model
from podsrl.tasks.arithmetic import build_arithmetic
from podsrl.trl import PODSConfig, PODSTrainer

rank = int(os.environ["RANK"])


def reward(completions, **kwargs):
    return [float(zlib.crc32(c.encode()) % 3) for c in completions]


class Recording(PODSTrainer):
    def _select(self, rewards_per_func, local_count):
        local, kept = super()._select(rewards_per_func, local_count)
        self.generated_here = len(local)  # kept rows this process generated, before they are shared out
        return local, kept

    def _generate(self, prompts):
        kept = super()._generate(prompts)
        with open(f"{sys.argv[1]}/rank{rank}.jsonl", "a") as fh:
            fh.write(json.dumps({"rewards": self.last_selection["rewards"].tolist(),
                                 "kept": self.last_selection["kept"].tolist(), "completions": kept[3],
                                 "prompts": prompts, "generated_here": self.generated_here}) + "\\n")
        return kept


examples = build_arithmetic(level=3, num_train=200, num_test=10, seed=0).train
bundle = load_model("tiny")
# 6 rows per process, n = 4: 3 groups in all, the middle one on both processes; m = 2: 3 kept rows each
config = PODSConfig(output_dir=sys.argv[1] + "/out", max_steps=2, use_cpu=True, report_to="none", save_strategy="no",
                    disable_tqdm=True, seed=0, max_completion_length=6, top_k=0, ddp_backend="gloo",
                    per_device_train_batch_size=6, num_generations=4, num_kept=2)
assert config.groups_span_processes
Recording(model=bundle.model, processing_class=bundle.tokenizer, reward_funcs=[reward], args=config,
          train_dataset=Dataset.from_list([{"prompt": ex.prompt} for ex in examples])).train()
torch.distributed.destroy_process_group()
'''


def launch_two_processes(tmp_path, script_text: str) -> list[list[dict]]:
    """Run ``script_text`` on two CPU processes (gloo); each rank's recorded lines."""
    script = tmp_path / "launched.py"
    script.write_text(script_text)
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    done = subprocess.run([accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
                           str(script), str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return [[json.loads(line) for line in (tmp_path / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]


@pytest.mark.slow
def test_groups_split_across_processes_are_selected_whole_and_shared_out_evenly(tmp_path):
    ranks = launch_two_processes(tmp_path, SPLIT_GROUPS)
    assert len(ranks[0]) == len(ranks[1]) == 2
    for step0, step1 in zip(*ranks):
        assert step0["rewards"] == step1["rewards"] and step0["kept"] == step1["kept"]  # one selection everywhere
        rewards = torch.tensor(step0["rewards"])  # [3 groups, n = 4], the middle one generated on both processes
        kept = torch.tensor(step0["kept"])
        assert torch.equal(kept, select("max_variance", rewards, 2).sort(dim=1).values)
        assert len(step0["completions"]) == len(step1["completions"]) == 3  # 6 kept rows, 3 per process
        # the rows each process trains on, in process order, are the kept rows in global order with their rewards
        trained = step0["completions"] + step1["completions"]
        assert [float(zlib.crc32(c.encode()) % 3) for c in trained] == rewards.gather(1, kept).flatten().tolist()
        prompts = step0["prompts"] + step1["prompts"]
        assert prompts[0] == prompts[1] and prompts[2] == prompts[3] and prompts[4] == prompts[5]  # whole groups
    moved = [step0["generated_here"] != 3 for step0 in ranks[0]]
    assert any(moved), "no step needed rows moved between the processes: the sharing went untested"


def test_pods_trainer_logs_the_trainers_selection_statistics_under_the_same_names():
    """One statistics function, one set of names: what PODSTrainer logs for the generated and
    kept rewards is podsrl's trainer's group_stats, under pods/{generated,kept}_reward_*."""
    from collections import defaultdict
    from types import SimpleNamespace

    from podsrl.algorithms.group_stats import group_stats
    from podsrl.trl import PODSTrainer

    generator = torch.Generator().manual_seed(0)
    generated = (torch.rand(5, 8, generator=generator) > 0.5).float()  # [P, n]
    generated[0] = 1.0  # one constant group
    kept = generated[:, :4]  # [P, m]
    stub = SimpleNamespace(_metrics={"train": defaultdict(list)})
    PODSTrainer._log_selection(stub, generated, kept)
    logged = {key: values[-1] for key, values in stub._metrics["train"].items()}
    expected = {**group_stats("pods/generated_reward", generated), **group_stats("pods/kept_reward", kept)}
    assert logged == expected
    own = group_stats("reward", generated)  # the trainer's metrics.jsonl names
    assert {key.replace("pods/generated_", "") for key in logged if "generated" in key} == set(own)


def test_podsrl_trl_is_the_integration_module_users_scripts_import():
    """The integrations live side by side in podsrl.integrations; podsrl.trl stays the same module."""
    import podsrl.integrations.trl
    import podsrl.trl

    assert podsrl.trl is podsrl.integrations.trl and PODSTrainer is podsrl.integrations.trl.PODSTrainer


def test_without_args_it_builds_its_default_config_as_grpo_trainer_does(tmp_path, monkeypatch):
    """No ``args``: a default PODSConfig named after the model (GRPOTrainer's rule), plain GRPO
    (num_kept = num_generations) with every other field GRPOConfig's default. GRPOConfig
    defaults to bf16, which transformers refuses on a machine without a bf16 GPU: there both
    trainers fail with that same message, and with the check answered as on such a GPU both
    build."""
    monkeypatch.chdir(tmp_path)  # the default output folder is relative to the current one
    refusals = []
    for cls in (GRPOTrainer, PODSTrainer):
        with pytest.raises(ValueError) as refused:
            cls(model=load_model("tiny").model, reward_funcs=REWARDS, train_dataset=dataset())
        refusals.append(str(refused.value))
    assert refusals[0] == refusals[1] and "bf16" in refusals[0]
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    built = {}
    for cls in (GRPOTrainer, PODSTrainer):
        bundle = load_model("tiny")
        built[cls] = cls(model=bundle.model, reward_funcs=REWARDS, train_dataset=dataset(),
                         processing_class=bundle.tokenizer).args
    grpo, pods = built[GRPOTrainer], built[PODSTrainer]
    assert isinstance(pods, PODSConfig) and pods.num_kept == pods.num_generations == grpo.num_generations
    assert pods.output_dir.endswith("-PODS") and grpo.output_dir.endswith("-GRPO")
    assert pods.output_dir.removesuffix("-PODS") == grpo.output_dir.removesuffix("-GRPO")
    differing = {f.name for f in dataclasses.fields(GRPOConfig)
                 if getattr(grpo, f.name) != getattr(pods, f.name)}
    assert differing <= {"output_dir", "run_name", "logging_dir"}, differing


def test_the_callers_generation_batch_is_left_whole(tmp_path):
    """GRPOTrainer leaves the list of rows it is given as it was; PODSTrainer narrows its own
    copy to the kept rows, not the caller's list."""
    pods = trainer(PODSTrainer, PODSConfig(**options(tmp_path), num_kept=2))
    batch = [{"prompt": ex.prompt, "answer": ex.answer} for ex in EXAMPLES[:4] for _ in range(4)]  # 4 groups of 4
    before = [dict(row) for row in batch]
    pods.model.train()
    out = pods._generate_and_score_completions(batch)
    assert batch == before
    assert out["completion_ids"].shape[0] == 8  # 4 prompts x m = 2 kept rows went on


@pytest.mark.parametrize("value, weights, refused", [
    (float("inf"), [1.0, 1.0], r"reward function huge returned inf for completion 0 of 16 \(beyond \+/-1e\+15"),
    (1e38, [1.0, 1.0], r"reward function huge returned 1e\+38 for completion 0 of 16 \(beyond \+/-1e\+15"),
    (-1e38, [1.0, 1.0], r"reward function huge returned -1e\+38 for completion 0 of 16"),
    (1e10, [1e10, 1.0], r"reward functions huge, arithmetic_format: the weighted sum is 1e\+20 for completion 0"),
])
@pytest.mark.slow
def test_rewards_too_large_for_float32_are_refused_naming_the_function(tmp_path, value, weights, refused):
    """An inf, or a finite reward whose group mean and variance overflow float32 (1e38), would
    give inf / NaN advantages and a run that ends as a success: refused before selection, in
    one line naming the reward function, as podsrl's own trainer refuses it; None (NaN) passes."""
    def huge(completions, **kwargs):
        return [value] + [None] * (len(completions) - 1)

    pods = trainer(PODSTrainer, PODSConfig(**options(tmp_path, max_steps=1, reward_weights=weights), num_kept=2),
                   reward_funcs=[huge, arithmetic_format])
    with pytest.raises(ValueError, match=f"^PODSTrainer: {refused}") as failed:
        pods.train()
    assert "\n" not in str(failed.value)


@pytest.mark.parametrize("returned, refused", [
    ("['1.0'] * len(completions)", "reward function wordy returned str '1.0' at index 0, expected a number or None"),
    ("{'reward': 1.0}", "reward function wordy returned dict, expected a list of numbers or None, one per "
                           "completion"),
])
def test_a_reward_that_returns_no_numbers_is_one_line_naming_it(tmp_path, returned, refused):
    """Strings ended in torch.tensor's traceback inside TRL's reward step."""
    namespace = {}
    exec(f"def wordy(completions, **kwargs):\n    return {returned}\n", namespace)
    pods = trainer(PODSTrainer, PODSConfig(**options(tmp_path, max_steps=1, reward_weights=[1.0, 1.0]), num_kept=2),
                   reward_funcs=[namespace["wordy"], arithmetic_format])
    with pytest.raises(ValueError, match=f"^PODSTrainer: {re.escape(refused)}$"):
        pods.train()
