"""train.local_eval_every: local accuracy when due, each client's newest upload evaluated once,
every other client's last result reused; the numbers of evaluating every upload at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedcomm.algorithms import build_algorithm
from fedcomm.algorithms.fedavg import Config as FedAvgConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.config import ConfigError, validate_params
from fedcomm.simulation import local_eval, loop
from tests.conftest import digits_federation, small_loop, tiny_params

LOCAL = ("local/accuracy", "local/accuracy_weighted", "local/coverage")
_LOCAL_EVAL = local_eval.evaluate_upload  # the loop's local evaluation, spied on by each run


def _run(every: int, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> tuple[Any, list[int]]:
    """A 7-round run, 3 of 6 clients a round; returns it and the clients evaluated, in order."""
    fed = digits_federation(6)
    model, cfg = small_loop(fed, rounds=7, local_eval_every=every, **kw.pop("cfg", {}))
    evaluated: list[int] = []
    inner = _LOCAL_EVAL

    def spy(model: Any, params: Any, data: Any, cid: int, batch_size: int) -> Any:
        evaluated.append(cid)
        return inner(model, params, data, cid, batch_size)

    monkeypatch.setattr(local_eval, "evaluate_upload", spy)
    alg, comp = build_algorithm(FedAvgConfig()), build_compressor("none")
    return loop.run(cfg, alg, model, fed, comp, config_hash="h", **kw), evaluated


def _numbers(rows: list[dict[str, Any]], drop: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows]


def test_due_rounds_report_what_evaluating_every_upload_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    every, at_once = _run(1, monkeypatch)
    cadence, evaluated = _run(3, monkeypatch)
    uploads = [(r["round"], r["client_id"]) for r in every.state.client_rows]
    assert at_once == [c for _, c in uploads]  # every=1: each upload, as it arrives
    for a, b in zip(every.state.round_rows, cadence.state.round_rows, strict=True):
        if b["round"] in (3, 6, 7):  # due: the last round too
            assert all(a[k] == b[k] for k in LOCAL)
        else:
            assert not set(LOCAL) & set(b)
        assert a["global/accuracy"] == b["global/accuracy"]  # training is untouched
    # each window's clients once, newest upload only: a client trained twice is evaluated once
    windows = [{c for r, c in uploads if lo < r <= hi} for lo, hi in ((0, 3), (3, 6), (6, 7))]
    assert sorted(evaluated) == sorted(c for w in windows for c in w)
    assert len(evaluated) < len(uploads)
    newest = {}
    for i, (r, c) in enumerate(uploads):
        newest[(c, next(k for k, h in enumerate((3, 6, 7)) if r <= h))] = i
    for i, (a, b) in enumerate(
        zip(every.state.client_rows, cadence.state.client_rows, strict=True)
    ):
        kept = i in newest.values()  # superseded uploads within a window are never evaluated
        for key in ("local_accuracy", "local_loss", "test_n"):
            assert b[key] == (a[key] if kept else None)


def test_a_resumed_run_evaluates_the_uploads_kept_before_the_checkpoint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    whole, _ = _run(3, monkeypatch)
    ckpt = tmp_path / "ckpt.pt"
    _run(3, monkeypatch, cfg={"checkpoint_every": 4}, checkpoint_path=ckpt)  # saved at round 4
    state = loop.checkpoint.load(ckpt, "h")
    assert state is not None and state.round_ == 4
    assert any(r.pending is not None for r in state.clients.values())  # mid-window uploads
    resumed, _ = _run(3, monkeypatch, checkpoint_path=ckpt)
    assert resumed.resumed_from == 4
    assert _numbers(resumed.state.round_rows, "time/") == _numbers(whole.state.round_rows, "time/")
    assert _numbers(resumed.state.client_rows, "train_s") == _numbers(
        whole.state.client_rows, "train_s"
    )


def test_local_eval_every_is_validated() -> None:
    with pytest.raises(
        ConfigError, match=r"train\.local_eval_every: .*greater than or equal to 1 \(got 0\)"
    ):
        validate_params(tiny_params(**{"train.local_eval_every": 0}))
    assert validate_params(tiny_params()).train.local_eval_every == 1
