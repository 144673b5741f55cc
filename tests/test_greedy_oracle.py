"""The greedy oracle of tests/greedy_oracle.py (the engines' tests use it): it passes
implementations that part only at near ties, and fails a broken one."""

import copy

import pytest
import torch
from greedy_oracle import assert_greedy_agrees, divergences

from podsrl.rollout import Sampling, generate
from podsrl.tasks.arithmetic import build_arithmetic

PROMPTS = [example.prompt for example in build_arithmetic(level=3, num_train=10, num_test=16, seed=3).test]


@pytest.fixture(scope="module")
def reference(tiny):
    rows = generate(tiny.model, tiny.tokenizer, PROMPTS, 1, Sampling(max_completion_length=8,
                                                                     temperature=0)).completion_id_lists()
    prompt_ids = [tiny.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    return prompt_ids, rows


def test_equal_rows_pass_and_tokens_after_the_first_eos_are_not_read(tiny, reference):
    prompt_ids, rows = reference
    eos = tiny.tokenizer.eos_token_id
    assert any(row[-1] == eos for row in rows)
    other = [row + [5, 6] if row[-1] == eos else row for row in rows]  # what an engine may emit past its EOS
    assert divergences(tiny.model, prompt_ids, other, rows, eos) == []
    assert_greedy_agrees(tiny.model, prompt_ids, other, rows, eos, tie_nats=0.0, min_equal=1.0)


def test_a_broken_engine_fails(tiny, reference):
    """An engine that generates from other weights (a sync that did not happen: the weights
    noised as the sync oracle of tests/on_vllm does) picks tokens the reference ranks far lower."""
    prompt_ids, rows = reference
    stale = copy.deepcopy(tiny.model)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in stale.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    broken = generate(stale, tiny.tokenizer, PROMPTS, 1, Sampling(max_completion_length=8,
                                                                  temperature=0)).completion_id_lists()
    assert broken != rows
    with pytest.raises(AssertionError, match="beyond a near tie"):
        assert_greedy_agrees(tiny.model, prompt_ids, broken, rows, tiny.tokenizer.eos_token_id, tie_nats=0.1)


def test_a_row_parted_at_its_nearest_tie_passes_within_the_tolerance_only(tiny, reference):
    prompt_ids, rows = reference
    row = rows[0]
    with torch.no_grad():  # the reference's top-2 gap at each completion token of row 0
        logits = tiny.model(input_ids=torch.tensor([prompt_ids[0] + row])).logits[0, len(prompt_ids[0]) - 1:-1]
    logp = torch.log_softmax(logits, -1)  # [len(row), V]
    top2 = logp.topk(2, dim=-1)
    position = int((top2.values[:, 0] - top2.values[:, 1]).argmin())
    gap = (top2.values[position, 0] - top2.values[position, 1]).item()
    parted = [row[:position] + [int(top2.indices[position, 1])]] + rows[1:]  # the runner-up taken there
    eos = tiny.tokenizer.eos_token_id
    [found] = divergences(tiny.model, prompt_ids, parted, rows, eos)
    assert (found.row, found.position) == (0, position) and found.gap_nats == pytest.approx(gap, abs=1e-4)
    assert_greedy_agrees(tiny.model, prompt_ids, parted, rows, eos, tie_nats=gap + 1e-3)
    with pytest.raises(AssertionError, match="beyond a near tie"):
        assert_greedy_agrees(tiny.model, prompt_ids, parted, rows, eos, tie_nats=gap / 2)


def test_ties_alone_do_not_pass(tiny, reference):
    prompt_ids, rows = reference
    shifted = [row[:-1] + [row[-1] + 1] for row in rows]  # every row parts at its last token
    with pytest.raises(AssertionError):
        assert_greedy_agrees(tiny.model, prompt_ids, shifted, rows, tiny.tokenizer.eos_token_id,
                             tie_nats=float("inf"))
