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

Tools, environments (``environment_factory``, one or several, environment-owned rewards and
data), custom rollout functions and vision-language models: TRL runs the tool calls and
environments as usual; selection uses the final rewards (after the last tool turn, with the
rollout function's fields and each row's environment in the reward kwargs), and every kept
row keeps its own tool mask, images, rollout fields and environment instance.

Batch accounting (checked in :class:`PODSConfig`): TRL counts rows, not prompts. The
kept rows (groups x m) must split evenly over the processes and then into the
``steps_per_generation`` micro-batches. When the generated rows per process are not whole
prompt groups (one prompt's n rows on two processes), selection still sees every group
whole (the rewards are gathered), and the kept rows are then shared out evenly between the
processes (refused with ``environment_factory``: an environment instance cannot move).
:func:`trl_batch_arguments` derives whole-group arguments from prompts per step, n, m,
the micro-batch size and the process count.

vLLM: TRL generates with vLLM as it does for GRPOTrainer (server or colocate), and the kept
rows carry their vLLM log-probs to TRL's importance-sampling correction. On vLLM's CPU
backend TRL's colocate weight sync fails (vLLM repacks each linear layer for oneDNN and
leaves an empty parameter TRL cannot load into), so there PODSTrainer pushes the weights
TRL prepares through vLLM's ``reload_weights`` (:class:`CPUWeightSync`); on GPUs TRL's
own sync runs.

