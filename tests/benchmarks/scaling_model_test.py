"""The ring all-reduce model: its formula, its fit, and its efficiency."""

import pytest

from benchmarks.scaling_model import (
    NCCL_CLASS,
    Network,
    efficiency,
    fit_ring,
    predict,
    ring_allreduce_seconds,
    step_seconds,
)

LOOPBACK = Network("loopback", latency=2e-4, bandwidth=1e9)
SIZES = [4 * 4**i for i in range(13)]


def test_ring_moves_two_n_minus_one_over_n_of_the_bytes_in_two_n_minus_one_steps():
    assert ring_allreduce_seconds(LOOPBACK, 1, 10**6) == 0
    assert ring_allreduce_seconds(LOOPBACK, 2, 10**6) == pytest.approx(2 * 2e-4 + 1e-3)
    assert ring_allreduce_seconds(LOOPBACK, 4, 10**6) == pytest.approx(6 * 2e-4 + 1.5e-3)


def test_fit_recovers_latency_and_bandwidth_of_exact_ring_times():
    seconds = [ring_allreduce_seconds(LOOPBACK, 2, size) for size in SIZES]
    fitted = fit_ring("fitted", SIZES, seconds)
    assert fitted.latency == pytest.approx(2e-4, rel=1e-6)
    assert fitted.bandwidth == pytest.approx(1e9, rel=1e-6)


def test_fail_with_measurements_that_are_not_a_ring():
    with pytest.raises(ValueError, match="not follow a ring"):
        fit_ring("shrinking", [1, 10**6], [1.0, 0.001])
    with pytest.raises(ValueError, match="two or more"):
        fit_ring("one", [1], [1.0])


def test_accumulation_divides_the_all_reduce_and_shared_cores_multiply_compute():
    compute, nbytes = 0.005, 1.4e6
    plain = step_seconds(compute, LOOPBACK, 2, nbytes)
    assert step_seconds(compute, LOOPBACK, 2, nbytes, accumulation=4) == pytest.approx(
        compute + (plain - compute) / 4
    )
    assert step_seconds(compute, LOOPBACK, 3, nbytes, cores=2) == pytest.approx(
        2 * compute + ring_allreduce_seconds(LOOPBACK, 3, nbytes)
    )
    assert efficiency(compute, LOOPBACK, 2, nbytes) == pytest.approx(compute / plain)


def test_efficiency_falls_with_workers_and_a_faster_network_keeps_more():
    predicted = predict(0.005, 1.4e6, [LOOPBACK, NCCL_CLASS], workers=[2, 16, 256])
    slow, fast = predicted["loopback"], predicted[NCCL_CLASS.name]
    assert slow[0] > slow[1] > slow[2]
    assert all(f > s for f, s in zip(fast, slow))
