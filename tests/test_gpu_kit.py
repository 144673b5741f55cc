"""#51's GPU kit (benchmarks/gpu_kit.py): the GGUF packed in two halves under one call's carry
limit, joined and checked on the device, and the whole command end to end at a tiny size on
this CPU."""

import importlib.util
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_kit", REPO / "benchmarks" / "gpu_kit.py")
gpu_kit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_kit)


@pytest.fixture
def packed(tmp_path):
    """A stand-in GGUF (a length three does not divide) packed with a stand-in wheel."""
    source = tmp_path / "model.gguf"
    source.write_bytes(bytes(range(256)) * 1001 + b"xy")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / gpu_kit.GGUF_WHEEL).write_bytes(b"wheel")
    folders = gpu_kit.pack(tmp_path / "carry", source, wheels)
    return source, folders


def test_pack_stage_join_gives_back_the_file(packed, tmp_path):
    source, folders = packed
    assert [f.name for f in folders] == ["stage1", "stage2", "run"]
    assert sorted(p.name for p in folders[-1].iterdir()) == sorted(["gguf.part3", "gguf.sha256", gpu_kit.GGUF_WHEEL])
    stage = tmp_path / "stage"
    for folder in folders[:-1]:  # one device call each
        gpu_kit.stage(folder, stage)
    joined = gpu_kit.join_gguf(folders[-1], stage)
    assert joined.read_bytes() == source.read_bytes()
    assert joined.parent.name == gpu_kit.GGUF_PACKAGE and (joined.parent / "__init__.py").exists()
    assert gpu_kit.join_gguf(folders[-1], stage) == joined  # joined once: a second call keeps it


def test_join_refuses_pieces_of_two_packs(packed, tmp_path):
    _, folders = packed
    stage = tmp_path / "stage"
    for folder in folders[:-1]:
        gpu_kit.stage(folder, stage)
    (stage / "gguf.part2").write_bytes(b"another pack")
    with pytest.raises(SystemExit, match="are not of one pack"):
        gpu_kit.join_gguf(folders[-1], stage)
    assert not (stage / "site" / gpu_kit.GGUF_PACKAGE / gpu_kit.GGUF_FILE).exists()  # no half-joined file left


def test_join_without_a_staging_call_says_which_to_run(packed, tmp_path):
    _, folders = packed
    stage = tmp_path / "stage"
    gpu_kit.stage(folders[0], stage)  # the second call was skipped
    with pytest.raises(SystemExit, match="benchmarks/gpu_kit.py stage gpu-carry/stage2"):
        gpu_kit.join_gguf(folders[-1], stage)


def test_pack_refuses_a_folder_with_files(packed, tmp_path):
    source, _ = packed
    with pytest.raises(SystemExit, match="is not empty"):
        gpu_kit.pack(tmp_path / "carry", source, None)


def test_run_refuses_an_out_folder_with_earlier_results(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "runs.tar.gz").write_bytes(b"an earlier session's runs")
    with pytest.raises(SystemExit, match="runs.tar.gz exists"):
        gpu_kit.run(out, tmp_path / "work", 1.0, 0, 2.0, True, tmp_path / "carried")
    assert (out / "runs.tar.gz").read_bytes() == b"an earlier session's runs"
    assert not (tmp_path / "work").exists()  # refused before any work
    (out / "runs.tar.gz").unlink()
    (out / "RESULTS.md").symlink_to(tmp_path / "elsewhere.md")  # a dangling link: a copy would write through it
    with pytest.raises(SystemExit, match="RESULTS.md exists"):
        gpu_kit.run(out, tmp_path / "work", 1.0, 0, 2.0, True, tmp_path / "carried")
    assert not (tmp_path / "elsewhere.md").exists()


@pytest.mark.slow
def test_the_kit_runs_end_to_end_at_a_tiny_size(tmp_path):
    # the device command with the built-in tiny model: rounds of the three-arm comparison, one
    # seed each, while the last round's time fits; OUT gets few files (a device call returns at
    # most 8), the run files in one archive that later sessions add to
    out, work = tmp_path / "out", tmp_path / "work"
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_kit.py"), "run", str(out), "--tiny",
                             "--work", str(work), "--minutes", "0.7", "--budget_seconds", "2", "--first_seed", "5"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((out / "gpu-kit.json").read_text())
    assert record["seeds"] >= 1 and record["first_seed"] == 5
    assert sorted(p.name for p in out.iterdir()) == ["accuracy.png", "compare.json", "compare.md", "gpu-kit.json",
                                                      "runs.tar.gz"]
    with tarfile.open(out / "runs.tar.gz") as archive:
        names = set(archive.getnames())
        config = json.load(archive.extractfile("pods-n16-m4-max_variance/seed5/config.json"))
    for arm in ("grpo-m4", "grpo-ga-n16", "pods-n16-m4-max_variance"):
        for k in range(record["seeds"]):
            assert {f"{arm}/seed{5 + k}/{name}" for name in gpu_kit.RUN_FILES} <= names
    assert not any("checkpoints" in name or name.endswith(".safetensors") for name in names)
    assert config["generation_static_cache"] is True and config["generation_dtype"] == "float32"
    rows = json.loads((out / "compare.json").read_text())["rows"]
    assert {r["arm"] for r in rows} == {"grpo 4/4", "grpo-ga 16", "pods 16->4 max_variance"}
    assert f"--first_seed {5 + record['seeds']}" in result.stdout


