"""Config: defaults, YAML, overrides and validation messages that name the field."""

from pathlib import Path

import pytest

from podsrl.trainer.config import FIELDS, Config, make_config

ROOT = Path(__file__).parents[1]


def test_every_field_is_documented():
    for name, f in FIELDS.items():
        assert f.metadata.get("help"), name


def test_defaults_are_valid_and_the_demo():
    cfg = make_config()
    assert (cfg.model, cfg.task, cfg.method, cfg.downsampling_rule) == ("tiny", "arithmetic", "pods", "max_variance")
    assert cfg.generated_per_prompt == cfg.num_generations and cfg.trained_per_prompt == cfg.num_kept


def test_optimisation_defaults_are_the_papers():
    """README/DESIGN: AdamW betas (0.9, 0.99), weight decay 0.1, grad clip 0.1, eval at T = 0.9
    (the learning rate is ours: the paper's 5e-6 is for LoRA on 3B models)."""
    cfg = make_config()
    assert (cfg.optim, cfg.adam_beta1, cfg.adam_beta2, cfg.weight_decay, cfg.max_grad_norm) == \
        ("adamw_torch", 0.9, 0.99, 0.1, 0.1)
    assert (cfg.eval_temperature, cfg.num_iterations, cfg.beta, cfg.scale_rewards) == (0.9, 1, 0.0, True)


def test_method_decides_generated_and_trained_counts():
    assert make_config(overrides={"method": "grpo", "num_kept": "4", "num_generations": "16"}).generated_per_prompt == 4
    ga = make_config(overrides={"method": "grpo-ga", "num_generations": "16"})
    assert (ga.generated_per_prompt, ga.trained_per_prompt) == (16, 16)


@pytest.mark.parametrize("overrides, field", [
    ({"num_kept": "20", "num_generations": "4"}, "num_kept:"),
    ({"downsampling_rule": "best"}, "downsampling_rule:"),
    ({"m": "2"}, "unknown config field 'm'"),
    ({"task": "chess"}, "task:"),
    ({"method": "ppo"}, "method:"),
    ({"model": "no_such_model"}, "model:"),
    ({"model": "./missing/folder"}, "model:"),
    ({"num_generations": "0"}, "num_generations:"),
    ({"prompts_per_step": "-1"}, "prompts_per_step:"),
    ({"micro_batch_size": "0"}, "micro_batch_size:"),
    ({"learning_rate": "0"}, "learning_rate:"),
    ({"learning_rate": "fast"}, "learning_rate:"),
    ({"max_steps": "1.5"}, "max_steps:"),
    ({"eval_greedy": "maybe"}, "eval_greedy:"),
    ({"top_p": "1.5"}, "top_p:"),
    ({"loss_type": "sum"}, "loss_type: 'sum' is not implemented"),
    ({"loss_type": "dr_grpo"}, "loss_type: 'dr_grpo' is not implemented; podsrl has grpo and dapo"),
    ({"scale_rewards": "batch"}, "scale_rewards: TRL's 'batch' is not implemented"),
    ({"scale_rewards": "sometimes"}, "scale_rewards: expected true/false"),
    ({"optim": "adam"}, "optim: unknown optimizer 'adam'"),
    ({"device": "gpu"}, "device:"),
    ({"reward_funcs": "arithmetic_correct", "reward_weights": "heavy"}, "reward_weights: expected comma-separated"),
    ({"reward_funcs": "arithmetic_correct", "reward_weights": "1,2"}, "reward_weights: 2 weights for 1"),
    ({"learning_rate": "nan"}, "learning_rate: must be a finite number, got nan"),
    ({"max_grad_norm": "inf"}, "max_grad_norm: must be a finite number, got inf"),
    ({"lora_dropout": "1"}, "lora_dropout: must be in [0, 1), got 1.0"),
    ({"seed": "-1"}, "seed: must be in [0, 4294967295]"),
    ({"num_kept": "1"}, "num_kept: must be at least 2 for method pods"),
    ({"method": "grpo", "num_kept": "1"}, "num_kept: must be at least 2 for method grpo"),
    ({"method": "grpo-ga", "num_generations": "1"}, "num_generations: must be at least 2 for method grpo-ga"),
    ({"dtype": "float16"}, "dtype: float16 weights are not supported"),
])
def test_invalid_values_name_the_field(overrides, field):
    with pytest.raises(ValueError) as err:
        make_config(overrides=overrides)
    assert field in str(err.value)


