"""The benchmark's FLOP accounting: each dtype's matmuls against that dtype's peak."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tdmpc.bench import count_flops, fraction_of_peak, make_agent, random_batch


@pytest.mark.parametrize("train_precision, kinds", [("fp32", {"fp32"}), ("mixed", {"fp32", "bf16"}),
                                                     ("bf16", {"bf16"})])
def test_update_flops_are_split_by_the_dtype_their_matmuls_ran_in(train_precision, kinds):
    agent = make_agent(1, torch.device("cpu"), "fp32", train_precision=train_precision)
    batch = random_batch(agent, B=16)
    flops = count_flops(lambda: agent.update(batch))
    with FlopCounterMode(display=False) as counter:
        agent.update(batch)
    assert {k for k, v in flops.items() if v > 0} == kinds
    assert sum(flops.values()) == counter.get_total_flops()  # the same ops, only grouped


def test_fraction_of_peak_charges_each_dtype_at_its_own_peak():
    peaks = {"fp32": {"peak": 100.0}, "bf16": {"peak": 400.0}}  # GFLOP/s
    # 1 GFLOP at 100 GFLOP/s (10 ms) + 4 GFLOP at 400 (10 ms): 20 ms at the peaks; measured 40 ms
    assert fraction_of_peak({"fp32": 10**9, "bf16": 4 * 10**9}, 0.040, peaks) == pytest.approx(0.5)
