"""``train.system.policy.compression: fit_deadline``: each client's uplink compressed just enough
to arrive by the deadline on its own link.

What is varied is one setting that decides how much a client sends, listed in ``ladder``:

* the run's uplink codec's (:data:`KNOBS`: DGC's and STC's density, FedPAQ's levels, LQ's bits,
  SP's keep probability). Per client and round, after its local work, its uplink is encoded at
  each setting from the mildest (the most bits) to the strongest. Every trial encodes from the
  client's same compressor state and generator state;
* or the algorithm's own, where its compression happens in training (:data:`ALGORITHM_KNOBS`:
  FedBIAD's ``p``, the fraction of rows dropped). The cohort trains under the mildest setting;
  a client whose upload does not fit is trained again from the round's start under the next
  (its generator drawn afresh from ``(seed, CLIENT, round, client)``, its state as before the
  round), and so on. The server steps of these algorithms do not read the setting (each client
  may send at another one) and their downlinks do not depend on it.

Each trial is timed on the client's link from where its upload starts
(:func:`fedcomm.simulation.timed.time_turn`, its compute from that trial's own work); the first
whose upload finishes by the deadline is sent (a client under asynchronous aggregation: by its
time limit). If none does, the strongest is sent and the client is a straggler as under
``fixed``. What is sent is exactly what that setting alone would have sent; the ledger charges
its bits as always. ``vary``: ``auto`` takes the codec's setting when the codec has one, else
the algorithm's. FedSparse cannot be fitted: its sparsity is learnt by its gates (λ0), with no
setting that fixes a client's upload before it trains; it is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from fedcomm.algorithms.core import AlgorithmConfig, FedAlgorithm
from fedcomm.algorithms.core.registry import build_algorithm
from fedcomm.comm.codecs import Compressor, build_compressor
from fedcomm.comm.compressors.config import CompressorConfig
from fedcomm.errors import InputError, one_line
from fedcomm.simulation.backends import Turn
from fedcomm.simulation.rounds import Encoded, Round

# the codec's field that sets how much it sends (larger: more bits)
KNOBS: dict[str, str] = {
    "dgc": "density",
    "stc": "density",
    "fedpaq": "levels",
    "lq": "bits",
    "sp": "keep",
}

# an algorithm's own field that sets how much its clients send, and whether larger sends more
ALGORITHM_KNOBS: dict[str, tuple[str, bool]] = {
    "fedbiad": ("p", False),  # the fraction of rows dropped: larger sends fewer
}

# algorithms whose compression cannot be fitted, and why (named in the refusal)
UNFITTABLE: dict[str, str] = {
    "fedsparse": "its sparsity is learnt in training by its gates (λ0), and no setting fixes a "
    "client's upload before it trains",
}


C = TypeVar("C", bound=BaseModel)


@dataclass(frozen=True)
class Ladder:
    """The settings tried, mildest first, with the codecs or the algorithms that send at them."""

    knob: str
    values: tuple[float, ...]
    codecs: tuple[Compressor, ...] = ()  # a codec's rungs
    algorithms: tuple[FedAlgorithm[Any], ...] = ()  # an algorithm's rungs (retrained per rung)

    @property
    def first(self) -> FedAlgorithm[Any] | None:
        """The algorithm the cohort trains under (the mildest rung; None: the run's)."""
        return self.algorithms[0] if self.algorithms else None


def ladder(
    codec: CompressorConfig,
    values: Sequence[float],
    algorithm: AlgorithmConfig | None = None,
    vary: str = "auto",
) -> Ladder:
    """The rungs at ``values`` of the codec's setting or of ``algorithm``'s (``vary``), sorted
    mildest first; :class:`InputError` naming what cannot be built."""
    name = algorithm.name if algorithm is not None else None
    if vary == "codec" or (vary == "auto" and codec.name in KNOBS):
        if codec.name in KNOBS:
            return _codec_ladder(codec, values)
    elif name in ALGORITHM_KNOBS:
        assert algorithm is not None
        return _algorithm_ladder(algorithm, values)
    codecs = f"codec {codec.name!r} has none (codecs with one: {', '.join(sorted(KNOBS))})"
    algos = ", ".join(f"{a}'s {k}" for a, (k, _) in sorted(ALGORITHM_KNOBS.items()))
    why = f": {UNFITTABLE[name]}" if name in UNFITTABLE else ""
    algo = f"algorithm {name!r} has none{why} (algorithms with one: {algos})"
    key = "train.system.policy.compression"
    fix = "Set train.compressor (or the run's uplink) to a codec with one"
    if vary == "codec":
        raise InputError(
            f"{key}: fit_deadline with vary: codec varies the uplink codec's setting, and "
            f"{codecs}. {fix}"
        )
    if vary == "algorithm":
        raise InputError(
            f"{key}: fit_deadline with vary: algorithm varies the algorithm's own setting, and "
            f"{algo}. Run one that has one, or set vary: auto"
        )
    raise InputError(
        f"{key}: fit_deadline (vary: auto) varies the uplink codec's setting or the algorithm's "
        f"own: {codecs}, and {algo}. {fix}, or run an algorithm with one"
    )


def _codec_ladder(codec: CompressorConfig, values: Sequence[float]) -> Ladder:
    knob = KNOBS[codec.name]
    kept = _settings(codec, knob, values, True, codec.name)
    rungs = tuple(build_compressor(cfg.name, **cfg.model_dump(exclude={"name"})) for cfg, _ in kept)
    return Ladder(knob, tuple(v for _, v in kept), codecs=rungs)


def _algorithm_ladder(algorithm: AlgorithmConfig, values: Sequence[float]) -> Ladder:
    knob, larger_sends_more = ALGORITHM_KNOBS[algorithm.name]
    kept = _settings(algorithm, knob, values, larger_sends_more, algorithm.name)
    rungs = tuple(build_algorithm(cfg) for cfg, _ in kept)
    return Ladder(knob, tuple(v for _, v in kept), algorithms=rungs)


def _settings(
    config: C, knob: str, values: Sequence[float], larger_sends_more: bool, name: str
) -> list[tuple[C, float]]:
    """``config`` at each of ``values`` of ``knob``, mildest first, validated."""
    out = []
    for v in sorted(set(values), reverse=larger_sends_more):
        try:
            cfg = type(config).model_validate({**config.model_dump(), knob: v})
        except ValidationError as err:
            raise InputError(
                f"train.system.policy.compression.ladder: {v!r} is not a valid {name} "
                f"{knob} ({one_line(err)})"
            ) from None
        out.append((cfg, float(getattr(cfg, knob))))
    return out


Trial = Callable[[int], tuple[Turn, Encoded]]  # rung index -> the client's turn and uplink
Timer = Callable[[Turn, Encoded], float]  # a turn and its encoded uplink -> its finish (s)
Retrain = Callable[[FedAlgorithm[Any]], Turn]  # the client trained again under a rung


def trials(rnd: Round, turn: Turn, steps: Ladder, retrain: Retrain) -> Trial:
    """``turn``'s client at each rung: its uplink encoded at the codec's setting (from the
    turn's generator state as it is now), or the client retrained under the algorithm's (rung
    0: ``turn`` itself, trained under :attr:`Ladder.first`)."""
    if steps.algorithms:

        def trained(i: int) -> tuple[Turn, Encoded]:
            t = turn if i == 0 else retrain(steps.algorithms[i])
            return t, rnd.encode(t)

        return trained
    start = turn.generator.get_state()

    def encoded(i: int) -> tuple[Turn, Encoded]:
        turn.generator.set_state(start)
        return turn, rnd.encode(turn, steps.codecs[i])

    return encoded


def fit(
    steps: Ladder, trial: Trial, finish_s: Timer, limit_s: float
) -> tuple[Turn, Encoded, float]:
    """The mildest rung whose upload finishes by ``limit_s`` (else the strongest): its turn,
    uplink and value. The rungs are tried in order and the last tried is the one sent, so its
    generator is left as its encoding left it."""
    chosen: tuple[Turn, Encoded, float] | None = None
    for i, value in enumerate(steps.values):
        turn, enc = trial(i)
        chosen = (turn, enc, value)
        if finish_s(turn, enc) <= limit_s:
            break
    assert chosen is not None  # a ladder has at least one rung
    return chosen
