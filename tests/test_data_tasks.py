"""Task loaders (local files, real data), prompt rendering, custom data, reasoning-gym."""

import json
from pathlib import Path

import pytest

from podsrl.tasks import build_task, prepare_split, render_prompt, reward_columns
from podsrl.tasks.base import Example
from podsrl.tasks.gsm8k import build_gsm8k
from podsrl.tasks.jsonl import build_jsonl
from podsrl.tasks.math import build_math
from podsrl.trainer.config import make_config
from podsrl.trainer.setup import task_options

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"real data folder {SHARED_DATA} is absent")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gsm8k_from_local_jsonl(tmp_path):
    rows = [{"question": "Q1?", "answer": "steps\n#### 1,000"}, {"question": "Q2?", "answer": "x\n#### -3"}]
    task = build_gsm8k(write_jsonl(tmp_path / "train.jsonl", rows), write_jsonl(tmp_path / "test.jsonl", rows[:1]))
    assert [ex.answer for ex in task.train] == ["1,000", "-3"]
    assert task.correct_fn(prompts=["Q1?"], completions=["<answer>1000</answer>"], answer=["1,000"]) == [1.0]
    assert "<think>" in task.system_prompt
    # reward functions get GSM8K's own columns, raw, as TRL passes them; the built-in grades the raw answer
    columns = reward_columns(task.train, 2)
    assert columns == {"question": ["Q1?", "Q1?", "Q2?", "Q2?"],
                       "answer": [rows[0]["answer"]] * 2 + [rows[1]["answer"]] * 2}
    assert task.correct_fn(prompts=["Q1?"] * 2, completions=["<answer>1000</answer>", "<answer>-3</answer>"],
                           answer=[r["answer"] for r in rows]) == [1.0, 1.0]


def test_math_gold_falls_back_to_last_boxed(tmp_path):
    rows = [{"problem": "P", "solution": r"so \boxed{1} then \boxed{\frac{1}{2}}"},
            {"problem": "Q", "solution": "...", "answer": "7"}]
    path = write_jsonl(tmp_path / "m.jsonl", rows)
    task = build_math(path, path)
    assert [ex.answer for ex in task.test] == [r"\frac{1}{2}", "7"]


@pytest.mark.parametrize("content, message", [
    (b'{"question": "a", "answer": "#### 1"}\n{"question": "b"}\n', "line 2: missing column 'answer'"),
    (b'{"question": "a", "answer": "#### 1"}\n{not json}\n', "line 2: invalid JSON"),
    (b'{"question": "a", "answer": "#### 1"}\n\n{"question": "\xff\xfe", "answer": "1"}\n', "line 3: not valid UTF-8"),
    (b'{"question": "a", "answer": "#### 1"}\n{"question": "  ", "answer": "#### 2"}\n',
     "line 2: column 'question' is empty"),
    (b'{"question": "a", "answer": "#### 1"}\n\n{"question": "b"}\n', "line 3: missing column 'answer'"),
    (b'{"question": "a", "answer": "#### 1"}\n[1, 2]\n', "line 2: expected a JSON object"),
])
def test_bad_rows_name_field_file_and_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError) as err:
        build_gsm8k(str(path), str(path))
    assert message in str(err.value) and "train_data" in str(err.value) and "bad.jsonl" in str(err.value)


def test_missing_data_file_is_rejected_by_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_data: file not found"):
        make_config(overrides={"task": "gsm8k", "train_data": str(tmp_path / "nope.jsonl")})
    with pytest.raises(ValueError, match="test_data: task 'jsonl' needs test_data"):
        make_config(overrides={"task": "jsonl", "train_data": write_jsonl(tmp_path / "t.jsonl", [{"prompt": "q",
                                                                                               "answer": 1}])})


@needs_shared
def test_real_gsm8k_and_math500_load():
    gsm = build_gsm8k(str(SHARED_DATA / "gsm8k/train.jsonl"), str(SHARED_DATA / "gsm8k/test.jsonl"))
    assert (len(gsm.train), len(gsm.test)) == (7473, 1319)
    assert all(ex.answer and "####" not in ex.answer for ex in gsm.test)
    math500 = build_math(str(SHARED_DATA / "math500/test.jsonl"), str(SHARED_DATA / "math500/test.jsonl"))
    assert len(math500.test) == 500 and all(ex.answer for ex in math500.test)


