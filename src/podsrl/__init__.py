"""podsrl: reinforcement learning with verifiable rewards built around PODS
(Policy Optimization with Down-Sampling; Xu et al., arXiv 2504.13818).

The packages, from the bottom layer up (docs/architecture.md maps every file):

- :mod:`~podsrl.types`: the data between a step's stages, with its shapes;
  :mod:`~podsrl.registry`: one registration form for every extension kind, held to
  :mod:`~podsrl.contracts`; :mod:`~podsrl.options`: settings declared beside their readers;
  :mod:`~podsrl.interrupts`: stops that reach user code; :mod:`~podsrl.distributed`: the collectives
- :mod:`~podsrl.algorithms`: the algorithm core on tensors with a group axis; :mod:`~podsrl.methods`:
  what each method generates, selects and trains on
- :mod:`~podsrl.models` (built by :mod:`~podsrl.build`, shipped in ``assets``), :mod:`~podsrl.rollout`
  (the engines), :mod:`~podsrl.rewards`, :mod:`~podsrl.tasks`, :mod:`~podsrl.scoring` (the run's
  reward), :mod:`~podsrl.prompt_selection`, :mod:`~podsrl.update` (the update stage)
- :mod:`~podsrl.generation`: the trainer's half of generation; :mod:`~podsrl.trainer`: the run;
  :mod:`~podsrl.run_folder`: the run folder and its commands; :mod:`~podsrl.metrics`: metrics.jsonl;
  :mod:`~podsrl.tracking`: experiment trackers; :mod:`~podsrl.provenance`: where a measurement was taken
- :mod:`~podsrl.config_checks` (validation), :mod:`~podsrl.config_yaml` (YAML files read strictly),
  :mod:`~podsrl.config_layouts` (earlier spellings of settings)
- :mod:`~podsrl.experiments`: ``podsrl compare``, ``plot`` and ``plan``
- :mod:`~podsrl.integrations` (TRL, verl; :mod:`~podsrl.trl` is its TRL module's short name)
- :mod:`~podsrl.cli` (the commands; :mod:`~podsrl.command_options`: their own arguments),
  :mod:`~podsrl.entry` (the ``podsrl`` entry point)
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``podsrl.train(cfg, reward_funcs=...)``, imported on first use so that ``import
    podsrl`` stays light."""
    if name == "train":
        from podsrl.trainer import train

        return train
    raise AttributeError(f"module 'podsrl' has no attribute {name!r}")
