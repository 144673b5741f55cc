"""Two CPU processes (gloo) under `accelerate launch`: the tiny model trains a few steps,
replicated (DDP) and sharded (FSDP2, fully and ZeRO-2 style), against one process."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from podsrl.distributed import LaunchRefused
from podsrl.metrics import read_metrics
from podsrl.trainer import train
from podsrl.trainer.config import make_config

ACCELERATE = shutil.which("accelerate", path=str(Path(sys.executable).parent))
CONFIGS = Path(__file__).parents[1] / "configs" / "accelerate"
DDP = ["--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no"]
# 4 prompts per step, generated in chunks of 2 prompts (2 x 8 rollouts): each process owns one
# chunk. Plain SGD without clipping or weight decay: the update is -lr x the gradient, so a
# gradient of the wrong scale (summed instead of averaged over processes, a local instead of
# the global token count) changes the parameters, not only the logged norm. 5 new tokens cut
# the longer answers short, so greedy accuracy lies strictly between 0 and 1, and 15 held-out
# prompts split 8 / 7: one process's share can never have the accuracy of all 15.
OPTIONS = dict(model="tiny", method="pods", max_steps=3, prompts_per_step=4, num_generations=8, num_kept=2,
               generation_batch_size=16, loss_type="dapo",
               optim="sgd", learning_rate=0.2, max_grad_norm=0, weight_decay=0, warmup_steps=0,
               max_completion_length=5, eval_prompts=15, eval_samples=2, eval_steps=0, save_steps=0, progress=False)


def test_the_accelerate_launcher_is_installed():
    # accelerate is a declared dependency: its absence is a broken install, not a reason to skip
    assert ACCELERATE is not None, f"no accelerate launcher next to {sys.executable}"


class SharedLaunch:
    """The runs of one launcher setup (DDP flags, or a shipped config's ``--config_file``), in one
    `accelerate launch` (tests/distributed_jobs.py): a launch costs the launcher's and both
    processes' start before any training, so runs of one setup share it. Jobs run in the order
    added; :meth:`result` is a job's outcome as its own launch would have been."""

    def __init__(self, folder: Path, setup: tuple[str, ...] = tuple(DDP), processes: int = 2) -> None:
        self.folder, self.setup, self.processes = folder, setup, processes
        self.jobs: list[dict] = []
        self.launcher: subprocess.CompletedProcess | None = None

    def add(self, name: str, output_dir: Path, **overrides) -> None:
        options = {**OPTIONS, **overrides, "output_dir": str(output_dir)}
        self.jobs.append({"name": name, "argv": [f"--{k}={v}" for k, v in options.items()],
                          "output_dir": str(output_dir), "report": str(self.folder / f"{name}.report")})

    def run(self) -> "SharedLaunch":
        jobs = self.folder / "jobs.json"
        jobs.write_text(json.dumps(self.jobs))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        self.launcher = subprocess.run(
            [ACCELERATE or "accelerate", "launch", *self.setup, "--num_processes", str(self.processes),
             "--num_machines", "1", "--main_process_port", "0", "-m", "tests.distributed_jobs", str(jobs)],
            capture_output=True, text=True, env=env, timeout=240 * len(self.jobs), cwd=Path(__file__).parents[1])
        return self

    def result(self, name: str) -> "JobResult":
        """The job's exit code (the first process's that failed, else 0), what every process
        printed, and the checkpoints its folder held when it ended."""
        job = next(job for job in self.jobs if job["name"] == name)
        reports = [Path(f"{job['report']}.rank{rank}.json") for rank in range(self.processes)]
        if not all(report.is_file() for report in reports):  # the launch ended before this job finished
            return JobResult(self.launcher.returncode or 1, self.launcher.stdout,
                             f"no report of job {name}: the launch ended first\n{self.launcher.stderr}")
        done = [json.loads(report.read_text()) for report in reports]
        return JobResult(next((d["returncode"] for d in done if d["returncode"]), 0),
                         "".join(d["stdout"] for d in done), "".join(d["stderr"] for d in done), done[0]["checkpoints"])


@dataclass
class JobResult:
    returncode: int
    stdout: str
    stderr: str
    checkpoints: list[str] = field(default_factory=list)


def one_process(output_dir: Path, **overrides) -> Path:
    options = {**OPTIONS, **overrides, "output_dir": output_dir}
    return train(make_config(overrides={k: str(v) for k, v in options.items()})).run_dir


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The saved model's weights: the whole model, or the LoRA adapter."""
    full = run_dir / "model" / "model.safetensors"
    return load_file(str(full if full.exists() else run_dir / "model" / "adapter_model.safetensors"))


def steps(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] > 0]


