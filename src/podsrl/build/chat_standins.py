"""Offline stand-ins for the tiny hub models and datasets TRL's GRPO tests load, and the
chat tokenizer that tool-using training needs.

There is no model hub here, and TRL's tests name ``trl-internal-testing/...`` repositories.
``transformers`` and ``datasets`` read an ``org/name`` that exists as a local folder from
that folder, so :func:`build_standins` writes folders under those names: tiny causal
language models and sequence classifiers of the architectures the tests name (random
weights, as TRL's own tiny models have), sharing :func:`chat_tokenizer`, and the ``zen``
prompt datasets in their two configurations, all with :func:`chat_tokenizer`. TRL's tool and
environment tests write Qwen token ids by hand (151,657 for ``<tool_call>``); on request the
two policies they use get :func:`qwen_id_tokenizer`, whose ids match, at the price of a
151,669-row vocabulary. Not built: vision-language models (the
Qwen-VL and Gemma processors need torchvision, which has no wheel for this torch here),
NemotronH, remote code; tests that need them fail for GRPOTrainer too, and the table says so.

:func:`chat_tokenizer` is the built-in tiny model's byte-level tokenizer with the ChatML and
tool-call special tokens and TRL's Qwen3 chat template, which TRL recognises for tool-call
parsing (``trl.chat_template_utils.add_response_schema``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from podsrl.models.loading import TINY_DIR

CHAT_TOKENS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
               "</tool_response>", "<think>", "</think>"]

# Qwen2.5 / Qwen3 token ids that TRL's tests write out by hand (scripted tool calls): the
# chat and tool special tokens, and the multi-byte words of those scripts
QWEN_SPECIAL_IDS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>",
                    151657: "<tool_call>", 151658: "</tool_call>", 151665: "<tool_response>",
                    151666: "</tool_response>", 151667: "<think>", 151668: "</think>"}
QWEN_WORD_IDS = {4913: '{"', 606: "name", 788: '":', 330: ' "', 64648: "multiply", 22785: "_tool", 497: '",',
                 16370: "arguments", 5212: ' {"', 11248: "}}\n", 7692: "async", 93054: "_multiply",
                 35744: "increment", 9520: "step", 927: "sh", 411: "out", 1318: "text", 6023: "hi",
                 95642: '"}}\n', 450: "dec", 13477: "rement", 14172: "tool", 6659: "call", 397: ">\n",
                 522: "</", 314: " {", 293: " b", 2765: " won", 944: "'t", 1513: " don", 1414: " know",
                 894: " any", 5392: " tool", 17453: "Done"}

# hub id -> (transformers class, extra config fields); sizes are shared (see tiny_config)
CAUSAL_LMS = {
    "tiny-Qwen2ForCausalLM-2.5": ("Qwen2", {}),
    "tiny-Qwen3ForCausalLM": ("Qwen3", {}),
    "tiny-Qwen3MoeForCausalLM": ("Qwen3Moe",
                                 {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
    "tiny-LlamaForCausalLM-3.2": ("Llama", {}),
    "tiny-MistralForCausalLM-0.2": ("Mistral", {}),
    "tiny-Gemma2ForCausalLM": ("Gemma2", {"head_dim": 8}),
    "tiny-Cohere2ForCausalLM": ("Cohere2", {}),
    "tiny-Glm4MoeForCausalLM": ("Glm4Moe",
                                {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
                                 "moe_intermediate_size": 32, "first_k_dense_replace": 1}),
    "tiny-GptOssForCausalLM": ("GptOss", {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 8}),
}
# the policies TRL's tool and environment tests script by Qwen token id; with
# build_standins(scripted_ids=True) they get qwen_id_tokenizer (151,669 ids: on 2 CPU cores
# one of those tests then takes up to 13 minutes), else chat_tokenizer like the rest
SCRIPTED_BY_ID = {"tiny-Qwen3ForCausalLM", "tiny-Qwen3MoeForCausalLM"}
SEQUENCE_CLASSIFIERS = {
    "tiny-Qwen2ForSequenceClassification-2.5": "Qwen2",
    "tiny-Qwen3ForSequenceClassification": "Qwen3",
    "tiny-LlamaForSequenceClassification-3.2": "Llama",
}
ORG = "trl-internal-testing"

# the prompts of the zen datasets: short sentence openings, as TRL's are
ZEN_PROMPTS = ["Beautiful is better than", "Explicit is", "Simple is better", "Complex",
               "Flat is better than", "Sparse is better", "Readability", "Special cases aren't special",
               "Although practicality beats", "Errors should never", "Unless explicitly",
               "In the face of ambiguity, refuse", "There should be one--", "Although that way may not be",
               "Now is better than", "Although never is", "If the implementation is",
               "If the implementation is easy", "Namespaces are one honking great idea", "The sky is"]


def chat_tokenizer():
    """The built-in tiny model's byte-level tokenizer with ChatML / tool-call special tokens and
    TRL's Qwen3 chat template; ``<|im_end|>`` ends a turn (eos), ``<|endoftext|>`` pads."""
    from trl.chat_template_utils import qwen3_chat_template

    tokenizer = AutoTokenizer.from_pretrained(str(TINY_DIR))
    tokenizer.add_special_tokens({"additional_special_tokens": CHAT_TOKENS})
    tokenizer.chat_template = qwen3_chat_template
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|endoftext|>"
    return tokenizer


