"""The slots engine: large n on bounded memory (micro-groups, continuous refill, length-aware order)."""

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from podsrl.models import load_model
from podsrl.rollout import (
    ENGINES,
    STOP_GROUPS,
    HFOptions,
    Sampling,
    SlotsOptions,
    generate,
    generate_in_slots,
    generation_memory_bytes,
)
from podsrl.rollout.lanes import balance_lanes, makespan
from podsrl.rollout.sampling import warp_logits
from podsrl.rollout.schedule import LaneQueue, LengthPredictor, PendingSamples, PrefixLengthPredictor
from podsrl.tasks import TaskOptions, build_task, render_prompt, reward_columns
from podsrl.trainer import train
from podsrl.trainer.config import Config, validate

SETTINGS = [(0, "continuous", "fifo"), (1, "continuous", "fifo"), (3, "continuous", "fifo"),
            (4, "group", "fifo"), (5, "continuous", "shortest_first"), (7, "group", "longest_first"),
            (6, "continuous", "longest_first"), (5, "continuous", "round_robin"), (3, "continuous", "length_aware"),
            (7, "continuous", "length_aware"), (0, "continuous", "length_aware")]


@pytest.fixture(scope="module")
def tiny_prompts(tiny):
    task = build_task(TaskOptions())
    return task, [render_prompt(tiny.tokenizer, ex) for ex in task.train[:64]]


def full_group_greedy(bundle, prompts, n, max_completion_length):
    """The reference: every prompt repeated n times, decoded as one batch by transformers."""
    out = generate(bundle.model, bundle.tokenizer, [p for p in prompts for _ in range(n)], 1,
                   Sampling(max_completion_length=max_completion_length, temperature=0.0))
    lengths = out.completion_mask.sum(-1).view(len(prompts), n)  # [P, n]
    return [[t for g in out.texts[i * n:(i + 1) * n] for t in g] for i in range(len(prompts))], lengths


@pytest.mark.parametrize("seed", range(5))
def test_warp_logits_matches_transformers(seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 50, generator=gen) * 3
    logits[0, :10] = 2.0  # ties
    for temperature in (0.5, 1.0, 1.7):
        for top_p in (0.1, 0.5, 0.9, 0.999, 1.0):
            expected = TemperatureLogitsWarper(temperature)(None, logits.clone())
            if top_p < 1.0:
                expected = TopPLogitsWarper(top_p)(None, expected)
            assert torch.equal(warp_logits(logits, temperature, top_p), expected), (temperature, top_p)


@pytest.mark.parametrize("slots,refill,schedule", SETTINGS)
def test_greedy_matches_full_group_generation(tiny, tiny_prompts, slots, refill, schedule):
    _, prompts = tiny_prompts
    prompts = prompts[:6] + ["What is 3 + 4?"]  # a short prompt among longer ones: widening on refill
    expected, _ = full_group_greedy(tiny, prompts, 5, 8)
    out = generate_in_slots(tiny.model, tiny.tokenizer, prompts, 5,
                            SlotsOptions(max_completion_length=8, temperature=0.0, micro_group=slots, refill=refill,
                                         schedule=schedule))
    assert out.texts == expected


def test_greedy_matches_on_a_random_model_that_rarely_stops(random_model_dir):
    bundle = load_model(random_model_dir)
    prompts = ["What is 1 + 2?", "What is 10 - 3 + 4? Answer in format", "7"]
    expected, lengths = full_group_greedy(bundle, prompts, 4, 9)
    for slots, refill, schedule in SETTINGS:
        out = generate_in_slots(bundle.model, bundle.tokenizer, prompts, 4,
                                SlotsOptions(max_completion_length=9, temperature=0.0, micro_group=slots,
                                             refill=refill, schedule=schedule))
        assert out.texts == expected, (slots, refill, schedule)
        assert torch.equal(out.completion_mask.sum(-1), lengths)


def simulated_decode_steps(lengths: list[int], slots: int, refill: str) -> int:
    """Brute-force oracle: decode steps of samples with these lengths, taken in this order.

    A sample's first token comes from its prompt's prefill, so it needs length - 1 decode
    steps; one that ends on its first token never takes a slot."""
    queue = [length - 1 for length in lengths]
    steps, rows = 0, []
    while queue or rows:
        if refill == "group" and not rows:
            rows = [r for r in queue[:slots] if r > 0]
            queue = queue[slots:]
            steps += max(rows, default=0)
            rows = []
            continue
        while queue and len(rows) < slots:
            remaining = queue.pop(0)
            if remaining > 0:
                rows.append(remaining)
        steps += 1
        rows = [r - 1 for r in rows if r > 1]
    return steps


