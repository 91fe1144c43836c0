"""FedSparse's pieces on their own: the messages round-trip, the penalties match Eqs. 37-38,
pruning never revives a group and zeroes the pruned groups' weights and moments."""

from __future__ import annotations

import pytest
import torch

from fedcomm.algorithms.fedsparse.gates import gate_probs
from fedcomm.algorithms.fedsparse.messages import decode_downlink, encode_downlink, encode_upload
from fedcomm.algorithms.fedsparse.penalties import drift, l0_cost, prior_log_likelihood
from fedcomm.algorithms.fedsparse.server import prune, server_metrics, zero_pruned
from fedcomm.models import build_model, groups


def _hand() -> tuple[dict[str, torch.Tensor], list, dict[str, torch.Tensor]]:
    torch.manual_seed(0)  # mlp 4 -> 3 -> 2: fc1 input features (4), fc2 input features (3)
    model = build_model("mlp", input_shape=(4,), num_classes=2, hidden=[3])
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    alive = {"fc1": torch.tensor([1, 1, 0, 1]).bool(), "fc2": torch.tensor([1, 0, 1]).bool()}
    return params, list(groups(model)), alive


def test_downlink_round_trip_zeroes_pruned_groups() -> None:
    params, specs, alive = _hand()
    params = {k: t * 0 + 1 for k, t in params.items()}
    v = {s.name: torch.arange(s.count, dtype=torch.float32) + 1 for s in specs}
    got_alive, w, got_v = decode_downlink(
        encode_downlink(params, v, alive, specs).decode(), specs, params
    )
    assert all(torch.equal(got_alive[k], alive[k]) for k in alive)
    assert torch.equal(w["fc1.weight"].sum(0), torch.tensor([3.0, 3.0, 0.0, 3.0]))
    assert torch.equal(w["fc1.bias"], params["fc1.bias"])  # ungated: always sent
    assert torch.equal(got_v["fc2"], torch.tensor([1.0, 0.0, 3.0]))


def test_upload_is_z_times_w() -> None:
    params, specs, alive = _hand()
    z = {"fc1": torch.tensor([1, 0, 0, 1]).bool(), "fc2": torch.tensor([0, 0, 1]).bool()}
    payload, uploaded = encode_upload(params, z, alive, specs)
    assert payload.nbits().total == 5 + 32 * (3 * 2 + 2 * 1 + 3 + 2)  # as the unit test counts
    assert torch.equal(uploaded["fc1.weight"][:, 1], torch.zeros(3))
    assert torch.equal(uploaded["fc1.weight"][:, 0], params["fc1.weight"][:, 0])


def test_penalties_are_the_equations() -> None:
    pi, theta = torch.tensor([0.2, 0.9]), torch.tensor([0.5, 0.99])
    assert l0_cost(torch.tensor([3.0, 3.0]), pi).item() == pytest.approx(3.0 * 1.1)
    expected = sum(p * t.log() + (1 - p) * (1 - t).log() for p, t in zip(pi, theta, strict=True))
    torch.testing.assert_close(prior_log_likelihood(pi, theta), expected)
    params, specs, _ = _hand()
    moved = {k: t + 1 for k, t in params.items()}
    fc2 = next(s for s in specs if s.name == "fc2")  # weight 2x3: each group moved by ‖(1, 1)‖
    torch.testing.assert_close(
        drift(moved, params, fc2, torch.tensor([1.0, 0.5, 0.0])), torch.tensor(1.5 * 2)
    )


def test_pruned_groups_stay_pruned_with_zero_weights_and_moments() -> None:
    params, specs, alive = _hand()
    theta = {"fc1": torch.tensor([0.05, 0.5, 0.9, 0.2]), "fc2": torch.tensor([0.1, 0.9, 0.95])}
    after = prune(alive, theta, 0.1)
    assert after["fc1"].tolist() == [False, True, False, True]  # the pruned third stays pruned
    assert after["fc2"].tolist() == [False, False, True]  # θ ≤ ε is pruned
    opt = ({k: torch.ones_like(t) for k, t in params.items()}, 7)
    w, (moments, count) = zero_pruned(params, opt, after, specs)
    assert count == 7
    for name in ("fc1.weight", "fc2.weight"):
        kept = after[name.split(".")[0]]
        assert torch.all(w[name][:, ~kept] == 0) and torch.all(moments[name][:, ~kept] == 0)
        assert torch.equal(w[name][:, kept], params[name][:, kept])
    assert torch.equal(moments["fc1.bias"], torch.ones(3))  # ungated: untouched


def test_server_metrics_count_alive_groups_and_average_theta_over_all() -> None:
    params, specs, alive = _hand()
    v = {s.name: torch.zeros(s.count) for s in specs}
    got = server_metrics(params, v, alive, specs, 1e-3)
    assert got["fedsparse/groups_alive"] == pytest.approx(5 / 7)
    theta = torch.cat(list(gate_probs(params, v, specs, 1e-3).values()))
    assert got["fedsparse/theta_mean"] == pytest.approx(float(theta.mean()))  # pruned included
