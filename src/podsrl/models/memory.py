"""What the update costs in memory: the measure behind the paper's memory argument (PODS
trains on m rollouts per prompt where GRPO-GA trains on all n, Xu et al. 2025, sec. 3).

Two numbers per update, both in MiB:
- ``activation_mb``: the bytes of the tensors autograd saves for backward in one
  micro-batch's forward pass (parameters excluded, each storage counted once), the largest
  over the step's micro-batches. It is what grows with the rows trained at once and what
  gradient accumulation bounds; it is exact and the same on every device, so CPU runs
  report it too.
- ``peak_cuda_mb``: the CUDA allocator's peak during the update (weights, gradients,
  optimizer state and activations together); NaN off CUDA.
"""

from __future__ import annotations

import contextlib

import torch

MIB = 2 ** 20


def storage_of(tensor: torch.Tensor) -> tuple[int, int] | None:
    """(address, bytes) of the memory under ``tensor``; None where it has none to count: a
    storage FSDP freed after gathering, or a tensor subclass without one (a sharded
    parameter). Under FSDP the full weights it gathers and autograd saves do count: they
    are held for the backward like activations."""
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


class UpdateMemory:
    """Measures one update: ``with meter.micro_batch(): forward`` for each micro-batch, then
    read ``activation_mb`` and ``peak_cuda_mb``."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.parameter_storages = {found[0] for found in map(storage_of, model.parameters()) if found}
        self.device = torch.device(device)
        self.activation_bytes = 0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    @contextlib.contextmanager
    def micro_batch(self):
        seen: set[int] = set()
        saved = 0

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            nonlocal saved
            found = storage_of(tensor)
            if found and found[0] not in seen and found[0] not in self.parameter_storages:
                seen.add(found[0])
                saved += found[1]
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield
        self.activation_bytes = max(self.activation_bytes, saved)

    @property
    def activation_mb(self) -> float:
        return self.activation_bytes / MIB

    @property
    def peak_cuda_mb(self) -> float:
        if self.device.type != "cuda":
            return float("nan")
        return torch.cuda.max_memory_allocated(self.device) / MIB