def test_custom_jsonl_columns_reach_reward_functions(tmp_path):
    rows = [{"q": "2+2?", "gold": 4, "difficulty": "easy"}, {"q": "3*3?", "gold": 9, "difficulty": "hard"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    task = build_jsonl(path, path, prompt_column="q", answer_column="gold")
    assert task.train[0] == Example(prompt="2+2?", answer="4", columns=rows[0])  # every column, raw
    # the gold answer is added as `answer` since the data has no `answer` column
    assert reward_columns(task.train, 1) == {"answer": ["4", "9"], "q": ["2+2?", "3*3?"], "gold": [4, 9],
                                             "difficulty": ["easy", "hard"]}
    with pytest.raises(ValueError, match="missing column 'question'"):
        build_jsonl(path, path, prompt_column="question", answer_column="gold")
    empty = write_jsonl(tmp_path / "e.jsonl", [{"prompt": "  ", "answer": 1}])
    with pytest.raises(ValueError, match="line 1: column 'prompt' is empty"):
        build_jsonl(empty, "")


def test_reasoning_gym_task_uses_its_scorer():
    cfg = make_config(overrides={"task": "reasoning_gym:basic_arithmetic", "reasoning_gym_size": 20,
                                 "eval_prompts": 5})
    task = build_task(task_options(cfg))
    assert (len(task.train), len(task.test)) == (20, 5)
    ex = task.test[0]
    right = task.correct_fn(prompts=[ex.prompt], completions=[f"<think>x</think><answer>{ex.answer}</answer>"],
                            answer=[ex.answer], rg_entry=[ex.columns["rg_entry"]])
    wrong = task.correct_fn(prompts=[ex.prompt], completions=["<answer>not a number</answer>"],
                            answer=[ex.answer], rg_entry=[ex.columns["rg_entry"]])
    assert (right, wrong) == ([1.0], [0.0])
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset"):
        build_task(task_options(make_config(overrides={"task": "reasoning_gym:no_such_thing"})))


def test_reasoning_gym_held_out_problems_never_appear_in_training():
    # lcm's problem space is small: a 1,000-problem stream repeats questions, so some held-out
    # questions also occur among the train indices; those train copies must be dropped
    import reasoning_gym

    stream = reasoning_gym.create_dataset("lcm", size=1050, seed=0)
    questions = [stream[i]["question"] for i in range(1050)]
    assert set(questions[:1000]) & set(questions[1000:]), "the case this test is for"
    task = build_task(task_options(make_config(overrides={"task": "reasoning_gym:lcm", "reasoning_gym_size": 1000,
                                                          "eval_prompts": 50})))
    held_out = {ex.prompt for ex in task.test}
    assert len(task.test) == 50 and not held_out & {ex.prompt for ex in task.train}
    assert len(task.train) == sum(q not in held_out for q in questions[:1000])


def test_render_prompt_with_and_without_chat_template(random_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_model_dir)
    example = Example(prompt="What is 1 + 1?\n", answer="2")
    assert render_prompt(tokenizer, example) == example.prompt  # no template: verbatim
    assert render_prompt(tokenizer, example, "Be brief.") == "Be brief.\n\nWhat is 1 + 1?\n"
    tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                               "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert render_prompt(tokenizer, example, "Be brief.") == "<system>Be brief.<user>What is 1 + 1?<assistant>"
    assert render_prompt(tokenizer, example, "", use_chat_template=False) == example.prompt


def test_over_long_prompts_are_dropped_and_counted(random_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_model_dir)
    examples = [Example("What is 1 + 1?", "2"), Example("What is 1 + 1? " * 50, "2")]
    split = prepare_split(examples, tokenizer, system_prompt="", use_chat_template=True, max_prompt_tokens=30)
    assert (len(split.examples), split.dropped) == (1, 1)


def test_parquet_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"question": ["Q?"], "answer": ["so\n#### 12"]}), path)
    assert [ex.answer for ex in build_gsm8k(str(path), str(path)).test] == ["12"]


