"""What the slots decoder keeps for a watcher of running samples (kind ``prune_running``, #72):
per row, the sum of the last hidden states of the tokens it has fed since the sample took the
row, and the next completion length at which the watcher wants to see the sample.

The watcher's contract (:data:`podsrl.rollout.base.PRUNE_RUNNING`): ``lengths(prompt)`` gives,
ascending, the completion lengths at which it is shown a running sample of that prompt;
``watcher(samples, lengths, features, running)`` is shown the samples that reached one of them
this step, (prompt, sample) each, with their completion lengths and their pooled states [S, D]
(the mean last hidden state over the tokens fed in this call: a sample resumed from an earlier
step pools from its resumption), and every sample running after the step (``running``, pairs),
and returns samples, any of the call's, to stop. The
decoder stops running ones at once: their tokens are dropped, they count as not generated
(``Rollouts.generated``), and their slots go to pending samples. Named samples that have not
started never start (not generated either); a finished one named is left as it is.
"""

from __future__ import annotations

import torch


class RunningWatch:
    """Per-row state [B] of a ``prune_running`` watcher's view, moved with the decoder's rows."""

    def __init__(self, watcher, dim: int, device) -> None:
        self.watcher = watcher
        self.pooled = torch.zeros(0, dim, dtype=torch.float32, device=device)  # [B, D] summed states
        self.fed = torch.zeros(0, dtype=torch.long, device=device)  # [B] states summed
        self.check = torch.zeros(0, dtype=torch.long, device=device)  # [B] next length to show (0: none)
        self.shown = 0  # samples shown, over the call
        self.pruned_samples = 0  # samples it stopped, running or not yet started
        self.pruned_tokens = 0  # tokens the stopped samples had drawn

    def open(self, count: int) -> None:
        self.pooled = torch.cat([self.pooled, self.pooled.new_zeros(count, self.pooled.shape[1])])
        self.fed = torch.cat([self.fed, self.fed.new_zeros(count)])
        self.check = torch.cat([self.check, self.check.new_zeros(count)])

    def next_length(self, prompt: int, length: int) -> int:
        """The first length the watcher asks for past ``length`` (0: none)."""
        return next((k for k in self.watcher.lengths(prompt) if k > length), 0)

    def place(self, rows: list[int], started: list[tuple[int, int, int]]) -> None:
        """Rows taken by samples (prompt, sample, completion length so far)."""
        for row, (prompt, _, length) in zip(rows, started):
            self.pooled[row] = 0
            self.fed[row] = 0
            self.check[row] = self.next_length(prompt, length)

    def reorder(self, index: torch.Tensor) -> None:
        self.pooled, self.fed, self.check = self.pooled[index], self.fed[index], self.check[index]

    def after_step(self, hidden: torch.Tensor, fed: torch.Tensor, length: torch.Tensor,
                   row_sample: list) -> list[tuple[int, int]]:
        """hidden [B, D]: this step's states; fed [B] bool: rows whose sample fed a token and is
        still running after the step; length [B]: completion lengths after the step. -> the
        samples the watcher stops."""
        self.pooled += hidden * fed[:, None]
        self.fed += fed.long()
        due = fed & (length == self.check)  # [B]
        if not bool(due.any()):
            return []
        rows = due.nonzero()[:, 0].tolist()
        for row in rows:
            self.check[row] = self.next_length(row_sample[row][0], int(length[row]))
        features = self.pooled[rows] / self.fed[rows].clamp_min(1)[:, None]  # [S, D]
        self.shown += len(rows)
        running = [owner for owner, on in zip(row_sample, fed.tolist()) if on]
        return list(self.watcher([row_sample[row] for row in rows], length[rows].tolist(), features, running))
