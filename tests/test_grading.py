"""Answer extraction, grading and reward functions (CPU only, no model)."""

import importlib.util
import threading
from pathlib import Path

import pytest

from podsrl.rewards import grading
from podsrl.rewards.functions import gsm8k_correct, math_correct, think_answer_format_soft, think_answer_format_strict
from podsrl.rewards.grading import extract_final_answer, grade, gsm8k_gold, last_boxed, math_gold, normalize_number

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


# --- extraction ---------------------------------------------------------------------------

@pytest.mark.parametrize("completion, expected", [
    ("so \\boxed{\\frac{1}{\\sqrt{2}}} is it", "\\frac{1}{\\sqrt{2}}"),
    ("\\boxed{1} then \\boxed{2}", "2"),
    ("\\boxed {7}", "7"),
    ("\\fbox{8}", "8"),
    ("\\boxed{\\boxed{3}}", "3"),
    ("good \\boxed{4} then cut off \\boxed{\\frac{1}{", "4"),
    ("<answer>12</answer> ... <answer> 13 </answer>", "13"),
    ("<answer>so \\boxed{5} and \\boxed{6}</answer>", "6"),
    ("\\boxed{9} <answer>10</answer>", "10"),
    ("<answer>x</answer> unfinished <answer>11", "x"),
    ("16 - 3 - 4 = <<16-3-4=9>>9 eggs\n#### 18", "18"),
    ("It went from 3 to -4", "-4"),
    ("between 3-4 hours", "4"),
    ("it costs $1,234,567.", "1,234,567"),
    ("half: 3/4 of it", "3/4"),
    ("cooled to −5 °C", "-5"),
    ("πr² where r = 2.5 — ≈ 19.6", "19.6"),
    ("value .5", ".5"),
])
def test_extract_final_answer(completion, expected):
    assert extract_final_answer(completion) == expected


@pytest.mark.parametrize("completion", ["", "no numbers at all", "<answer>  </answer> 42", "\\boxed{}",
                                        "version v2 of x3"])
def test_extract_nothing(completion):
    assert extract_final_answer(completion) is None


def test_last_boxed_nested_and_missing():
    assert last_boxed("a \\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.") == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert last_boxed("nothing here") is None
    assert last_boxed("\\boxed{unclosed") is None


@pytest.mark.parametrize("text, expected", [
    ("1,000", "1000"), ("$18", "18"), ("€5", "5"), ("18.", "18"), ("10%", "10"), ("\\$18.90", "18.90"),
    ("30^\\circ", "30"), ("30^{\\circ}", "30"), ("\\frac{1}{2}", "1/2"), ("-\\dfrac{3}{8}", "-3/8"),
    ("\\frac43", "4/3"), ("1\\frac{4}{5}", "9/5"), ("10,\\!080", "10080"), ("5.4 \\text{ cents}", "5.4"),
    ("6.72\\times10^{-5}", "6.72e-5"), ("2k", None), ("x+1", None),
])
def test_normalize_number(text, expected):
    out = normalize_number(text)
    assert (out.replace(",", "") if out is not None else None) == expected


def test_normalize_number_gsm8k_words_only_for_gsm8k():
    assert normalize_number("18 dollars", "gsm8k") == "18"
    assert normalize_number("2*9 = 18", "gsm8k") == "18"
    assert normalize_number("18 dollars", "math") is None


# --- grading ------------------------------------------------------------------------------