# a ChatML template that renders an image part as the processor's <image> placeholder
LLAVA_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{% if message.content is string %}"
    "{{ message.content }}{% else %}{% for part in message.content %}{% if part.type == 'image' %}<image>"
    "{% elif part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_llava(seed: int = 0):
    """A two-layer LLaVA (CLIP vision tower, Qwen2 text model) and its processor: images of
    28 x 28 pixels in 4 patches. The smallest vision-language model that needs no torchvision
    (the Qwen-VL processors do) and no downloaded weights; returns (model, processor)."""
    tokenizer = chat_tokenizer()
    tokenizer.add_tokens(["<image>"], special_tokens=True)
    processor = transformers.LlavaProcessor(
        image_processor=transformers.CLIPImageProcessorPil(size={"shortest_edge": 28},
                                                           crop_size={"height": 28, "width": 28}),
        tokenizer=tokenizer, patch_size=14, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=LLAVA_TEMPLATE)  # 4 patches + CLS, CLS dropped: 4 tokens
    text = tiny_config("Qwen2", tokenizer).to_dict()
    config = transformers.LlavaConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=32,
                           num_hidden_layers=2, num_attention_heads=2, image_size=28, patch_size=14,
                           projection_dim=16),
        text_config=text, image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default", vision_feature_layer=-1)
    torch.manual_seed(seed)
    return transformers.LlavaForConditionalGeneration(config), processor


def byte_symbols() -> dict[int, str]:
    """Byte -> the printable character byte-level BPE writes it as, in GPT-2's order (which
    Qwen's first 256 ids follow): printable bytes keep their character, the others map past 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def qwen_id_tokenizer():
    """A byte-level tokenizer with Qwen2.5's ids for the 256 bytes, the special tokens and the
    words TRL's tests script by id (:data:`QWEN_WORD_IDS`), so their hand-written token ids
    decode to the text their comments give; every other id up to the last special token is a
    filler word ("w<id>"). It encodes text byte by byte (no merges), and carries TRL's Qwen3
    chat template, so TRL parses tool calls from it."""
    from trl.chat_template_utils import qwen3_chat_template

    symbols = byte_symbols()

    def written(text: str) -> str:
        return "".join(symbols[b] for b in text.encode())

    vocab = {symbol: i for i, symbol in enumerate(symbols.values())}  # byte_symbols is in id order
    vocab.update({written(word): i for i, word in QWEN_WORD_IDS.items()})
    vocab.update({token: i for i, token in QWEN_SPECIAL_IDS.items()})
    taken = set(vocab.values())
    vocab.update({written(f" w{i}"): i for i in range(256, max(QWEN_SPECIAL_IDS) + 1) if i not in taken})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                for token in QWEN_SPECIAL_IDS.values()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>")
    tokenizer.chat_template = qwen3_chat_template
    return tokenizer


def tiny_config(architecture: str, tokenizer, **extra):
    """A two-layer config of ``architecture`` (e.g. "Qwen2") over ``tokenizer``'s vocabulary."""
    config_class = getattr(transformers, f"{architecture}Config")
    return config_class(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                        bos_token_id=None, tie_word_embeddings=False, **extra)


def build_standins(root: Path, seed: int = 0, scripted_ids: bool = False) -> list[str]:
    """Write the stand-in models and datasets under ``root/trl-internal-testing``; returns
    the hub ids written. Existing folders are kept (a re-run is cheap). ``scripted_ids``:
    the :data:`SCRIPTED_BY_ID` policies speak Qwen's token ids (slow, see there)."""
    small = chat_tokenizer()
    by_id = qwen_id_tokenizer() if scripted_ids else small
    written = []
    for name, (architecture, extra) in CAUSAL_LMS.items():
        tokenizer = by_id if name in SCRIPTED_BY_ID else small
        written += _save(root / ORG / name, f"{architecture}ForCausalLM",
                         tiny_config(architecture, tokenizer, **extra), tokenizer, seed)
    for name, architecture in SEQUENCE_CLASSIFIERS.items():
        written += _save(root / ORG / name, f"{architecture}ForSequenceClassification",
                         tiny_config(architecture, small, num_labels=1), small, seed)
    written += _zen(root / ORG / "zen")
    return written


def _save(folder: Path, model_class: str, config, tokenizer, seed: int) -> list[str]:
    if (folder / "config.json").exists():
        return [f"{ORG}/{folder.name}"]
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config)
    if getattr(model, "generation_config", None) is not None:  # causal LMs: stop at the end of a turn
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return [f"{ORG}/{folder.name}"]


def _zen(folder: Path) -> list[str]:
    """``zen`` with configurations standard_prompt_only (a string prompt) and
    conversational_prompt_only (one user message), train (17 rows) and test (3 rows)."""
    splits = {"train": ZEN_PROMPTS[:17], "test": ZEN_PROMPTS[17:]}
    rows = {"standard_prompt_only": lambda p: {"prompt": p},
            "conversational_prompt_only": lambda p: {"prompt": [{"role": "user", "content": p}]}}
    card = ["---", "configs:"]
    for config, row in rows.items():
        card += [f"- config_name: {config}", "  data_files:"]
        for split, prompts in splits.items():
            path = folder / config / f"{split}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(row(p)) + "\n" for p in prompts))
            card += [f"  - split: {split}", f"    path: {config}/{split}.jsonl"]
    (folder / "README.md").write_text("\n".join(card + ["---", ""]))
    return [f"{ORG}/zen"]
