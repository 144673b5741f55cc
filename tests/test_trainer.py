"""End-to-end tiers on a tiny random model: one step trains, runs are reproducible,
PODS with m == n is GRPO, micro-batching does not change the update, resume is exact."""

import copy
import dataclasses
import json
import math

import pytest
import torch

from podsrl.metrics import read_metrics
from podsrl.models import load_model
from podsrl.prompt_selection import PromptSelectionOptions, ShuffledPass
from podsrl.rollout import Sampling, generate
from podsrl.trainer import train
from podsrl.types import completion_mask_from_eos
from podsrl.update import (
    OptimizerOptions,
    UpdateOptions,
    batch_logprobs,
    flatten_for_update,
    make_optimizer,
    update_policy,
)
from tests.conftest import quick


def quick_config(model_dir, output_dir, **overrides):
    """conftest's two-step run, without checkpoints, evaluated on 16 prompts x 2 samples."""
    return quick(model_dir, output_dir, **{"eval_prompts": 16, "eval_samples": 2, "save_steps": 0, **overrides})


def final_weights(run_dir):
    """The saved model's weights: the whole model, or the LoRA adapter."""
    from safetensors.torch import load_file

    full = run_dir / "model" / "model.safetensors"
    return load_file(str(full if full.exists() else run_dir / "model" / "adapter_model.safetensors"))


def training_records(run_dir):
    """metrics.jsonl without the wall-clock timing fields (time_*, train_seconds, weight_sync_seconds)."""
    return [{k: v for k, v in r.items() if not k.startswith("time_") and not k.endswith("_seconds")}
            for r in read_metrics(run_dir / "metrics.jsonl")]


def test_one_step_trains(random_model_dir, tmp_path):
    # no weight decay: any change of the weights comes from the policy gradient
    cfg = quick_config(random_model_dir, tmp_path / "run", max_steps=1, weight_decay=0)
    before = {k: v.clone() for k, v in load_model(random_model_dir).model.state_dict().items()}
    result = train(cfg)
    after = final_weights(result.run_dir)
    record = read_metrics(result.run_dir / "metrics.jsonl")[-1]
    assert math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"])
    assert record["skipped_step"] == 0 and record["grad_norm"] > 0
    assert record["kept_reward_std"] > 0
    changed = [k for k in after if not torch.equal(after[k], before[k])]
    assert changed, "no parameter changed"
    for key in ("time_generate", "time_reward", "time_select", "time_update", "reward_mean",
                "kept_reward_std", "reward_zero_var_frac", "completion_len", "lr", "eval_accuracy", "eval_accuracy_se"):
        assert key in record, key
    assert not (result.run_dir / "accuracy.png").exists()  # the caller draws it: test_cli's smoke test checks it
    assert json.loads((result.run_dir / "config.json").read_text())["num_generations"] == 6


@pytest.mark.slow
def test_same_seed_same_run(random_model_dir, tmp_path):
    a = train(quick_config(random_model_dir, tmp_path / "a"))
    b = train(quick_config(random_model_dir, tmp_path / "b"))
    assert training_records(a.run_dir) == training_records(b.run_dir)
    c = train(quick_config(random_model_dir, tmp_path / "c", seed=1))
    assert training_records(c.run_dir) != training_records(a.run_dir)


@pytest.mark.slow
def test_pods_with_m_equal_n_is_grpo(random_model_dir, tmp_path):
    pods = train(quick_config(random_model_dir, tmp_path / "pods", method="pods", num_generations=4, num_kept=4))
    grpo = train(quick_config(random_model_dir, tmp_path / "grpo", method="grpo", num_generations=4, num_kept=4))
    assert training_records(pods.run_dir) == training_records(grpo.run_dir)
    wp, wg = final_weights(pods.run_dir), final_weights(grpo.run_dir)
    assert all(torch.equal(wp[k], wg[k]) for k in wp)


