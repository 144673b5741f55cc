"""vLLM alone, with nothing of podsrl: tokens/s of SmolLM2-135M-Instruct in one dtype, to tell
the CPU's own speed per dtype from the vllm engine's (benchmarks/RESULTS.md, #37).

    python benchmarks/vllm_plain.py DTYPE IN_PROCESS [eager]
    e.g. python benchmarks/vllm_plain.py bfloat16 1 eager

16 short prompts x 16 samples x 64 forced tokens (the shape #37 was filed with), vLLM's
defaults otherwise (block size, compilation unless ``eager``); IN_PROCESS 1 runs the engine in
this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, as the vllm engine does). A warm-up call,
then two timed calls, each printed.
"""

import os
import sys
import time

os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


def main() -> None:
    from vllm import LLM, SamplingParams

    from podsrl.models.loading import resolve_model_path

    dtype, in_process, eager = sys.argv[1], sys.argv[2] == "1", len(sys.argv) > 3
    if in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    llm = LLM(model=resolve_model_path("smollm2-135m-instruct"), dtype=dtype, seed=0,
              kv_cache_memory_bytes=2 << 30, max_model_len=512, enforce_eager=eager)
    prompts = [f"What is {i} + {2 * i + 3}? Think step by step." for i in range(16)]
    sampling = SamplingParams(n=16, temperature=1.0, max_tokens=64, min_tokens=64)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm-up
    for _ in range(2):
        start = time.perf_counter()
        out = llm.generate(prompts, sampling, use_tqdm=False)
        seconds = time.perf_counter() - start
        tokens = sum(len(c.token_ids) for o in out for c in o.outputs)
        print(f"dtype={dtype} in_process={in_process} eager={eager}: {tokens} tokens in {seconds:.1f} s = "
              f"{tokens / seconds:.0f} tokens/s", flush=True)


if __name__ == "__main__":  # vLLM may spawn its engine process: the entry needs a main guard
    main()
