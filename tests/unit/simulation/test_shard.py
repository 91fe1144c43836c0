"""The pieces of a sharded round that need no second process: the split, the order, the run's
identity (the runs on two processes: tests/contract/test_sharded.py and
tests/pipeline/test_torchrun.py)."""

from __future__ import annotations

import pytest
import torch

from fedcomm.config import Params
from fedcomm.errors import InputError
from fedcomm.simulation import shard
from fedcomm.stages.identity import config_hash, resolved_run_config
from tests.conftest import tiny_params


def test_assign_balances_examples_and_keeps_cohort_order() -> None:
    sizes = [50, 10, 40, 30, 20, 60]
    shares = shard.assign(sizes, 2)
    assert sorted(i for s in shares for i in s) == list(range(6))  # each client once
    assert all(s == sorted(s) for s in shares)
    loads = [sum(sizes[i] for i in s) for s in shares]
    assert loads == [110, 100]  # largest first to the least loaded: 60,40,20 | 50,30,10...
    assert shard.assign(sizes, 2) == shares  # a function of the sizes: every rank agrees


def test_assign_with_more_ranks_than_clients_leaves_some_idle() -> None:
    assert shard.assign([5, 7], 4) == [[1], [0], [], []]
    assert shard.assign([], 3) == [[], [], []]


def test_in_order_puts_the_gathered_clients_back_in_cohort_order() -> None:
    shares = [[0, 3], [1, 2]]
    assert list(shard.in_order(shares, [["a", "d"], ["b", "c"]])) == ["a", "b", "c", "d"]
    with pytest.raises(RuntimeError, match="returned 1 clients for a share of 2"):
        list(shard.in_order(shares, [["a"], ["b", "c"]]))


def test_world_size_reads_torchrun_and_names_a_bad_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert shard.world_size() == 1 and shard.start(torch.device("cpu")) is None
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(InputError, match="WORLD_SIZE: 'two' is not an integer"):
        shard.world_size()


def test_the_number_of_processes_is_not_part_of_a_runs_identity() -> None:
    """A checkpoint resumes with any number of processes: the same numbers either way."""
    hashes = {
        config_hash(
            resolved_run_config(
                Params.model_validate(tiny_params(**{"train.nproc": n})), "fedavg", 0, "p"
            )
        )
        for n in (1, 2, 8)
    }
    assert len(hashes) == 1