@pytest.mark.parametrize("method", ["grpo", "grpo-ga", "pods"])
def test_every_method_runs(random_model_dir, tmp_path, method):
    result = train(quick_config(random_model_dir, tmp_path / method, method=method, max_steps=1))
    record = read_metrics(result.run_dir / "metrics.jsonl")[-1]
    assert math.isfinite(record["loss"])
    assert record["kept_completion_len"] > 0


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_micro_batching_equals_one_big_batch(random_model_dir, loss_type):
    """The gradient accumulated over micro-batches is the one-batch gradient (SGD with lr 1
    makes the parameter change the gradient itself; Adam's first step is sign(g) and would
    turn float noise on near-zero entries into lr-sized differences)."""
    bundle = load_model(random_model_dir)
    torch.manual_seed(0)
    rollouts = generate(bundle.model, bundle.tokenizer, ["What is 1 + 2?", "7", "What is 10 - 3 + 4?", "9 + 9"], 3,
                        Sampling(max_completion_length=6, temperature=1.0))
    batch = flatten_for_update(rollouts, torch.randn(4, 3))  # [B = 12, ...]
    options = UpdateOptions(max_grad_norm=0, loss_type=loss_type)
    changes = {}
    for size in (12, 5, 1):
        model = copy.deepcopy(bundle.model)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        before = {k: v.detach().clone() for k, v in model.named_parameters()}
        update_policy(model, optimizer, scheduler, batch, dataclasses.replace(options, micro_batch_size=size))
        changes[size] = {k: before[k] - v.detach() for k, v in model.named_parameters()}
    assert any(float(g.abs().max()) > 1e-4 for g in changes[12].values())  # a real gradient
    for size in (5, 1):
        for key, grad in changes[12].items():
            assert torch.allclose(changes[size][key], grad, atol=1e-6, rtol=1e-4), (size, key)


RESUME_CASES = {
    "defaults": {},
    "random_rule": {"downsampling_rule": "random"},  # the rule's own generator
    "lora_dropout": {"lora_rank": 4, "lora_dropout": 0.1},  # dropout draws from the global RNG
    "kl": {"beta": 0.1},  # the reference policy must stay the initial one
    "two_iterations": {"num_iterations": 2},
    "slots_shortest_first": {"generation_engine": "slots", "generation_micro_group": 8,
                             "generation_schedule": "shortest_first"},  # the learned length predictor
    "slots_length_aware": {"generation_engine": "slots", "generation_micro_group": 8,
                           "generation_schedule": "length_aware"},  # the token-conditioned predictor
    "pass_rate": {"prompt_selector": "pass_rate", "max_train_prompts": 6},  # the posterior and its draws
    "dynamic_sampling": {"dynamic_sampling": True, "format_weight": 0},  # refill rounds' prompts
    # the posterior's draws over refill rounds (groups of 3: a quarter constant, so steps 1 and 3 refill):
    # dynamic sampling composes with any selector
    "pass_rate_dynamic_sampling": {"prompt_selector": "pass_rate", "dynamic_sampling": True, "format_weight": 0,
                                   "max_train_prompts": 12, "num_generations": 3, "num_kept": 2},
    # the generation copy is rebuilt from the restored weights (not checkpointed); static cache: its padding
    "generation_copy": {"lora_rank": 4, "generation_dtype": "bfloat16", "generation_static_cache": True},
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(RESUME_CASES))
def test_resume_matches_uninterrupted_run(random_model_dir, tmp_path, case):
    options = RESUME_CASES[case]
    full = train(quick_config(random_model_dir, tmp_path / "full", max_steps=4, **options))
    part_dir = tmp_path / "part"
    train(quick_config(random_model_dir, part_dir, max_steps=2, save_steps=2, **options))
    (part_dir / "model").rename(part_dir / "model_at_2")
    resumed = train(quick_config(random_model_dir, part_dir, max_steps=4, resume=True, **options))
    # the interrupted run also evaluated at its last step (2); evaluation draws from its own
    # RNG, so every training quantity must still match
    def without_eval(records):
        return [{k: v for k, v in r.items() if not k.startswith("eval_")} for r in records]

    assert without_eval(training_records(resumed.run_dir)) == without_eval(training_records(full.run_dir))
    assert training_records(resumed.run_dir)[-1] == training_records(full.run_dir)[-1]
    wf, wr = final_weights(full.run_dir), final_weights(resumed.run_dir)
    assert wf.keys() == wr.keys() and all(torch.equal(wf[k], wr[k]) for k in wf)


