"""The economics of a step (docs/reproducing.md, "Will PODS pay here?"; DESIGN.md): what a step
of GRPO m/m, GRPO-GA n and PODS n -> m costs, from three numbers measured on the user's machine,
and the per-step learning PODS then needs to be sooner than each baseline.

A step of P prompts costs ``f + P * (generated * g + trained * t)`` seconds: ``g`` a generated
rollout, ``t`` a trained one, ``f`` what scales with neither (a prefill's fixed part, an optimizer
step, selection). PODS n -> m generates n and trains m a prompt; GRPO-GA n trains all n, GRPO m/m
generates and trains m. PODS reaches a baseline's accuracy levels ``L * r`` times as soon, where
``r`` is the baseline's step seconds over PODS's and ``L`` the per-step learning ratio (the steps
the baseline takes to those levels over the steps PODS takes). The step-cost ratio depends on the
machine; ``L`` does not, and the planner cannot know it: :data:`RECORDED` gives the ratios podsrl
has measured, with their intervals, and the break-even ``L = goal / r`` says what it must reach.
"""

from __future__ import annotations

from dataclasses import dataclass

from podsrl.methods import METHODS

BASELINES = ("grpo", "grpo-ga")  # what PODS is compared with: GRPO m/m, GRPO-GA n


@dataclass(frozen=True)
class StepCosts:
    """Seconds per generated rollout (``generated``, g), per trained rollout (``trained``, t) and
    per step fixed (``fixed``, f), measured at ``prompts`` prompts a step."""

    generated: float
    trained: float
    fixed: float
    prompts: int

    def step_seconds(self, method: str, n: int, m: int) -> float:
        """Predicted seconds of one step of ``method`` with n and m."""
        kind = METHODS[method]
        per_prompt = (kind.generated_per_prompt(n, m) * self.generated
                      + kind.trained_per_prompt(n, m) * self.trained)
        return self.fixed + self.prompts * per_prompt


@dataclass(frozen=True)
class Recorded:
    """A per-step learning ratio podsrl measured (PODS n -> m against ``baseline``, steps to the
    baseline's accuracy levels: above 1, PODS needed fewer), with the per-seed 95% interval."""

    regime: str
    baseline: str
    n: int
    m: int
    ratio: float
    low: float
    high: float
    section: str  # where benchmarks/RESULTS.md records it


# The per-step learning ratios of podsrl's recorded comparisons (benchmarks/RESULTS.md, the
# headline "in steps" column: mean curves, per seed [95% CI]); each is the section's number.
RECORDED = (
    Recorded("main job (tiny, arithmetic)", "grpo", 16, 4, 1.29, 1.19, 1.40,
             "Time to accuracy, interleaved: GRPO 4/4 vs PODS 16 -> 4, 5 seeds x 2 minutes"),
    Recorded("main job (tiny, arithmetic)", "grpo-ga", 16, 4, 0.86, 0.81, 0.92,
             "The paper's second comparison: PODS 16 -> 4 vs GRPO-GA 16 (#51 item 4a)"),
    Recorded("main job (tiny, arithmetic)", "grpo", 64, 16, 1.06, 1.00, 1.12,
             "The paper's first comparison per step: PODS 64 -> 16 vs GRPO 16/16 (#51 item 4b)"),
    Recorded("reasoning (tiny-chain, hf engine)", "grpo", 16, 4, 1.63, 1.05, 3.19,
             "The reasoning regime on the 2-core CPU: GRPO 4/4 vs GRPO-GA 16 vs PODS 16 -> 4 (#58 item 4)"),
    Recorded("reasoning (tiny-chain, at its best)", "grpo-ga", 16, 4, 0.57, 0.34, 0.90,
             "Every method at its best on podsrl's decode step, in the reasoning regime (#70 item 4)"),
    Recorded("reasoning (tiny-chain, at its best and its tuned rate)", "grpo", 16, 4, 1.29, 1.01, 1.64,
             "Each method at its tuned learning rate in the reasoning regime, 5 seeds x 3 minutes "
             "(#81 item 4)"),
    Recorded("reasoning (tiny-chain, at its best and its tuned rate)", "grpo-ga", 16, 4, 0.91, 0.71, 1.16,
             "Each method at its tuned learning rate in the reasoning regime, 5 seeds x 3 minutes "
             "(#81 item 4)"),
)


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares (intercept, slope) of seconds against a count, over ``points`` (count,
    seconds) at two or more distinct counts."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if not spread:
        raise ValueError("fit_line: the points need two different counts")
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    return mean_y - slope * mean_x, slope


@dataclass(frozen=True)
class BreakEven:
    """PODS n -> m against ``baseline`` at these costs: the baseline's step over PODS's
    (``step_ratio``), and the per-step learning PODS needs to be as soon (``for_1x``) and 1.5x
    as soon (``for_1_5x``)."""

    baseline: str
    n: int
    m: int
    step_ratio: float
    for_1x: float
    for_1_5x: float


def break_even(costs: StepCosts, n: int, m: int) -> list[BreakEven]:
    """PODS n -> m against GRPO m/m and GRPO-GA n."""
    pods = costs.step_seconds("pods", n, m)
    out = []
    for baseline in BASELINES:
        ratio = costs.step_seconds(baseline, n, m) / pods
        out.append(BreakEven(baseline, n, m, ratio, 1 / ratio, 1.5 / ratio))
    return out


def grid(n: int, m: int) -> list[tuple[int, int]]:
    """(n, m) pairs around the config's: n halved, as given and doubled, m halved, as given and
    doubled, each with 2 <= m < n."""
    ns = sorted({value for value in (n // 2, n, 2 * n) if value >= 3})
    ms = sorted({value for value in (m // 2, m, 2 * m) if value >= 2})
    return [(a, b) for a in ns for b in ms if b < a]


def recommendation(costs: StepCosts, n: int, m: int) -> str:
    """What the costs and the recorded per-step learning say of PODS n -> m against each
    baseline, with the reason: the break-even against the recorded intervals' span."""
    lines = []
    for row in break_even(costs, n, m):
        recorded = [r for r in RECORDED if r.baseline == row.baseline]
        low, high = min(r.low for r in recorded), max(r.high for r in recorded)
        span = f"recorded intervals against {row.baseline}: {low:.2f}-{high:.2f}x"
        if row.for_1x <= low:
            verdict = f"likely to pay ({span}, all above it)"
        elif row.for_1x > high:
            verdict = f"unlikely to pay ({span}, none reaching it)"
        else:
            verdict = f"depends on your task ({span}): measure it with podsrl compare"
        baseline = METHODS[row.baseline].arm_name(n, m, None)  # 'grpo 4/4', 'grpo-ga 16'
        lines.append(f"against {baseline} PODS {n} -> {m} needs per-step learning >= {row.for_1x:.2f}x to be "
                     f"as soon ({row.for_1_5x:.2f}x for 1.5x): {verdict}")
    return "; ".join(lines)
