"""scripts/trl_suite.py (TRL's own GRPO tests against PODSTrainer) and its offline stand-ins.

TRL's test file is not in its sdist and is not copied here; with a local copy of TRL's
repository in $PODSRL_TRL_REPO the last test runs a part of it in all three modes."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from podsrl.build.chat_standins import QWEN_SPECIAL_IDS, QWEN_WORD_IDS, build_standins, qwen_id_tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import trl_suite  # noqa: E402  (a script, imported for its functions)


def test_the_stand_in_tokenizer_round_trips_any_text_and_speaks_qwens_ids():
    tokenizer = qwen_id_tokenizer()
    rng = random.Random(0)
    alphabet = "abcXYZ 019\n\t{}\":,<>|_!?éü中😀"
    for _ in range(200):  # any text, byte by byte, comes back
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    for char in map(chr, range(ord("!"), ord("~") + 1)):  # GPT-2's byte table, which Qwen's first ids follow
        assert tokenizer.encode(char, add_special_tokens=False) == [ord(char) - ord("!")]
    assert tokenizer.encode(" \n", add_special_tokens=False) == [220, 198]
    for token_id, word in {**QWEN_WORD_IDS, **QWEN_SPECIAL_IDS}.items():
        assert tokenizer.decode([token_id]) == word
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                             add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")


def test_the_stand_ins_load_by_their_hub_names_offline(tmp_path, monkeypatch):
    monkeypatch.setattr("podsrl.build.chat_standins.CAUSAL_LMS", {"tiny-Qwen3ForCausalLM": ("Qwen3", {})})
    monkeypatch.setattr("podsrl.build.chat_standins.SEQUENCE_CLASSIFIERS",
                        {"tiny-Qwen2ForSequenceClassification-2.5": "Qwen2"})
    written = build_standins(tmp_path)
    assert written == ["trl-internal-testing/tiny-Qwen3ForCausalLM",
                       "trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5", "trl-internal-testing/zen"]
    monkeypatch.chdir(tmp_path)  # transformers and datasets read an existing org/name folder
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained("trl-internal-testing/tiny-Qwen3ForCausalLM")
    assert model.config.vocab_size == len(AutoTokenizer.from_pretrained("trl-internal-testing/tiny-Qwen3ForCausalLM"))
    scorer = AutoModelForSequenceClassification.from_pretrained(
        "trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5")
    assert scorer.config.num_labels == 1
    standard = load_dataset("trl-internal-testing/zen", "standard_prompt_only")
    conversational = load_dataset("trl-internal-testing/zen", "conversational_prompt_only", split="test")
    assert (len(standard["train"]), len(standard["test"])) == (17, 3)
    assert conversational[0]["prompt"] == [{"role": "user", "content": standard["test"][0]["prompt"]}]
    assert build_standins(tmp_path) == written  # a second build keeps the folders


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_grpo_trainer.TestGRPOTrainer" name="test_a" time="1"/>
<testcase classname="tests.test_grpo_trainer.TestGRPOTrainer" name="test_b" time="1">
  <failure message="AssertionError: loss is nan&#10;second line">trace</failure></testcase>
<testcase classname="tests.test_grpo_trainer.TestGRPOTrainer" name="test_c[x]" time="0">
  <skipped message="test requires vllm"/></testcase>
<testcase classname="tests.test_grpo_trainer.TestGRPOTrainerVLM" name="test_d" time="1">
  <error message="collection error"/></testcase>
</testsuite></testsuites>"""


def test_the_report_reads_junit_and_counts_what_pods_loses(tmp_path):
    report = tmp_path / "run.xml"
    report.write_text(JUNIT)
    outcomes = trl_suite.parse_junit(report)
    assert outcomes == {"TestGRPOTrainer::test_a": ("passed", ""),
                        "TestGRPOTrainer::test_b": ("failed", "AssertionError: loss is nan"),
                        "TestGRPOTrainer::test_c[x]": ("skipped", "test requires vllm"),
                        "TestGRPOTrainerVLM::test_d": ("error", "collection error")}
    worse = {**outcomes, "TestGRPOTrainer::test_a": ("failed", "boom")}
    lines, regressions = trl_suite.summary({"grpo": outcomes, "pods_m_eq_n": worse, "pods_m_lt_n": outcomes})
    assert regressions == 1  # only m = n counts: with m < n a difference may be by design
    assert "pods_m_eq_n: passes 0 of the 1 tests GRPOTrainer passes" in lines
    assert "  TestGRPOTrainer::test_a: failed: boom" in lines
    assert "pods_m_lt_n: passes 1 of the 1 tests GRPOTrainer passes" in lines
    table = trl_suite.table({"grpo": outcomes, "pods_m_eq_n": worse}, {"TestGRPOTrainer::test_a": "8->2"})
    assert "| TestGRPOTrainer::test_a | passed | failed | 8->2 |" in table


def test_the_fewer_kept_config_picks_the_smallest_m_the_arithmetic_accepts(tmp_path, monkeypatch):
    namespace = {}
    monkeypatch.setenv("PODSRL_TRL_SUITE_MODE", "pods_m_lt_n")
    monkeypatch.setenv("PODSRL_TRL_SUITE_LOG", str(tmp_path / "kept.jsonl"))
    exec(compile(trl_suite.PLUGIN, "plugin", "exec"), namespace)
    config = namespace["FewerKeptConfig"]
    common = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    assert config(**common, num_generations=8, per_device_train_batch_size=8).num_kept == 2
    # 6 rows, n = 3, 3 micro-batches: 2 groups x m must split in 3, so m = 3 (no m < n fits)
    assert config(**common, num_generations=3, per_device_train_batch_size=2, gradient_accumulation_steps=3,
                  steps_per_generation=3).num_kept == 3
    assert config(**common, num_generations=2, per_device_train_batch_size=2).num_kept == 2  # n = 2: m = n
    assert len((tmp_path / "kept.jsonl").read_text().splitlines()) == 3


@pytest.mark.skipif(not os.environ.get("PODSRL_TRL_REPO"),
                    reason="no local copy of TRL's repository: set PODSRL_TRL_REPO to run TRL's own GRPO tests "
                           "(scripts/trl_suite.py; TRL's tests are not in its sdist and are not copied here)")
def test_trls_own_tool_and_environment_tests_pass_against_pods_trainer(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "trl_suite.py"), os.environ["PODSRL_TRL_REPO"],
                           "--work", str(tmp_path), "-k", "tools or environment or test_train_dataset_format"],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "pods_m_eq_n: passes" in done.stdout and "pods_m_lt_n: passes" in done.stdout


def test_a_folder_the_script_did_not_make_is_never_written_into(tmp_path):
    mine = tmp_path / "results"
    mine.mkdir()
    (mine / "finished.txt").write_text("a week of work")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "trl_suite.py"), str(tmp_path / "trl"),
                           "--work", str(mine)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"--work: {mine} is not empty and is not a folder this script made" in done.stderr
    assert [p.name for p in mine.iterdir()] == ["finished.txt"]
    assert (mine / "finished.txt").read_text() == "a week of work"
