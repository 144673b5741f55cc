"""Answer extraction and grading for GSM8K and MATH(-500).

``grade`` is layered from cheap-and-certain to expensive-and-general so that the common
cases never touch sympy: (1) both sides are plain numbers -> compare as exact fractions;
(2) the gold is a word answer -> loose case-insensitive text compare; (3) the two answers
are the same LaTeX up to presentation -> equal; (4) otherwise ``math_verify`` (sympy),
under its own timeouts, where any error or timeout means "not correct".
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction
from typing import Any

GRADED_TASKS = ("gsm8k", "math")  # the answer styles grade() knows
# math_verify's timeouts are whole seconds of SIGALRM. A few seconds is far above what any
# real MATH answer needs (~1-100 ms) and bounds the damage of a pathological completion.
PARSE_TIMEOUT_S = 3
VERIFY_TIMEOUT_S = 3
# Longer "answers" are run-on text, not answers; sympy on them is slow and never right.
MAX_VERIFY_CHARS = 1000
REL_TOL = 1e-6

_BOX_CMDS = ("\\boxed", "\\fbox")
# A number in free text. The sign only counts when it is not a binary minus ("3-4" is 3 and
# 4, "= -4" is -4); digits glued to a letter or a dot ("x2", "v1.2") are not numbers;
# thousands commas only in well-formed groups so a list "1,2,3" stays three numbers.
_NUM = (r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?(?:\s*/\s*[0-9]+)?"
        r"|\.[0-9]+")
_NUMBER_IN_TEXT = re.compile(rf"(?:(?<![\w.)\]}}])[-+−])?(?<![\w.])(?:{_NUM})")
_PLAIN_NUMBER = re.compile(r"[-+]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]*)?|[-+]?\.[0-9]+")
_FRAC = re.compile(r"(-?)\\frac(?:\{\s*(-?[0-9]+)\s*\}|([0-9]))(?:\{\s*([0-9]+)\s*\}|([0-9]))")
_MIXED = re.compile(r"(-?)([0-9]+)\s*\\frac\{([0-9]+)\}\{([0-9]+)\}")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|textrm|mbox|mathrm)\s*\{([^{}]*)\}")
# Units written as \text{ cm}^2 after a number: presentation, not value.
_TEXT_UNIT = re.compile(r"(?<=[0-9}])\s*\\(?:text|mbox|mathrm)\s*\{\s*[A-Za-z][A-Za-z ]*\}"
                        r"(?:\^\{?[0-9]\}?)?(?=\s*$)")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree|°")
# Answers sympy would evaluate into astronomically large integers (numeric power towers
# "9^{9^{9}}" / "9^9^9", exponents >= 10^6, factorials >= 10^4): no MATH answer looks like
# this, and off the main thread there is no timeout to stop the evaluation. Symbolic
# towers such as e^{x^2} are left alone: sympy keeps them unevaluated.
_HUGE = re.compile(r"\^\s*[{(]?\s*[0-9]+\s*[})]?\s*\^|\^\s*\{?\s*[0-9]{7,}|[0-9]{5,}\s*!")
_SCI = re.compile(r"([-+]?[0-9]*\.?[0-9]+)\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{?\s*([-+]?[0-9]+)\s*\}?")
_WORD_UNITS = re.compile(r"(?:\s+[A-Za-z][A-Za-z\-']*\.?)+(?:\^\{?[0-9]\}?|[²³])?$")


def last_boxed(text: str) -> str | None:
    """Content of the last well-formed ``\\boxed{...}`` / ``\\boxed {...}`` / ``\\fbox{...}``.

    Braces are matched by a scan because answers nest them (``\\frac{1}{\\sqrt{2}}``), which
    no regex handles. A truncated last box (generation cut off) is skipped in favour of the
    previous complete one rather than returning half an answer. Searching backwards with
    ``rfind`` keeps this linear even on very long completions.
    """
    limit = len(text)
    found = {cmd: text.rfind(cmd) for cmd in _BOX_CMDS}
    while True:
        cmd = max(found, key=found.__getitem__)
        start = found[cmd]
        if start < 0:
            return None
        i = start + len(cmd)
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, limit):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1:j].strip()
            # Never closed, so no earlier box can close after this point either: bounding
            # later scans here keeps "\boxed{" * 10_000 linear instead of quadratic.
            limit = start
        found[cmd] = text.rfind(cmd, 0, start)


def extract_final_answer(completion: str) -> str | None:
    """The model's final answer: last ``<answer>`` block, else last box, else last number.

    The answer block wins because it is the format we ask for; a box inside it is the more
    specific answer (``<answer>so \\boxed{5}</answer>``). An *empty* answer block returns None
    instead of falling back to numbers in the reasoning: the model explicitly answered
    nothing. The last-number fallback is the GSM8K convention (its gold solutions end with
    ``#### N``, whose N is the last number of the text).
    """
    if not completion:
        return None
    close = completion.rfind("</answer>")
    open_ = completion.rfind("<answer>", 0, close) if close >= 0 else -1
    if open_ >= 0:
        content = completion[open_ + len("<answer>"):close].strip()
        boxed = last_boxed(content)
        return (boxed if boxed is not None else content) or None
    boxed = last_boxed(completion)
    if boxed is not None:  # an empty box is an explicit non-answer, like an empty block
        return boxed or None
    last = None
    for last in _NUMBER_IN_TEXT.finditer(completion):
        pass
    return re.sub(r"\s+", "", last.group(0)).replace("−", "-") if last else None


def _strip_wrappers(s: str) -> str:
    """Remove presentation shared by both graders: math delimiters, spacing, \\left/\\right."""
    s = s.strip().replace("−", "-").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r",\\!\s*", ",", s)
    s = re.sub(r"\\[!,;: ]|\\left|\\right|\\displaystyle|~", " ", s)
    s = s.replace("\\$", "").replace("$", "").strip()
    return s.rstrip(".").strip()


def normalize_number(text: str, task: str = "math") -> str | None:
    """Reduce a number with GSM8K/MATH decoration to a plain numeral (or a/b), else None.

    Strips currency, percent (``10%`` counts as 10: the answer is the number the question
    asks for, in its unit), degrees, ``\\text{}`` units and trailing periods. For ``gsm8k``
    bare trailing words ("18 dollars") and a left-hand side ("2*9 = 18") go too; for
    ``math`` they do not, because there "2k" or "x+1 = 0" are the answer itself.
    """
    if len(text) > MAX_VERIFY_CHARS:  # not a number; also keeps the regexes below linear
        return None
    s = _strip_wrappers(text)
    s = _TEXT_UNIT.sub("", s)
    s = _DEGREES.sub("", s)
    s = re.sub(r"\\?%|\s*percent$", "", s)
    s = re.sub(r"^[A-Za-z]\s*=\s*", "", s)  # x = 5
    if task == "gsm8k":
        s = s.rsplit("=", 1)[-1]
        s = _WORD_UNITS.sub("", _TEXT_CMD.sub(r" \1", s))
    s = re.sub(r"^([-+]?)\s*(?:USD|US\$|[€£¥₹])", r"\1", s.strip()).strip().rstrip(".").strip()
    s = re.sub(r"^\{(.*)\}$", r"\1", s)
    if _PLAIN_NUMBER.fullmatch(s) or re.fullmatch(r"-?[0-9]+\s*/\s*[0-9]+", s):
        return re.sub(r"\s+", "", s)
    sci = _SCI.fullmatch(s) or (task == "gsm8k"
                                and re.fullmatch(r"([-+]?[0-9]*\.?[0-9]+)[eE]([-+]?[0-9]+)", s))
    if sci:  # 6.72\times10^{-5}; bare "1e-3" only for gsm8k, in MATH "2e-1" may mean 2e - 1
        return f"{sci.group(1)}e{sci.group(2)}"
    mixed = _MIXED.fullmatch(s)
    if mixed:  # 1\frac{4}{5} is 1 + 4/5, not 1 * 4/5
        sign, whole, num, den = mixed.groups()
        return f"{sign}{int(whole) * int(den) + int(num)}/{den}"
    frac = _FRAC.fullmatch(s)
    if frac:
        sign, n1, n2, d1, d2 = frac.groups()
        num = (n1 or n2).lstrip("-")
        neg = (sign == "-") != ((n1 or "").startswith("-"))
        return f"{'-' if neg else ''}{num}/{d1 or d2}"
    return None


def _to_fraction(numeral: str) -> tuple[Fraction, bool] | None:
    """Exact value and whether it is an integer literal (compared exactly, never with tolerance)."""
    try:
        value = Fraction(numeral.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None
    return value, re.fullmatch(r"[-+]?[0-9,]+", numeral) is not None


def _numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    """Exact for integers; 1e-6 relative for decimals/fractions (0.3333333 = 1/3, 0.33 != 1/3)."""
    (x, x_int), (y, y_int) = a, b
    if x == y or (x_int and y_int):
        return x == y
    return abs(x - y) <= REL_TOL * max(abs(x), abs(y))


def _as_text(s: str, allow_single_letter: bool) -> str | None:
    """Lower-cased word answer (``\\text{Monday}``, ``(C)``, ``east``), else None.

    Bare single letters ("p q") are variables, not words, unless wrapped in ``\\text``/
    parentheses or the gold already told us the answer is a word/choice
    (``allow_single_letter``). No operators allowed, so "p - q" stays maths.
    """
    had_text = bool(_TEXT_CMD.search(s))
    t = _TEXT_CMD.sub(r"\1", _strip_wrappers(s)).strip().rstrip(".").strip()
    if not re.fullmatch(r"\(?[A-Za-z][A-Za-z ']*\)?", t):
        return None
    if not (had_text or allow_single_letter or t.startswith("(") or re.search(r"[A-Za-z]{2}", t)):
        return None
    return re.sub(r"[\s()]", "", t).lower()


def _canonical_latex(s: str) -> str:
    """Presentation-free LaTeX for an exact string compare: whitespace, delimiters, units."""
    s = _DEGREES.sub("", _TEXT_UNIT.sub("", _strip_wrappers(s)))
    return re.sub(r"\s+", "", s).replace("\\%", "%")


def _math_verify_equal(pred: str, gold: str) -> bool:
    """math_verify's verdict; False on any error, timeout or an unparseable side.

    Both sides are wrapped in ``\\boxed{}`` so math_verify takes the whole string as the
    answer instead of hunting for anchors inside it. Its timeouts use ``signal.alarm``,
    which raises in any thread but the main one, so off the main thread they are disabled
    (bounded instead by ``MAX_VERIFY_CHARS``).
    """
    if len(pred) > MAX_VERIFY_CHARS or _HUGE.search(pred.replace("**", "^")):
        return False
    try:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
        from math_verify.errors import TimeoutException
    except ImportError as err:  # a grader that silently returns False would hide this
        raise ImportError("grading MATH answers needs `pip install math-verify`") from err
    main = threading.current_thread() is threading.main_thread()
    parse_t, verify_t = (PARSE_TIMEOUT_S, VERIFY_TIMEOUT_S) if main else (None, None)
    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    try:
        parsed = []
        for text in (gold, pred):
            value = parse(f"\\boxed{{{text}}}", extraction_config=config, parsing_timeout=parse_t)
            if not value:  # e.g. plain text with anchors: let math_verify look for them
                value = parse(text, extraction_config=config, parsing_timeout=parse_t)
            parsed.append(value)
        return bool(parsed[0] and parsed[1]
                    and verify(parsed[0], parsed[1], timeout_seconds=verify_t))
    except (Exception, TimeoutException):
        return False


def answers_equal(pred: str, gold: str, task: str) -> bool:
    """Whether an already-extracted answer equals the gold (see module docstring for the order)."""
    if task not in GRADED_TASKS:
        raise ValueError(f"unknown task {task!r}: expected one of {GRADED_TASKS}")
    p_num, g_num = normalize_number(pred, task), normalize_number(gold, task)
    if p_num is not None and g_num is not None:
        p_val, g_val = _to_fraction(p_num), _to_fraction(g_num)
        if p_val is not None and g_val is not None:
            return _numbers_equal(p_val, g_val)
    gold_text = _as_text(gold, allow_single_letter=False)
    if gold_text is not None:  # sympy would read "Evelyn" as E*v*e*l*y*n, equal to "Nevely"
        return _as_text(pred, allow_single_letter=True) == gold_text
    if _canonical_latex(pred) == _canonical_latex(gold):
        return True
    return _math_verify_equal(pred, gold)


def grade(completion: str, gold: str, task: str) -> bool:
    """True when the completion's final answer equals ``gold`` mathematically.

    Deterministic for a given input (no sampling; only a math_verify timeout, i.e. a
    pathological answer on an overloaded machine, can flip a verdict, and only to False).
    """
    if task not in GRADED_TASKS:
        raise ValueError(f"unknown task {task!r}: expected one of {GRADED_TASKS}")
    pred = extract_final_answer(completion or "")
    if pred is None or not gold or not gold.strip():
        return False
    return answers_equal(pred, gold, task)


def gsm8k_gold(answer_field: str) -> str:
    """Text after the last ``####``; commas kept as written since grading handles them."""
    return answer_field.rsplit("####", 1)[-1].strip()


def math_gold(example: dict[str, Any]) -> str:
    """The ``answer`` field (MATH-500), else the last box of ``solution`` (original MATH)."""
    answer = example.get("answer")
    if isinstance(answer, str) and answer.strip():
        return answer.strip()
    boxed = last_boxed(example.get("solution") or "")
    if boxed is None:
        raise ValueError("example has no `answer` and no \\boxed{} in `solution`")
    return boxed
