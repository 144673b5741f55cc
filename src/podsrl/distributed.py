"""Multi-process training: the few collectives the training loop needs, through accelerate.

``podsrl train`` in one process never touches ``torch.distributed``: every method below is
then the identity. Under ``accelerate launch`` (or ``torchrun``; any launcher that sets
WORLD_SIZE > 1) an ``accelerate.Accelerator`` wraps the policy in DDP (FSDP and DeepSpeed
are refused with a clear error: generation needs whole weights, and DeepSpeed steps the
optimizer on every backward, which the micro-batch loop would have to hand over) and:

* each step's prompts are split into contiguous blocks, one per process; every process
  generates, scores and selects its own whole prompt groups (selection never mixes groups
  across processes, as PODS requires: variance is a within-group quantity);
* gradients are averaged by the wrapper; each process normalises its loss so that the
  average equals the loss of the whole batch (token aggregation needs the global token
  count, :meth:`Processes.sum`);
* metrics are computed from tensors gathered over processes, evaluation is split across
  processes and its counts summed, and only the main process writes files.
"""

from __future__ import annotations

import contextlib
import os

import torch


class Processes:
    """The processes of one run (``world_size`` 1 without a launcher)."""

    def __init__(self, accelerator=None) -> None:
        self.accelerator = accelerator
        self.rank = accelerator.process_index if accelerator else 0
        self.world_size = accelerator.num_processes if accelerator else 1
        self.is_main = self.rank == 0

    @classmethod
    def from_env(cls) -> "Processes":
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size == 1:
            return cls()
        from accelerate import Accelerator

        # without a GPU accelerate only forms a process group when told to use the CPU (gloo)
        accelerator = Accelerator(cpu=not torch.cuda.is_available())
        if accelerator.num_processes != world_size:
            raise RuntimeError(f"WORLD_SIZE={world_size} but accelerate formed {accelerator.num_processes} "
                               f"process(es) ({accelerator.distributed_type}); launch with `accelerate launch "
                               f"--config_file configs/accelerate/ddp.yaml` or torchrun")
        kind = str(accelerator.distributed_type)
        if "FSDP" in kind or "DEEPSPEED" in kind:  # generation needs whole weights; ZeRO steps per backward
            raise NotImplementedError(f"{kind}: podsrl supports plain DDP under accelerate so far "
                                      f"(configs/accelerate/ddp.yaml); FSDP and DeepSpeed are not supported yet")
        return cls(accelerator)

    # --- splitting work ---------------------------------------------------------------------
    def block(self, items: list) -> list:
        """This process's contiguous share of ``items`` (their count must divide evenly)."""
        share = len(items) // self.world_size
        return items[self.rank * share:(self.rank + 1) * share]

    def strided(self, items: list) -> list:
        """Every world_size-th item from this process's rank (any count; for evaluation)."""
        return items[self.rank::self.world_size]

    # --- the model ----------------------------------------------------------------------------
    def prepare(self, model, optimizer):
        if self.accelerator is None:
            return model, optimizer
        return self.accelerator.prepare(model, optimizer)

    def unwrap(self, model):
        """The bare model (for generation, no-grad log-probs and saving)."""
        return self.accelerator.unwrap_model(model) if self.accelerator else model

    def no_sync(self, model, last: bool):
        """Skip the gradient all-reduce on all but the last micro-batch of a step."""
        if self.accelerator is None or last:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(model)

    def backward(self, loss: torch.Tensor) -> None:
        if self.accelerator is None:
            loss.backward()
        else:
            self.accelerator.backward(loss)

    def clip_grad_norm(self, model, max_norm: float) -> float:
        if self.accelerator is None:
            params = [p for p in model.parameters() if p.requires_grad]
            return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        return float(self.accelerator.clip_grad_norm_(model.parameters(), max_norm))

    # --- collectives --------------------------------------------------------------------------
    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate equal-shaped tensors of every process along dim 0 (rank order)."""
        return self.accelerator.gather(tensor.contiguous()) if self.accelerator else tensor

    def sum(self, values: list[float]) -> list[float]:
        if self.accelerator is None:
            return values
        return self.accelerator.reduce(torch.tensor(values, dtype=torch.float64), reduction="sum").tolist()

    def max(self, values: list[float]) -> list[float]:
        if self.accelerator is None:
            return values
        gathered = self.accelerator.gather(torch.tensor([values], dtype=torch.float64))  # [W, k]
        return gathered.amax(dim=0).tolist()

    def mean(self, record: dict[str, float]) -> dict[str, float]:
        """Average a dict of per-process scalars over processes."""
        if self.accelerator is None:
            return record
        totals = self.sum([float(v) for v in record.values()])
        return {k: v / self.world_size for k, v in zip(record, totals)}

    def parameter_spread(self, model) -> float:
        """Largest difference across processes of a fingerprint of the parameters (0 = in sync)."""
        if self.accelerator is None:
            return 0.0
        with torch.no_grad():
            params = [p.detach().double() for p in self.unwrap(model).parameters()]
            fingerprint = torch.stack([sum(p.sum() for p in params), sum((p * p).sum() for p in params)])
        gathered = self.accelerator.gather(fingerprint[None])  # [W, 2]
        return float((gathered.amax(0) - gathered.amin(0)).max())

    def barrier(self) -> None:
        if self.accelerator is not None:
            self.accelerator.wait_for_everyone()
