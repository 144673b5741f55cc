"""LoRA into the vllm engine, two ways, per training step: the policy's LoRA merged into the
pushed weights (what the engine does) against vLLM's own LoRA adapters (the adapter saved
and given to vLLM as a new LoRARequest every step).

    python benchmarks/vllm_lora.py [--model smollm2] [--rank 16] [--dtype float32] [--steps 3]
        [--prompts 8] [--n 16] [--tokens 12] [--record NAME]

Each way runs in its own process on the same prompts (arithmetic level 2 in the chat
template; the headroom regime's step shape by default): the engine is built and warmed up,
then every step moves the adapter's B matrices a little (as an optimizer step would) and
generates P x n rows of T forced tokens. Reported per step: the time to get the new weights
into vLLM (push, or save the adapter) and the generation time (for adapters, vLLM loads the
new adapter inside it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engines import MODELS, prompts  # noqa: E402 (benchmarks/ is not a package)
from results_md import record  # noqa: E402


def worker(way: str, args) -> dict:
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    from podsrl.models import load_model
    from podsrl.rollout import VLLMEngine, VLLMOptions
    from podsrl.rollout.vllm import CPU_BLOCK_SIZE, load_weights_into

    bundle = load_model(MODELS[args.model], lora_rank=args.rank, lora_alpha=2 * args.rank)
    model, tokenizer = bundle.model, bundle.tokenizer
    batch = prompts(tokenizer, args.model, args.prompts)
    requests = [TokensPrompt(prompt_token_ids=ids) for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]]
    sampling = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.tokens, min_tokens=args.tokens,
                              logprobs=0, flat_logprobs=True, detokenize=False)

    def nudge():  # what an optimizer step does to the adapter
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.add_(torch.randn_like(p) * 1e-3)

    max_model_len = min(512, model.get_base_model().config.max_position_embeddings)  # the tiny model has 128
    scratch = tempfile.TemporaryDirectory()  # the adapters' config and each step's adapter
    adapters = Path(scratch.name)
    engine = None
    if way == "merged":
        engine = VLLMEngine(VLLMOptions(max_completion_length=args.tokens, compute_dtype=args.dtype,
                                        max_model_length=max_model_len, enforce_eager=True))
        engine(model, tokenizer, batch[:1], 1)  # builds the engine and pushes the weights
        llm = engine.llm
    else:  # in process, as the engine runs (weights passed by reference)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        config_dir = adapters / "config"
        model.get_base_model().config.save_pretrained(config_dir)
        llm = LLM(model=str(config_dir), skip_tokenizer_init=True, load_format="dummy", dtype=args.dtype,
                  enforce_eager=True, max_model_len=max_model_len, kv_cache_memory_bytes=1024 * 2**20, enable_lora=True,
                  block_size=CPU_BLOCK_SIZE,
                  max_lora_rank=args.rank, max_loras=1, generation_config="vllm")
        base = [(name.removeprefix("base_model.model.").replace(".base_layer", ""), p)
                for name, p in model.named_parameters() if ".lora_" not in name]
        load_weights_into(llm, base)
    llm.generate(requests, sampling, use_tqdm=False)  # warm-up
    steps = []
    for step in range(args.steps):
        nudge()
        start = time.perf_counter()
        if way == "merged":
            engine.push_weights(model)
            lora = None
        else:
            path = adapters / f"step{step}"
            model.save_pretrained(path, save_embedding_layers=False)
            lora = LoRARequest(f"step{step}", step + 1, str(path))
        update = time.perf_counter() - start
        start = time.perf_counter()
        llm.generate(requests, sampling, use_tqdm=False, lora_request=lora)
        steps.append({"update": update, "generate": time.perf_counter() - start})
    if engine is not None:
        engine.close()
    scratch.cleanup()
    return {"way": way, "steps": steps}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--record", default="")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return 0
    rows = []
    for way in ("merged", "adapters"):
        command = [sys.executable, __file__, "--worker", way, *sys.argv[1:]]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{way}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    lines = [f"{args.model} + LoRA r{args.rank}, {args.dtype}, {args.prompts} prompts x {args.n} samples x "
             f"{args.tokens} tokens per step, {args.steps} steps each:", "",
             "| way | weights into vLLM, s per step | generation, s per step | total, s per step |",
             "| --- | --- | --- | --- |"]
    totals = {}
    for row in rows:
        update = sum(s["update"] for s in row["steps"]) / len(row["steps"])
        generate = sum(s["generate"] for s in row["steps"]) / len(row["steps"])
        totals[row["way"]] = update + generate
        label = {"merged": "LoRA merged into pushed weights (the engine)",
                 "adapters": "vLLM's LoRA adapters (save + LoRARequest)"}[row["way"]]
        lines.append(f"| {label} | {update:.2f} | {generate:.2f} | {update + generate:.2f} |")
    lines += ["", f"Adapters take {totals['adapters'] / totals['merged']:.1f}x the merged way's time per step."]
    body = "\n".join(lines)
    print(body)
    if args.record:
        record(args.record, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