def test_unusable_checkpoints_refuse_the_resume_and_leave_the_run_as_it_was(random_model_dir, tmp_path, capfd):
    """Every checkpoint's optimizer state is for another model: each is refused, and the
    resume stops without touching the run (it used to start from scratch over the run's own
    files; restore leaving the model untouched is test_checkpoint's rollback tests)."""
    out = tmp_path / "run"
    train(quick_config(random_model_dir, out, max_steps=2, save_steps=1))
    for path in (out / "checkpoints").iterdir():
        rest = torch.load(path / "optimizer.pt", weights_only=True)
        rest["optimizer"]["param_groups"][0]["params"].pop()  # one parameter fewer than the model
        torch.save(rest, path / "optimizer.pt")
    before, weights_before = training_records(out), final_weights(out)
    with pytest.raises(ValueError, match="resume: no usable checkpoint"):
        train(quick_config(random_model_dir, out, max_steps=3, resume=True))
    assert capfd.readouterr().err.count("is unreadable") == 2
    assert training_records(out) == before
    after = final_weights(out)
    assert all(torch.equal(after[k], weights_before[k]) for k in after)


@pytest.mark.slow
def test_grpo_ga_is_one_big_batch(random_model_dir, tmp_path):
    """grpo-ga trains on all n rollouts in micro-batches with gradient accumulation and one
    optimizer step: the update of grpo training the same n rollouts in one batch. SGD without
    clipping makes the update the gradient itself, so a wrong accumulation scale shows."""
    options = dict(max_steps=2, num_generations=6, num_kept=6, optim="sgd", learning_rate=0.5, max_grad_norm=0,
                   weight_decay=0)
    accumulated = train(quick_config(random_model_dir, tmp_path / "ga", method="grpo-ga", micro_batch_size=5,
                                     **options)).run_dir
    one_batch = train(quick_config(random_model_dir, tmp_path / "one", method="grpo", micro_batch_size=64,
                                   **options)).run_dir
    a, b = training_records(accumulated), training_records(one_batch)
    for ra, rb in zip(a[1:], b[1:]):
        assert ra["reward_mean"] == rb["reward_mean"] and ra["kept_reward_std"] == rb["kept_reward_std"]
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-5, abs=1e-7)
        assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-5)
    start = load_model(random_model_dir).model.state_dict()
    wa, wb = final_weights(accumulated), final_weights(one_batch)
    assert max(float((wb[k] - start[k]).abs().max()) for k in wb) > 1e-3  # it trained
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


@pytest.mark.slow
def test_optimizer_is_the_papers_adamw_unless_configured(random_model_dir, tmp_path):
    def first_group(**overrides):
        run = train(quick_config(random_model_dir, tmp_path / str(len(overrides)), max_steps=1, save_steps=1,
                                 **overrides)).run_dir
        return torch.load(run / "checkpoints" / "step_0000001" / "optimizer.pt",
                          weights_only=True)["optimizer"]["param_groups"][0]

    adamw = first_group()
    assert adamw["betas"] == (0.9, 0.99) and adamw["weight_decay"] == 0.1 and adamw["decoupled_weight_decay"]
    assert adamw["eps"] == 1e-8 and not adamw["amsgrad"]
    custom = first_group(adam_beta2=0.95, weight_decay=0.01)
    assert custom["betas"] == (0.9, 0.95) and custom["weight_decay"] == 0.01
    sgd = first_group(optim="sgd", weight_decay=0, learning_rate=0.1)
    assert "betas" not in sgd and sgd["momentum"] == 0 and sgd["lr"] == 0.1


def test_gradients_are_clipped_to_max_grad_norm(random_model_dir, tmp_path):
    """With SGD the update is -lr x the clipped gradient: its global norm is lr x min(norm, max)."""
    run = train(quick_config(random_model_dir, tmp_path / "run", max_steps=1, optim="sgd", learning_rate=0.5,
                             weight_decay=0, max_grad_norm=0.01)).run_dir
    record = read_metrics(run / "metrics.jsonl")[-1]
    assert record["grad_norm"] > 0.01  # the logged norm is the one before clipping
    start, end = load_model(random_model_dir).model.state_dict(), final_weights(run)
    moved = torch.sqrt(sum(((end[k] - start[k]) ** 2).sum() for k in end))
    assert float(moved) == pytest.approx(0.5 * 0.01, rel=1e-4)


