"""Experiments over runs: ``podsrl compare``, ``podsrl plot`` and ``podsrl plan``.

- :mod:`~podsrl.experiments.compare`: methods compared as the paper does, held-out accuracy
  against training time; their report (:mod:`~podsrl.experiments.report`,
  :mod:`~podsrl.experiments.plots`) and the report files it may overwrite
  (:mod:`~podsrl.experiments.report_files`)
- :mod:`~podsrl.experiments.runs`: a run folder as comparisons read it; which runs a re-run may
  reuse (:mod:`~podsrl.experiments.reuse`), whether seeds differ in the seed alone
  (:mod:`~podsrl.experiments.seeds`), whether runs share the model's end of turn
  (:mod:`~podsrl.experiments.conversions`), the untimed warm-up (:mod:`~podsrl.experiments.warmup`)
- :mod:`~podsrl.experiments.levels`: a headline no single evaluation can move; one evaluation's
  noise (:mod:`~podsrl.experiments.noise`); small statistics over seeds
  (:mod:`~podsrl.experiments.stats`)
- :mod:`~podsrl.experiments.plan`: ``podsrl plan``, a step's economics measured on the user's
  machine (:mod:`~podsrl.experiments.economics`)
"""