def test_stage_refuses_a_folder_without_pieces(tmp_path):
    with pytest.raises(SystemExit, match="holds no gguf.part"):
        gpu_kit.stage(tmp_path / "no" / "such" / "dir", tmp_path / "stage")
    assert not (tmp_path / "stage").exists()


def test_run_without_a_gpu_or_the_carried_folder_is_refused_before_any_work(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no GPU here"):
        gpu_kit.run(tmp_path / "out", tmp_path / "work", 1.0, 0, 2.0, False, tmp_path / "carried")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit, match="gguf.sha256 is missing"):
        gpu_kit.run(tmp_path / "out", tmp_path / "work", 1.0, 0, 2.0, False, tmp_path / "carried")
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_the_chain_regime_compares_tiny_chain_and_needs_nothing_carried(tmp_path, monkeypatch):
    # #58's regime on a GPU: the built-in tiny-chain model's config, no GGUF piece to check
    command = gpu_kit.compare_command(tmp_path, gpu_kit.CHAIN_SETTINGS, 3, 2, 60.0, "chain")
    assert command[command.index("--config") + 1].endswith("configs/tiny-chain.yaml")
    assert command[command.index("--seed") + 1] == "3" and command[command.index("--eval_steps") + 1] == "5"
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    called = []
    monkeypatch.setattr(gpu_kit, "chain_engine_steps", lambda out, env: called.append(out))
    monkeypatch.setattr(gpu_kit, "run_rounds", lambda *args: 0)  # no GPU here: the rounds are not run
    assert gpu_kit.run(tmp_path / "out", tmp_path / "work", 1.0, 0, 60.0, False, tmp_path / "absent",
                       "chain") == 1  # no seed finished: a failure, not a success
    assert called == [tmp_path / "out"]
    assert json.loads((tmp_path / "out" / "gpu-kit.json").read_text())["regime"] == "chain"


def test_the_partial_regime_runs_the_partial_rollouts_benchmark_and_brings_its_block_back(tmp_path, monkeypatch):
    # #60 on a GPU: PODS without and with partial rollouts, seeded from --first_seed, recorded as
    # its own block; the runs sit one folder deeper (podsrl/runs/ARM/seedN) and still come back
    command = gpu_kit.compare_command(tmp_path, gpu_kit.CHAIN_SETTINGS, 3, 2, 60.0, "partial")
    assert command[1].endswith("benchmarks/partial_rollouts.py")
    assert command[command.index("--config") + 1].endswith("configs/tiny-chain-early-stop.yaml")
    assert {"seed=3", "eval_steps=5"} <= {command[i + 1] for i, item in enumerate(command) if item == "--set"}
    assert command[command.index("--seeds") + 1] == "2" and command[command.index("--budget_minutes") + 1] == "1"
    assert command[command.index("--record") + 1] == "gpu-partial-rollouts"
    with pytest.raises(SystemExit, match="--regime partial is for a GPU"):
        gpu_kit.run(tmp_path / "out", tmp_path / "work", 1.0, 0, 60.0, True, tmp_path / "absent", "partial")
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_kit, "REPO", tmp_path)  # a device's tree, where the rounds recorded their block
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "RESULTS.md").write_text("the device's RESULTS.md\n")

    def one_round(work, *args):  # no GPU here: a finished run's files stand for a round
        run_dir = work / "podsrl" / "runs" / "pods-n16-m4-max_variance-partial-2" / "seed0"
        run_dir.mkdir(parents=True)
        for name in gpu_kit.RUN_FILES:
            (run_dir / name).write_text("{}")
        return 1

    monkeypatch.setattr(gpu_kit, "run_rounds", one_round)
    assert gpu_kit.run(tmp_path / "out", tmp_path / "work", 1.0, 0, 60.0, False, tmp_path / "absent",
                       "partial") == 0
    assert (tmp_path / "out" / "RESULTS.md").read_text() == "the device's RESULTS.md\n"
    with tarfile.open(tmp_path / "out" / "runs.tar.gz") as archive:
        assert "runs/pods-n16-m4-max_variance-partial-2/seed0/metrics.jsonl" in archive.getnames()


def test_decode_refuses_earlier_results_and_a_machine_without_a_gpu(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "RESULTS.md").write_text("an earlier session's block")
    with pytest.raises(SystemExit, match="RESULTS.md exists"):
        gpu_kit.decode(out, tmp_path / "carried")
    assert (out / "RESULTS.md").read_text() == "an earlier session's block"
    fresh = tmp_path / "fresh"
    with pytest.raises(SystemExit, match="no GPU here"):
        gpu_kit.decode(fresh, tmp_path / "carried")
    assert not fresh.exists()  # refused before any work