def without_timings(records: list[dict], *prefixes: str) -> list[dict]:
    skip = ("time_", "train_seconds", *prefixes)
    return [{k: v for k, v in r.items() if not k.startswith(skip)} for r in records]


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    return one_process(tmp_path_factory.mktemp("one") / "run")


RANK_REWARDS = {
    "spread_on_one_rank_1": "import os\n\n\ndef spread_on_one_rank(completions, **kwargs):\n"
                            "    spread = os.environ.get('RANK') == '1'\n"
                            "    return [float(spread and i % 2) for i in range(len(completions))]\n",
    "spread_on_one_rank_none": "import os\n\n\ndef spread_on_one_rank(completions, **kwargs):\n"
                               "    spread = os.environ.get('RANK') == 'none'\n"
                               "    return [float(spread and i % 2) for i in range(len(completions))]\n",
    "fails_on_rank_1": "import os\n\n\ndef fails_on_rank_1(completions, **kwargs):\n"
                       "    if os.environ.get('RANK') == '1':\n        raise ValueError('rank 1 refuses')\n"
                       "    return [float('Answer' in c) for c in completions]\n\n\n"
                       "fails_on_rank_1.reward_bounds = (0.0, 1.0)\n",
}
PARTIAL = dict(generation_engine="slots", generation_micro_group=4, generation_schedule="round_robin",
               partial_rollouts=True, prompt_selector="pass_rate", generation_batch_size=0, dynamic_sampling_rounds=2)
# prune_running over partial rollouts, with early stop on the correctness reward: each process
# prunes its own groups, and the head learns every process's judged samples
PRUNING = dict(PARTIAL, prompt_selector="shuffled", max_steps=4, group_early_stop=True, correct_weight=1.0,
               format_weight=0.0, prune_running=True, prune_warmup_steps=1, prune_threshold=0.6)
SELECTION = dict(prompt_selector="pass_rate", max_train_prompts=12, max_steps=4)
SHARDED_LORA = dict(lora_rank=4, generation_engine="slots", generation_micro_group=4)


@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> SharedLaunch:
    """Every DDP run of this module in one launch; the runs expected to fail come last."""
    folder = tmp_path_factory.mktemp("ddp")
    for name, source in RANK_REWARDS.items():
        (folder / f"{name}.py").write_text(source)
    launch = SharedLaunch(folder)
    launch.add("run", folder / "run")
    launch.add("grpo_loss", folder / "grpo_loss", loss_type="grpo")
    launch.add("part", folder / "part", max_steps=2, save_steps=2)
    launch.add("resumed", folder / "part", max_steps=3, resume=True)
    launch.add("pass_rate", folder / "pass_rate", **SELECTION)
    launch.add("dynamic", folder / "dynamic", dynamic_sampling=True, dynamic_sampling_rounds=2)
    for dynamic_sampling in (False, True):
        launch.add(f"partial_{dynamic_sampling}", folder / f"partial_{dynamic_sampling}", **PARTIAL,
                   dynamic_sampling=dynamic_sampling)
    launch.add("pruning", folder / "pruning", **PRUNING)
    for spread_on in ("1", "none"):
        launch.add(f"signal_{spread_on}", folder / f"signal_{spread_on}", max_steps=1,
                   reward_funcs=f"{folder / f'spread_on_one_rank_{spread_on}.py'}:spread_on_one_rank")
    launch.add("early_stop_failure", folder / "early_stop_failure", generation_engine="slots",
               generation_schedule="round_robin", generation_micro_group=8, group_early_stop=True,
               reward_funcs=f"{folder / 'fails_on_rank_1.py'}:fails_on_rank_1")
    launch.add("odd", folder / "odd", prompts_per_step=3, generation_batch_size=0)
    return launch.run()


