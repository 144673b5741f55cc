"""Training runs: ``train(cfg)`` and its parts. The run folder and its commands are
:mod:`podsrl.run_folder`; the trainer's half of generation (prompt source, partial rollouts, early
stop, pruning) is :mod:`podsrl.generation`.

- :mod:`~podsrl.trainer.config`: the run's configuration (``Config``), composed of the options
  each stage and job declares beside its reader; ``validate`` and the YAML / command-line parsing
- :mod:`~podsrl.trainer.training`: ``train(cfg)``: set-up, then the loop
- :mod:`~podsrl.trainer.loop`: the loop and one step of the pipeline (it reads no config)
- :mod:`~podsrl.trainer.stages`: the step's stages, bound to the config at set-up
- :mod:`~podsrl.trainer.setup`: Config -> the run, each stage, job and hook built with what it
  reads; :mod:`~podsrl.trainer.fits`: the bounds no constant gives (split size, model width, memory)
- :mod:`~podsrl.trainer.run`: the run: starting or resuming, a step's timing, finishing
- :mod:`~podsrl.trainer.jobs`: the jobs the loop calls around each step (evaluate, log, checkpoint)
- :mod:`~podsrl.trainer.hooks`: step hooks (``StepHook``), what sees a finished step besides the jobs
- :mod:`~podsrl.trainer.state`: what a checkpoint restores besides the weights (the learned
  parts, the counters), rollout seeds
- :mod:`~podsrl.trainer.stops`: the signals, where a run stops before its end (abandoned steps,
  held-back evaluations) and the line it ends with
- :mod:`~podsrl.trainer.limits`: when the run ends or gives up (max_steps, max_minutes,
  max_consecutive_skips)
- :mod:`~podsrl.trainer.checkpoints`: checkpoint files (crash-safe, all-or-nothing) and when
  one is due
- :mod:`~podsrl.trainer.logging`: step records, metrics.jsonl, progress;
  :mod:`~podsrl.trainer.timer`: seconds per stage
- :mod:`~podsrl.trainer.evaluate`: held-out evaluation (training and ``podsrl eval``)
- :mod:`~podsrl.trainer.cores`: how many threads torch runs on (the cores others leave free)
"""

import importlib

# imported on first use: the run folder's modules read the checkpoints' file names and the config
# (podsrl.trainer.checkpoints, .config) without importing the run, which imports them
_PUBLIC = {"RunResult": "podsrl.trainer.run", "TrainingStopped": "podsrl.trainer.stops",
           "train": "podsrl.trainer.training"}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'podsrl.trainer' has no attribute {name!r}")


__all__ = ["RunResult", "TrainingStopped", "train"]