@pytest.mark.parametrize("name, content, message", [
    ("rows.txt", b'{"question": "a", "answer": "#### 1"}\n{"question": "caf\xe9", "answer": "1"}\n',
     "line 2: not valid UTF-8 (byte 17: b'\\xe9')"),  # no .jsonl suffix: read as JSON Lines all the same
    ("rows.csv", b'question,answer\nok,#### 1\n"caf\xe9",#### 2\n', "line 3: not valid UTF-8 (byte 4: b'\\xe9')"),
    ("rows.json", b'[{"question": "a", "answer": "1"},\n {"question": "caf\xe9", "answer": "1"}]',
     "line 2: not valid UTF-8"),
    ("rows.json", b'[{"question": "a", "answer": "1"},\n {"question": oops}]', "line 2: not a valid JSON file"),
    ("rows.parquet", b"PAR1" + b"\0not a parquet file" * 20, ": not a readable parquet file (ArrowInvalid: "),
    ("rows.csv", b'question,answer\n"open,#### 1\n', ": not a readable csv file (ParserError: "),
])
def test_a_file_that_is_not_utf8_or_not_its_format_is_one_line_naming_it(tmp_path, name, content, message):
    """#57: bytes that are not UTF-8 in a file without a .jsonl suffix or in a CSV, and a corrupt
    parquet file, came out as the reader's own error, naming no file (a CSV's as a traceback)."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError) as err:
        build_gsm8k(str(path), str(path))
    assert str(err.value).startswith(f"train_data: {path}") and message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_hub_dataset_failure_names_field_and_offline_fix(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(OSError, match=r"test_data: could not load hub dataset 'openai/gsm8k:main'.*local \.jsonl"):
        build_gsm8k("", "", with_train=False)


def test_a_jsonl_answer_column_of_its_own_is_passed_raw_and_the_gold_column_still_grades(tmp_path):
    rows = [{"prompt": "2+2?", "gold": "4", "answer": "unrelated"}]
    task = build_jsonl(write_jsonl(tmp_path / "d.jsonl", rows), "", answer_column="gold")
    columns = reward_columns(task.train, 1)
    assert columns == {"gold": ["4"], "answer": ["unrelated"]}  # `prompt` arrives as `prompts`, not a column
    assert task.correct_fn(prompts=["2+2?"], completions=["<answer>4</answer>"], **columns) == [1.0]


def test_math_reward_columns_keep_the_solution_and_add_the_boxed_gold(tmp_path):
    rows = [{"problem": "P", "solution": r"so \boxed{\frac{1}{2}}", "level": "Level 1"}]
    task = build_math(write_jsonl(tmp_path / "m.jsonl", rows), write_jsonl(tmp_path / "m2.jsonl", rows))
    columns = reward_columns(task.test, 1)
    assert columns == {"answer": [r"\frac{1}{2}"], **{k: [v] for k, v in rows[0].items()}}
    assert task.correct_fn(prompts=["P"], completions=[r"\boxed{0.5}"], answer=[""], solution=[rows[0]["solution"]]) \
        == [1.0]  # an empty answer column falls back to the solution's box


def test_local_files_load_through_datasets(tmp_path, monkeypatch):
    import datasets

    calls = []
    real = datasets.load_dataset

    def spy(path, *args, **kwargs):
        calls.append((path, kwargs.get("data_files")))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    (tmp_path / "d.csv").write_text("prompt,answer\n2+2?,4\n3+3?,6\n")
    (tmp_path / "d.json").write_text(json.dumps([{"prompt": "2+2?", "answer": 4}, {"prompt": "3+3?", "answer": 6}]))
    write_jsonl(tmp_path / "d.jsonl", [{"prompt": "2+2?", "answer": 4}, {"prompt": "3+3?", "answer": "6"}])
    for name in ("d.csv", "d.json", "d.jsonl"):
        task = build_jsonl(str(tmp_path / name), "")
        assert [(ex.prompt, ex.answer) for ex in task.train] == [("2+2?", "4"), ("3+3?", "6")], name
    assert [c[0] for c in calls] == ["csv", "json", "json"]
    assert calls[0][1] == str(tmp_path / "d.csv")


def test_a_file_datasets_cannot_load_but_whose_lines_are_valid_is_read_line_by_line(tmp_path):
    # numbers and text in one column, and a blank line: datasets' loaders both give up
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"prompt": "a?", "answer": 4}\n\n{"prompt": "b?", "answer": "1/2"}\n')
    assert [ex.answer for ex in build_jsonl(str(path), "").train] == ["4", "1/2"]


CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 + 1?"}]


def test_conversational_prompts_are_accepted_and_rendered_with_the_chat_template(tmp_path, random_model_dir):
    from transformers import AutoTokenizer

    path = write_jsonl(tmp_path / "c.jsonl", [{"prompt": CONVERSATION, "solution": "2"},
                                              {"prompt": CONVERSATION[1:], "solution": "3"}])
    task = build_jsonl(path, path, answer_column="solution")
    assert task.train[0].prompt == CONVERSATION and task.train[0].columns == {"solution": "2"}
    tokenizer = AutoTokenizer.from_pretrained(random_model_dir)
    with pytest.raises(ValueError, match="chat_template: a prompt is a conversation.*the model's tokenizer has none"):
        prepare_split(task.train, tokenizer, system_prompt="", use_chat_template=True, max_prompt_tokens=100)
    tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                               "{% if add_generation_prompt %}<assistant>{% endif %}")
    with pytest.raises(ValueError, match="chat_template is false"):
        prepare_split(task.train, tokenizer, system_prompt="", use_chat_template=False, max_prompt_tokens=100)
    split = prepare_split(task.train, tokenizer, system_prompt="Sys.", use_chat_template=True, max_prompt_tokens=100)
    assert split.prompts == ["<system>Be brief.<user>What is 1 + 1?<assistant>",  # its own system message wins
                             "<system>Sys.<user>What is 1 + 1?<assistant>"]
    assert split.chat
    assert split.reward_prompts == [CONVERSATION, [{"role": "system", "content": "Sys."}] + CONVERSATION[1:]]


@pytest.mark.parametrize("prompt", [[], [{"content": "no role"}], ["text"], 5])
def test_malformed_conversations_name_file_and_line(tmp_path, prompt):
    path = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "fine", "answer": 1}, {"prompt": prompt, "answer": 1}])
    with pytest.raises(ValueError, match=r"train_data: .*c\.jsonl line 2: column 'prompt' is neither text nor a list"):
        build_jsonl(path, "")
