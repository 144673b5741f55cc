"""Partial rollouts (:mod:`podsrl.rollout.partial`) on the vllm engine: every sample is a vLLM
request of its own, stepped through vLLM's engine until ``quota`` groups are complete; the
other requests are aborted (vLLM frees their slots and KV blocks at once) and their tokens so
far are handed back to carry on.

A carried cut-off sample resumes as a new request whose prompt is the prompt plus its tokens
so far: vLLM's prefill recomputes their keys and values under the new weights (what the slots
engine does with its one prefill), and ``max_tokens`` is what the sample has left. Cut-off
samples are added first, so vLLM's first-come scheduler resumes them before any other sample
starts (APRIL's resume-first). Each token keeps vLLM's log-prob of it when it was drawn
(``raw_logprobs``: temperature 1), for every token, this step's too: vLLM's numerics are not
the policy's, so the update's importance correction weighs every token by pi_policy / pi_vLLM,
which for a carried token is also its staleness correction.
"""

from __future__ import annotations

import torch

from podsrl.rollout.base import Sampling, to_rollouts
from podsrl.rollout.partial import CarriedGroup, PartialCall, PartialGeneration, token_tensors

REQUEST_PREFIX = "podsrl-partial"  # request ids of their own: evaluation's LLM.generate numbers its requests


def _resume_order(groups: list[CarriedGroup]) -> list[tuple[int, int]]:
    """(prompt, sample) of every sample still to decode: cut-off ones first, then the rest in
    prompt order."""
    cut_off = [(p, s) for p, group in enumerate(groups) for s in group.cut_off]
    unstarted = [(p, s) for p, group in enumerate(groups) for s, tokens in enumerate(group.completions)
                 if not tokens and s not in group.done]
    return cut_off + unstarted


def stepped_until_quota(llm, tokenizer, prompt_batch: tuple[torch.Tensor, torch.Tensor], num_samples: int,
                        partial: PartialCall, sampling: Sampling) -> PartialGeneration:
    """``prompt_batch``: the prompts' ids and mask [P, Lp] (left-padded), sampled as ``sampling``
    says on ``llm`` (a vLLM ``LLM`` holding the current weights); the prompts at the positions
    in ``partial.carried`` continue their groups.
    Returns the first ``quota`` complete groups (groups complete on arrival first) as rollouts
    [quota, n, Lc] with every token's version and vLLM log-prob, and the others to carry."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    carried, quota, version = partial.carried, partial.quota, partial.version
    prompt_ids, prompt_mask = prompt_batch
    prompt_tokens = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask)]
    groups = [carried[p].copy() if p in carried else CarriedGroup.unstarted(num_samples)
              for p in range(len(prompt_tokens))]
    complete = [p for p, group in enumerate(groups) if len(group.done) == num_samples]
    engine, live = llm.llm_engine, set()
    try:
        for p, s in _resume_order(groups):
            request = f"{REQUEST_PREFIX}-{version}-{p}-{s}"
            params = SamplingParams(n=1, temperature=sampling.temperature,
                                    top_p=sampling.top_p if sampling.temperature else 1.0, top_k=0,
                                    max_tokens=sampling.max_completion_length - len(groups[p].completions[s]),
                                    stop_token_ids=[tokenizer.eos_token_id], logprobs=0, flat_logprobs=True,
                                    detokenize=False, output_kind=RequestOutputKind.DELTA)
            live.add(request)
            engine.add_request(request,
                               TokensPrompt(prompt_token_ids=prompt_tokens[p] + groups[p].completions[s]),
                               params)
        steps = _step_until(engine, groups, complete, live, quota, num_samples, version)
    finally:  # the quota met (nothing more is decoded), or a failure: no request of this call outlives it
        if live:
            engine.abort_request(sorted(live))
    complete = complete[:quota]  # groups complete beyond it in the same step go first next step
    width = max(1, max(len(c) for p in complete for c in groups[p].completions))
    completion_ids = torch.full((len(complete), num_samples, width), tokenizer.pad_token_id, dtype=torch.long)
    for row, p in enumerate(complete):
        for s, tokens in enumerate(groups[p].completions):
            completion_ids[row, s, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    rollouts = to_rollouts(tokenizer, prompt_ids[complete], prompt_mask[complete], completion_ids)
    rollouts.token_versions, rollouts.sampling_logp = token_tensors(
        [groups[p].completions for p in complete], [groups[p].versions for p in complete],
        [groups[p].logps for p in complete], None, width)
    rollouts.sampling_logp = rollouts.sampling_logp.nan_to_num(0.0) * rollouts.completion_mask
    rollouts.stats.update(generated_tokens=sum(v == version for group in groups for sample in group.versions
                                               for v in sample), decode_steps=steps)
    trained = set(complete)
    return PartialGeneration(rollouts, complete,
                             {p: group for p, group in enumerate(groups) if p not in trained})


def _step_until(engine, groups: list[CarriedGroup], complete: list[int], live: set[str], quota: int,
                num_samples: int, version: int) -> int:
    """Step vLLM's engine until ``quota`` groups are complete, each request's new tokens (and
    their log-probs and version) appended to its sample; returns the steps taken."""
    steps = 0
    while len(complete) < quota:
        if not engine.has_unfinished_requests():
            raise RuntimeError(f"vllm engine: {len(complete)} groups complete, {quota} asked for, and "
                               "nothing left to decode")
        for output in engine.step():
            p, s = map(int, output.request_id.rsplit("-", 2)[1:])
            sample, group = output.outputs[0], groups[p]
            group.completions[s] += list(sample.token_ids)
            group.logps[s] += list(sample.logprobs.logprobs)[:len(sample.token_ids)]
            group.versions[s] += [version] * len(sample.token_ids)
            if output.finished:
                live.discard(output.request_id)
                group.finished[s] = True
                if len(group.done) == num_samples:
                    complete.append(p)
        steps += 1
    return steps