@pytest.mark.parametrize("slots", [1, 2, 3, 5, 8, 40])
@pytest.mark.parametrize("refill", ["continuous", "group"])
def test_decode_steps_match_the_scheduling_oracle(tiny, tiny_prompts, slots, refill):
    prompts = tiny_prompts[1][:4]
    torch.manual_seed(1)  # hot sampling: completions of unequal lengths
    out = generate_in_slots(tiny.model, tiny.tokenizer, prompts, 6,
                            SlotsOptions(max_completion_length=9, temperature=2.0, micro_group=slots, refill=refill))
    fifo_lengths = out.completion_mask.sum(-1).view(-1).tolist()  # prompt by prompt = fifo order
    assert len(set(fifo_lengths)) > 1  # the oracle is only interesting with unequal lengths
    assert out.stats["decode_steps"] == simulated_decode_steps(fifo_lengths, slots, refill)
    assert out.stats["generated_tokens"] == sum(fifo_lengths)


def correct_rate(task, prompts, rollouts) -> tuple[float, int]:
    examples = task.train[:len(prompts)]
    n = rollouts.group_size
    completions = [c for group in rollouts.texts for c in group]
    values = task.correct_fn([p for p in prompts for _ in range(n)], completions, **reward_columns(examples, n))
    return sum(values) / len(values), len(values)


@pytest.mark.slow
def test_sampling_matches_full_group_in_distribution(tiny, tiny_prompts):
    """Over 3 seeds x 16 prompts x 32 samples, the correct-answer rate of the slots engine
    and of full-group generation agree within 4 standard errors; both differ from greedy
    decoding (so the check has the power to see a sampler that ignores the temperature)."""
    task, prompts = tiny_prompts
    prompts = prompts[:16]
    rates = {"hf": [], "slots": []}
    for seed in range(3):
        torch.manual_seed(seed)
        rates["hf"].append(correct_rate(task, prompts, generate(tiny.model, tiny.tokenizer, prompts, 32,
                                                                Sampling(max_completion_length=8, temperature=1.0))))
        torch.manual_seed(seed)
        options = SlotsOptions(max_completion_length=8, temperature=1.0, micro_group=24, schedule="shortest_first")
        rates["slots"].append(correct_rate(task, prompts, generate_in_slots(tiny.model, tiny.tokenizer, prompts, 32,
                                                                            options)))
    pooled = {k: (sum(r * c for r, c in v) / sum(c for _, c in v), sum(c for _, c in v)) for k, v in rates.items()}
    (p1, n1), (p2, n2) = pooled["hf"], pooled["slots"]
    p = (p1 * n1 + p2 * n2) / (n1 + n2)
    stderr = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
    assert abs(p1 - p2) < 4 * stderr, pooled
    greedy, count = correct_rate(task, prompts, generate_in_slots(tiny.model, tiny.tokenizer, prompts, 32,
                                                                  SlotsOptions(max_completion_length=8,
                                                                               temperature=0.0, micro_group=24)))
    assert abs(greedy - p2) > 4 * math.sqrt(p2 * (1 - p2) / n2), (greedy, p2)


def test_top_p_samples_stay_in_the_nucleus(random_model_dir):
    """A tiny nucleus leaves only the most likely token: sampling equals greedy decoding."""
    bundle = load_model(random_model_dir)
    prompts = ["What is 1 + 2?", "7"]
    torch.manual_seed(0)
    sampled = generate_in_slots(bundle.model, bundle.tokenizer, prompts, 5,
                                SlotsOptions(max_completion_length=6, temperature=1.0, top_p=1e-6, micro_group=3))
    greedy = generate_in_slots(bundle.model, bundle.tokenizer, prompts, 5, SlotsOptions(max_completion_length=6,
                                                                                        temperature=0.0))
    assert sampled.texts == greedy.texts


