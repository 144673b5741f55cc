"""podsrl's own decode step (podsrl.rollout.decode_step) against the model's forward, the rows it
decodes in (podsrl.rollout.kv_rows), the models it refuses, and the sampler's draw."""

import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from podsrl.rollout import decode_step
from podsrl.rollout.decode_step import DecodeModel, GraphedStep, decode_path_refusal, row_bucket
from podsrl.rollout.kv_rows import InPlaceRows, cache_rows
from podsrl.rollout.sampling import next_tokens, warp_logits
from podsrl.rollout.slots import SlotsOptions, generate_in_slots
from podsrl.tasks import TaskOptions, build_task, render_prompt


def llama(**overrides):
    """A random Llama-family model with grouped kv heads (3 query heads per kv head), odd sizes."""
    config = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5) | overrides
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**config)).eval()


MODELS = {
    "qwen2 (tiny)": lambda tiny: tiny.model.eval(),
    "llama": lambda tiny: llama(),
    "llama, biases, llama3 rope": lambda tiny: llama(attention_bias=True, mlp_bias=True, rope_parameters=dict(
        rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=32)),
    "mistral": lambda tiny: MistralForCausalLM(MistralConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, sliding_window=None, max_position_embeddings=128)).eval(),
}


@pytest.mark.parametrize("name", MODELS)
def test_a_decode_step_gives_the_models_logits_for_rows_of_different_lengths(tiny, name):
    """Rows of random lengths, prefilled by the model, then 6 steps of random tokens: each step's
    logits match the model's forward over the row's whole sequence (float32 tolerance)."""
    model = MODELS[name](tiny)
    assert decode_path_refusal(model) == ""
    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    lengths = [1, 5, 17, 9]
    sequences = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]
    step_model = DecodeModel(model)
    cache = step_model.new_cache(len(lengths), max(lengths) + 8)
    with torch.no_grad():
        for row, tokens in enumerate(sequences):
            out = model(torch.tensor([tokens]), use_cache=True)
            cache.write(row, [(layer.keys[0], layer.values[0]) for layer in out.past_key_values.layers])
        position = torch.tensor(lengths)
        for _ in range(6):
            fed = torch.randint(0, vocab, (len(lengths),), generator=generator)
            logits = step_model.step(cache, fed, position)  # [B, V]
            for row, token in enumerate(fed.tolist()):
                sequences[row].append(token)
                expected = model(torch.tensor([sequences[row]])).logits[0, -1].float()
                torch.testing.assert_close(logits[row], expected, atol=2e-5, rtol=1e-4)
            position += 1


def test_the_step_reads_the_weights_of_when_it_was_made_and_a_new_one_sees_an_update():
    model = llama()
    cache_tokens = torch.tensor([3, 4])
    before = DecodeModel(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    after = DecodeModel(model)
    with torch.no_grad():
        expected = model(cache_tokens[:, None], position_ids=torch.zeros(2, 1, dtype=torch.long)).logits[:, -1]
    logits = {}
    for name, step_model in (("before", before), ("after", after)):
        cache = step_model.new_cache(2, 4)
        logits[name] = step_model.step(cache, cache_tokens, torch.zeros(2, dtype=torch.long))
    torch.testing.assert_close(logits["after"], expected, atol=2e-5, rtol=1e-4)
    # the fused q|k|v and gate|up matrices are copies (read once per call); norms and o_proj are not
    assert not torch.allclose(logits["before"], expected, atol=1e-3)


@pytest.mark.parametrize("make, reason", [
    (lambda: GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)), "model type 'gpt2'"),
    (lambda: MistralForCausalLM(MistralConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                              num_attention_heads=2, num_key_value_heads=1, sliding_window=8)),
     "a sliding window"),
    (lambda: llama(hidden_act="gelu"), "not a plain SiLU-gated"),
])
def test_models_it_does_not_cover_are_refused_in_one_line_and_decode_with_their_forward(make, reason, capsys,
                                                                                       monkeypatch):
    from podsrl.rollout import kv_rows

    monkeypatch.setattr(kv_rows, "NOTED", set())
    model = make()
    refusal = decode_path_refusal(model)
    assert reason in refusal and "\n" not in refusal
    kv = [[(torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))]]
    for _ in range(2):
        rows, why = cache_rows(model, kv, 4)
        assert rows.path == "model" and why == refusal
    assert capsys.readouterr().err.count(f"decodes with the model's own forward (slower, docs/generation.md): "
                                         f"{refusal}\n") == 1  # said once
    for path in ("podsrl", "eager"):
        with pytest.raises(ValueError, match="podsrl's decode step cannot run this model: .*" + reason):
            cache_rows(model, kv, 4, path=path)