Supported TRL: the range in :data:`SUPPORTED_TRL` (this module relies on private methods of
``GRPOTrainer`` that change between releases: ``_generate`` and ``_calculate_rewards``).
Not run by the developers: GPUs, and vLLM on a GPU (vLLM colocate ran on vLLM's CPU backend).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field

import torch
from accelerate.utils import gather_object
from packaging.version import Version

try:
    import trl
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import get_config_model_id
except ImportError as err:  # an optional dependency
    raise ImportError("podsrl.integrations.trl (podsrl.trl) needs TRL: pip install '.[trl]' in a podsrl "
                      f"clone ({err})") from err

from podsrl.algorithms.group_stats import group_stats
from podsrl.algorithms.select import RULES, Groups, select
from podsrl.rewards.stack import REWARD_LIMIT
from podsrl.rewards.worker import checked_values
from podsrl.rollout.vllm import load_weights_into, vllm_runs_on_cpu

# GRPOTrainer's per-row state of the generation batch: each rollout's environment instance,
# its environment's name (which tools its prompt shows) and its tool functions
ENVIRONMENT_STATE = ("environments", "_batch_environments", "_sync_tool_dicts", "_async_tool_dicts")
SUPPORTED_TRL = ("1.16.0", "1.17.0")  # [lowest tested, first untested)
if not Version(SUPPORTED_TRL[0]) <= Version(trl.__version__) < Version(SUPPORTED_TRL[1]):
    raise ImportError(f"podsrl.integrations.trl supports trl >= {SUPPORTED_TRL[0]}, < {SUPPORTED_TRL[1]} (it "
                      f"overrides private methods of GRPOTrainer); found trl {trl.__version__}: "
                      "pip install '.[trl]' in a podsrl clone")


def trl_batch_arguments(prompts_per_step: int, num_generations: int, num_kept: int, micro_batch_size: int,
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

    counts = {"prompts_per_step": prompts_per_step, "num_generations": num_generations, "num_kept": num_kept,
              "micro_batch_size": micro_batch_size, "num_processes": num_processes}
    for name, value in counts.items():  # zero steps would reach PODSConfig as a division by zero
        need(_is_count(value), f"{name}: must be a whole number >= 1, got {value!r}")
    need(num_kept <= num_generations, f"num_kept: {num_kept} is more than num_generations {num_generations}")
    need(prompts_per_step % num_processes == 0,
         f"prompts_per_step: {prompts_per_step} prompts do not split evenly over {num_processes} processes")
    local_prompts = prompts_per_step // num_processes
    kept_rows = local_prompts * num_kept
    need(kept_rows % micro_batch_size == 0,
         f"micro_batch_size: {local_prompts} prompts per process x num_kept {num_kept} = {kept_rows} kept "
         f"rows do not split into micro-batches of {micro_batch_size}")
    need((micro_batch_size * num_generations) % num_kept == 0,
         f"micro_batch_size: {micro_batch_size} kept rows x num_generations {num_generations} / num_kept "
         f"{num_kept} is not a whole number of generated rows per micro-step")
    steps = kept_rows // micro_batch_size
    return {"per_device_train_batch_size": micro_batch_size * num_generations // num_kept,
            "gradient_accumulation_steps": steps, "steps_per_generation": steps,
            "num_generations": num_generations, "num_kept": num_kept}


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def rows_with_extra_fields(inputs: list[dict], extra_fields: dict) -> list[dict]:
    """The rows TRL's reward step sees: each dataset row with a rollout function's extra
    fields merged in (a list gives one value per row, anything else is shared), as
    ``GRPOTrainer._generate_and_score_completions`` merges them. New dicts: the rows stay."""
    merged = []
    for i, row in enumerate(inputs):
        row = dict(row)
        for key, values in extra_fields.items():
            if not isinstance(values, list):
                row[key] = values
            elif i < len(values):
                row[key] = values[i]
        merged.append(row)
    return merged


def keep_rows(values: list | None, local_rows: list[int], rows: int, name) -> list | None:
    """The kept rows' entries of a per-row list (one entry per generated row)."""
    if values is None:
        return None
    if len(values) != rows:
        raise ValueError(f"PODSTrainer: {name} has {len(values)} entries for {rows} generated rows; cannot "
                         "tell which entries belong to the kept rows")
    return [values[i] for i in local_rows]


def check_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor, names: list[str]) -> None:
    """Refuse rewards [R_all, F] whose advantages would be meaningless, as podsrl's own trainer
    does: inf, or beyond +/-:data:`~podsrl.rewards.stack.REWARD_LIMIT` (1e38 is a finite float32,
    but a group's mean and variance overflow), per function or in TRL's weighted sum. NaN is
    TRL's "no reward" (the function returned None) and passes. The rewards are gathered, so
    every process raises together (none is left waiting in a collective)."""
    for column, values in enumerate(rewards_per_func.unbind(1)):
        too_large = (values.abs() > REWARD_LIMIT).nonzero()  # NaN compares False
        if len(too_large):
            row = int(too_large[0])
            name = names[column] if column < len(names) else f"number {column + 1}"
            raise ValueError(f"PODSTrainer: reward function {name} returned {values[row].item():.3g} for "
                             f"completion {row} of {len(values)} (beyond +/-{REWARD_LIMIT:g}: too large for "
                             "float32 rewards and their group statistics, so the advantages would be inf / "
                             "NaN); return finite rewards of ordinary size")
    total = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # [R_all], as TRL sums them
    too_large = (total.abs() > REWARD_LIMIT).nonzero()
    if len(too_large):
        row = int(too_large[0])
        raise ValueError(f"PODSTrainer: reward functions {', '.join(names)}: the weighted sum is "
                         f"{total[row].item():.3g} for completion {row} of {len(total)} (beyond "
                         f"+/-{REWARD_LIMIT:g}: too large for float32 rewards and their group statistics); "
                         "scale the rewards or reward_weights down")


def dataset_images(inputs: list[dict]) -> list | None:
    """The images of the dataset rows, one entry per row, as GRPOTrainer reads them (an
    ``images`` list or one ``image``), or None when the rows carry none."""
    if "images" in inputs[0]:
        images = [row.get("images") for row in inputs]
    elif "image" in inputs[0]:
        images = [[row["image"]] if row.get("image") is not None else None for row in inputs]
    else:
        return None
    return None if all(entry == [] for entry in images) else images


@dataclass
class PODSConfig(GRPOConfig):
    """``GRPOConfig`` plus the two PODS fields. ``num_generations`` keeps TRL's meaning: n,
    rollouts generated per prompt."""

    num_kept: int | None = field(default=None, metadata={
        "help": "m: rollouts per prompt kept and trained on (PODS); None = num_generations (plain GRPO)."})
    downsampling_rule: str = field(default="max_variance", metadata={
        "help": f"Which m of the n rollouts to keep: one of {', '.join(sorted(RULES))} "
                "(podsrl.algorithms.select)."})

    def __post_init__(self):
        super().__post_init__()
        if self.num_kept is None:
            self.num_kept = self.num_generations
        RULES.resolve(self.downsampling_rule)  # a registered name, or module:function
        if not _is_count(self.num_kept):
            raise ValueError(f"num_kept: must be a whole number, got {self.num_kept!r}")
        if not 2 <= self.num_kept <= self.num_generations:
            raise ValueError(f"num_kept: must be between 2 (an advantage needs a group) and num_generations "
                             f"({self.num_generations}), got {self.num_kept}")
        n, m, steps, processes = (self.num_generations, self.num_kept, self.steps_per_generation,
                                  self.world_size)
        # rows per process; GRPOConfig: x processes = groups
        generated = self.per_device_train_batch_size * steps
        groups = generated * processes // n
        if groups * m % processes:
            raise ValueError(
                f"num_kept: {groups} prompt groups per generation x num_kept {m} = {groups * m} kept rows do "
                f"not split evenly over {processes} processes ({generated} generated rows per process, "
                f"num_generations {n})")
        kept = groups * m // processes
        if kept % steps:
            raise ValueError(
                f"steps_per_generation: {kept} kept rows per process ({groups} groups x num_kept {m} / "
                f"{processes} processes) do not split into {steps} equal micro-batches; TRL would drop the "
                "remainder silently")

    @property
    def groups_span_processes(self) -> bool:
        """Whether one prompt's n rows can lie on two processes (generated rows per process
        not a multiple of n): the kept rows are then shared out again after selection."""
        return self.per_device_train_batch_size * self.steps_per_generation % self.num_generations != 0


class CPUWeightSync:
    """TRL's colocated vLLM generation (``trl.generation.vllm_generation.VLLMGeneration``) with
    a weight sync that works on vLLM's CPU backend: the weights TRL prepares (its own
    parameter walk: PEFT merged, names fixed) go through vLLM's ``reload_weights``
    (:func:`podsrl.rollout.vllm.load_weights_into`). Everything else is TRL's object."""

    def __init__(self, generation) -> None:
        self.generation = generation

    def __getattr__(self, name: str):
        return getattr(self.generation, name)

    def sync_weights(self) -> None:
        load_weights_into(self.generation.llm, self.generation._iter_named_params())


def release_vllm(trainer) -> None:
    """Shut the trainer's colocated vLLM engine down now (nothing without one): it holds process
    groups of its own, and vLLM's exit-time finalizer would tear them down after a script has
    destroyed the default group, printing a traceback ("Invalid process group specified")."""
    llm = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    if llm is not None:
        llm.llm_engine.engine_core.shutdown()


def checked_reward(fn):
    """A reward function held to TRL's contract where PODSTrainer calls it (one number or None per
    completion): what else it returns (strings, a value per prompt) is one line naming it, not
    torch.tensor's traceback inside TRL's reward step. Reward models and async functions, which
    TRL calls its own ways, are left as they are."""
    if isinstance(fn, torch.nn.Module) or inspect.iscoroutinefunction(fn) or not callable(fn):
        return fn

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        values = fn(*args, **kwargs)
        completions = kwargs.get("completions")
        try:
            checked_values(fn, values, len(values) if completions is None else len(completions))
        except TypeError as err:  # not numbers; a wrong count or inf: TRL's and check_rewards' own lines
            raise ValueError(f"PODSTrainer: {err}") from None
        except ValueError:
            pass
        return values
    return checked


class PODSTrainer(GRPOTrainer):
    """``GRPOTrainer`` that trains on ``num_kept`` of the ``num_generations`` rollouts of each
    prompt (see the module docstring). Evaluation generates and scores as GRPOTrainer does."""

    def __init__(self, model, reward_funcs=None, args: PODSConfig | None = None, *more, **kwargs):
        if args is None:  # as GRPOTrainer builds its default: named after the model; plain GRPO (m = n)
            name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = PODSConfig(f"{name.split('/')[-1]}-PODS")
        super().__init__(model, reward_funcs, args, *more, **kwargs)
        if not isinstance(self.args, PODSConfig):
            raise TypeError("args: PODSTrainer needs a PODSConfig (GRPOConfig plus num_kept and "
                            "downsampling_rule)")
        if self.args.groups_span_processes and self.environment_factories is not None:
            raise ValueError(
                "environment_factory: with per_device_train_batch_size x steps_per_generation not a multiple "
                "of num_generations, a prompt's rollouts lie on two processes and PODSTrainer moves kept "
                "rows between them; an environment instance holds its rollout's state in the process that "
                "ran it and cannot move. Make the generated rows per process a multiple of num_generations "
                "(podsrl.trl.trl_batch_arguments)")
        if self.use_vllm and self.vllm_mode == "colocate" and vllm_runs_on_cpu():
            self.vllm_generation = CPUWeightSync(self.vllm_generation)
        self.reward_funcs = [checked_reward(fn) for fn in self.reward_funcs]
        # the same stream on every process: rules that draw choose the same rows everywhere
        self.selection_generator = torch.Generator().manual_seed(self.args.seed)
        self._pods_inputs = None  # the generation batch's dataset rows while it is being scored
        # [kept rows of all processes, reward functions], for TRL's reward step
        self._pods_kept_rewards = None
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
        # score the final completions (after any tool calls) with what TRL's reward step sees:
        # the dataset row plus the rollout function's per-row fields, and every row's environment
        scored = rows_with_extra_fields(self._pods_inputs, extra_fields)
        rewards_per_func = super()._calculate_rewards(scored, prompts, completions, completion_ids)
        check_rewards(rewards_per_func, self.reward_weights.to(rewards_per_func.device),
                      self.reward_func_names)
        rows = len(prompts)
        local_rows, kept_global_rows = self._select(rewards_per_func, rows)
        if images is None:  # TRL then falls back to the dataset's images: narrow those
            images = dataset_images(self._pods_inputs)
        per_row = {"prompts": prompts, "inputs": self._pods_inputs, "prompt_ids": prompt_ids,
                   "completion_ids": completion_ids, "tool_mask": tool_mask, "completions": completions,
                   "logprobs": logprobs, "images": images, "tool_images": tool_images or None,
                   **{("extra", key): v for key, v in extra_fields.items() if isinstance(v, list)},
                   **{("log", column): v for column, v in self._pending_extra_logs.items()}}
        # each kept row keeps its own environment and tools; when rows move between processes
        # there are none to keep (environments are refused; the tool loop has finished)
        if not self.args.groups_span_processes:
            per_row.update({name: getattr(self, name) for name in ENVIRONMENT_STATE
                            if isinstance(getattr(self, name, None), list)})
        kept = {key: keep_rows(values, local_rows, rows, key) for key, values in per_row.items()}
        if self.args.groups_span_processes:
            kept = self._share_kept_rows(kept)
        prompts[:] = kept["prompts"]  # TRL's caller holds these lists: it continues with the kept rows only
        self._pods_inputs[:] = kept["inputs"]
        for key, values in kept.items():
            if isinstance(key, tuple) and key[0] == "log":  # reward functions' log_extra: one value per row
                self._pending_extra_logs[key[1]] = values
            elif key in ENVIRONMENT_STATE:
                setattr(self, key, values)
        extra_fields = {key: kept[("extra", key)] if isinstance(v, list) else v
                        for key, v in extra_fields.items()}
        self._pods_kept_rewards = rewards_per_func[kept_global_rows]
        self.num_generations = self.args.num_kept  # advantages are normalised over the kept m
        return (kept["prompt_ids"], kept["completion_ids"], kept["tool_mask"], kept["completions"],
                kept["logprobs"], extra_fields, kept["images"], kept["tool_images"] or tool_images)

    def _share_kept_rows(self, kept: dict) -> dict:
        """Groups that span processes: each process holds the kept rows it generated, which
        need not be as many as the others'. Gather every process's kept rows (process order
        is global row order, as the gathered rewards are) and give each process an equal,
        contiguous share, so that TRL's per-process slice of the kept rewards matches."""
        everyone = gather_object([kept])  # [processes] dicts of per-row lists
        keys = {key for share in everyone for key in share}
        merged = {key: [value for share in everyone
                        for value in (share.get(key) or [None] * len(share["prompts"]))] for key in keys}
        size = len(merged["prompts"]) // self.accelerator.num_processes  # PODSConfig: an even split
        mine = slice(self.accelerator.process_index * size, (self.accelerator.process_index + 1) * size)
        return {key: None if all(v is None for v in values) else values[mine]
                for key, values in merged.items()}

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
        groups = rewards.view(-1, n)  # [G_all, n]: all processes' rows are whole groups (GRPOConfig checks)
        keep = select(self.args.downsampling_rule, Groups(groups), m,
                      generator=self.selection_generator)  # [G_all, m]
        # rows stay in generation order (with m = n: exactly GRPOTrainer's rows)
        keep = keep.sort(dim=1).values
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
