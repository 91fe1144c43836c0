"""One rank of the sharded contract test (``tests/contract/test_sharded.py``), started by torch's
elastic launcher: every case of :data:`CASES` run through :func:`fedcomm.simulation.loop.run` with
this process's :class:`~fedcomm.simulation.shard.Shard`; rank 0 saves each result to
``OUT/<algorithm>-<backend>.pt`` (round rows without wall times, ledger rows, final model)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # (the tests package: a script's directory is not the root)

from fedcomm.algorithms import CONFIGS  # noqa: E402
from fedcomm.simulation import shard  # noqa: E402
from tests.conftest import digits_federation  # noqa: E402
from tests.contract.test_backends import _run  # noqa: E402

# every algorithm on the sequential backend (its turns travel whole: client state, payloads,
# generator); the vectorized backend where its chunks then hold other clients
CASES = [(name, "sequential") for name in sorted(CONFIGS)] + [
    (name, "vectorized") for name in ("fedavg", "fedbiad", "feddst", "fedsparse")
]
# a train.system run whose deadline cuts a straggler's work short (its retraining goes through
# the sharded turns too): FedAvg, sequential
SYSTEM_CASE = ("fedavg", "system-partial")
CASES.append(SYSTEM_CASE)
# fit_deadline over FedBIAD's p: a sparse-compute algorithm timed on every rank (a client another
# rank trained is charged from its nonzero counts) and clients retrained through the gathers;
# every rank saves its result (``OUT/fedbiad-system-fit-rank<r>.pt``): their clocks must agree
FIT_CASE = ("fedbiad", "system-fit")
CASES.append(FIT_CASE)


def fit_run(sharded: Any = None) -> Any:
    from tests.unit.system.test_fit_algorithm import _fit

    return _fit(1.0, sharded=sharded)


def system_run(sharded: Any = None) -> Any:
    from tests.unit.system.test_round_clock import _run as clock_run
    from tests.unit.system.test_round_clock import _system

    return clock_run(_system(deadline_s=0.45, stragglers="partial"), sharded=sharded)


def result(res: Any) -> dict[str, Any]:
    rows = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in res.state.round_rows]
    clients = [{k: v for k, v in c.items() if k != "train_s"} for c in res.state.client_rows]
    return {
        "rounds": rows,
        "ledger": res.ledger.rows,
        "final": res.final_params,
        "backend": res.backend,
        "clients": clients,
    }


def main(out: Path) -> None:
    sharded = shard.start(torch.device("cpu"))
    assert sharded is not None and sharded.world == 2
    fed = digits_federation(6)
    for name, backend in CASES:
        if (name, backend) == SYSTEM_CASE:
            res = system_run(sharded)
        elif (name, backend) == FIT_CASE:
            res = fit_run(sharded)
            torch.save(result(res), out / f"{name}-{backend}-rank{sharded.rank}.pt")
        else:
            res = _run(name, fed, backend, sharded=sharded)
        if sharded.writes:
            torch.save(result(res), out / f"{name}-{backend}.pt")
    traffic = sharded.traffic
    if sharded.writes:
        torch.save(vars(traffic), out / "traffic.pt")
    shard.finish(sharded)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