def sharded(tmp_path_factory, config: str) -> SharedLaunch:
    """A launch of a shipped sharding config whose first job is the default run."""
    launch = SharedLaunch(tmp_path_factory.mktemp(config.split(".")[0]), ("--config_file", str(CONFIGS / config)))
    launch.add("run", launch.folder / "run")
    return launch


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory) -> SharedLaunch:
    launch = sharded(tmp_path_factory, "fsdp.yaml")
    one_process(launch.folder / "part", max_steps=2, save_steps=2)  # checkpoints hold whole tensors: any layout
    launch.add("resumed", launch.folder / "part", resume=True)
    return launch.run()


@pytest.fixture(scope="module")
def zero2(tmp_path_factory) -> SharedLaunch:
    launch = sharded(tmp_path_factory, "fsdp-zero2.yaml")
    launch.add("lora", launch.folder / "lora", **SHARDED_LORA)
    return launch.run()


@pytest.fixture(scope="module")
def two_process_run(ddp):
    done = ddp.result("run")
    assert done.returncode == 0, done.stderr[-3000:]
    return ddp.folder / "run", done


@pytest.mark.slow
def test_two_processes_stay_in_sync_and_write_once(two_process_run):
    run_dir, done = two_process_run
    records = steps(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3]  # one writer: no duplicated lines
    assert all(r["rank_param_spread"] == 0.0 for r in records)  # identical parameters after every step
    assert json.loads((run_dir / "data.json").read_text())["processes"] == 2
    assert done.stdout.count("run directory:") == 1


def assert_same_training(run_dir: Path, reference_dir: Path) -> None:
    """Step by step: the same rollouts (sampling is seeded per chunk of prompts, not per
    process), the same loss and gradient norm, and at the end the same parameters, up to
    the order of float additions in the gradient average."""
    ran, reference = steps(run_dir), steps(reference_dir)
    assert len(ran) == len(reference) == OPTIONS["max_steps"]
    for a, b in zip(ran, reference):
        for key in ("reward_mean", "kept_reward_mean", "kept_reward_std", "completion_len", "correct_rate"):
            assert a[key] == b[key], (a["step"], key)
        assert b["grad_norm"] > 1e-3  # a real gradient at every step
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), a["step"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7), a["step"]
    two, one = weights(run_dir), weights(reference_dir)
    assert set(two) == set(one)
    if (run_dir / "model" / "model.safetensors").exists():
        start = load_file(str(Path(__file__).parents[1] / "src/podsrl/assets/tiny/model.safetensors"))
    else:  # LoRA: B starts at zero
        start = {k: torch.zeros_like(v) for k, v in one.items() if "lora_B" in k}
    movement = max(float((one[k] - start[k]).abs().max()) for k in start)
    assert movement > 1e-3  # it trained
    for key in two:
        assert torch.allclose(two[key], one[key], atol=1e-3 * movement), key


@pytest.mark.slow
def test_two_processes_match_one_process_over_the_same_prompts(two_process_run, one_process_run):
    assert_same_training(two_process_run[0], one_process_run)
    # evaluation is split over the processes (every 2nd prompt each) and the counts summed:
    # greedy accuracy at step 0 (the same model) is the one-process accuracy exactly
    first = [read_metrics(run / "metrics.jsonl")[0] for run in (two_process_run[0], one_process_run)]
    assert 0 < first[1]["eval_greedy_accuracy"] < 1
    assert first[0]["eval_greedy_accuracy"] == first[1]["eval_greedy_accuracy"]
    # and so is its standard error over prompts: the per-prompt moments are summed too
    assert first[0]["eval_greedy_accuracy_se"] == pytest.approx(first[1]["eval_greedy_accuracy_se"])


@pytest.mark.slow
def test_sequence_aggregation_matches_one_process(ddp, tmp_path):
    done = ddp.result("grpo_loss")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_training(ddp.folder / "grpo_loss", one_process(tmp_path / "one", loss_type="grpo"))


@pytest.mark.slow
@pytest.mark.parametrize("config", ["fsdp.yaml", "fsdp-zero2.yaml"])
def test_sharded_processes_match_one_process(config, one_process_run, request):
    launch = request.getfixturevalue({"fsdp.yaml": "fsdp", "fsdp-zero2.yaml": "zero2"}[config])
    done = launch.result("run")
    assert done.returncode == 0, done.stderr[-3000:]
    records = [r for r in read_metrics(launch.folder / "run" / "metrics.jsonl") if r["step"] > 0]
    assert "rank_param_spread" not in records[0]  # sharded: no replicas to compare
    assert_same_training(launch.folder / "run", one_process_run)