def test_hub_ids_are_accepted_without_network():
    # users with network load these; validation must not reject (or fetch) them
    for name in ("Qwen/Qwen2.5-0.5B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "meta-llama/Llama-3.2-1B"):
        assert make_config(overrides={"model": name}).model == name


def test_unknown_field_suggests_the_close_one():
    with pytest.raises(ValueError, match="unknown config field 'learning_rat'"):
        make_config(overrides={"learning_rat": "1"})
    with pytest.raises(ValueError, match="did you mean 'eval_steps'"):
        make_config(overrides={"eval_stepz": "1"})


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("method: grpo-ga\nnum_generations: 8\nlearning_rate: 1.0e-5\nscale_rewards: false\n")
    cfg = make_config(path, {"num_generations": "6"})
    assert (cfg.method, cfg.num_generations, cfg.learning_rate, cfg.scale_rewards) == ("grpo-ga", 6, 1e-5, False)


def test_yaml_values_keep_their_yaml_types(tmp_path):
    path = tmp_path / "typed.yaml"
    path.write_text("lora_rank: 4\nlora_target_modules: [q_proj, v_proj]\nsystem_prompt: null\n"
                    "reward_funcs:\n  - arithmetic_correct\n  - arithmetic_format\nreward_weights: [1, 0.5]\n")
    cfg = make_config(path)
    assert cfg.lora_targets == ("q_proj", "v_proj")
    assert cfg.system_prompt == ""  # null: no system prompt, not the text "None"
    assert cfg.reward_specs == ["arithmetic_correct", "arithmetic_format"]
    assert cfg.reward_weight_values == [1.0, 0.5]
    # the command line keeps its comma form, with the same meaning
    assert make_config(overrides={"lora_rank": "4", "lora_target_modules": "q_proj,v_proj"}).lora_targets == \
        cfg.lora_targets


def test_yaml_values_of_the_wrong_shape_name_the_field_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("lora_target_modules: [q_proj, 'a,b']\n")
    with pytest.raises(ValueError, match=r"bad.yaml line 1: lora_target_modules: list items may not contain commas"):
        make_config(path)
    path.write_text("seed: 0\nsystem_prompt: {role: system}\n")
    with pytest.raises(ValueError, match=r"bad.yaml line 2: system_prompt: expected text or a list"):
        make_config(path)
    path.write_text("max_steps: null\n")
    with pytest.raises(ValueError, match=r"bad.yaml line 1: max_steps: expected int, got None"):
        make_config(path)


def test_yaml_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("method: pods\n\nlearning_rate: quick\n")
    with pytest.raises(ValueError, match=r"bad.yaml line 3: learning_rate: expected float"):
        make_config(path)
    path.write_text("method: pods\nmax_steps: [1\n")
    with pytest.raises(ValueError, match=r"bad.yaml line \d+: invalid YAML: while parsing a flow sequence; expected "
                                         r"',' or '\]', but got '<stream end>'$"):  # one line (#57)
        make_config(path)
    path.write_bytes(b"method: pods\n# caf\xe9\n")  # #57: Python's decode error named no file
    with pytest.raises(ValueError, match=r"^.*bad.yaml line 2: not valid UTF-8 \(byte b'\\xe9'\); save it as UTF-8$"):
        make_config(path)
    with pytest.raises(FileNotFoundError, match="config: file not found"):
        make_config(tmp_path / "nope.yaml")


def test_yaml_values_that_fail_validation_name_file_and_line(tmp_path):
    """validate's errors name a field; when the YAML file set it, its file and line lead, as
    parse_value's do; a command-line value replaces the file's, and its error has neither."""
    path = tmp_path / "bad.yaml"
    path.write_text("method: pods\nnum_generations: 4\n\nnum_kept: 8\n")
    with pytest.raises(ValueError, match=r"^\S*bad.yaml line 4: num_kept: must be <= num_generations"):
        make_config(path)
    with pytest.raises(ValueError, match=r"^num_kept: must be <= num_generations"):
        make_config(path, {"num_kept": "6"})
    path.write_text("top_p: 0\n")
    with pytest.raises(ValueError, match=r"^\S*bad.yaml line 1: top_p: must be in \(0, 1\], got 0.0$"):
        make_config(path)


def test_config_is_frozen():
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().n = 3


def test_comma_separated_fields_parse():
    cfg = make_config(overrides={"reward_funcs": " arithmetic_correct, arithmetic_format ,", "reward_weights": "",
                                 "lora_target_modules": "q_proj,,v_proj"})
    assert cfg.reward_specs == ["arithmetic_correct", "arithmetic_format"]
    assert cfg.reward_weight_values == [1.0, 1.0] and cfg.lora_targets == ("q_proj", "v_proj")


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yaml")
                                        if "accelerate" not in p.parts))