def test_length_predictor_learns_a_linear_length_law():
    predictor = LengthPredictor()
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        prompts = [torch.randint(0, 100, (int(k),), generator=gen).tolist()
                   for k in torch.randint(4, 60, (8,), generator=gen)]
        features = predictor.features(prompts)
        lengths = torch.tensor([[3 + len(p) // 2] * 4 for p in prompts])  # [P, n]
        predictor.update(features, lengths)
    test = [[1] * 10, [2] * 50]
    predicted = predictor.predict(predictor.features(test))
    assert abs(predicted[0] - 8) < 1.5 and abs(predicted[1] - 28) < 1.5, predicted


def test_pending_samples_order():
    predictor = LengthPredictor()
    order = {}
    for schedule in ("fifo", "round_robin", "shortest_first", "longest_first"):
        pending = PendingSamples(3, 2, schedule, [5.0, 1.0, 9.0], predictor)
        order[schedule] = [pending.pop() for _ in range(6)]
        assert len(pending) == 0
    assert order["fifo"] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert order["round_robin"] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    pending = PendingSamples(3, 3, "round_robin", [0.0] * 3, None)
    assert [pending.pop() for _ in range(4)] == [(0, 0), (1, 0), (2, 0), (0, 1)]
    assert pending.cancel(1) == [1, 2] and len(pending) == 3  # early stop drops a group's unstarted samples
    assert [pending.pop() for _ in range(3)] == [(2, 1), (0, 2), (2, 2)]
    assert [p for p, _ in order["shortest_first"]] == [1, 1, 0, 0, 2, 2]
    assert [p for p, _ in order["longest_first"]] == [2, 2, 0, 0, 1, 1]
    # finished siblings update the guess: prompt 0's samples turn out long
    pending = PendingSamples(2, 3, "shortest_first", [2.0, 4.0], predictor)
    assert pending.pop() == (0, 0)
    pending.record(0, 0, 20)
    assert pending.pop()[0] == 1


def run_lanes(queue: LaneQueue, lengths: dict, slots: int) -> int:
    """Brute-force engine for a LaneQueue: every step each busy slot decodes one token; a
    freed slot reports its sample and takes the next at once. Returns the steps."""
    rows, steps = [], 0
    while len(queue) and len(rows) < slots:
        sample = queue.pop()
        rows.append([sample, lengths[sample]])
    while rows:
        steps += 1
        for row in rows:
            row[1] -= 1
        for row in [r for r in rows if r[1] == 0]:
            queue.record(*row[0], 0)
            if len(queue):
                row[0] = queue.pop()
                row[1] = lengths[row[0]]
        rows = [r for r in rows if r[1] > 0]
    return steps


@pytest.mark.parametrize("seed", range(4))
def test_lane_queue_keeps_the_plan_and_steals_when_predictions_are_wrong(seed):
    gen = torch.Generator().manual_seed(seed)
    samples = [(p, s) for p in range(3) for s in range(7)]
    true = {x: int(v) for x, v in zip(samples, torch.randint(1, 40, (len(samples),), generator=gen))}
    slots = 4
    exact = [float(true[x]) for x in samples]
    plan = balance_lanes(exact, slots)
    # exact predictions: the run takes exactly the planned makespan, each lane shortest first
    assert run_lanes(LaneQueue(samples, exact, plan, slots), true, slots) == makespan(exact, plan, slots)
    queue = LaneQueue(samples, exact, plan, slots)
    first = [queue.pop() for _ in range(slots)]
    for lane, sample in enumerate(first):
        own = [x for x, a in zip(samples, plan) if a == lane]
        assert true[sample] == min(true[x] for x in own)  # SJF within the lane
    # wrong predictions: no slot idles while work is left, whatever the plan
    noisy = [float(v) for v in torch.randint(1, 40, (len(samples),), generator=gen)]
    steps = run_lanes(LaneQueue(samples, noisy, balance_lanes(noisy, slots), slots), true, slots)
    total = sum(true.values())
    assert steps <= total / slots + max(true.values())  # list scheduling's bound: no idle slot
    queue = LaneQueue(samples, exact, plan, slots)
    assert sorted(queue.cancel(1)) == list(range(7)) and len(queue) == 14
    assert all(queue.pop()[0] != 1 for _ in range(14))


def test_prefix_length_predictor_orders_samples_of_one_prompt_by_their_first_tokens():
    """Samples of one prompt differ only in their prefix: a law on the first token is learned."""
    predictor = PrefixLengthPredictor()
    gen = torch.Generator().manual_seed(0)
    prompt = [5, 6, 7]
    for _ in range(10):
        prefixes = torch.randint(0, 200, (16, 4), generator=gen).tolist()
        remaining = torch.tensor([40.0 if p[0] % 2 else 4.0 for p in prefixes])
        predictor.update(predictor.features(prompt, prefixes, [0.0] * 16), remaining)
    predicted = predictor.predict(predictor.features(prompt, [[3, 1, 1, 1], [8, 1, 1, 1]], [0.0, 0.0]))
    assert abs(predicted[0] - 40) < 4 and abs(predicted[1] - 4) < 4, predicted
    state = predictor.state_dict()
    with pytest.raises(ValueError, match="PrefixLengthPredictor"):
        PrefixLengthPredictor(prefix_buckets=8).check_state(state)


def test_length_aware_probe_pauses_and_resumes_and_early_stop_drops_paused_prefixes(tiny, tiny_prompts):
    _, prompts = tiny_prompts
    prompts = prompts[:3]
    stopped = []

    def stop_prompt_one(prompt_indices, completions):  # prompt 1 is saturated by its first finished sample
        if 1 in prompt_indices and not stopped:
            stopped.append(1)
            return [1]
        return []

    stop_prompt_one.kind = STOP_GROUPS
    torch.manual_seed(0)
    out = generate_in_slots(tiny.model, tiny.tokenizer, prompts, 6,
                            SlotsOptions(max_completion_length=8, temperature=1.0, micro_group=4,
                                         schedule="length_aware", probe_tokens=3), watchers=(stop_prompt_one,))
    lengths = out.completion_mask.sum(-1)  # [P, n]
    assert stopped and not out.generated[1].all() and out.generated[[0, 2]].all()
    assert (lengths[~out.generated] == 0).all() and (lengths[out.generated] > 0).all()
    assert out.stats["probe_steps"] > 0 and out.stats["decode_steps"] > out.stats["probe_steps"]


def test_engine_evaluates_in_slots_without_touching_its_length_predictor(tiny, tiny_prompts):
    _, prompts = tiny_prompts
    engine = ENGINES["slots"](SlotsOptions(schedule="length_aware", micro_group=4))
    before = engine.state_dict()["length_predictor"]
    expected, _ = full_group_greedy(tiny, prompts[:5], 3, 8)
    out = engine.generate(tiny.model, tiny.tokenizer, prompts[:5], 3, Sampling(max_completion_length=8,
                                                                               temperature=0.0, batch_size=4))
    assert out.texts == expected and out.stats["slots"] == 4
    after = engine.state_dict()["length_predictor"]
    assert all(torch.equal(torch.as_tensor(before[k]), torch.as_tensor(after[k])) for k in before)


@pytest.mark.slow
def test_length_aware_engine_state_and_a_training_run(tmp_path, tiny):
    options = SlotsOptions(schedule="length_aware", micro_group=8)
    engine = ENGINES["slots"](options)
    assert set(engine.state_dict()) == {"length_predictor"}
    with pytest.raises(ValueError, match="length predictor state"):
        engine.load_state_dict(ENGINES["slots"](dataclasses.replace(options, schedule="shortest_first")).state_dict())
    cfg = Config(model="tiny", method="pods", num_generations=8, num_kept=4, prompts_per_step=2, max_steps=2,
                 eval_steps=0, eval_prompts=4, eval_samples=1, save_steps=0, progress=False,
                 generation_engine="slots", generation_micro_group=6, generation_schedule="length_aware",
                 output_dir=str(tmp_path / "run"))
    assert train(cfg).steps == 2


def test_memory_cap_hf_refuses_a_group_that_does_not_fit_and_slots_fits_it(tiny, tiny_prompts):
    _, prompts = tiny_prompts
    prompts = prompts[:2]
    longest = max(len(tiny.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    full_mb = generation_memory_bytes(tiny.model.config, 2 * 256, longest + 8) / 2**20
    options = SlotsOptions(memory_mb=full_mb / 4)
    with pytest.raises(MemoryError, match="generation_memory_mb"):
        ENGINES["hf"](HFOptions(memory_mb=full_mb / 4))(tiny.model, tiny.tokenizer, prompts, 256)
    torch.manual_seed(0)
    out = ENGINES["slots"](options)(tiny.model, tiny.tokenizer, prompts, 256)
    assert out.completion_ids.shape[:2] == (2, 256)
    assert 0 < out.stats["slots"] <= 2 * 256 // 4
    too_many = dataclasses.replace(options, micro_group=2 * 256)
    with pytest.raises(MemoryError, match="generation_micro_group"):
        ENGINES["slots"](too_many)(tiny.model, tiny.tokenizer, prompts, 256)


@pytest.mark.slow
def test_pods_at_n256_trains_under_a_memory_cap_full_group_generation_exceeds(tmp_path, tiny):
    base = Config(model="tiny", method="pods", num_generations=256, num_kept=4, prompts_per_step=2, max_steps=2,
                  eval_steps=0, eval_prompts=8, eval_samples=1, save_steps=0, progress=False, generation_memory_mb=4.0)
    # full-group generation of one step: 2 x 256 sequences
    full_mb = generation_memory_bytes(tiny.model.config, 2 * 256, 40 + base.max_completion_length) / 2**20
    assert full_mb > base.generation_memory_mb
    validate(base)
    with pytest.raises(MemoryError, match="generation_memory_mb"):
        train(dataclasses.replace(base, output_dir=str(tmp_path / "hf")))
    result = train(dataclasses.replace(base, generation_engine="slots", output_dir=str(tmp_path / "slots")))
    assert result.steps == 2


def test_config_names_bad_slots_fields():
    """The slots engine's options are checked by it (SlotsOptions.check); with another engine they
    are read by nobody, a warning (tests/test_config.py)."""
    with pytest.raises(ValueError, match="generation_refill"):
        validate(dataclasses.replace(Config(), generation_engine="slots", generation_refill="eager"))
    with pytest.raises(ValueError, match="generation_schedule"):
        validate(dataclasses.replace(Config(), generation_engine="slots", generation_schedule="random"))
    with pytest.raises(ValueError, match="generation_memory_mb"):
        validate(dataclasses.replace(Config(), generation_memory_mb=-1))
    with pytest.raises(ValueError, match="generation_refill group"):
        validate(dataclasses.replace(Config(), generation_engine="slots", generation_schedule="length_aware",
                                     generation_refill="group"))
    with pytest.raises(ValueError, match="generation_probe_tokens"):
        validate(dataclasses.replace(Config(), generation_engine="slots", generation_schedule="length_aware",
                                     generation_probe_tokens=1))


# --- the SlotDecoder's parts, each alone ---------------------------------------------------------
def make_decoder(bundle, prompts, num_samples, *, max_completion_length=8, eos=None, watcher=None):
    """A decoder of ``prompts`` on the model's forward; ``eos`` replaces the tokenizer's end token."""
    from podsrl.rollout.slots import SlotDecoder, prefill

    enc = bundle.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    prompt_kv, logits = prefill(bundle.model.eval(), enc["input_ids"], enc["attention_mask"], chunk=8)
    pending = PendingSamples(len(prompts), num_samples, "fifo", [0.0] * len(prompts), None)
    options = SlotsOptions(max_completion_length=max_completion_length, decode_path="model")
    tokenizer = SimpleNamespace(eos_token_id=bundle.tokenizer.eos_token_id if eos is None else eos,
                                pad_token_id=bundle.tokenizer.pad_token_id)
    watchers = () if watcher is None else (StopGroups(watcher),)
    return SlotDecoder(bundle.model, prompt_kv, logits, pending, num_samples, options, tokenizer, watchers), enc


@dataclasses.dataclass(frozen=True)
class StopGroups:
    """A plain function as a ``stop_groups`` watcher (the decoder takes the call's watchers)."""

    rule: object
    kind = "stop_groups"

    def __call__(self, prompt_index, completion_ids):
        return self.rule(prompt_index, completion_ids)


def test_admission_places_each_prompt_cache_right_aligned(tiny):
    prompts = ["What is 1 + 2? Answer in format: 'Answer: {result}'\n", "What is 10 - 3?\n"]  # unequal lengths
    decoder, enc = make_decoder(tiny, prompts, 1)
    rows = decoder.open_rows(2)
    assert rows == [0, 1] and decoder.row_sample == [None, None]
    torch.manual_seed(0)
    started = decoder.start_samples(2)
    decoder.place(rows, started)
    width = decoder.rows.column_mask.shape[1]
    lengths = enc["attention_mask"].sum(1).tolist()
    assert width == max(lengths)
    for row, (prompt, sample, token) in zip(rows, started):
        length = lengths[prompt]
        assert decoder.row_sample[row] == (prompt, sample) and int(decoder.last_token[row]) == token
        assert decoder.rows.column_mask[row].tolist() == [0] * (width - length) + [1] * length
        assert int(decoder.position[row]) == length  # the next token's position id
        for layer, (keys, values) in zip(decoder.rows.layers, decoder.prompt_kv[prompt]):
            assert torch.equal(layer.keys[row, :, width - length:], keys)
            assert not layer.values[row, :, :width - length].any()  # the masked-out columns hold zeros


def test_refill_gives_a_freed_row_the_next_pending_sample(tiny):
    prompts = ["What is 1 + 2?\n", "What is 3 + 4?\n"]
    decoder, _ = make_decoder(tiny, prompts, 2, max_completion_length=50, eos=-1)  # no sample ends by itself
    torch.manual_seed(0)
    decoder.start_group(2)  # fifo: prompt 0's two samples
    assert decoder.row_sample == [(0, 0), (0, 1)] and len(decoder.pending) == 2
    decoder.step()
    decoder.row_sample[1] = None  # its sample ended
    decoder.fill([1])
    assert decoder.row_sample == [(0, 0), (1, 0)] and len(decoder.pending) == 1
    assert int(decoder.position[1]) == len(tiny.tokenizer(prompts[1], add_special_tokens=False)["input_ids"])


def test_compaction_drops_rows_and_unused_columns_without_changing_what_live_rows_see(tiny):
    prompts = ["What is 12 + 34? Answer in format: 'Answer: {result}'\n", "What is 1 + 2?\n"]
    decoder, _ = make_decoder(tiny, prompts, 1, max_completion_length=50, eos=-1)
    torch.manual_seed(0)
    decoder.start_group(2)
    for _ in range(3):
        decoder.step()

    def attended(row):  # keys and values at the columns the row attends to, layer by layer
        mask = decoder.rows.column_mask[row].bool()
        return [(layer.keys[row][:, mask], layer.values[row][:, mask]) for layer in decoder.rows.layers]

    short_row_view = attended(1)
    decoder.row_sample[0] = None  # the long prompt's sample ended
    decoder.drop_idle_rows()
    assert decoder.row_sample == [(1, 0)] and decoder.rows.layers[0].keys.shape[0] == 1
    width_before = decoder.rows.column_mask.shape[1]
    decoder.trim_columns()
    assert decoder.rows.column_mask.shape[1] < width_before and bool(decoder.rows.column_mask[:, 0].any())
    assert all(torch.equal(a, b) and torch.equal(c, d) for (a, c), (b, d) in zip(attended(0), short_row_view))


def test_early_stop_cancels_unstarted_samples_and_lets_running_ones_finish(tiny):
    prompts = ["What is 1 + 2?\n", "What is 3 + 4?\n"]
    reports = []

    def saturate_prompt_0(prompt_index, completion_ids):
        reports.append(list(prompt_index))
        return [0]

    decoder, _ = make_decoder(tiny, prompts, 4, max_completion_length=50, eos=-1, watcher=saturate_prompt_0)
    torch.manual_seed(0)
    decoder.start_group(2)  # fifo: prompt 0's samples 0 and 1 run, 2 and 3 and prompt 1's wait
    decoder.step()
    decoder._finish(0, 0)  # sample (0, 0) ends; (0, 1) is still running
    decoder.row_sample[0] = None
    decoder.stop_saturated()
    assert reports == [[0]]
    assert len(decoder.pending) == 4 and decoder.skipped == {(0, 2), (0, 3)}  # only unstarted ones cancelled
    assert decoder.row_sample[1] == (0, 1)  # the running sample keeps decoding (no bias to short ones)
    decoder.fill([0])
    assert decoder.row_sample[0] == (1, 0)  # the freed slot goes to the next prompt
    assert decoder.generated().tolist() == [[True, True, False, False], [True] * 4]


def test_early_stop_drops_a_groups_samples_parked_after_the_probe(tiny):
    prompts = ["What is 1 + 2?\n", "What is 3 + 4?\n"]
    decoder, _ = make_decoder(tiny, prompts, 3, max_completion_length=50, eos=-1, watcher=lambda p, c: [0])
    decoder.pause_at = 3
    torch.manual_seed(0)
    decoder.start_group(6)
    while decoder.live:  # the probe: every sample decodes 3 tokens and parks
        decoder.step()
    assert set(decoder.paused) == {(p, s) for p in range(2) for s in range(3)}
    decoder._finish(0, 0)  # as if (0, 0) had resumed and ended: its group saturates
    decoder.paused.pop((0, 0))
    decoder.stop_saturated()
    assert decoder.skipped == {(0, 1), (0, 2)} and set(decoder.paused) == {(1, 0), (1, 1), (1, 2)}
    assert decoder.completions[0][1] == [] and len(decoder.completions[1][0]) == 3  # dropped with its tokens
