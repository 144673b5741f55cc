"""TRL's GRPOTrainer and podsrl's PODSTrainer with ``use_vllm=True, vllm_mode="colocate"`` on
vLLM's CPU backend: a few training steps each, and after a weight change the engine's greedy
output equals transformers' on the updated weights (the weight sync reached vLLM)."""

import os

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here: scripts/test_vllm.sh runs these in .venv-vllm")
pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from podsrl.integrations.trl import CPUWeightSync  # noqa: E402
from podsrl.models import load_model  # noqa: E402
from podsrl.rewards import arithmetic_correct, arithmetic_format  # noqa: E402
from podsrl.rollout import generate  # noqa: E402
from podsrl.tasks.arithmetic import build_arithmetic  # noqa: E402
from podsrl.trl import PODSConfig, PODSTrainer  # noqa: E402

TASK = build_arithmetic(level=3, num_train=400, num_test=16, seed=0)

# TRL's own engine runs in bfloat16 (vLLM's dtype "auto"). Where the CPU computes bfloat16 natively
# (AMX or AVX-512 BF16), vLLM's CPU backend repacks those layers too and TRL's own sync cannot
# load into them (docs/trl.md). Decided before any engine is built: a sync failing inside
# train() leaves vLLM's process-wide state broken for the next test's engine.
REPACKS_BFLOAT16 = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()


@pytest.fixture(autouse=True)
def _cpu_kv_cache(monkeypatch):
    # TRL sizes vLLM's KV cache from vllm_gpu_memory_utilization, which the CPU backend does not
    # use; its own default (a share of the machine's memory) is slow to allocate on a test machine
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))


def make_trainer(trainer_class, output_dir, num_kept, steps_per_generation):
    bundle = load_model("tiny")
    dataset = Dataset.from_list([{"prompt": ex.prompt, "answer": ex.answer} for ex in TASK.train])
    config = PODSConfig(output_dir=str(output_dir), max_steps=3, logging_steps=1, save_strategy="no",
                        per_device_train_batch_size=16, num_generations=8, num_kept=num_kept,
                        steps_per_generation=steps_per_generation, learning_rate=2e-4, max_completion_length=8,
                        use_cpu=True, reward_weights=[0.8, 0.2], report_to="none", use_vllm=True,
                        vllm_mode="colocate", disable_tqdm=True, seed=0)
    trainer = trainer_class(model=bundle.model, processing_class=bundle.tokenizer,
                            reward_funcs=[arithmetic_correct, arithmetic_format], args=config, train_dataset=dataset)
    return trainer, bundle.tokenizer


def engine_greedy_equals_transformers(trainer, tokenizer) -> list[bool]:
    from vllm import SamplingParams

    prompts = [ex.prompt for ex in TASK.test]
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    outputs = trainer.vllm_generation.llm.generate(
        [{"prompt_token_ids": row} for row in ids],
        SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[tokenizer.eos_token_id], detokenize=False),
        use_tqdm=False)
    hf = generate(trainer.model, tokenizer, prompts, 1, max_new_tokens=8, temperature=0).completion_id_lists()
    return [list(out.outputs[0].token_ids) == row for out, row in zip(outputs, hf)]


@pytest.mark.parametrize("trainer_class, num_kept, steps_per_generation",
                         [pytest.param(GRPOTrainer, 8, 1, marks=pytest.mark.skipif(
                             REPACKS_BFLOAT16, reason="vLLM's CPU backend repacks bfloat16 layers on this CPU "
                             "(AMX / AVX-512 BF16), where TRL's own weight sync fails (docs/trl.md)")),
                          (PODSTrainer, 8, 1), (PODSTrainer, 4, 2)],
                         ids=["GRPOTrainer", "PODSTrainer m=n", "PODSTrainer m<n"])
def test_trainers_train_with_vllm_colocate_and_sync_their_weights(trainer_class, num_kept, steps_per_generation,
                                                                  tmp_path):
    trainer, tokenizer = make_trainer(trainer_class, tmp_path, num_kept, steps_per_generation)
    if trainer_class is PODSTrainer:  # on vLLM's CPU backend PODSTrainer pushes weights through reload_weights
        assert isinstance(trainer.vllm_generation, CPUWeightSync)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) >= 2 and all(0 <= h["sampling/sampling_logp_difference/mean"] < 0.05 for h in logged)
    if trainer_class is PODSTrainer and num_kept < 8:
        assert all(h["pods/kept_reward_std"] >= h["pods/generated_reward_std"] - 1e-6 for h in logged)
    with torch.no_grad():  # a change no optimizer step at this rate would make: the greedy output moves
        for p in trainer.model.parameters():
            p.add_(torch.randn_like(p) * 0.03)
    before = engine_greedy_equals_transformers(trainer, tokenizer)
    trainer.vllm_generation.sync_weights()
    after = engine_greedy_equals_transformers(trainer, tokenizer)
    assert not all(before), "the change must alter transformers' greedy output, or this test shows nothing"
    assert all(after)


def test_trls_direct_load_fails_where_vllms_cpu_backend_repacked_the_layers():
    """Why PODSTrainer carries its own sync on the CPU: TRL's colocate sync calls the engine
    model's load_weights, which cannot load into a layer vLLM's CPU backend has repacked for
    oneDNN (float32 here). If this starts passing, vLLM fixed it and CPUWeightSync can go."""
    from podsrl.rollout import GenerationOptions, VLLMEngine, VLLMOptions

    bundle = load_model("tiny")
    engine = VLLMEngine(GenerationOptions(max_new_tokens=4, vllm=VLLMOptions(dtype="float32", enforce_eager=True)))
    try:
        engine(bundle.model, bundle.tokenizer, [TASK.test[0].prompt], 1)  # builds it
        model = engine.llm.llm_engine.model_executor.driver_worker.model_runner.model
        with pytest.raises(AttributeError, match="weight_loader"):
            for name, param in bundle.model.named_parameters():  # what TRL's VLLMGeneration.sync_weights does
                model.load_weights([(name, param.data)])
    finally:
        engine.close()