def test_a_lora_model_is_refused(tiny):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(llama(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert "LoRA" in decode_path_refusal(model)


def test_the_decode_path_option_is_checked():
    SlotsOptions(decode_path="model").check()
    with pytest.raises(ValueError, match="generation_decode_path: unknown 'fast'"):
        SlotsOptions(decode_path="fast").check()


@pytest.mark.parametrize("refill", ["continuous", "group"])
def test_both_paths_decode_the_same_greedy_completions(tiny, refill):
    """Greedy decoding on podsrl's step and on the model's forward: the same completions, unless
    the two logits' top tokens were within float32 noise of a tie where they first differ."""
    prompts = [render_prompt(tiny.tokenizer, ex) for ex in build_task(TaskOptions()).train[:6]]
    runs = {path: generate_in_slots(tiny.model, tiny.tokenizer, prompts, 2,
                                    SlotsOptions(max_completion_length=12, temperature=0.0, micro_group=5,
                                                 refill=refill, decode_path=path)) for path in ("podsrl", "model")}
    a, b = runs["podsrl"].completion_ids, runs["model"].completion_ids
    width = min(a.shape[-1], b.shape[-1])
    differing = (a[..., :width] != b[..., :width]).any(-1).nonzero().tolist()
    for prompt, sample in differing:  # a near tie: the model's top two logits at the first difference
        first = int((a[prompt, sample, :width] != b[prompt, sample, :width]).nonzero()[0])
        ids = torch.cat([runs["model"].prompt_ids[prompt][runs["model"].prompt_mask[prompt].bool()],
                         b[prompt, sample, :first]])
        with torch.no_grad():
            top = tiny.model(ids[None]).logits[0, -1].float().topk(2).values
        assert float(top[0] - top[1]) < 1e-4, (prompt, sample, first)
    assert len(differing) <= 1


def test_in_place_rows_reorder_without_changing_what_kept_rows_hold():
    rows = InPlaceRows(llama(), 12)
    rows.open(4)
    kvs = [[(torch.full((2, n, 8), float(r)), torch.full((2, n, 8), -float(r))) for _ in range(2)]
           for r, n in enumerate([3, 5, 2, 7], start=1)]
    rows.place([0, 1, 2, 3], kvs)
    rows.reorder([3, 1])  # row 0 takes old row 3, row 1 stays
    assert rows.count == 2
    for row, (old, length) in enumerate([(3, 7), (1, 5)]):
        for (keys, values), (k, v) in zip(rows.tail(row, length, length), kvs[old]):
            assert torch.equal(keys, k) and torch.equal(values, v)


def test_the_exponential_race_draws_each_token_with_its_probability():
    """64 rows x 20,000 draws of a fixed distribution with zeros (top-p filtered): every token's
    frequency within 5 standard errors of its probability, and no filtered token drawn."""
    torch.manual_seed(0)
    logits = torch.randn(1, 12) * 2
    probs = warp_logits(logits, 0.7, 0.9).softmax(-1)[0]  # [12] with zeros
    assert (probs == 0).any()
    counts = torch.zeros(12)
    for _ in range(20):
        drawn = next_tokens(logits.expand(1000, 12).contiguous(), 0.7, 0.9)
        counts += torch.bincount(drawn, minlength=12)
    total = counts.sum()
    assert counts[probs == 0].sum() == 0
    for p, c in zip(probs.tolist(), counts.tolist()):
        assert abs(c / total - p) <= 5 * math.sqrt(p * (1 - p) / total) + 1e-9, (p, c / total)


def test_under_bf16_autocast_the_step_follows_the_models_autocast_forward():
    """bf16 runs generate under the trainer's autocast: the step's linear layers compute in
    bfloat16 as the model's do, and its logits stay within bfloat16 rounding of the model's
    autocast forward (a tolerance that holds whether the CPU has native bf16 or emulates it)."""
    model = llama()
    sequence = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(sequence[:, :-1], use_cache=True)
        step_model = DecodeModel(model)
        assert step_model.compute == torch.bfloat16
        cache = step_model.new_cache(1, 12)
        cache.write(0, [(layer.keys[0], layer.values[0]) for layer in out.past_key_values.layers])
        logits = step_model.step(cache, sequence[:, -1], torch.tensor([8]))
        expected = model(sequence).logits[0, -1].float()
    with torch.no_grad():  # the same weights in float32: the scale of bfloat16's error
        exact = model(sequence).logits[0, -1].float()
    bf16_error = float((expected - exact).abs().max())
    assert float((logits[0] - expected).abs().max()) <= 4 * bf16_error + 1e-2
    assert cache.keys[0].dtype == torch.float32  # the cache keeps the weights' dtype


def test_row_buckets_are_powers_of_two_covering_the_rows_with_less_than_twice_their_padding():
    for rows in range(1, 1100):
        size = row_bucket(rows)
        assert size >= rows and size & (size - 1) == 0 and size >= 8
        assert size == 8 or size < 2 * rows


class Replayed:
    """Stands in for a CUDA graph on the CPU: a replay runs the captured call again into the
    tensor the capture returned (what a graph's replay does to its output's memory)."""

    def __init__(self, run):
        self.run, self.output = run, run()
        self.replays = 0

    def replay(self):
        self.output.copy_(self.run())
        self.replays += 1


def test_the_captured_step_gives_the_eager_steps_logits_and_cache_through_growth_and_shrinking(monkeypatch):
    """GraphedStep with the CUDA capture stood in for: its inputs padded to a bucket at the
    cache's last column and its whole width give each row the eager step's logits, the columns
    rows read hold the same keys, and a cache that grows drops the graphs captured over it."""
    captured = []

    def stand_in(run, device):
        graph = Replayed(run)
        captured.append(graph)
        return graph, graph.output

    monkeypatch.setattr(decode_step, "capture", stand_in)
    model = llama()
    eager_model, graphed_model = DecodeModel(model), DecodeModel(model)
    width = 12
    caches = {"eager": eager_model.new_cache(0, width), "graphed": graphed_model.new_cache(0, width)}
    graphed = GraphedStep(graphed_model, caches["graphed"])
    generator = torch.Generator().manual_seed(3)
    for rows, steps in ((3, 3), (11, 2), (5, 2)):  # bucket 8, then 16 (the cache grows), then 8 again
        for cache in caches.values():
            cache.reserve(rows)
        for _ in range(steps):
            tokens = torch.randint(0, 97, (rows,), generator=generator)
            position = torch.randint(0, width - 1, (rows,), generator=generator)
            expected = eager_model.step(caches["eager"], tokens, position)
            torch.testing.assert_close(graphed(tokens, position), expected, atol=1e-5, rtol=1e-5)
            for eager_keys, graphed_keys in zip(caches["eager"].keys, caches["graphed"].keys):
                torch.testing.assert_close(graphed_keys[:rows, :, :width - 1], eager_keys[:rows, :, :width - 1])
    assert [len(g.output) for g in captured] == [8, 16, 8]  # the growth to 16 rows dropped the 8-row graph
    assert [g.replays for g in captured] == [3, 2, 2]
    assert graphed.capture_seconds > 0


def test_nothing_is_captured_on_the_cpu():
    kv = [[(torch.zeros(2, 3, 8), torch.zeros(2, 3, 8))] * 2]
    for path in ("auto", "podsrl", "eager"):
        rows, _ = cache_rows(llama(), kv, 4, path=path)
        assert rows.path == "podsrl" and rows.graphed is None and rows.compile_seconds == 0.0


def test_a_step_that_cannot_be_captured_falls_back_to_the_eager_step_with_one_note(monkeypatch, capsys):
    from podsrl.rollout import kv_rows

    def fails(run, device):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(decode_step, "capture", fails)
    monkeypatch.setattr(kv_rows, "NOTED", set())
    model = llama()
    rows = InPlaceRows(model, 8, captured=True)
    rows.open(3)
    tokens, position = torch.tensor([5, 6, 7]), torch.tensor([0, 2, 4])
    logits = rows.step(tokens, position)
    assert rows.graphed is None
    eager = DecodeModel(model)
    cache = eager.new_cache(3, 8)
    torch.testing.assert_close(logits, eager.step(cache, tokens, position))
    rows.step(tokens, position + 1)
    err = capsys.readouterr().err
    assert err.count("note: podsrl's decode step runs without CUDA graphs: capturing it failed (operation not "
                     "permitted when stream is capturing)\n") == 1


def test_the_compiled_step_traces_whole_once_and_gives_the_eager_logits_for_new_rows_widths_and_weights(monkeypatch):
    """Dynamo's eager backend (its tracing and guards, no code generation: the suite's budget):
    one graph, no break, reused by every call's new DecodeModel, row count and width."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(decode_step, "BACKEND", "eager")
    monkeypatch.setattr(decode_step, "COMPILED", [])
    model = llama()
    generator = torch.Generator().manual_seed(5)
    paid = []
    for rows, width in ((3, 10), (7, 16), (2, 5)):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.001)  # an update between calls: the next call's weights
        compiled = InPlaceRows(model, width, compiled=True)
        compiled.open(rows)
        eager = DecodeModel(model)
        cache = eager.new_cache(rows, width)
        for _ in range(3):
            tokens = torch.randint(0, 97, (rows,), generator=generator)
            position = torch.randint(0, width - 1, (rows,), generator=generator)
            torch.testing.assert_close(compiled.step(tokens, position), eager.step(cache, tokens, position),
                                       atol=1e-5, rtol=1e-5)
        assert compiled.compiled and compiled.reports_compile
        paid.append(compiled.compile_seconds > 0)
    assert counters["stats"]["unique_graphs"] == 1
    assert paid == [True, False, False]  # the first call in the process pays the compile, and says so


def test_a_runs_compile_is_recorded_in_the_evaluation_that_paid_it_and_said_once(monkeypatch, capsys,
                                                                                  random_model_dir, tmp_path):
    """#80: step 0's evaluation pays the process's compile (about 2 minutes on CPU with inductor),
    and generate_compile_seconds was 0.0 in every step: the compile was recorded nowhere."""
    import json

    from podsrl.trainer import train
    from tests.conftest import quick

    monkeypatch.setattr(decode_step, "BACKEND", "eager")  # dynamo's tracing, no code generation
    monkeypatch.setattr(decode_step, "COMPILED", [])
    torch._dynamo.reset()
    train(quick(random_model_dir, tmp_path / "run", generation_engine="slots", generation_decode_path="compiled",
                max_steps=1, eval_greedy="false"))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 0 and records[0]["eval_compile_seconds"] > 0  # the first evaluation paid
    assert records[1]["generate_compile_seconds"] == 0.0 and records[1]["eval_compile_seconds"] == 0.0
    err = capsys.readouterr().err
    assert err.count("compiling the decode step took ") == 1
    assert "s, in this evaluation (metrics: eval_compile_seconds; a training step's: generate_compile_seconds)" in err


def test_a_compile_that_fails_runs_the_eager_step_with_one_note(monkeypatch, capsys):
    from podsrl.rollout import kv_rows

    def broken():
        def call(*args):
            raise RuntimeError("no C++ compiler found")
        return call

    monkeypatch.setattr(decode_step, "compiled_step", broken)
    monkeypatch.setattr(kv_rows, "NOTED", set())
    model = llama()
    rows = InPlaceRows(model, 8, compiled=True)
    rows.open(2)
    tokens, position = torch.tensor([5, 6]), torch.tensor([1, 3])
    logits = rows.step(tokens, position)
    torch.testing.assert_close(logits, DecodeModel(model).step(DecodeModel(model).new_cache(2, 8), tokens, position))
    assert not rows.compiled and rows.reports_compile  # still logged: every process logs the same fields
    assert capsys.readouterr().err.count("note: podsrl's decode step runs uncompiled: torch.compile failed "
                                         "(RuntimeError: no C++ compiler found)\n") == 1


@pytest.mark.parametrize("path", ["eager", "model"])
def test_rows_that_keep_the_hidden_state_give_the_models_last_hidden_state_and_the_same_logits(path):
    """Rows asked to keep it (cache_rows(..., hidden=True), for watchers of running samples) hold
    after each step the model's last hidden state at the fed token (its forward over the whole
    sequence, float32 tolerance), and their logits are those of rows that do not keep it."""
    model = llama()
    generator = torch.Generator().manual_seed(2)
    sequences = [torch.randint(0, 97, (n,), generator=generator).tolist() for n in (3, 7)]
    with torch.no_grad():
        kv = []
        for tokens in sequences:
            out = model(torch.tensor([tokens]), use_cache=True)
            kv.append([(layer.keys[0], layer.values[0]) for layer in out.past_key_values.layers])
        keeping, plain = (cache_rows(model, kv, 6, path=path, hidden=flag)[0] for flag in (True, False))
        for rows in (keeping, plain):
            rows.open(2)
            rows.place([0, 1], kv)
        position = torch.tensor([3, 7])
        for _ in range(4):
            fed = torch.randint(0, 97, (2,), generator=generator)
            logits = keeping.step(fed, position)
            assert torch.allclose(logits, plain.step(fed, position), atol=1e-5) and plain.hidden is None
            for row, token in enumerate(fed.tolist()):
                sequences[row].append(token)
                expected = model(torch.tensor([sequences[row]]), output_hidden_states=True).hidden_states[-1][0, -1]
                assert torch.allclose(keeping.hidden[row], expected.float(), atol=1e-4)
            position = position + 1
