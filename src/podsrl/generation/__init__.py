"""The trainer's half of a step's generation: where the step's prompt groups come from, and the
features that watch or carry generation across steps. The engines' half is :mod:`podsrl.rollout`.

- :mod:`~podsrl.generation.prompt_source`: the step's prompt groups, asked of the prompt selector,
  generated and scored (``dynamic_sampling`` rounds)
- :mod:`~podsrl.generation.partial_rollouts`: partial rollouts' carry-over between steps (the
  engines' half: :mod:`podsrl.rollout.partial`)
- :mod:`~podsrl.generation.saturation`: early stop of saturated groups, a watcher of kind
  ``stop_groups``
- :mod:`~podsrl.generation.pruning`: quota-aware pruning of running rollouts, a watcher of kind
  ``prune_running`` (the engines' half: :mod:`podsrl.rollout.running_watch`)
"""