def test_logged_learning_rate_is_the_one_each_step_used(random_model_dir, tmp_path):
    """transformers' constant_with_warmup: linear from 0 over warmup_steps optimizer steps,
    then constant; each record's lr is the rate its own optimizer step used (the
    optimizer's own state after step 5 holds the same)."""
    run = train(quick_config(random_model_dir, tmp_path / "run", max_steps=5, warmup_steps=3, learning_rate=1e-3,
                             save_steps=5)).run_dir
    records = read_metrics(run / "metrics.jsonl")[1:]
    assert [r["lr"] for r in records] == pytest.approx([0, 1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3], rel=1e-12)
    group = torch.load(run / "checkpoints" / "step_0000005" / "optimizer.pt",
                       weights_only=True)["optimizer"]["param_groups"][0]
    assert group["lr"] == pytest.approx(1e-3, rel=1e-12)


def test_a_warmup_fraction_and_a_cosine_schedule_follow_transformers(random_model_dir, tmp_path):
    """warmup_steps < 1 is a fraction of the run (0.2 x 5 steps = 1 step); then cosine decay
    0.5 (1 + cos(pi progress)) over the remaining 4 steps (oracle: the formula)."""
    run = train(quick_config(random_model_dir, tmp_path / "run", max_steps=5, warmup_steps=0.2, learning_rate=1e-3,
                             lr_scheduler_type="cosine")).run_dir
    expected = [0.0] + [1e-3 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)]
    assert [r["lr"] for r in read_metrics(run / "metrics.jsonl")[1:]] == pytest.approx(expected, rel=1e-12)


def test_existing_run_is_not_overwritten(random_model_dir, tmp_path):
    train(quick_config(random_model_dir, tmp_path / "run", max_steps=1))
    with pytest.raises(FileExistsError, match="output_dir"):
        train(quick_config(random_model_dir, tmp_path / "run", max_steps=1))


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_kl_is_to_the_initial_policy(random_model_dir, tmp_path, lora_rank):
    """The reference is the initial model (with LoRA: the base with the adapter disabled), so
    the KL is exactly 0 at step 1, where the policy still equals it, and positive once the
    policy has moved; a reference that follows the policy would keep it at 0."""
    result = train(quick_config(random_model_dir, tmp_path / "kl", max_steps=3, beta=0.1, lora_rank=lora_rank,
                                learning_rate=1e-2))
    kls = [r["kl"] for r in read_metrics(result.run_dir / "metrics.jsonl")[1:]]
    assert kls[0] == 0.0 and kls[1] > 0 and kls[2] > 0
    assert all("time_logprobs" in r for r in read_metrics(result.run_dir / "metrics.jsonl")[1:])


@pytest.mark.slow
def test_reused_batches_are_clipped_against_the_generating_policy(random_model_dir, tmp_path):
    """num_iterations = 2: the second optimizer step on a batch sees ratios != 1 and clips
    (the logged clip fraction is the last iteration's); with one iteration nothing clips."""
    options = dict(max_steps=3, learning_rate=5e-2, max_grad_norm=0)
    reused = read_metrics(train(quick_config(random_model_dir, tmp_path / "two", num_iterations=2,
                                             **options)).run_dir / "metrics.jsonl")[1:]
    single = read_metrics(train(quick_config(random_model_dir, tmp_path / "one", **options)).run_dir
                          / "metrics.jsonl")[1:]
    assert all(r["clip_fraction"] > 0 for r in reused)
    assert all(r["clip_fraction"] == 0 for r in single)


def small_batch(bundle, prompts=("What is 1 + 2?", "7", "What is 10 - 3 + 4?", "9 + 9"), n=3, seed=0):
    torch.manual_seed(seed)
    rollouts = generate(bundle.model, bundle.tokenizer, list(prompts), n, Sampling(max_completion_length=6,
                                                                                   temperature=1.0))
    advantages = torch.randn(len(prompts), n, generator=torch.Generator().manual_seed(seed))
    return flatten_for_update(rollouts, advantages)  # [B = P*n, ...]


