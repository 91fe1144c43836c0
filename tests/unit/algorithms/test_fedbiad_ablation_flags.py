"""FedBIAD's ablation flags of issue 29 §3: ``loss_trend`` (Eq. 8's losses over a step's minibatch
or over the client's whole data) and the LM's droppable parts (``lstm_rows: none``,
``drop_embedding``), each checked to change what the client does."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import Tensor, nn
from torch.func import functional_call

from fedcomm.algorithms import build_algorithm
from fedcomm.algorithms.core import ClientContext, ClientData, RoundContext
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.algorithms.fedbiad import algorithm as fedbiad
from fedcomm.algorithms.fedbiad import bayes
from fedcomm.algorithms.fedbiad import rows as rows_
from fedcomm.models import build_model

VOCAB = 20


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=[12])


def _lstm() -> nn.Module:
    torch.manual_seed(0)
    return build_model(
        "lstm", input_shape=(5,), num_classes=VOCAB, embed_dim=8, hidden=8, num_layers=1,
        tie_weights=False, output="sequence",
    )  # fmt: skip


def _images(n: int, seed: int = 1) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    return ClientData(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))


def _tokens(n: int, seed: int = 1) -> ClientData:
    x = torch.randint(0, VOCAB, (n, 5), generator=torch.Generator().manual_seed(seed))
    return ClientData(x, torch.roll(x, -1, dims=1))


def _client(cfg: fedbiad.Config, model: nn.Module, data: ClientData, local: LocalConfig) -> object:
    alg = build_algorithm(cfg)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    server = alg.init_server(params, RoundContext(0, torch.Generator(), 0, model))
    down = alg.broadcast(server, 0, fedbiad.ClientState(), RoundContext(1, torch.Generator()))
    ctx = ClientContext(1, 0, model, local, torch.Generator().manual_seed(0))
    return alg.client_update(down.decode(), fedbiad.ClientState(), data, ctx)


# --- loss_trend ------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "data"), [(_mlp, _images), (_lstm, _tokens)])
def test_local_data_loss_is_the_mean_ce_of_the_masked_means_over_all_the_data(
    model: Callable[[], nn.Module], data: Callable[[int], ClientData]
) -> None:
    net, d = model(), data(23)
    live = {k: v.detach().clone() for k, v in net.named_parameters()}
    specs = rows_.row_specs(net, drop_output_layer=True)
    beta = rows_.random_pattern(specs, 0.5, torch.Generator().manual_seed(2))
    frozen = bayes.row_masks(specs, beta, live)
    theta = {
        k: v * frozen[bayes.ROW + k] if bayes.ROW + k in frozen else v for k, v in live.items()
    }
    logits = functional_call(net, theta, (d.x,))
    want = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), d.y.reshape(-1)))
    for chunk in (1024, 5):  # chunks weigh every target alike
        got = bayes.local_data_loss(net, d, chunk, live, frozen)
        assert got == pytest.approx(want, rel=1e-5)
    unmasked = bayes.local_data_loss(net, d, 1024, live, {})
    assert abs(unmasked - want) > 1e-4  # the masks are applied


def test_stage_one_check_takes_the_data_loss_when_given() -> None:
    model = _mlp()
    like = {k: p.detach() for k, p in model.named_parameters()}
    specs = rows_.row_specs(model, drop_output_layer=True)

    def run(data_loss: list[float] | None) -> rows_.Track:
        gen = torch.Generator().manual_seed(0)
        track = rows_.Track(rows_.random_pattern(specs, 0.5, gen), rows_.initial_scores(specs, {}))
        script = iter(data_loss or [])
        check = partial(
            rows_.stage_one_check, specs, 0.5, 2, "layer", gen, like, track,
            data_loss=(lambda live, frozen: next(script)) if data_loss else None,
        )  # fmt: skip
        for v in range(5):  # minibatch losses fall: ΔL < 0 at v = 4 on them
            check(v, 3.0 - v, {}, {}, torch.zeros(0))
        return track

    assert run(None).resamples == 0 and run(None).losses == [3.0, 2.0, 1.0, 0.0, -1.0]
    rising = run([1.0, 1.0, 1.0, 2.0, 2.0])  # the data loss rises: ΔL > 0 at v = 4
    assert rising.resamples == 1 and rising.losses == [1.0, 1.0, 1.0, 2.0, 2.0]


def test_loss_trend_data_evaluates_the_whole_data_after_every_stage_one_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[int, float]] = []
    real = bayes.local_data_loss
    sign = {"s": 0.0}  # 0: the real loss; +1 / -1: a scripted rising / falling loss

    def spy(
        model: nn.Module, data: ClientData, chunk: int, live: dict[str, Tensor], frozen: dict
    ) -> float:
        out = real(model, data, chunk, live, frozen)
        calls.append((data.num_examples, out))
        return out if sign["s"] == 0 else sign["s"] * len(calls)

    monkeypatch.setattr(fedbiad, "local_data_loss", spy)
    local = LocalConfig(steps=9, batch_size=8, lr=0.1)
    data = _images(30)
    _client(fedbiad.Config(p=0.5, tau=2), _mlp(), data, local)
    assert calls == []  # the default never evaluates the whole data
    whole = fedbiad.Config(p=0.5, tau=2, loss_trend="data")
    _client(whole, _mlp(), data, local)
    assert len(calls) == 9 and {n for n, _ in calls} == {30}  # one per step, over all 30
    assert len({round(v, 6) for _, v in calls}) > 1  # losses of the changing model
    resamples = {}
    for s in (1.0, -1.0):  # the trend follows the data loss, not the minibatch losses
        sign["s"] = s
        res = _client(whole, _mlp(), data, local)
        resamples[s] = res.metrics["fedbiad/resamples"]  # type: ignore[attr-defined]
    assert resamples == {1.0: 3.0, -1.0: 0.0}  # check points v = 4, 6, 8


def test_ablation_flags_are_validated() -> None:
    with pytest.raises(ValidationError, match="loss_trend"):
        fedbiad.Config(loss_trend="epoch")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="lstm_rows"):
        fedbiad.Config(lstm_rows="all")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="data_loss_chunk"):
        fedbiad.Config(data_loss_chunk=0)


# --- the LM's droppable parts --------------------------------------------------------------------


def test_lm_parts_one_at_a_time() -> None:
    net = _lstm()
    names = {
        (lr, emb, out): [s.name for s in rows_.row_specs(net, out, lr, emb)]  # type: ignore[arg-type]
        for lr, emb, out in [
            ("hh", True, True), ("hh", False, False), ("none", True, False), ("none", False, True),
        ]
    }  # fmt: skip
    embed, hh, output = "embedding", "lstm.weight_hh_l0", "decoder"
    got = {key: sorted(v) for key, v in names.items()}
    assert [len(v) for v in got.values()] == [3, 1, 1, 1]
    assert got[("hh", False, False)] == [hh]
    assert got[("none", True, False)][0].startswith(embed)
    assert got[("none", False, True)][0].startswith(output)
    assert all(any(n.startswith(p) for n in got[("hh", True, True)]) for p in (embed, hh, output))


def test_drop_embedding_false_sends_the_embedding_whole() -> None:
    local = LocalConfig(steps=3, batch_size=4, lr=0.5)
    data = _tokens(12)
    dropped = _client(fedbiad.Config(p=0.5), _lstm(), data, local)
    whole = _client(fedbiad.Config(p=0.5, drop_embedding=False), _lstm(), data, local)
    emb = next(k for k in dropped.local_params if "embedding" in k)  # type: ignore[attr-defined]
    zero_dims = lambda res: int((res.local_params[emb].abs().sum(0) == 0).sum())  # noqa: E731
    assert zero_dims(dropped) == 4 and zero_dims(whole) == 0  # 8 dims, p = 0.5
    up = lambda res: res.uplink.nbits().total  # noqa: E731
    assert up(whole) > up(dropped)


# --- the PTB suspects: softmax over the kept output rows, kept rows rescaled ---------------------


def test_masked_cross_entropy_is_a_softmax_over_the_kept_classes() -> None:
    """By hand: the kept classes' log-softmax among themselves, targets of dropped classes left
    out of the mean; per-sample weights as weighted_cross_entropy; all dropped -> 0."""
    from fedcomm.algorithms.core.jobs import masked_cross_entropy

    g = torch.Generator().manual_seed(3)
    logits, y = torch.randn(4, 3, 6, generator=g), torch.randint(0, 6, (4, 3), generator=g)
    keep = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    kept = keep.bool()
    sub = logits[..., kept].log_softmax(-1)  # the softmax among the kept classes
    index = torch.cumsum(keep, 0).long() - 1  # class -> its position among the kept
    terms = [(-sub[b, t, index[y[b, t]]], b) for b in range(4) for t in range(3) if kept[y[b, t]]]
    want = torch.stack([v for v, _ in terms]).mean()
    torch.testing.assert_close(masked_cross_entropy(logits, y, keep, None), want)
    # a padded batch (w = 1/n on the real samples, 0 on padding) gives the real batch's value
    pad = torch.cat([logits, torch.randn(2, 3, 6, generator=g)]), torch.cat([y, y[:2]])
    w = torch.tensor([0.25] * 4 + [0.0, 0.0])
    torch.testing.assert_close(masked_cross_entropy(pad[0], pad[1], keep, w), want)
    none = torch.zeros(6)
    assert float(masked_cross_entropy(logits, y, none, None)) == 0.0


def test_softmax_kept_and_rescaled_rows_change_the_lm_step() -> None:
    """One client step of the LM under each reading: the uploaded rows differ from the default;
    with ``rescale_rows`` the local model is the kept rows x rows/kept (p = 0.5: x2); and
    ``softmax_rows: kept`` needs the output layer's rows droppable."""
    local = LocalConfig(epochs=1, batch_size=4, lr=0.5)
    base = fedbiad.Config(p=0.5)
    default = _client(base, _lstm(), _tokens(16), local)
    kept = _client(base.model_copy(update={"softmax_rows": "kept"}), _lstm(), _tokens(16), local)
    scaled = _client(base.model_copy(update={"rescale_rows": True}), _lstm(), _tokens(16), local)
    out = bayes.output_weight(_lstm())
    for other in (kept, scaled):
        assert not torch.equal(default.local_params[out], other.local_params[out])  # type: ignore[attr-defined]
    # the same pattern and training as default except the scale: rows kept by both are x2 here
    row = scaled.local_params[out].abs().sum(1) > 0  # type: ignore[attr-defined]
    assert 0 < int(row.sum()) < VOCAB and int(row.sum()) == VOCAB - round(0.5 * VOCAB)
    with pytest.raises(ValidationError, match="softmax_rows: kept needs drop_output_layer"):
        fedbiad.Config(softmax_rows="kept", drop_output_layer=False)
    assert bayes.kept_scale(torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])) == 2.0


def test_rescaled_forward_pass_is_the_kept_rows_times_rows_over_kept() -> None:
    names = ["w", "b"]
    full = {
        "w": torch.ones(4, 2), "b": torch.ones(4),
        "rows.w": torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]),
        "rows.b": torch.tensor([1.0, 0.0, 1.0, 1.0]),
        "eps.w": torch.zeros(4, 2), "eps.b": torch.zeros(4), "s_tilde": torch.tensor(0.0),
    }  # fmt: skip
    plain = bayes.perturbed_params(names, dict(full))
    scaled = bayes.perturbed_params(names, dict(full), rescale=True, output_weight="w")
    torch.testing.assert_close(scaled["w"], plain["w"] * 4 / 3)
    torch.testing.assert_close(scaled["b"], plain["b"] * 4 / 3)
    assert scaled[bayes.LOGIT_KEEP].tolist() == [1.0, 0.0, 1.0, 1.0]
