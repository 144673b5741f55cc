"""The vllm engine on the real vLLM (vLLM's CPU backend here): run by scripts/test_vllm.sh in
.venv-vllm, skipped where vLLM is not installed (the main suite).

The engine's greedy output agrees with transformers' (equal through each row's first EOS, or
parted only at a near tie: tests/greedy_oracle.py) on the same weights, and on the *updated*
weights after an optimizer step (the test that fails if weights never reach vLLM), with and
without LoRA; its log-probs are the policy's; seeded calls repeat and building the engine
leaves the trainer's random streams alone."""

import copy
import random

import numpy as np
import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here: scripts/test_vllm.sh runs these in .venv-vllm")

from greedy_oracle import assert_greedy_agrees  # noqa: E402

from podsrl.models import load_model  # noqa: E402
from podsrl.models.logprobs import token_logprobs  # noqa: E402
from podsrl.rollout import Sampling, VLLMEngine, VLLMOptions, generate  # noqa: E402
from podsrl.rollout.partial import PartialCall  # noqa: E402
from podsrl.tasks.arithmetic import build_arithmetic  # noqa: E402

PROMPTS = [example.prompt for example in build_arithmetic(level=3, num_train=10, num_test=24, seed=3).test]


def completions(rollouts) -> list[list[int]]:
    return rollouts.completion_id_lists()


def make_engine(max_completion_length=8, **vllm_options):
    vllm_options.setdefault("enforce_eager", True)  # compiling costs minutes on the CPU, for no speed
    return VLLMEngine(VLLMOptions(max_completion_length=max_completion_length, **vllm_options))


@pytest.fixture
def engine():
    # one engine at a time: vLLM keeps its parallel state in globals of the process, which
    # closing an engine tears down (a run has one engine; so does each test)
    engine = make_engine()
    yield engine
    engine.close()


def greedy(engine, bundle, prompts=PROMPTS):
    hf = generate(bundle.model, bundle.tokenizer, prompts, 1, Sampling(max_completion_length=8, temperature=0))
    ours = engine.generate(bundle.model, bundle.tokenizer, prompts, 1, Sampling(max_completion_length=8, temperature=0))
    return completions(hf), completions(ours)


# vLLM's float32 CPU kernels and transformers' round differently: two next tokens this close in
# transformers' log-probs may be picked either way (tests/greedy_oracle.py); a broken engine's
# picks are nats apart (tests/test_greedy_oracle.py)
TIE_NATS = 0.01