@pytest.mark.slow
def test_sharded_lora_matches_one_process(zero2, tmp_path):
    # slots decoding takes a different number of steps on each process: without gathering
    # the whole model first, the per-layer all-gathers fall out of step and hang (checked)
    done = zero2.result("lora")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_training(zero2.folder / "lora", one_process(tmp_path / "one", **SHARDED_LORA))


@pytest.mark.slow
def test_sharded_run_resumes_a_one_process_checkpoint(one_process_run, fsdp):
    # checkpoints hold whole tensors, so they move between process layouts (the fixture trained
    # fsdp.folder / "part" for 2 steps in this process)
    done = fsdp.result("resumed")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_training(fsdp.folder / "part", one_process_run)


@pytest.mark.slow
def test_two_process_resume_matches_the_uninterrupted_run(two_process_run, ddp):
    run_dir, _ = two_process_run
    part = ddp.folder / "part"
    done = ddp.result("part")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.checkpoints == ["step_0000002"]
    done = ddp.result("resumed")
    assert done.returncode == 0, done.stderr[-3000:]
    # the interrupted run evaluated at its end (step 2); evaluation has its own RNG
    assert without_timings(steps(part), "eval_") == without_timings(steps(run_dir), "eval_")
    resumed, uninterrupted = weights(part), weights(run_dir)
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)


@pytest.mark.slow
def test_pass_rate_selection_over_two_processes_matches_one_process(ddp, tmp_path):
    """The selector learns from every process's outcomes (gathered), so each process draws
    the same prompts, and the run is the one-process run: the same selector numbers, the
    same rollouts and the same weights."""
    done = ddp.result("pass_rate")
    assert done.returncode == 0, done.stderr[-3000:]
    one = one_process(tmp_path / "one", **SELECTION)
    ran, reference = steps(ddp.folder / "pass_rate"), steps(one)
    assert [r["selector_prompts_seen"] for r in ran] == [r["selector_prompts_seen"] for r in reference]
    for a, b in zip(ran, reference):
        assert a["selector_informativeness"] == pytest.approx(b["selector_informativeness"], rel=1e-12)
        assert a["reward_mean"] == b["reward_mean"] and a["correct_rate"] == b["correct_rate"]
    assert all(r["rank_param_spread"] == 0.0 for r in ran)


@pytest.mark.slow
def test_dynamic_sampling_over_two_processes_stays_in_sync(ddp):
    """Refill rounds are decided for all processes together (a process short of informative
    groups makes every process generate again), so their collectives never diverge."""
    done = ddp.result("dynamic")
    assert done.returncode == 0, done.stderr[-3000:]
    records = steps(ddp.folder / "dynamic")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["rank_param_spread"] == 0.0 for r in records)
    assert all(r["prompts_generated"] == 4 * r["prompt_rounds"] for r in records)


@pytest.mark.slow
@pytest.mark.parametrize("dynamic_sampling", [False, True])
def test_partial_rollouts_over_two_processes_stay_in_sync(ddp, dynamic_sampling):
    """Each process carries its own groups in flight; fresh prompts are drawn for both together
    (each its own slice: with dynamic sampling, a round may find one process with its share and
    the other without) and a learning selector observes every process's complete groups."""
    done = ddp.result(f"partial_{dynamic_sampling}")
    assert done.returncode == 0, done.stderr[-3000:]
    records = steps(ddp.folder / f"partial_{dynamic_sampling}")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["rank_param_spread"] == 0.0 for r in records)
    assert all(r["partial_groups_carried"] == 2 * 2 for r in records)  # each process keeps its 2 extra in flight
    assert "decodes with the model's own forward" not in done.stderr  # DDP's replica runs podsrl's decode step
    if dynamic_sampling:
        assert all(r["prompts_generated"] >= 4 for r in records)


@pytest.mark.slow
def test_pruning_over_two_processes_stays_in_sync(ddp):
    """The head's sums are added over processes in rank order, so both hold one head (a head that
    differed would prune differently without breaking a collective: prune_head_spread measures it)."""
    done = ddp.result("pruning")
    assert done.returncode == 0, done.stderr[-3000:]
    records = steps(ddp.folder / "pruning")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["rank_param_spread"] == 0.0 and r["prune_head_spread"] == 0.0 for r in records)
    assert all("pruned_samples" in r and "prune_auc_0" in r for r in records)
    assert records[0]["pruned_samples"] == 0  # the warm-up step


