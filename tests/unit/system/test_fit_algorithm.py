"""``fit_deadline`` over an algorithm's own setting (issue 45): FedBIAD's ``p``, each client
retrained under the mildest ``p`` whose upload arrives by the deadline. Checked against runs at
one fixed ``p``: at the extreme deadlines the fitted run *is* the fixed run, and in between each
client sends exactly what its ``p`` alone would have sent."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedcomm.algorithms import fedavg, fedbiad, fedsparse
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.comm.compressors.config import DgcCompressor, NoCompressor
from fedcomm.errors import InputError
from fedcomm.models import build_model
from fedcomm.simulation import fitting, loop
from tests.conftest import digits_federation
from tests.unit.system.test_policies import _system

LADDER = [0.9, 0.1, 0.5]  # sorted mildest (smallest p) first


def _run(
    p: float = 0.2,
    rounds: int = 3,
    epochs: int = 1,
    backend: str = "sequential",
    sharded: Any = None,
    **policy: Any,
) -> loop.RunResult:
    fed = digits_federation(8)
    cfg = loop.LoopConfig(
        rounds=rounds, clients_per_round=3, local=LocalConfig(epochs=epochs, batch_size=8), seed=0,
        system=_system(**policy), checkpoint_every=2, backend=backend,
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[32])
    algorithm = fedbiad.build(fedbiad.Config(p=p, stage_boundary=1))
    compressor = build_compressor("none")
    return loop.run(cfg, algorithm, model, fed, compressor, config_hash="h", sharded=sharded)


def _fit(
    deadline: float,
    ladder: list[float] = LADDER,
    epochs: int = 1,
    backend: str = "sequential",
    sharded: Any = None,
    p: float = 0.2,  # the run's own p, which fit_deadline does not use
    **policy: Any,
) -> loop.RunResult:
    compression = {"kind": "fit_deadline", "ladder": ladder}
    return _run(
        p, epochs=epochs, backend=backend, sharded=sharded, deadline_s=deadline,
        compression=compression, **policy,
    )  # fmt: skip


def _without_setting(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` less the setting sent and the wall-clock seconds (which no two runs share)."""
    drop = {"uplink_setting", "system/uplink_setting", "train_s"}
    return [
        {
            k: v
            for k, v in r.items()
            if k not in drop and not (k.startswith("time/") and not k.startswith("time/sim"))
        }
        for r in rows
    ]


def _same_run(a: loop.RunResult, b: loop.RunResult) -> None:
    assert _without_setting(a.state.client_rows) == _without_setting(b.state.client_rows)
    assert a.ledger.frame().equals(b.ledger.frame())
    assert _without_setting(a.state.round_rows) == _without_setting(b.state.round_rows)
    for k, v in a.final_params.items():
        assert torch.equal(v, b.final_params[k]), k


def test_the_ladder_runs_from_the_smallest_p_and_builds_one_algorithm_per_rung() -> None:
    steps = fitting.ladder(NoCompressor(), LADDER, fedbiad.Config())
    assert steps.knob == "p" and steps.values == (0.1, 0.5, 0.9) and not steps.codecs
    assert [a.config.p for a in steps.algorithms] == [0.1, 0.5, 0.9]  # type: ignore[attr-defined]
    assert steps.first is steps.algorithms[0]
    dgc = DgcCompressor(density=0.1)
    assert fitting.ladder(dgc, [0.1], fedbiad.Config()).knob == "density"  # auto: the codec's
    assert fitting.ladder(dgc, [0.2], fedbiad.Config(), "algorithm").knob == "p"


def test_what_cannot_be_fitted_is_refused_by_name() -> None:
    with pytest.raises(InputError, match=r"algorithm 'fedsparse' has none: its sparsity is learnt"):
        fitting.ladder(NoCompressor(), [0.1], fedsparse.Config())
    with pytest.raises(InputError, match=r"'fedavg' has none \(algorithms with one: fedbiad's p"):
        fitting.ladder(NoCompressor(), [0.1], fedavg.Config())
    with pytest.raises(InputError, match=r"vary: codec .*codec 'none' has none") as codec:
        fitting.ladder(NoCompressor(), [0.1], fedbiad.Config(), "codec")
    assert "fedbiad" not in str(codec.value)  # (it has a setting: not the one asked for)
    with pytest.raises(InputError, match=r"vary: algorithm .*'fedavg' has none") as algo:
        fitting.ladder(DgcCompressor(density=0.1), [0.1], fedavg.Config(), "algorithm")
    assert "dgc" not in str(algo.value)
    with pytest.raises(InputError, match=r"ladder: 1.0 is not a valid fedbiad p"):
        fitting.ladder(NoCompressor(), [0.5, 1.0], fedbiad.Config())