def test_clip_range_is_asymmetric_as_configured(random_model_dir):
    """The second update on a batch clips exactly where ratio leaves [1 - eps_low, 1 + eps_high]
    on the side that limits the objective (oracle: the PPO formula token by token)."""
    bundle = load_model(random_model_dir)
    batch = small_batch(bundle)
    batch.old_logp = batch_logprobs(bundle.model, batch, size=64)
    options = UpdateOptions(max_grad_norm=0, epsilon=0.05, epsilon_high=0.4)
    optimizer = torch.optim.SGD(bundle.model.parameters(), lr=2.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    first = update_policy(bundle.model, optimizer, scheduler, batch, options)
    assert first.clip_fraction == 0
    with torch.no_grad():
        logp = batch_logprobs(bundle.model, batch, size=64)
    ratios, mask = torch.exp(logp - batch.old_logp), batch.completion_mask.bool()
    clipped = total = 0
    for row in range(ratios.shape[0]):
        advantage = float(batch.advantages[row])
        for ratio in ratios[row][mask[row]].tolist():
            bounded = min(max(ratio, 1 - 0.05), 1 + 0.4)
            clipped += (ratio * advantage) != (bounded * advantage) and advantage != 0
            total += 1
    second = update_policy(bundle.model, optimizer, scheduler, batch, options)
    assert 0 < clipped < total and second.clip_fraction == pytest.approx(clipped / total, abs=1e-6)


def test_lora_update_changes_only_the_adapter(random_model_dir):
    bundle = load_model(random_model_dir, lora_rank=4)
    batch = small_batch(bundle)
    options = UpdateOptions(max_grad_norm=0)
    optimizer, scheduler = make_optimizer((p for p in bundle.model.parameters() if p.requires_grad),
                                          OptimizerOptions())
    before = {k: v.clone() for k, v in bundle.model.state_dict().items()}
    for _ in range(2):  # the second step moves lora_A too (its gradient is 0 while lora_B is 0)
        update_policy(bundle.model, optimizer, scheduler, batch, options)
    changed = {k for k, v in bundle.model.state_dict().items() if not torch.equal(v, before[k])}
    assert any("lora_A" in k for k in changed) and any("lora_B" in k for k in changed)
    assert all("lora_" in k for k in changed), sorted(k for k in changed if "lora_" not in k)


def test_the_saved_lora_model_is_the_trained_one(random_model_dir, tmp_path):
    """Reloading run/model (base + saved adapter) gives the greedy accuracy the run logged at
    its end: nothing the run trained (e.g. a base weight) is missing from what it saved."""
    from podsrl.run_folder.eval_command import run_eval
    from podsrl.trainer.setup import task_options

    result = train(quick_config(random_model_dir, tmp_path / "lora", max_steps=3, lora_rank=4, learning_rate=1e-2))
    logged = read_metrics(result.run_dir / "metrics.jsonl")[-1]["eval_greedy_accuracy"]
    trained = torch.load(result.run_dir / "checkpoints" / "step_0000003" / "trainable.pt", weights_only=True)
    assert trained and all("lora_" in name for name in trained)  # what the optimizer updates: the adapter
    cfg = quick_config(str(result.run_dir / "model"), tmp_path / "eval", eval_temperature=0)
    saved = run_eval(cfg, task_options(cfg))
    assert saved["accuracy"] == logged


def test_generation_shapes_and_masks():
    """Masks against a token-by-token oracle, on the shipped tiny model (it ends its answers
    with EOS, so rows of every length occur)."""
    bundle = load_model("tiny")
    torch.manual_seed(0)
    prompts = ["What is 3 + 7? Answer in format: 'Answer: {result}'\n",
               "What is 41 - 85? Answer in format: 'Answer: {result}'\n"]
    rollouts = generate(bundle.model, bundle.tokenizer, prompts, 5, Sampling(max_completion_length=12, temperature=1.0))
    assert rollouts.completion_ids.shape[:2] == (2, 5) and rollouts.completion_ids.shape[2] <= 12
    assert len(rollouts.texts) == 2 and all(len(g) == 5 for g in rollouts.texts)
    eos, pad = bundle.tokenizer.eos_token_id, bundle.tokenizer.pad_token_id
    ended = 0
    for p in range(2):
        for j in range(5):
            ids = rollouts.completion_ids[p, j].tolist()
            end = ids.index(eos) + 1 if eos in ids else len(ids)  # up to and including the first EOS
            assert rollouts.completion_mask[p, j].tolist() == [1] * end + [0] * (len(ids) - end)
            assert all(token == pad for token in ids[end:])
            assert rollouts.texts[p][j] == bundle.tokenizer.decode(ids[:end], skip_special_tokens=True)
            ended += eos in ids
    assert ended == 10 and len(set(rollouts.completion_mask.sum(-1).flatten().tolist())) > 1  # lengths vary
    kept = rollouts.kept(torch.tensor([[0, 4], [1, 2]]))
    assert kept.completion_ids.shape[:2] == (2, 2) and kept.texts[1] == rollouts.texts[1][1:3]
    assert torch.equal(kept.completion_ids[0, 1], rollouts.completion_ids[0, 4])
    assert rollouts.at_prompts([1]).texts == rollouts.texts[1:]


def test_shared_prefill_draws_the_same_samples(random_model_dir):
    bundle = load_model(random_model_dir)
    prompts = ["What is 1 + 2?", "What is 10 - 3 + 4? Answer in format", "7"]  # unequal lengths: left padding
    outputs = []
    for share in (False, True):
        torch.manual_seed(0)
        outputs.append(generate(bundle.model, bundle.tokenizer, prompts, 6,
                                Sampling(max_completion_length=6, temperature=1.0), share_prefill=share))
    assert outputs[0].texts == outputs[1].texts
    assert torch.equal(outputs[0].completion_mask, outputs[1].completion_mask)
    greedy_one = generate(bundle.model, bundle.tokenizer, prompts, 1, Sampling(max_completion_length=6,
                                                                               temperature=0.0))
    greedy_shared = generate(bundle.model, bundle.tokenizer, prompts, 3, Sampling(max_completion_length=6,
                                                                                  temperature=0.0))
    assert all(text == greedy_one.texts[p][0] for p in range(3) for text in greedy_shared.texts[p])


def test_completion_mask_from_eos():
    ids = torch.tensor([[5, 6, 0, 0], [0, 7, 0, 8], [5, 5, 5, 5]])
    assert completion_mask_from_eos(ids, 0).tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]


