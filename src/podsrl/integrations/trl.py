"""PODS inside TRL's ``GRPOTrainer``: keep TRL's generation backends (transformers, vLLM
server or colocate), distributed engines (DDP, DeepSpeed, FSDP), trackers and datasets, and
train on the m rollouts per prompt whose rewards vary most (Xu et al., arXiv 2504.13818).

Switching an existing GRPO script is two lines::

    from podsrl.trl import PODSConfig as GRPOConfig, PODSTrainer as GRPOTrainer
    config = GRPOConfig(..., num_generations=16, num_kept=4)   # n generated, m trained on

How it works, per generation batch: TRL generates ``num_generations`` (n) rollouts per
prompt as it always does; PODSTrainer scores all n with the trainer's reward functions,
keeps ``num_kept`` (m) per prompt by ``downsampling_rule`` (a name in
:data:`podsrl.algorithms.select.RULES`), computed identically on every process from the
gathered rewards; only the kept rows go on to TRL's old-policy / reference / importance
sampling log-prob passes, its advantages (normalised over the kept m, as the paper does)
and the loss. The rewards of the kept rows are not recomputed.

Batch accounting (checked in :class:`PODSConfig`): TRL counts rows, not prompts.
``per_device_train_batch_size x steps_per_generation`` generated rows per process must be
whole prompt groups (a multiple of n), and the kept rows (``x m / n``) must split evenly
into the ``steps_per_generation`` micro-batches. :func:`pods_batch_arguments` derives
these arguments from prompts per step, n, m, the micro-batch size and the process count.

Supported TRL: the range in :data:`SUPPORTED_TRL` (this module relies on private methods of
``GRPOTrainer`` that change between releases: ``_generate`` and ``_calculate_rewards``).
Not supported yet, refused with an error: tools, environments, custom rollout functions,
vision-language models. Not run by the developers: vLLM and GPUs (tested on CPU only).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from packaging.version import Version

try:
    import trl
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import get_config_model_id
except ImportError as err:  # an optional dependency
    raise ImportError(f"podsrl.integrations.trl (podsrl.trl) needs TRL: pip install 'podsrl[trl]' ({err})") from err

from podsrl.algorithms.group_stats import group_stats
from podsrl.algorithms.select import RULES, Groups, select

SUPPORTED_TRL = ("1.16.0", "1.17.0")  # [lowest tested, first untested)
if not Version(SUPPORTED_TRL[0]) <= Version(trl.__version__) < Version(SUPPORTED_TRL[1]):
    raise ImportError(f"podsrl.integrations.trl supports trl >= {SUPPORTED_TRL[0]}, < {SUPPORTED_TRL[1]} (it "
                      f"overrides private methods of GRPOTrainer); found trl {trl.__version__}: "
                      "pip install 'podsrl[trl]'")


def pods_batch_arguments(prompts_per_step: int, num_generations: int, num_kept: int, micro_batch_size: int,
                         num_processes: int = 1) -> dict[str, int]:
    """TRL's batch arguments for one optimizer step on ``prompts_per_step`` prompts (over all
    processes), each with ``num_generations`` (n) rollouts of which ``num_kept`` (m) are
    trained on in micro-batches of ``micro_batch_size`` kept rows per process.

    Returns ``per_device_train_batch_size`` (generated rows per micro-step: the micro-batch
    before selection), ``gradient_accumulation_steps`` and ``steps_per_generation`` (both:
    one generation per optimizer step), ``num_generations`` and ``num_kept``."""
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ValueError(message)

    need(prompts_per_step % num_processes == 0,
         f"prompts_per_step: {prompts_per_step} prompts do not split evenly over {num_processes} processes")
    local_prompts = prompts_per_step // num_processes
    kept_rows = local_prompts * num_kept
    need(kept_rows % micro_batch_size == 0,
         f"micro_batch_size: {local_prompts} prompts per process x num_kept {num_kept} = {kept_rows} kept rows do not "
         f"split into micro-batches of {micro_batch_size}")
    need((micro_batch_size * num_generations) % num_kept == 0,
         f"micro_batch_size: {micro_batch_size} kept rows x num_generations {num_generations} / num_kept {num_kept} "
         f"is not a whole number of generated rows per micro-step")
    steps = kept_rows // micro_batch_size
    return {"per_device_train_batch_size": micro_batch_size * num_generations // num_kept,
            "gradient_accumulation_steps": steps, "steps_per_generation": steps,
            "num_generations": num_generations, "num_kept": num_kept}


@dataclass
class PODSConfig(GRPOConfig):
    """``GRPOConfig`` plus the two PODS fields. ``num_generations`` keeps TRL's meaning: n,
    rollouts generated per prompt."""

    num_kept: int | None = field(default=None, metadata={
        "help": "m: rollouts per prompt kept and trained on (PODS); None = num_generations (plain GRPO)."})
    downsampling_rule: str = field(default="max_variance", metadata={
        "help": f"Which m of the n rollouts to keep: one of {', '.join(sorted(RULES))} (podsrl.algorithms.select)."})

    def __post_init__(self):
        super().__post_init__()
        if self.num_kept is None:
            self.num_kept = self.num_generations
        RULES.resolve(self.downsampling_rule)  # a registered name, or module:function
        if not 2 <= self.num_kept <= self.num_generations:
            raise ValueError(f"num_kept: must be between 2 (an advantage needs a group) and num_generations "
                             f"({self.num_generations}), got {self.num_kept}")
        generated = self.per_device_train_batch_size * self.steps_per_generation
        if generated % self.num_generations:
            raise ValueError(
                f"per_device_train_batch_size x steps_per_generation = {self.per_device_train_batch_size} x "
                f"{self.steps_per_generation} = {generated} generated rows per process is not a multiple of "
                f"num_generations ({self.num_generations}): a prompt's group would be split across processes, and "
                f"PODS selects within whole groups (see podsrl.trl.pods_batch_arguments)")
        kept = generated // self.num_generations * self.num_kept
        if kept % self.steps_per_generation:
            raise ValueError(
                f"steps_per_generation: {kept} kept rows per process ({generated} generated x num_kept "
                f"{self.num_kept} / num_generations {self.num_generations}) do not split into "
                f"{self.steps_per_generation} equal micro-batches; TRL would drop the remainder silently")


class PODSTrainer(GRPOTrainer):
    """``GRPOTrainer`` that trains on ``num_kept`` of the ``num_generations`` rollouts of each
    prompt (see the module docstring). Evaluation generates and scores as GRPOTrainer does."""

    def __init__(self, model, reward_funcs, args: PODSConfig | None = None, *more, **kwargs):
        if args is None:  # as GRPOTrainer builds its default: named after the model; plain GRPO (m = n)
            name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = PODSConfig(f"{name.split('/')[-1]}-PODS")
        super().__init__(model, reward_funcs, args, *more, **kwargs)
        if not isinstance(self.args, PODSConfig):
            raise TypeError("args: PODSTrainer needs a PODSConfig (GRPOConfig plus num_kept and downsampling_rule)")
        unsupported = {"tools": bool(self.tools), "environment_factory": self.environment_factories is not None,
                       "rollout_func": self.rollout_func is not None, "a vision-language model": self._is_vlm}
        refused = [name for name, used in unsupported.items() if used]
        if refused:
            raise NotImplementedError(f"PODSTrainer does not support {', '.join(refused)} yet; use GRPOTrainer")
        # the same stream on every process: rules that draw choose the same rows everywhere
        self.selection_generator = torch.Generator().manual_seed(self.args.seed)
        self._pods_inputs = None  # the generation batch's dataset rows while it is being scored
        self._pods_kept_rewards = None  # [kept rows of all processes, reward functions], for TRL's reward step
        self.last_selection: dict[str, torch.Tensor] = {}  # rewards [G, n] and kept [G, m] of the last batch

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:  # evaluation: TRL's own path
            return super()._generate_and_score_completions(inputs)
        # a copy: _generate narrows the rows to the kept ones in place, and the caller's list stays whole
        inputs = self._pods_inputs = list(inputs)
        try:
            return super()._generate_and_score_completions(inputs)
        finally:  # TRL sees n again for the next generation (samplers, vLLM, eval)
            self.num_generations = self.args.num_generations
            self._pods_inputs = self._pods_kept_rewards = None

    def _generate(self, prompts: list):
        out = super()._generate(prompts)
        if self._pods_inputs is None:
            return out
        prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images = out
        rewards_per_func = super()._calculate_rewards(self._pods_inputs, prompts, completions, completion_ids)
        local_rows, kept_global_rows = self._select(rewards_per_func, len(prompts))

        def take(values):
            return values if values is None else [values[i] for i in local_rows]

        prompts[:] = take(prompts)  # TRL's caller holds these lists: it continues with the kept rows only
        self._pods_inputs[:] = take(self._pods_inputs)
        for column, values in self._pending_extra_logs.items():  # reward functions' log_extra: one per row
            self._pending_extra_logs[column] = take(values)
        extra_fields = {k: take(v) if isinstance(v, list) else v for k, v in extra_fields.items()}
        self._pods_kept_rewards = rewards_per_func[kept_global_rows]
        self.num_generations = self.args.num_kept  # advantages are normalised over the kept m
        return (take(prompt_ids), take(completion_ids), take(tool_mask), take(completions), take(logprobs),
                extra_fields, images, take(tool_images) if tool_images else tool_images)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if self._pods_kept_rewards is not None:  # the kept rows were scored before selection
            return self._pods_kept_rewards
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _select(self, rewards_per_func: torch.Tensor, local_count: int) -> tuple[list[int], torch.Tensor]:
        """Keep m per prompt group, from the rewards of every process's rollouts.

        rewards_per_func [R_all, F] (gathered, process order) -> (this process's kept rows,
        indices of every process's kept rows into R_all). The weighted sum is TRL's; a row
        no function could score (all NaN) counts as reward 0 for selection."""
        n, m = self.args.num_generations, self.args.num_kept
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1).float().cpu()  # [R_all]
        groups = rewards.view(-1, n)  # [G_all, n]: whole groups per process (PODSConfig checks)
        keep = select(self.args.downsampling_rule, Groups(groups), m, generator=self.selection_generator)  # [G_all, m]
        kept_global_rows = (torch.arange(groups.shape[0]).unsqueeze(1) * n + keep).flatten()  # [G_all * m]
        first = self.accelerator.process_index * local_count
        mine = (kept_global_rows >= first) & (kept_global_rows < first + local_count)
        self.last_selection = {"rewards": groups, "kept": keep}
        self._log_selection(groups, groups.gather(1, keep))
        return (kept_global_rows[mine] - first).tolist(), kept_global_rows.to(rewards_per_func.device)

    def _log_selection(self, generated: torch.Tensor, kept: torch.Tensor) -> None:
        """What shows whether down-sampling works: reward mean, within-group spread and the
        share of constant groups, before and after selection."""
        for name, values in (("generated", generated), ("kept", kept)):  # the trainer's numbers and names
            for key, value in group_stats(f"pods/{name}_reward", values).items():
                self._metrics["train"][key].append(value)