def test_a_deadline_every_client_makes_at_the_smallest_p_is_the_run_at_that_p() -> None:
    fit = _fit(1e6)
    assert {c["uplink_setting"] for c in fit.state.client_rows} == {0.1}
    _same_run(fit, _run(0.1, deadline_s=1e6))


def test_a_deadline_no_client_makes_but_at_the_largest_p_is_the_run_at_that_p() -> None:
    fixed = {p: _run(p) for p in (0.5, 0.9)}
    milder = min(c["sim_finish_s"] for c in fixed[0.5].state.client_rows)
    strong = sorted(c["sim_finish_s"] for c in fixed[0.9].state.client_rows)
    deadline = 0.99 * milder  # nobody makes it at p = 0.5; some do at 0.9
    assert strong[0] < deadline < strong[-1]
    fit = _fit(deadline, [0.5, 0.9])
    assert {c["uplink_setting"] for c in fit.state.client_rows} == {0.9}
    assert {c["status"] for c in fit.state.client_rows} == {"aggregated", "dropped"}
    _same_run(fit, _run(0.9, deadline_s=deadline))


def test_each_client_sends_what_its_p_alone_sends_at_the_mildest_p_that_fits() -> None:
    fixed = {p: _run(p) for p in (0.1, 0.5, 0.9)}
    deadline = 2.0
    fit = _fit(deadline)
    finish = {
        p: {(c["round"], c["client_id"]): c["sim_finish_s"] for c in r.state.client_rows}
        for p, r in fixed.items()
    }
    chosen = [c["uplink_setting"] for c in fit.state.client_rows]
    assert set(chosen) == {0.1, 0.5, 0.9}  # the deadline splits them over every rung
    for c in fit.state.client_rows:
        key = (c["round"], c["client_id"])
        fits = [p for p in (0.1, 0.5, 0.9) if finish[p][key] <= deadline]
        assert c["uplink_setting"] == (fits[0] if fits else 0.9)
    up = fit.ledger.frame().filter(direction="up")
    for c in (c for c in fit.state.client_rows if c["round"] == 1):  # the same global model
        alone = fixed[c["uplink_setting"]]
        twin = next(r for r in alone.state.client_rows if r["client_id"] == c["client_id"]
                    and r["round"] == 1)  # fmt: skip
        assert c["train_loss"] == twin["train_loss"]  # trained as at that p alone
        sent = up.filter(round=1, client_id=c["client_id"])["encoded_bits"].item()
        alone_up = alone.ledger.frame().filter(direction="up", round=1)
        assert sent == alone_up.filter(client_id=c["client_id"])["encoded_bits"].item()
    down = fit.ledger.frame().filter(direction="down")["encoded_bits"]
    assert down.n_unique() == 1  # U_{r-1} whole, whatever p the client trains at
    _same_run(fit, _fit(deadline, p=0.9))  # the run's own p is not used
    mean = fit.state.round_rows[0]["system/uplink_setting"]
    aggregated = [c for c in fit.state.client_rows if c["round"] == 1]
    assert mean == pytest.approx(sum(c["uplink_setting"] for c in aggregated) / len(aggregated))


def test_partial_work_is_fitted_over_p_too() -> None:
    # compute-bound: some steps fit; the run's own p (0.9, unused) would fit where 0.1 does not
    res = _fit(1.0, epochs=8, stragglers="partial", p=0.9)
    partial = [c for c in res.state.client_rows if c["status"] == "partial_work"]
    assert partial, "some straggler's partial work should fit"
    for c in partial:
        assert c["sim_finish_s"] <= 1.0 and c["uplink_setting"] in (0.1, 0.5, 0.9)
        assert c["local_steps"] < 8 * c["num_examples"] / 8  # fewer minibatches than 8 epochs
    # each client trained at the p it is labelled with: the round's mean kept fraction of rows
    # is the mean of each p's own (a fixed-p round keeps ceil((1 - p) rows) of every layer)
    kept = {p: _run(p, rounds=1).state.round_rows[0]["fedbiad/kept_fraction"] for p in LADDER}
    taken = [c for c in res.state.client_rows if c["status"] in ("aggregated", "partial_work")]
    for r in res.state.round_rows:
        sent = [c["uplink_setting"] for c in taken if c["round"] == r["round"]]
        assert r["fedbiad/kept_fraction"] == pytest.approx(sum(kept[p] for p in sent) / len(sent))


def test_the_vectorized_backend_fits_the_same_p_and_bits() -> None:
    seq, vec = _fit(2.0), _fit(2.0, backend="vectorized")
    assert vec.backend == "vectorized"
    settings = [[c["uplink_setting"] for c in r.state.client_rows] for r in (seq, vec)]
    assert settings[0] == settings[1] and len(set(settings[0])) == 3
    assert seq.ledger.frame().equals(vec.ledger.frame())
    for k, v in seq.final_params.items():
        assert torch.allclose(v, vec.final_params[k], atol=1e-6), k