def test_shipped_configs_are_valid(path):
    cfg = make_config(str(ROOT / path))
    assert cfg.output_dir.startswith("runs/")  # run outputs stay where .gitignore keeps them out of git


# --- one name per concept in podsrl and TRL -----------------------------------------------------
def test_fields_with_trls_meaning_have_trls_names():
    """A field that means what a GRPOConfig field means has its name, in podsrl train and in
    podsrl.trl's PODSConfig alike (PODS's own fields, num_kept and downsampling_rule, are PODSConfig's)."""
    pytest.importorskip("trl")
    from dataclasses import fields

    from trl import GRPOConfig

    from podsrl.trl import PODSConfig

    trl_names = {f.name for f in fields(GRPOConfig)}
    pods_names = {f.name for f in fields(PODSConfig)}
    assert {"num_kept", "downsampling_rule"} <= pods_names & set(FIELDS)
    shared = {"num_generations", "learning_rate", "max_completion_length", "max_steps", "epsilon", "epsilon_high",
              "save_steps", "save_total_limit", "eval_steps", "loss_type", "scale_rewards", "beta", "num_iterations",
              "temperature", "top_p", "optim", "lr_scheduler_type", "warmup_steps", "adam_beta1", "adam_beta2",
              "weight_decay", "max_grad_norm", "bf16", "fp16", "gradient_checkpointing", "reward_weights", "seed",
              "output_dir", "report_to"}
    assert shared <= set(FIELDS) and shared <= trl_names and shared <= pods_names


@pytest.mark.parametrize("value, scale", [("group", True), ("none", False), ("true", True), ("false", False)])
def test_scale_rewards_takes_trls_values(value, scale):
    assert make_config(overrides={"scale_rewards": value}).scale_rewards is scale



def test_resume_takes_true_false_and_auto_from_the_command_line_yaml_and_python(tmp_path):
    from podsrl.cli import _parse_config
    from podsrl.trainer.config import validate

    assert [make_config(overrides={"resume": v}).resume for v in ("true", "false", "auto", "AUTO")] == [
        True, False, "auto", "auto"]
    assert _parse_config(["--resume"], "podsrl train", "").resume is True  # the flag alone, as before
    assert _parse_config(["--resume", "auto"], "podsrl train", "").resume == "auto"
    for text, value in (("true", True), ("false", False), ("auto", "auto")):
        (tmp_path / "c.yaml").write_text(f"resume: {text}\n")
        assert make_config(str(tmp_path / "c.yaml")).resume == value
    with pytest.raises(ValueError, match="^resume: expected true/false/auto, got 'sometimes'"):
        make_config(overrides={"resume": "sometimes"})
    validate(Config(resume="auto"))
    with pytest.raises(ValueError, match="^resume: expected true, false or auto, got 'yes'"):
        validate(Config(resume="yes"))

def test_loss_type_takes_trls_values_that_podsrl_implements():
    from podsrl.algorithms.loss import LOSSES, sequence_mean, token_mean
    from podsrl.trainer.setup import update_options

    assert make_config().loss_type == "grpo"  # the paper's: token mean per sequence, then mean
    for loss_type, reduce in (("grpo", sequence_mean), ("dapo", token_mean)):
        cfg = make_config(overrides={"loss_type": loss_type})
        assert LOSSES[cfg.loss_type] is update_options(cfg).loss_type.fn is reduce


