"""Training runs: ``train(cfg)`` and its parts.

- :mod:`~podsrl.trainer.config`: the run's configuration (``Config``), composed of the options
  each stage and job declares beside its reader; ``validate`` and the YAML / command-line parsing
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

from podsrl.trainer.run import RunResult
from podsrl.trainer.stops import TrainingStopped
from podsrl.trainer.training import train

__all__ = ["RunResult", "TrainingStopped", "train"]