def assert_engine_agrees(bundle, ours, hf, prompts=PROMPTS):
    prompt_ids = [bundle.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    assert_greedy_agrees(bundle.model, prompt_ids, ours, hf, bundle.tokenizer.eos_token_id, TIE_NATS)


def sgd_steps(model, prompts, tokenizer, steps=3, lr=0.5):
    """A few real optimizer steps (SGD on the prompts' next-token loss): the weights move the
    way training moves them, in place."""
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    ids = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    for _ in range(steps):
        out = model(**ids, labels=ids["input_ids"].masked_fill(ids["attention_mask"] == 0, -100))
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def test_greedy_output_agrees_with_transformers_on_the_same_weights(engine, tiny):
    hf, ours = greedy(engine, tiny)
    assert_engine_agrees(tiny, ours, hf)


def test_after_an_update_the_engine_generates_from_the_updated_weights(engine):
    bundle = load_model("tiny")
    before, _ = greedy(engine, bundle)
    sgd_steps(bundle.model, PROMPTS[:8], bundle.tokenizer)
    hf, ours = greedy(engine, bundle)
    assert hf != before, "the update must change transformers' greedy output, or this test shows nothing"
    assert_engine_agrees(bundle, ours, hf)


def test_lora_is_merged_into_what_the_engine_gets(engine):
    bundle = load_model("tiny", lora_rank=8, lora_alpha=32)
    before, _ = greedy(engine, bundle)
    sgd_steps(bundle.model, PROMPTS[:8], bundle.tokenizer, steps=4, lr=2.0)
    hf, ours = greedy(engine, bundle)
    assert hf != before
    assert_engine_agrees(bundle, ours, hf)
    assert not any(getattr(m, "merged", False) for m in bundle.model.modules())  # the policy stays unmerged


def test_the_engines_log_probs_are_the_policys(engine, tiny):
    torch.manual_seed(0)
    rollouts = engine(tiny.model, tiny.tokenizer, PROMPTS[:6], 4)
    assert rollouts.completion_ids.shape[:2] == (6, 4) and rollouts.sampling_logp.shape == rollouts.completion_ids.shape
    rows = rollouts.completion_ids.view(24, -1)
    prompt_ids = rollouts.prompt_ids.repeat_interleave(4, 0)
    prompt_mask = rollouts.prompt_mask.repeat_interleave(4, 0)
    mask = rollouts.completion_mask.view(24, -1)
    with torch.no_grad():
        policy = token_logprobs(tiny.model, torch.cat([prompt_ids, rows], 1), torch.cat([prompt_mask, mask], 1),
                                rows.shape[1])
    engine_logp = rollouts.sampling_logp.view(24, -1)
    gap = ((policy - engine_logp).abs() * mask).sum() / mask.sum()
    assert gap < 1e-4
    assert (engine_logp * (1 - mask)).abs().sum() == 0  # nothing after the end of a completion


def reseed(seed):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def test_seeded_calls_repeat_and_building_an_engine_leaves_the_random_streams_alone(tiny):
    reseed(7)
    python_and_numpy = (random.random(), np.random.rand())
    first = make_engine()
    reseed(7)
    a = first(tiny.model, tiny.tokenizer, PROMPTS[:4], 8)  # builds the engine: vLLM seeds every generator
    assert (random.random(), np.random.rand()) == python_and_numpy
    reseed(7)
    b = first(tiny.model, tiny.tokenizer, PROMPTS[:4], 8)  # built already
    first.close()
    second = make_engine()
    reseed(7)
    c = second(tiny.model, tiny.tokenizer, PROMPTS[:4], 8)  # a fresh engine, the same seed
    second.close()
    assert completions(a) == completions(b) == completions(c)
    assert len({tuple(ids) for ids in completions(a)}) > 4  # sampled, not all alike


def test_float32_and_bfloat16_engines_start_and_sample(tiny):
    engine = make_engine(compute_dtype="bfloat16")
    torch.manual_seed(0)
    rollouts = engine(tiny.model, tiny.tokenizer, PROMPTS[:4], 4)
    engine.close()
    assert rollouts.completion_mask.sum() > 0 and torch.isfinite(rollouts.sampling_logp).all()


def test_closing_releases_the_engine_and_a_later_call_builds_it_again(tiny):
    engine = make_engine()
    first = completions(engine.generate(tiny.model, tiny.tokenizer, PROMPTS[:3], 1, Sampling(max_completion_length=8,
                                                                                             temperature=0)))
    engine.close()
    assert engine.llm is None and engine.config_dir is None
    again = completions(engine.generate(tiny.model, tiny.tokenizer, PROMPTS[:3], 1, Sampling(max_completion_length=8,
                                                                                             temperature=0)))
    engine.close()
    assert first == again


def test_the_model_is_not_changed_by_generating(engine):
    bundle = load_model("tiny")
    before = copy.deepcopy(bundle.model.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the trainer's bf16 autocast must not reach vLLM
        engine(bundle.model, bundle.tokenizer, PROMPTS[:4], 2)
    assert all(torch.equal(before[k], v) for k, v in bundle.model.state_dict().items())


def test_smollm2_greedy_output_agrees_with_transformers():
    """A pretrained model (SmolLM2-135M-Instruct, from the GGUF file scripts/test_vllm.sh
    installs; ~1 min): chat-templated prompts, completions that end on their own EOS."""
    from podsrl.tasks import prepare_split

    bundle = load_model("smollm2-135m-instruct")
    task = build_arithmetic(level=2, num_train=10, num_test=12, seed=0)
    prompts = list(prepare_split(task.test, bundle.tokenizer, system_prompt="", use_chat_template=True,
                                 max_prompt_tokens=512).prompts)
    engine = make_engine(max_completion_length=24, max_model_length=256)
    try:
        ours = engine.generate(bundle.model, bundle.tokenizer, prompts, 1, Sampling(max_completion_length=24,
                                                                                    temperature=0))
    finally:
        engine.close()
    hf = generate(bundle.model, bundle.tokenizer, prompts, 1, Sampling(max_completion_length=24, temperature=0))
    assert_engine_agrees(bundle, completions(ours), completions(hf), prompts)
    assert bundle.tokenizer.eos_token_id == 2  # <|im_end|>: the converted tokenizer ends turns where the GGUF does
    rows = completions(hf) + completions(ours)
    assert all(row[-1] == 2 or len(row) == 24 for row in rows) and not any(1 in row for row in rows)
    assert sum(row[-1] == 2 for row in rows) >= len(rows) // 2  # most answers end their turn, at <|im_end|>


def partial_engine(**options):
    return make_engine(max_completion_length=8, temperature=0.0, **options)


def test_partial_rollouts_stop_at_the_quota_and_resume_where_they_stopped(tiny):
    """Partial rollouts on vLLM: a call returns exactly its quota of complete groups and aborts
    the rest (vLLM has no request left); the carried cut-off samples resume in the next call
    from their tokens (kept, with their version), and greedy, the groups end as an
    uninterrupted generation does (up to near ties); every token's log-prob is the policy's."""
    engine = partial_engine()
    try:
        prompts = PROMPTS[:6]
        first = engine(tiny.model, tiny.tokenizer, prompts, 3, partial=PartialCall({}, 2, 1))
        assert len(first.complete) == 2 and first.rollouts.completion_ids.shape[:2] == (2, 3)
        assert sorted([*first.complete, *first.carried]) == list(range(6))
        assert not engine.llm.llm_engine.has_unfinished_requests()  # the rest was aborted
        assert any(group.cut_off for group in first.carried.values())
        order = sorted(first.carried)
        kept = {i: first.carried[p] for i, p in enumerate(order)}
        second = engine(tiny.model, tiny.tokenizer, [prompts[p] for p in order], 3,
                        partial=PartialCall(kept, len(order), 2))
        assert len(second.complete) == len(order) and not second.carried
        for row, i in enumerate(second.complete):
            for s, tokens in enumerate(kept[i].completions):  # a carried prefix is kept as it was
                assert second.rollouts.completion_ids[row, s, :len(tokens)].tolist() == tokens
                assert second.rollouts.token_versions[row, s, :len(tokens)].tolist() == [1] * len(tokens)
        firsts = {}  # greedy: a group's n samples are one; its first, per prompt
        for result, prompt_of in ((first, lambda i: i), (second, lambda i: order[i])):
            flat = result.rollouts.completion_id_lists()  # [quota * 3]
            firsts.update((prompt_of(i), flat[3 * row]) for row, i in enumerate(result.complete))
        hf = completions(generate(tiny.model, tiny.tokenizer, prompts, 1, Sampling(max_completion_length=8,
                                                                                   temperature=0)))
        assert_engine_agrees(tiny, [firsts[p] for p in range(6)], hf, prompts)
        for result in (first, second):
            rollouts = result.rollouts
            rows = rollouts.completion_ids.view(-1, rollouts.completion_ids.shape[-1])
            n = rollouts.group_size
            prompt_ids = rollouts.prompt_ids.repeat_interleave(n, 0)
            prompt_mask = rollouts.prompt_mask.repeat_interleave(n, 0)
            mask = rollouts.completion_mask.view(rows.shape[0], -1)
            with torch.no_grad():
                policy = token_logprobs(tiny.model, torch.cat([prompt_ids, rows], 1),
                                        torch.cat([prompt_mask, mask], 1), rows.shape[1])
            gap = ((policy - rollouts.sampling_logp.view(rows.shape[0], -1)).abs() * mask).sum() / mask.sum()
            assert gap < 1e-4  # every token's, the carried ones too (the weights did not move)
        vllm_engine, step = engine.llm.llm_engine, engine.llm.llm_engine.step
        calls = []

        def failing_step():  # a failure in the middle of a call: none of its requests outlives it
            calls.append(1)
            if len(calls) > 2:
                raise RuntimeError("injected")
            return step()

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(vllm_engine, "step", failing_step)
            with pytest.raises(RuntimeError, match="injected"):
                engine(tiny.model, tiny.tokenizer, prompts, 3, partial=PartialCall({}, 6, 3))
        assert not vllm_engine.has_unfinished_requests()
        after = engine.generate(tiny.model, tiny.tokenizer, prompts, 1, Sampling(max_completion_length=8,
                                                                                 temperature=0))
        assert_engine_agrees(tiny, completions(after), hf, prompts)  # the next call is served as before
    finally:
        engine.close()