def test_prompt_sampler_covers_each_epoch_once():
    sampler = ShuffledPass(10, PromptSelectionOptions(seed=3))
    first = sampler.take(7) + sampler.take(3)
    assert sorted(first) == list(range(10))
    second = sampler.take(10)
    assert sorted(second) == list(range(10)) and second != first
    resumed = ShuffledPass(10, PromptSelectionOptions(seed=3))
    resumed.load_state_dict({"epoch": 1, "position": 4})
    assert resumed.take(6) == second[4:]


def test_the_update_gets_advantages_normalised_over_the_kept_m_not_the_generated_n(random_model_dir, tmp_path,
                                                                                  monkeypatch):
    """The paper normalises over the m kept rollouts. A brute-force oracle per group (mean and
    sample std of the kept rewards, eps 1e-4, 0 for a constant group) must equal what reaches
    the update, and normalising over all n would give something else on these very steps."""
    import statistics

    from podsrl.trainer import loop, stages

    steps, batches = [], []
    real_step, real_update = loop.training_step, stages.update_policy

    def spy_step(*args):
        steps.append(real_step(*args))
        return steps[-1]

    def spy_update(model, optimizer, scheduler, batch, *args, **kwargs):
        batches.append(batch.advantages.clone())
        return real_update(model, optimizer, scheduler, batch, *args, **kwargs)

    monkeypatch.setattr(loop, "training_step", spy_step)
    monkeypatch.setattr(stages, "update_policy", spy_update)
    train(quick_config(random_model_dir, tmp_path / "run", max_steps=3, num_generations=6, num_kept=3))

    def normalised(group: list[float], over: list[float]) -> list[float]:
        if max(over) == min(over):
            return [0.0] * len(group)
        mean, std = statistics.fmean(over), statistics.stdev(over)
        return [(r - mean) / (std + 1e-4) for r in group]

    differs = False
    for outcome, advantages in zip(steps, batches, strict=True):
        oracle, over_n = [], []
        for p in range(outcome.kept_rewards.shape[0]):
            kept, generated = outcome.kept_rewards[p].tolist(), outcome.scores.reward[p].tolist()
            assert sorted(kept) == sorted(generated[i] for i in outcome.kept_indices[p].tolist())
            oracle += normalised(kept, kept)
            over_n += normalised(kept, generated)
        assert torch.allclose(advantages, torch.tensor(oracle), atol=1e-5), (advantages, oracle)
        differs |= not torch.allclose(advantages, torch.tensor(over_n), atol=1e-3)
    assert differs  # the test can tell the two normalisations apart on these steps