def test_a_key_given_twice_in_yaml_is_an_error_naming_file_key_and_lines(tmp_path):
    """PyYAML silently keeps the last of two equal keys; which one the user meant is unknown."""
    path = tmp_path / "twice.yaml"
    path.write_text("learning_rate: 1e-3\nmax_steps: 3\n\nlearning_rate: 2e-3\n")
    with pytest.raises(ValueError, match=r"^\S*twice.yaml line 4: duplicate key 'learning_rate' \(first set on "
                                         r"line 1\); YAML keeps only the last: remove one$"):
        make_config(path)
    path.write_text("defaults: &d {max_steps: 3}\n")  # anchors and distinct keys still load (then fail as unknown)
    with pytest.raises(ValueError, match="unknown config field 'defaults'"):
        make_config(path)


def test_a_key_given_twice_in_a_yaml_flow_mapping_is_an_error_too(tmp_path):
    """In a flow mapping ({a: 1, a: 2}) both keys are on one line; PyYAML keeps the last there too."""
    path = tmp_path / "flow.yaml"
    path.write_text("max_steps: 3\ndownsampling_rule: {name: random, name: max_variance}\n")
    with pytest.raises(ValueError, match=r"^\S*flow.yaml line 2: duplicate key 'name' \(first set on line 2\); YAML "
                                         r"keeps only the last: remove one$"):
        make_config(path)
    path.write_text("max_steps: 3\nadvantage_estimator: {name: group, eps: 1.0e-3}\nreward_funcs: [{name: "
                    "arithmetic_format}, {name: arithmetic_correct}]\n")  # one key per mapping: loads
    assert make_config(path).advantage_estimator == {"name": "group", "eps": 1e-3}


PRUNING = {"generation_engine": "slots", "generation_micro_group": "8", "generation_schedule": "round_robin",
           "group_early_stop": "true", "prune_running": "true", "correct_weight": "1", "format_weight": "0"}
IGNORED = [  # (overrides, the warning's lines): #57, options an engine does not read were accepted in silence
    ({"vllm_enforce_eager": "true", "vllm_max_model_length": "64"},
     ["generation_engine hf does not read vllm_max_model_length = 64 (read by vllm), vllm_enforce_eager = true (read "
      "by vllm): they have no effect in this run"]),
    ({"generation_micro_group": "8"},
     ["generation_engine hf does not read generation_micro_group = 8 (read by slots): it has no effect in this run"]),
    ({"generation_engine": "slots", "share_prefill": "false", "vllm_importance_sampling_mode": "token_mask"},
     ["generation_engine slots does not read share_prefill = false (read by hf), vllm_importance_sampling_mode = "
      "\"token_mask\" (read by vllm): they have no effect in this run"]),
    ({"dynamic_sampling_rounds": "5"},
     ["dynamic_sampling_rounds = 5: read only with dynamic_sampling true; it has no effect in this run"]),
    ({"dynamic_sampling_rounds": "5", "dynamic_sampling": "true"}, []),
    # every field read only with a switch says so first in its help: the warning is taken from that
    ({"num_generations_max": "32"}, ["num_generations_max = 32: read only with adaptive_n true; it has no effect in "
                                     "this run"]),
    ({"partial_extra_prompts": "4", "partial_stale_correction": "mask"},
     ["partial_extra_prompts = 4, partial_stale_correction = \"mask\": read only with partial_rollouts true; they "
      "have no effect in this run"]),
    ({"generation_engine": "slots", "generation_micro_group": "8", "generation_schedule": "round_robin"}, []),
    ({"vllm_enforce_eager": "false", "generation_micro_group": "0", "dynamic_sampling_rounds": "3"}, []),  # defaults
    # #80: pruning that can never act, or may not (a reward of several terms)
    ({**PRUNING, "prune_warmup_steps": "20", "max_steps": "20"},
     ["prune_warmup_steps = 20: the head only watches for that many steps, and the run has max_steps = 20: "
      "prune_running prunes nothing in it"]),
    ({**PRUNING, "prune_warmup_steps": "19", "max_steps": "20"}, []),
    ({**PRUNING, "format_weight": "0.1"},
     ["prune_running: the reward sums 2 terms (correct_weight 1, format_weight 0.1), so it takes values strictly "
      "between its bounds, and pruning counts only finished samples at a bound (a wrong answer scored for its "
      "format fills neither class): it may prune nothing; give one term weight (correct_weight, format_weight)"]),
    ({**PRUNING, "reward_funcs": "arithmetic_correct,arithmetic_format", "reward_weights": "1,0"}, []),
]


