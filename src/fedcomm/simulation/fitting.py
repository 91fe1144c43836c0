"""``train.system.policy.compression: fit_deadline``: each client's uplink compressed just enough
to arrive by the deadline on its own link.

The run's uplink codec has one knob that sets how much it sends (:data:`KNOBS`: DGC's and STC's
density, FedPAQ's levels, LQ's bits, SP's keep probability); ``ladder`` lists settings of it.
Per client and round, after its local work, its uplink is encoded at each setting from the
mildest (the most bits) to the strongest, and timed on its link from where its upload starts
(:func:`fedcomm.simulation.timed.time_turn`); the first whose upload finishes by the deadline is
sent (a client under asynchronous aggregation: by its time limit). If none does, the strongest
is sent and the client is a straggler as under ``fixed``. Every trial encodes from the client's
same compressor state and generator state, so the one sent is exactly what that setting alone
would have sent; the ledger charges its bits as always. An algorithm whose compression happens
in its training (FedBIAD's dropped rows, FedSparse's gates) has no codec setting to vary here:
its run's codec is ``none`` and the ladder is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

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


@dataclass(frozen=True)
class Ladder:
    """The settings tried, mildest first, and their compressors."""

    knob: str
    values: tuple[float, ...]
    rungs: tuple[Compressor, ...]


def ladder(codec: CompressorConfig, values: Sequence[float]) -> Ladder:
    """The rungs of ``codec`` at ``values`` of its knob (sorted mildest first);
    :class:`InputError` naming what cannot be built."""
    knob = KNOBS.get(codec.name)
    if knob is None:
        raise InputError(
            f"train.system.policy.compression: fit_deadline varies the uplink codec's setting, "
            f"and codec {codec.name!r} has none (codecs with one: {', '.join(sorted(KNOBS))}; "
            "an algorithm that compresses in training, FedBIAD or FedSparse, runs with codec "
            "'none'). Set train.compressor (or the run's uplink) to one of them"
        )
    rungs, kept = [], []
    for v in sorted(set(values), reverse=True):
        try:
            cfg = type(codec).model_validate({**codec.model_dump(), knob: v})
        except ValidationError as err:
            raise InputError(
                f"train.system.policy.compression.ladder: {v!r} is not a valid {codec.name} "
                f"{knob} ({one_line(err)})"
            ) from None
        kept.append(float(getattr(cfg, knob)))
        rungs.append(build_compressor(cfg.name, **cfg.model_dump(exclude={"name"})))
    return Ladder(knob, tuple(kept), tuple(rungs))


Timer = Callable[[Encoded], float]  # an encoded uplink -> the client's finish (seconds)


def fit(rnd: Round, turn: Turn, steps: Ladder, finish_s: Timer, limit_s: float) -> tuple[
    Encoded, float
]:  # fmt: skip
    """``turn``'s uplink at the mildest rung whose upload finishes by ``limit_s`` (else the
    strongest), with that rung's value. Each trial starts from the same generator state; the
    turn's generator is left as the chosen encoding left it."""
    start = turn.generator.get_state()
    chosen: tuple[Encoded, float] | None = None
    after = start
    for value, rung in zip(steps.values, steps.rungs, strict=True):
        turn.generator.set_state(start)
        enc = rnd.encode(turn, rung)
        after = turn.generator.get_state()
        chosen = (enc, value)
        if finish_s(enc) <= limit_s:
            break
    assert chosen is not None  # a ladder has at least one rung
    turn.generator.set_state(after)
    return chosen
