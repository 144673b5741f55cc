"""An untimed warm-up before a comparison's first timed run (#57).

``podsrl compare`` trains its runs one after another in one process. With
``generation_static_cache`` on a GPU, transformers compiles the decode step the first time it
generates, so the first run to generate pays the compile inside its training-time budget, and
no later run does (on an H200: GRPO's first step took 43.9 s of its 45 s budget with a cold
compile cache, 13.2 s with a warm one; the other arms' first steps 0.2-0.3 s). Before the first
timed run, compare therefore trains one step of the first run that uses the static cache into a
temporary folder of its own (never inside the comparison's folder) and removes it: the process
has compiled by then, so every arm's budget buys training alone. Its curve is not compared, and
nothing of it is kept. Without the static cache nothing compiles, so there is no warm-up.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from podsrl.trainer.config import Config

WARMUP_STEPS = 1  # the first step generates, and so compiles; the update needs no warming


def run_to_warm_up(configs: list[Config]) -> Config | None:
    """The first run compare will train (not reuse) that generates with the static cache, if any."""
    return next((cfg for cfg in configs if cfg.generation_static_cache
                 and not (Path(cfg.output_dir) / "summary.json").exists()), None)


def warm_up(cfg: Config, train: Callable, log: Callable[[str], None] = print) -> None:
    """Train ``WARMUP_STEPS`` of ``cfg`` (its evaluations included: they generate too, through the
    same engine) into a temporary folder, untimed, then remove the folder."""
    folder = Path(tempfile.mkdtemp(prefix="podsrl-warmup-"))
    run = Path(cfg.output_dir)
    log(f"warm-up: {WARMUP_STEPS} untimed training step of {run.parent.name}/{run.name} in {folder} (removed "
        "afterwards): generation_static_cache compiles the decode step on first use, which the first timed "
        "run would otherwise pay inside its budget")
    warm = dataclasses.replace(cfg, output_dir=str(folder / "run"), max_steps=WARMUP_STEPS, max_minutes=0.0,
                               resume=False, save_steps=0, checkpoint_minutes=0.0, report_to="none",
                               log_rollouts=0)
    try:
        train(warm)
    except (ValueError, OSError) as err:
        raise (OSError if isinstance(err, OSError) else ValueError)(
            f"warm-up of {run.parent.name}/{run.name}: {err}") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # podsrl's own folder, made above: nobody else's files

