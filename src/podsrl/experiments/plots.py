"""Accuracy vs training time plots (training time excludes evaluation, as the paper plots)."""

from __future__ import annotations

from pathlib import Path

from podsrl.experiments.runs import evaluated_record
from podsrl.metrics import read_metrics


def plot_accuracy(run_dirs: list[Path], output: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for run_dir in run_dirs:
        records = [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if evaluated_record(r)]
        label = Path(run_dir).name
        minutes = [r["train_seconds"] / 60 for r in records]
        ax.plot(minutes, [100 * r["eval_accuracy"] for r in records], marker="o", label=f"{label} sampled")
        greedy = [(t, 100 * r["eval_greedy_accuracy"]) for t, r in zip(minutes, records)
                  if r.get("eval_greedy_accuracy") is not None]
        if greedy:
            ax.plot(*zip(*greedy), linestyle="--", marker=".", alpha=0.7, label=f"{label} greedy")
    save_accuracy_figure(fig, ax, output, title or "held-out accuracy vs training time")
    return output


def save_accuracy_figure(fig, ax, output, title: str) -> None:
    """The shared look of accuracy-vs-training-time figures (single runs and comparisons); ``output``: a
    path or a binary file."""
    import matplotlib.pyplot as plt

    ax.set_xlabel("training time (minutes, evaluation excluded)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(output, format="png", dpi=120)
    plt.close(fig)