@pytest.mark.slow
@pytest.mark.parametrize("spread_on", ["1", "none"])
def test_a_run_with_a_learning_signal_on_one_process_only_is_judged_the_same_on_both(ddp, spread_on):
    """Every advantage 0 fails the run (exit 1); the processes agree on it: rewards that differ
    only on rank 1's prompts are a signal for the whole run, so neither process fails it."""
    done = ddp.result(f"signal_{spread_on}")
    failure = json.loads((ddp.folder / f"signal_{spread_on}" / "summary.json").read_text()).get("failure", "")
    if spread_on == "none":
        assert done.returncode != 0 and "podsrl train: error: every advantage was 0 in the 1 steps run" in done.stderr
        assert failure.startswith("every advantage was 0")
    else:
        assert done.returncode == 0 and failure == "", done.stderr[-3000:]


@pytest.mark.slow
def test_a_reward_failure_on_one_process_in_early_stop_stops_both(ddp):
    """group_early_stop scores inside generation; a reward that fails on rank 1 alone must stop
    both processes with the error, not leave rank 0 waiting in a collective (the launch goes on
    to its next job: neither waits)."""
    done = ddp.result("early_stop_failure")
    assert done.returncode != 0
    assert "rank 1 refuses" in done.stderr  # rank 1's own error
    assert "a reward function failed on another process" in done.stderr  # rank 0 stopped with it
    assert done.stderr.count("stopped in step 1:") == 2, done.stderr[-3000:]  # each process, one line


@pytest.mark.slow
def test_prompts_must_split_evenly_over_processes(ddp):
    done = ddp.result("odd")
    assert done.returncode != 0
    assert "prompts_per_step: 3 prompts cannot be split evenly over 2 processes" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_asking_for_a_missing_gpu_names_the_field():
    from podsrl.distributed import Processes

    assert Processes().device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="device: 'cuda:1', but torch sees no CUDA GPU"):
        Processes().device("cuda:1")


class FakeAccelerator:
    """What Processes.from_env reads of accelerate's Accelerator, without a process group."""
    distributed_type = "DistributedType.MULTI_CPU"
    num_processes = 2
    process_index = 0

    def __init__(self, cpu: bool = False) -> None:
        pass


@pytest.mark.parametrize("env, kind, message", [
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1"}, LaunchRefused, "fsdp_version: 1"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "true"}, LaunchRefused,
     "fsdp_offload_params: true is not supported"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_RESHARD_AFTER_FORWARD": "sometimes"}, LaunchRefused,
     "fsdp_reshard_after_forward: 'sometimes'"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "TRANSFORMERS": "5.22.2"}, LaunchRefused,
     r"FSDP: sharded training needs transformers >= 5.23.0 \(found 5.22.2"),
    ({"DEEPSPEED": "1"}, LaunchRefused, "DeepSpeed: not supported"),
    ({"PROCESSES": "1"}, LaunchRefused, "WORLD_SIZE=2 but accelerate formed 1 process"),
])
def test_unsupported_distributed_modes_are_refused(monkeypatch, env, kind, message):
    import accelerate

    from podsrl import distributed
    from podsrl.distributed import Processes

    monkeypatch.setattr(distributed, "transformers_version", lambda: env.get("TRANSFORMERS", "5.23.0"))
    fake = type("Fake", (FakeAccelerator,), {
        "distributed_type": "DistributedType.DEEPSPEED" if "DEEPSPEED" in env else FakeAccelerator.distributed_type,
        "num_processes": int(env.get("PROCESSES", 2))})
    monkeypatch.setattr(accelerate, "Accelerator", fake)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for key in ("ACCELERATE_USE_FSDP", "FSDP_VERSION", "FSDP_OFFLOAD_PARAMS", "FSDP_RESHARD_AFTER_FORWARD"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        if key.startswith(("ACCELERATE", "FSDP")):
            monkeypatch.setenv(key, value)
    with pytest.raises(kind, match=message):
        Processes.from_env()
    # the supported ones are accepted
    for key, value in {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "false",
                       "FSDP_RESHARD_AFTER_FORWARD": "false"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(accelerate, "Accelerator", FakeAccelerator)
    monkeypatch.setattr(distributed, "transformers_version", lambda: "5.23.0")
    procs = Processes.from_env()
    assert procs.sharded and not procs.reshard_after_forward and procs.world_size == 2
