"""Chimera (Li and Hoefler, SC'21) against its published bubble ratio.

The paper gives a bubble ratio of (D-2)/(2N+D-2) for D stages on D workers
and N microbatches. Its assumptions, as far as we could establish them (the
paper body was not readable here; see docs/research/bidirectional.md, 1.6):
bubbles are counted in unit slots in which a forward and a backward take the
same time, N is a multiple of D, D is even, communication is free, and
units are directly concatenated. The order itself follows the authors' code
(Shigangli/Chimera, branch ChimeraBk), whose p = 4, m = 4 listing is pinned
below. Activation peaks D/2+1 on the end workers to D in the middle, weights
twice a 1F1B worker's.
"""

import numpy as np
import pytest

import pipecore as pc


def test_basic_unit_order_p4():
    # docs/research/bidirectional.md 1.4: down microbatches 0, 1; up 2, 3.
    assert pc.build("chimera", 4, 4).to_actions() == {
        0: ["0F0", "0F1", "3F2", "3BW2", "3F3", "3BW3", "0BW0", "0BW1"],
        1: ["1F0", "2F2", "1F1", "2F3", "2BW2", "1BW0", "2BW3", "1BW1"],
        2: ["1F2", "2F0", "1F3", "2F1", "2BW0", "1BW2", "2BW1", "1BW3"],
        3: ["0F2", "0F3", "3F0", "3BW0", "3F1", "3BW1", "0BW2", "0BW3"],
    }


@pytest.mark.parametrize("p", [2, 4, 6, 8, 16])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_bubble_ratio_matches_paper(p, k):
    m = k * p
    res = pc.simulate(pc.build("chimera", p, m), pc.Costs(f=1.0, b=1.0, w=0.0))
    assert res.bubble_ratio == pytest.approx((p - 2) / (2 * m + p - 2), abs=1e-12)
    d = np.arange(p)
    np.testing.assert_array_equal(res.peak_activation, p // 2 + 1 + np.minimum(d, p - 1 - d))
    # Two stage replicas per worker: twice the weights of a 1F1B worker.
    flat = pc.simulate(pc.build("1f1b", p, m), pc.Costs(f=1.0, b=1.0, w=0.0))
    np.testing.assert_array_equal(res.static_memory, 2 * flat.static_memory)


def test_backward_twice_forward_leaves_more_bubble():
    # With B = 2F direct concatenation loses a slot per unit boundary (the
    # reason the paper adds forward doubling): D = 8, m = 16 gives 0.273.
    res = pc.simulate(pc.build("chimera", 8, 16), pc.Costs(f=1.0, b=2.0))
    assert res.bubble_ratio > (8 - 2) / (2 * 16 + 8 - 2)
    assert res.bubble_ratio == pytest.approx(0.2727, abs=1e-4)


@pytest.mark.parametrize("p,m,match", [(3, 6, "even number of devices"), (4, 6, "multiple of devices")])
def test_bad_shapes(p, m, match):
    with pytest.raises(ValueError, match=match):
        pc.build("chimera", p, m)
