"""The update's memory measure (models/memory.py): the activations autograd saves, checked
against what a hand-built network saves, and how it moves with the micro-batch in
update_policy on the tiny random model."""

import copy
import math

import pytest
import torch

from podsrl.models import load_model
from podsrl.models.memory import MIB, UpdateMemory
from podsrl.rollout import Sampling, generate
from podsrl.update import UpdateOptions, flatten_for_update, update_policy


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_activations_are_the_saved_inputs_not_the_parameters(rows):
    """Linear -> tanh -> Linear saves x (for the first weight's gradient), tanh's output (for
    its own backward and the second weight's gradient: one storage, counted once); the
    weights autograd also keeps are parameters and are not activations."""
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    x = torch.randn(rows, 5)
    meter = UpdateMemory(net, torch.device("cpu"))
    with meter.micro_batch():
        hidden = torch.tanh(net[0](x))
        net[2](hidden).sum().backward()
    assert meter.activation_bytes == x.nbytes + hidden.nbytes
    assert meter.activation_mb == pytest.approx((x.nbytes + hidden.nbytes) / MIB)
    assert math.isnan(meter.peak_cuda_mb)  # not on CUDA: no allocator peak to report


def test_the_largest_micro_batch_is_reported():
    net = torch.nn.Linear(4, 4)
    meter = UpdateMemory(net, torch.device("cpu"))
    sizes = []
    for rows in (2, 9, 5):
        x = torch.randn(rows, 4)
        with meter.micro_batch():
            net(x).square().sum().backward()
        sizes.append(meter.activation_bytes)
    assert sizes[1] == sizes[2] > sizes[0]  # the 9-row micro-batch stays the peak


def test_update_activations_follow_the_micro_batch_and_are_logged(random_model_dir):
    """The same batch in micro-batches of 12 rows saves more than in micro-batches of 3, and
    the same micro-batch size gives the same number (exact, device-independent)."""
    bundle = load_model(random_model_dir)
    torch.manual_seed(0)
    rollouts = generate(bundle.model, bundle.tokenizer, ["What is 1 + 2?", "7", "What is 10 - 3 + 4?"], 4,
                        Sampling(max_completion_length=6, temperature=1.0))
    batch = flatten_for_update(rollouts, torch.randn(3, 4))  # [B = 12, ...]
    measured = {}
    for size in (12, 3, 3):
        model = copy.deepcopy(bundle.model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        result = update_policy(model, optimizer, scheduler, batch, UpdateOptions(micro_batch_size=size))
        measured.setdefault(size, []).append(result.update_activation_mb)
        assert math.isnan(result.update_peak_cuda_mb)
    assert measured[12][0] > 2 * measured[3][0] > 0
    assert measured[3][0] == measured[3][1]
