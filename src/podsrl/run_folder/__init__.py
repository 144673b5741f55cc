"""The run folder and the commands that read it.

- :mod:`~podsrl.run_folder.claim`: which folders a run may write into, the lock a run holds on
  its folder, and resume's check that the config still describes the checkpoint
- :mod:`~podsrl.run_folder.ownership`: what podsrl may remove: proofs, by a file's content, that
  podsrl wrote it
- :mod:`~podsrl.run_folder.eval_command`: ``podsrl eval``, a model's held-out accuracy written
  beside earlier evals
- :mod:`~podsrl.run_folder.export`: ``podsrl export``, a run as a standalone Hugging Face folder
  (:mod:`~podsrl.run_folder.run_info` reads the run's files, :mod:`~podsrl.run_folder.model_card`
  writes its card)
"""
