"""The vllm engine's checks that need no vLLM (the main suite): a sequence length that would cut
completions short is refused in one line, and the config folders of killed runs are removed
only when podsrl can prove they are its own and their process is gone."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from transformers import LlamaConfig

from podsrl.rollout.vllm import VLLMOptions, check_fits, kv_cache_advice
from podsrl.rollout.vllm_folders import CONFIG_FOLDER_PREFIX, OWNER_FILE, _process_start, remove_stale_config_folders

CONFIG = LlamaConfig(max_position_embeddings=2048)


def test_a_prompt_and_completion_that_do_not_fit_are_refused_naming_the_field_and_the_length_needed():
    check_fits(VLLMOptions(max_model_length=30), CONFIG, 20, 10)  # exactly fits
    with pytest.raises(ValueError, match=r"^vllm_max_model_length: the longest prompt \(20 tokens\) plus "
                                         r"max_completion_length \(11\) needs 31 tokens, but vllm_max_model_length "
                                         r"is 30; .* at least 31"):
        check_fits(VLLMOptions(max_model_length=30), CONFIG, 20, 11)
    with pytest.raises(ValueError, match=r"needs 2100 tokens, but the model's maximum \(max_position_embeddings\) "
                                         r"is 2048"):
        check_fits(VLLMOptions(max_model_length=4096), CONFIG, 100, 2000)
    check_fits(VLLMOptions(max_model_length=0), CONFIG, 1000, 1048)  # 0: the model's maximum


def _config_folder(owner: dict | None, extra: str = "") -> Path:
    folder = Path(tempfile.mkdtemp(prefix=CONFIG_FOLDER_PREFIX))
    CONFIG.save_pretrained(folder)
    if owner is not None:
        (folder / OWNER_FILE).write_text(json.dumps(owner))
    if extra:
        (folder / extra).write_text("a user's file")
    return folder


def _dead_process() -> dict:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = _process_start(child.pid)
    child.wait()
    return {"made_by": "podsrl vllm engine", "pid": child.pid, "process_start": start or "1"}


def test_a_killed_runs_config_folder_is_removed_and_nothing_podsrl_cannot_prove_is_its_own():
    stale = _config_folder(_dead_process())
    live = _config_folder({"made_by": "podsrl vllm engine", "pid": os.getpid(),
                           "process_start": _process_start(os.getpid())})
    unknown_start = _config_folder({"made_by": "podsrl vllm engine", "pid": 1, "process_start": ""})
    no_owner = _config_folder(None)
    with_user_file = _config_folder(_dead_process(), extra="notes.txt")
    try:
        removed = remove_stale_config_folders()
        assert stale in removed and not stale.exists()
        for kept in (live, unknown_start, no_owner, with_user_file):
            assert kept.is_dir() and kept not in removed
        assert (with_user_file / "notes.txt").read_text() == "a user's file"
    finally:
        for folder in (live, unknown_start, no_owner, with_user_file):
            for path in folder.iterdir():
                path.unlink()
            folder.rmdir()


def test_vllms_kv_cache_refusal_names_podsrls_settings():
    """vLLM says 'Try increasing `gpu_memory_utilization` or decreasing `max_model_len`', its own
    arguments: the one line names the config fields that set them; other errors pass unchanged."""
    vllm_says = ValueError("To serve at least one request with the models's max seq len (40960), (5.62 GiB KV cache "
                           "is needed, which is larger than the available KV cache memory (4.50 GiB). Try increasing "
                           "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
    assert kv_cache_advice(vllm_says, VLLMOptions(gpu_memory_utilization=0.3), 40960) == (
        f"vllm_kv_cache_memory_mb: vLLM's KV cache does not fit ({str(vllm_says)[:200]}); raise "
        f"vllm_gpu_memory_utilization (now 0.3) or vllm_kv_cache_memory_mb, or lower vllm_max_model_length (now "
        f"40960: prompt plus max_completion_length)")
    blocks = RuntimeError("No available memory for the cache blocks. Try increasing `gpu_memory_utilization`")
    assert "raise vllm_kv_cache_memory_mb (now 64)" in kv_cache_advice(blocks, VLLMOptions(kv_cache_memory_mb=64), 99)
    assert kv_cache_advice(ValueError("unknown architecture"), VLLMOptions(), 99) is None
