"""PODS inside other engines' trainers, side by side: each integration keeps its engine's
generation, distribution and logging and calls podsrl's one selection core
(:func:`podsrl.algorithms.select.select`) and one statistics function
(:func:`podsrl.algorithms.group_stats.group_stats`), so a rule or a metric means the same in
every engine. Each module imports its engine (an optional dependency) only when imported.

* :mod:`podsrl.integrations.trl`: ``PODSTrainer`` / ``PODSConfig`` for TRL's ``GRPOTrainer``
  (also importable as ``podsrl.trl``).
* :mod:`podsrl.integrations.verl`: ``PODSReplayBuffer`` for verl's v1 trainer, over
  :mod:`podsrl.integrations.verl_core` (the kept sessions and verl's batch arithmetic, which
  need no verl).
"""