@pytest.mark.parametrize("overrides, lines", IGNORED)
def test_options_the_run_does_not_read_are_warned_about_unless_left_at_their_default(overrides, lines):
    from podsrl.config_checks import ignored_fields

    assert ignored_fields(make_config(overrides=overrides)) == lines


def test_an_engine_is_judged_by_its_options_class_and_one_that_declares_none_gets_sampling_only(tmp_path):
    from podsrl.config_checks import ignored_fields

    path = tmp_path / "engines.py"
    path.write_text("from podsrl.rollout import VLLMEngine\nclass Mine:\n    def __init__(self, options):\n"
                    "        self.options = options\nclass LikeVllm(VLLMEngine):\n    pass\n")
    # the vllm engine (not validated here: vLLM need not be installed)
    assert ignored_fields(Config(generation_engine="vllm", generation_micro_group=8, share_prefill=False)) == [
        # the fields in the config's order of declaration
        "generation_engine vllm does not read generation_micro_group = 8 (read by slots), share_prefill = false "
        "(read by hf): they have no effect in this run"]
    options = {"vllm_enforce_eager": "true", "generation_micro_group": "8"}
    assert ignored_fields(make_config(overrides={"generation_engine": f"{path}:Mine", **options})) == [
        f"generation_engine {path}:Mine does not read generation_micro_group = 8 (read by slots), vllm_enforce_eager "
        f"= true (read by vllm): they have no effect in this run"]  # it is built with EngineOptions
    # like the vllm engine, it needs vLLM to validate: the warnings are read without validating
    assert ignored_fields(Config(generation_engine=f"{path}:LikeVllm", vllm_enforce_eager=True,
                                 generation_micro_group=8)) == [
        f"generation_engine {path}:LikeVllm does not read generation_micro_group = 8 (read by slots): it has no effect "
        f"in this run"]


def test_the_warning_is_said_once_before_anything_loads_and_the_run_goes_on(monkeypatch, capsys):
    from podsrl import cli
    from podsrl.trainer import setup

    def stop_at_building(*args, **kwargs):
        raise ValueError("stopped before the data and model")

    monkeypatch.setattr(setup, "_build_run", stop_at_building)
    monkeypatch.setattr(setup, "claim_run_dir", lambda cfg, procs: (Path(cfg.output_dir), None, False))
    assert cli.main(["train", "--vllm_enforce_eager", "true", "--output_dir", "unused"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "warning: generation_engine hf does not read vllm_enforce_eager = true (read by vllm): it has no effect in "
        "this run", "podsrl train: error: stopped before the data and model"]


def test_the_completion_budget_is_the_tasks_own_unless_set():
    """max_completion_length 0 (the default) is the task's declared budget (podsrl.tasks.budget), resolved
    when the config is made, so the engine, evaluation and config.json all see tokens; a value set stays."""
    from podsrl.tasks import DEFAULT_COMPLETION_BUDGET, TASKS, completion_budget

    built_in = {"arithmetic": 8, "chain": 256, "gsm8k": 512, "math": 512, "jsonl": DEFAULT_COMPLETION_BUDGET}
    assert {name: Config(task=name).max_completion_length for name in built_in} == built_in
    assert all(completion_budget(name) == getattr(TASKS[name], "completion_budget", 256) for name in TASKS)
    assert Config(task="reasoning_gym:leg_counting").max_completion_length == DEFAULT_COMPLETION_BUDGET
    assert make_config(overrides={"task": "chain", "max_completion_length": "40"}).max_completion_length == 40
    assert make_config(overrides={"task": "chain"}).to_dict()["max_completion_length"] == 256
    with pytest.raises(ValueError, match="task: unknown task 'nope'"):  # the task's error, not the budget's
        make_config(overrides={"task": "nope"})
