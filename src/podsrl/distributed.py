"""Multi-process training: the few collectives the training loop needs, through accelerate.

``podsrl train`` in one process never touches ``torch.distributed``: every method below is
then the identity. Under ``accelerate launch`` (or ``torchrun``; any launcher that sets
WORLD_SIZE > 1) an ``accelerate.Accelerator`` forms the process group and the policy is
either replicated (DDP, ``configs/accelerate/ddp.yaml``) or sharded with FSDP2 (an accelerate
config with ``distributed_type: FSDP`` and ``fsdp_version: 2``; ``fsdp_reshard_after_forward:
false`` shards gradients and optimizer state but keeps whole parameters between forward and
backward, the memory layout of DeepSpeed ZeRO-2). podsrl applies ``fully_shard`` itself, one
unit per decoder layer plus the root, on GPUs and on CPUs alike (accelerate only shards on
accelerators), so the CPU test covers the code GPUs run. DeepSpeed itself is refused with a
clear error: its engine steps the optimizer inside ``backward``, which the micro-batch
loop would have to hand over. Then:

* each step's prompts are split into contiguous blocks, one per process; every process
  generates, scores and selects its own whole prompt groups (selection never mixes groups
  across processes, as PODS requires: variance is a within-group quantity);
* gradients are averaged by the wrapper; each process normalises its loss so that the
  average equals the loss of the whole batch (token aggregation needs the global token
  count, :meth:`Processes.sum`);
* metrics are computed from tensors gathered over processes, evaluation is split across
  processes and its counts summed, and only the main process writes files;
* sharded, generation runs inside :meth:`Processes.whole_weights`: each process decodes a
  different number of steps, so per-forward all-gathers (which must run in lockstep) would
  deadlock; the parameters are gathered once before and resharded after. Checkpoints and
  the final model hold whole tensors, so a sharded run resumes a 1-process checkpoint and
  vice versa.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
from collections import defaultdict

import torch
from packaging.version import Version

# Sharded (FSDP2) decoding gave other tokens than the whole model with transformers 5.16 to
# 5.22.2 (found by the lower-bound job, scripts/test_lowest.sh); 5.23.0 is the first release
# whose sharded runs match one process
SHARDING_MIN_TRANSFORMERS = "5.23.0"


class LaunchRefused(ValueError):
    """A launcher's setting (or a model under it) that podsrl does not run: every process reads
    the same settings and refuses alike, so the CLI lets one of them say so."""


def transformers_version() -> str:
    return importlib.metadata.version("transformers")


class Processes:
    """The processes of one run (``world_size`` 1 without a launcher)."""

    def __init__(self, accelerator=None, sharded: bool = False, reshard_after_forward: bool = True) -> None:
        self.accelerator = accelerator
        self.rank = accelerator.process_index if accelerator else 0
        self.world_size = accelerator.num_processes if accelerator else 1
        self.is_main = self.rank == 0
        self.sharded = sharded  # FSDP2: every process holds 1/world_size of each parameter
        self.reshard_after_forward = reshard_after_forward  # False: ZeRO-2 (whole parameters in the step)

    @classmethod
    def from_env(cls) -> "Processes":
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size == 1:
            return cls()
        from accelerate import Accelerator

        # without a GPU accelerate only forms a process group when told to use the CPU (gloo)
        accelerator = Accelerator(cpu=not torch.cuda.is_available())
        if accelerator.num_processes != world_size:
            raise LaunchRefused(f"WORLD_SIZE={world_size} but accelerate formed {accelerator.num_processes} "
                                f"process(es) ({accelerator.distributed_type}); launch with `accelerate "
                                "launch --config_file configs/accelerate/ddp.yaml` or torchrun")
        if "DEEPSPEED" in str(accelerator.distributed_type):  # its engine steps the optimizer in backward
            raise LaunchRefused("DeepSpeed: not supported; for ZeRO-2's memory layout (sharded gradients and "
                                "optimizer state) use configs/accelerate/fsdp-zero2.yaml, for ZeRO-3's "
                                "configs/accelerate/fsdp.yaml")
        if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
            return cls(accelerator)
        version = os.environ.get("FSDP_VERSION", "1")
        if version != "2":
            raise LaunchRefused(f"fsdp_version: {version}; podsrl shards with FSDP2 only (fsdp_version: 2 "
                                      f"in the accelerate config, see configs/accelerate/fsdp.yaml)")
        found = transformers_version()
        if Version(found) < Version(SHARDING_MIN_TRANSFORMERS):
            raise LaunchRefused(f"FSDP: sharded training needs transformers >= {SHARDING_MIN_TRANSFORMERS} "
                                f"(found {found}: its sharded decoding differs from the whole model's); "
                                "upgrade transformers, or replicate with configs/accelerate/ddp.yaml")
        if os.environ.get("FSDP_OFFLOAD_PARAMS", "false").lower() == "true":
            raise LaunchRefused("fsdp_offload_params: true is not supported; set it to false")
        reshard = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower()
        if reshard not in ("true", "false"):
            raise LaunchRefused(f"fsdp_reshard_after_forward: {reshard!r}; "
                                "FSDP2 takes true (ZeRO-3) or false (ZeRO-2)")
        return cls(accelerator, sharded=True, reshard_after_forward=reshard == "true")

    def device(self, requested: str = "auto") -> torch.device:
        """The device this process trains on: its GPU under a launcher, else ``requested``."""
        if self.accelerator is not None:
            if requested not in ("auto", self.accelerator.device.type, str(self.accelerator.device)):
                raise ValueError(f"device: {requested!r}, but the launcher gave this process "
                                 f"{self.accelerator.device}; leave device at auto under accelerate launch")
            return self.accelerator.device
        if requested == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device: {requested!r}, but torch sees no CUDA GPU (torch "
                             f"{torch.__version__}); use device: cpu or auto")
        return torch.device(requested)

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
        """Wrap (DDP) or shard (FSDP2) the policy; the optimizer keeps working on the result."""
        if self.accelerator is None:
            return model, optimizer
        if not self.sharded:
            return self.accelerator.prepare(model, optimizer)
        self._fully_shard(model, optimizer)
        return model, optimizer

    def _fully_shard(self, model, optimizer) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import distribute_tensor

        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # under a LoRA adapter
        layer_types = set(getattr(base, "_no_split_modules", None) or ())
        layers = [m for m in model.modules() if type(m).__name__ in layer_types]
        if not layers:
            raise LaunchRefused(f"FSDP: {type(base).__name__} names no decoder layer class "
                                      f"(_no_split_modules) to shard by")
        mesh = init_device_mesh(self.accelerator.device.type, (self.world_size,))
        before = dict(model.named_parameters())
        for layer in layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=False)  # the root is needed again at once
        after = dict(model.named_parameters())
        # fully_shard registers new (DTensor) parameters: point the optimizer, and the scheduler
        # that holds it, at them, and shard any state it has (a resumed run) the same way
        new = {id(before[name]): param for name, param in after.items()}
        state = defaultdict(dict)
        for param, values in optimizer.state.items():
            sharded = new[id(param)]
            state[sharded] = {k: distribute_tensor(v, mesh, sharded.placements)
                              if torch.is_tensor(v) and v.shape == sharded.shape else v
                              for k, v in values.items()}
        for group in optimizer.param_groups:
            group["params"] = [new[id(p)] for p in group["params"]]
        optimizer.state = state

    @contextlib.contextmanager
    def whole_weights(self, model):
        """Whole parameters on every process for the block (generation, evaluation).

        Sharded, every forward pass all-gathers each layer and all processes must run those
        all-gathers in lockstep; generation decodes a different number of steps on each
        process, so the parameters are gathered once here and resharded after."""
        if not self.sharded:
            yield
            return
        from torch.distributed.fsdp import FSDPModule

        units = [m for m in model.modules() if isinstance(m, FSDPModule)]  # layers first, the root last
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        try:
            yield
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_forward(self.reshard_after_forward and unit is not model,
                                               recurse=False)

    def full_state(self, model, optimizer) -> tuple[dict[str, torch.Tensor], dict]:
        """Whole copies of the trainable parameters and the optimizer state, as one process
        holds them, on the CPU so a checkpoint loads anywhere (every process must call this:
        sharded, it gathers)."""
        def whole(value):
            value = value.full_tensor() if hasattr(value, "full_tensor") else value
            return value.cpu() if torch.is_tensor(value) else value

        weights = {name: whole(p.detach()) for name, p in model.named_parameters() if p.requires_grad}
        state = optimizer.state_dict()
        state["state"] = {i: {k: whole(v) for k, v in values.items()} for i, values in state["state"].items()}
        return weights, state

    def unwrap(self, model):
        """The bare model (for generation, no-grad log-probs and saving)."""
        return self.accelerator.unwrap_model(model) if self.accelerator else model

    def no_sync(self, model, last: bool):
        """Skip the gradient all-reduce on all but the last micro-batch of a step."""
        if self.accelerator is None or last:
            return contextlib.nullcontext()
        if self.sharded:
            return _without_gradient_sync(model)
        return self.accelerator.no_sync(model)

    def backward(self, loss: torch.Tensor) -> None:
        if self.accelerator is None:
            loss.backward()
        else:
            self.accelerator.backward(loss)

    def clip_grad_norm(self, model, max_norm: float) -> float:
        if self.accelerator is None or self.sharded:  # sharded: the norm of the DTensor gradients is global
            params = [p for p in model.parameters() if p.requires_grad]
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        return float(self.accelerator.clip_grad_norm_(model.parameters(), max_norm))

    # --- collectives --------------------------------------------------------------------------
    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate equal-shaped tensors of every process along dim 0 (rank order)."""
        return self.accelerator.gather(tensor.contiguous()) if self.accelerator else tensor

    def gather_objects(self, value) -> list:
        """Every process's ``value`` (any picklable object), in rank order, on every process."""
        if self.accelerator is None:
            return [value]
        import torch.distributed as dist

        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

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
        """Largest difference across processes of a fingerprint of the parameters (0 = in sync;
        replicated parameters only: sharded, each process holds a different part)."""
        if self.accelerator is None:
            return 0.0
        if self.sharded:
            raise ValueError("parameter_spread: sharded parameters are not replicated")
        with torch.no_grad():
            params = [p.detach().double() for p in self.unwrap(model).parameters()]
            fingerprint = torch.stack([sum(p.sum() for p in params), sum((p * p).sum() for p in params)])
        gathered = self.accelerator.gather(fingerprint[None])  # [W, 2]
        return float((gathered.amax(0) - gathered.amin(0)).max())

    def barrier(self) -> None:
        if self.accelerator is not None:
            self.accelerator.wait_for_everyone()


@contextlib.contextmanager
def _without_gradient_sync(model):
    model.set_requires_gradient_sync(False)  # FSDP2: accumulate unreduced gradients locally
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
