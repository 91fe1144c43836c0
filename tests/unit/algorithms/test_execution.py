"""The algorithm contract keeps what an algorithm is apart from how the simulator runs it:
the backends' and the clock's hints are one record, ``FedAlgorithm.execution``."""

from __future__ import annotations

from dataclasses import fields

import pytest

from fedcomm.algorithms import ALGORITHMS, CONFIGS, build_algorithm
from fedcomm.algorithms.core import Execution, FedAlgorithm

HINTS = {"client_job", "unbatched", "sparse_compute", "delta_uplink"}

# clients that train a masked sparse model or a sub-model (system/flops.py's list)
SPARSE = {
    "afd",
    "fedbiad",
    "feddrop",
    "feddst",
    "fedmp",
    "fjord",
    "grasp",
    "heterofl",
    "prunefl",
    "randommask",
}


def test_the_hints_are_one_record_not_fields_of_the_algorithm() -> None:
    assert not HINTS & {f.name for f in fields(FedAlgorithm)}
    assert {f.name for f in fields(Execution)} == HINTS
    assert "execution" in {f.name for f in fields(FedAlgorithm)}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_algorithm_is_batched_or_says_why(name: str) -> None:
    ex = build_algorithm(CONFIGS[name]()).execution
    assert (ex.client_job is None) == (ex.unbatched is not None), (name, ex.unbatched)


def test_sparse_compute_is_set_for_the_masked_and_sub_model_algorithms() -> None:
    sparse = {n for n in ALGORITHMS if build_algorithm(CONFIGS[n]()).execution.sparse_compute}
    assert sparse == SPARSE


# a delta from the downloaded global model, averaged by the server: may arrive stale (issue 45)
DELTA = {"fedavg", "fedprox"}


def test_delta_uplink_is_set_for_the_algorithms_that_average_client_deltas() -> None:
    delta = {n for n in ALGORITHMS if build_algorithm(CONFIGS[n]()).execution.delta_uplink}
    assert delta == DELTA