@pytest.mark.parametrize("completion, gold, task, expected", [
    # gsm8k: numbers with decoration
    ("#### 18", "18", "gsm8k", True),
    ("<answer>17</answer>", "18", "gsm8k", False),
    ("<answer>$1,000</answer>", "1,000", "gsm8k", True),
    ("<answer>1000</answer>", "1,000", "gsm8k", True),
    ("<answer>€5</answer>", "5", "gsm8k", True),
    ("<answer>18 dollars</answer>", "18", "gsm8k", True),
    ("<answer>5 cm</answer>", "5", "gsm8k", True),
    ("<answer>10%</answer>", "10", "gsm8k", True),
    ("The total is $18.", "18", "gsm8k", True),
    ("<answer>The answer is 18.</answer>", "18", "gsm8k", True),
    ("<answer>2*9 = 18</answer>", "18", "gsm8k", True),
    ("<answer>18.0</answer>", "18", "gsm8k", True),
    ("<answer>-3</answer>", "-3", "gsm8k", True),
    ("<answer>3</answer>", "-3", "gsm8k", False),
    ("<answer>\\frac{36}{2}</answer>", "18", "gsm8k", True),
    ("no number at all", "5", "gsm8k", False),
    ("", "5", "gsm8k", False),
    # math: fractions, decimals, radicals, pi
    ("\\boxed{0.5}", "\\frac{1}{2}", "math", True),
    ("\\boxed{1/2}", "\\dfrac{1}{2}", "math", True),
    ("\\boxed{\\frac12}", "0.5", "math", True),
    ("\\boxed{0.3333333}", "\\frac13", "math", True),
    ("\\boxed{0.33}", "\\frac13", "math", False),
    ("\\boxed{1.8}", "1\\frac{4}{5}", "math", True),
    ("\\boxed{4/5}", "1\\frac{4}{5}", "math", False),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{\\sqrt2}{2}", "math", True),
    ("\\boxed{\\frac{1}{\\sqrt{3}}}", "\\frac{\\sqrt2}{2}", "math", False),
    ("\\boxed{2\\pi}", "2\\pi", "math", True),
    ("\\boxed{\\pi \\cdot 2}", "2\\pi", "math", True),
    ("\\boxed{6.28}", "2\\pi", "math", False),
    ("\\boxed{-\\frac{3}{8}}", "-\\frac{3}{8}", "math", True),
    ("\\boxed{\\frac{3}{8}}", "-\\frac{3}{8}", "math", False),
    # degrees, percentages, units, thousands separators
    ("\\boxed{30}", "30^\\circ", "math", True),
    ("\\boxed{30^{\\circ}}", "30", "math", True),
    ("\\boxed{30°}", "30^\\circ", "math", True),
    ("\\boxed{10080}", "10,\\!080", "math", True),
    ("\\boxed{32348}", "\\$32,\\!348", "math", True),
    ("\\boxed{864 \\text{ square inches}}", "864 \\mbox{ inches}^2", "math", True),
    # intervals, tuples, sets, equations, matrices
    ("\\boxed{(-\\infty,3]}", "(-\\infty, 3]", "math", True),
    ("\\boxed{(-\\infty,3)}", "(-\\infty, 3]", "math", False),
    ("\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)", "math", True),
    ("\\boxed{(\\pi/2, 3)}", "\\left( 3, \\frac{\\pi}{2} \\right)", "math", False),
    ("\\boxed{-2, 1}", "1,-2", "math", True),
    ("\\boxed{1}", "1,-2", "math", False),
    ("\\boxed{x = 5}", "5", "math", True),
    ("\\boxed{5}", "x=5", "math", True),
    ("\\boxed{0}", "5x - 7y + 11z + 4 = 0", "math", False),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", "math", True),
    ("\\boxed{2}", "2k", "math", False),
    ("\\boxed{-q+p}", "p - q", "math", True),
    ("\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "math", True),
    # word answers and multiple choice
    ("\\boxed{\\text{Monday}}", "Monday", "math", True),
    ("<answer>monday.</answer>", "\\text{Monday}", "math", True),
    ("<answer>Tuesday</answer>", "\\text{Monday}", "math", False),
    ("\\boxed{Nevely}", "\\text{Evelyn}", "math", False),  # sympy alone would say E*v*e*l*y*n == it
    ("\\boxed{C}", "\\text{(C)}", "math", True),
    ("\\boxed{(D)}", "\\text{(C)}", "math", False),
    # malformed answers
    ("\\boxed{1/0}", "1", "math", False),
    ("\\boxed{\\frac{1}{2}", "0.5", "math", False),
    ("\\boxed{)(}", "1", "math", False),
])
def test_grade(completion, gold, task, expected):
    assert grade(completion, gold, task) is expected


def test_grade_bad_task():
    with pytest.raises(ValueError, match="task"):
        grade("\\boxed{1}", "1", "aime")


def run_with_hang_guard(fn, seconds=120):
    """fn() in a thread; fails only if it has not returned after ``seconds`` (a hang or an
    exponential blow-up, not a timing: a linear pass over these inputs takes milliseconds)."""
    results = []
    worker = threading.Thread(target=lambda: results.append(fn()), daemon=True)
    worker.start()
    worker.join(timeout=seconds)
    assert results, f"no result after {seconds} s"
    return results[0]


def test_long_and_unicode_input_is_bounded_before_math_verify(monkeypatch):
    import math_verify

    seen = []
    real_parse = math_verify.parse

    def recording_parse(text, *args, **kwargs):
        seen.append(len(text))
        return real_parse(text, *args, **kwargs)

    monkeypatch.setattr(math_verify, "parse", recording_parse)
    think = "<think>" + "é→ 12 + 3 = 15, π ≈ 3.14. " * 4000 + "</think>"
    cases = [
        (think + "<answer>\\boxed{42}</answer>", True),
        (think + "so the answer is 42", True),
        (think + "<answer>" + "a " * 50_000 + "</answer>", False),
        ("\\boxed{" * 20_000, False),
        ("9" * 100_000, False),
        (think + "<answer>" + "x+" * 40_000 + "1</answer>", False),  # a huge expression
        (think + "<answer>\\sqrt{1764}</answer>", True),  # needs math_verify
    ]
    for completion, expected in cases:
        assert len(completion) >= 80_000
        assert run_with_hang_guard(lambda: (grade(completion, "42", "math"), grade(completion, "42", "gsm8k"))) \
            == (expected, expected)
    # math_verify (sympy) only ever sees bounded strings: the wrapper adds \\boxed{}
    assert seen and all(length <= grading.MAX_VERIFY_CHARS + len("\\boxed{}") for length in seen)


def test_power_tower_rejected_without_sympy(monkeypatch):
    import math_verify

    calls = []  # (the grader swallows exceptions from math_verify, so record instead of raising)
    monkeypatch.setattr(math_verify, "parse", lambda *args, **kwargs: calls.append(args) or [])
    monkeypatch.setattr(math_verify, "verify", lambda *args, **kwargs: calls.append(args) or False)
    assert grade("\\boxed{9^{9^{9^{9}}}}", "3", "math") is False
    assert grade("\\boxed{2**3**4**5}", "3", "math") is False
    assert calls == []  # sympy would try to evaluate the tower
    assert grade("\\boxed{x^2+2x+1}", "3", "math") is False and calls  # an ordinary expression does go there


def test_math_verify_errors_and_timeouts_are_false(monkeypatch):
    import math_verify
    from math_verify.errors import TimeoutException

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    def slow(*args, **kwargs):
        raise TimeoutException("timed out")

    for failure in (boom, slow):
        monkeypatch.setattr(math_verify, "verify", failure)
        assert grade("\\boxed{x^2+2x+1}", "(x+1)^2", "math") is False
        assert grade("\\boxed{5}", "5", "math") is True  # fast paths do not need math_verify


def test_grade_from_worker_thread():
    results = []
    worker = threading.Thread(target=lambda: results.append(
        (grade("\\boxed{\\sqrt{2}/2}", "\\frac{1}{\\sqrt{2}}", "math"),
         grade("\\boxed{\\sqrt{3}/2}", "\\frac{1}{\\sqrt{2}}", "math"))))
    worker.start()
    worker.join(timeout=30)
    assert results == [(True, False)]


def test_gold_helpers():
    assert gsm8k_gold("He pays 2*500=<<2*500=1000>>1,000.\n#### 1,000") == "1,000"
    assert math_gold({"answer": "\\frac{1}{2}", "solution": "\\boxed{0.5}"}) == "\\frac{1}{2}"
    assert math_gold({"answer": "", "solution": "so $\\boxed{\\frac{a}{\\sqrt{b}}}$."}) == "\\frac{a}{\\sqrt{b}}"
    with pytest.raises(ValueError):
        math_gold({"solution": "no box"})


# --- reward functions ---------------------------------------------------------------------

def test_format_rewards():
    completions = [
        "<think>reason</think>\n<answer>5</answer>",
        "  <think>a\nb</think><answer>5</answer>\n",
        "<think>reason</think> text <answer>5</answer>",
        "<think>x</think><answer>5</answer> trailing",
        "<think>x</think><answer>5</answer><answer>6</answer>",
        "<think><think>x</think><answer>5</answer>",
        "<answer>5</answer>",
        "prefix <answer>5</answer> suffix",
        "<answer>5",
        "",
    ]
    assert think_answer_format_strict([None] * 10, completions) == [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    assert think_answer_format_soft([None] * 10, completions) == [1, 1, 1, 1, 1, 1, 1, 1, 0, 0]


def test_correctness_rewards_accept_strings_and_conversations():
    completions = [
        "<answer>18</answer>",
        [{"role": "assistant", "content": "<answer>17</answer>"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "#### 1,000"}],
        [{"role": "assistant", "content": [{"type": "text", "text": "\\boxed{18}"}]}],
    ]
    assert gsm8k_correct(["p"] * 4, completions, answer=["18", "18", "1,000", "18"], extra=[0] * 4) == \
        [1.0, 0.0, 1.0, 1.0]
    assert math_correct(["p", "p"], ["\\boxed{\\frac{1}{2}}", [{"role": "assistant", "content": "\\boxed{2}"}]],
                        answer=["0.5", "0.5"]) == [1.0, 0.0]
    conversation = [[{"role": "assistant", "content": "<think>a</think><answer>1</answer>"}]]
    assert think_answer_format_strict(["p"], conversation) == [1.0]


# --- acceptance check on real data (a sample; the full run is benchmarks/grade_check.py) ---

@pytest.mark.skipif(not (DATA / "gsm8k" / "test.jsonl").is_file() or not (DATA / "math500" / "test.jsonl").is_file(),
                    reason=f"reference data not found at {DATA} (gsm8k/test.jsonl, math500/test.jsonl)")
@pytest.mark.slow
def test_acceptance_sample_on_real_data():
    spec = importlib.util.spec_from_file_location("grade_check", REPO / "benchmarks" / "grade_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    for task, limit in (("gsm8k", 150), ("math", 100)):
        result = check.check(task, check.items(DATA, task), limit=limit)
        assert result["self_pct"] >= 99.0, (task, result["self_fail"])
        assert result["cross_pct"] >= 97.0, (task, result["cross_fail"])
        assert result["cross_checked"] >= 0.9 * limit


def test_module_constants_are_sane():
    assert grading.PARSE_TIMEOUT_S > 0 and grading.VERIFY_TIMEOUT_S > 0
    assert grading.GRADED_TASKS == ("gsm8k", "math")
