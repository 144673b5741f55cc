"""Training runs: ``train(cfg)`` and its parts.

- :mod:`~podsrl.trainer.training`: ``train(cfg)``: set-up, then the loop
- :mod:`~podsrl.trainer.loop`: the loop and one step of the pipeline (it reads no config)
- :mod:`~podsrl.trainer.stages`: the step's stages, bound to the config at set-up;
  :mod:`~podsrl.trainer.prompt_source`: the step's prompt groups, generated and scored
- :mod:`~podsrl.trainer.setup`: Config -> the stages and the run's components
- :mod:`~podsrl.trainer.run`: the run's bookkeeping (evaluate, resume, checkpoint, finish)
- :mod:`~podsrl.trainer.state`: what a checkpoint restores besides the weights (the learned
  parts, the counters), rollout seeds
- :mod:`~podsrl.trainer.stops`: where a run stops before its end (signals, abandoned steps,
  held-back evaluations) and the line it ends with
- :mod:`~podsrl.trainer.limits`: when the run ends or gives up (max_steps, max_minutes,
  max_consecutive_skips)
- :mod:`~podsrl.trainer.checkpoints`: checkpoint files (crash-safe, all-or-nothing) and when
  one is due
- :mod:`~podsrl.trainer.logging`: step records, metrics.jsonl, timers, progress
- :mod:`~podsrl.trainer.evaluate`: held-out evaluation (training and ``podsrl eval``, whose files
  are :mod:`~podsrl.trainer.eval_command`'s)
- :mod:`~podsrl.trainer.export`: ``podsrl export``, a run as a standalone Hugging Face folder
  (:mod:`~podsrl.trainer.run_info` reads the run's files, :mod:`~podsrl.trainer.model_card` writes its card)
"""

import importlib

__all__ = ["RunResult", "TrainingStopped", "train"]
_HOMES = {"RunResult": "podsrl.trainer.run", "TrainingStopped": "podsrl.trainer.stops",
          "train": "podsrl.trainer.training"}


def __getattr__(name: str):
    """``train``, ``RunResult`` and ``TrainingStopped`` on first use (PEP 562): the config
    composes options declared in trainer modules (podsrl.trainer.evaluate), so importing one
    of them must not import the trainer, which imports the config."""
    if name not in _HOMES:
        raise AttributeError(f"module 'podsrl.trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
