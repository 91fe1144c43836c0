"""The ``system`` params section: who each client is (links, compute, availability) and how a
round treats the slow ones (deadline, over-selection, stragglers).

Absent, nothing of it exists and every number is what it is without simulated time. Present, the
round loop (:mod:`fedcomm.simulation.loop`) draws one :class:`~fedcomm.system.population.Profile`
per client from the run's seed and turns each message's encoded bits into seconds
(:mod:`fedcomm.system.clock`). Units: Mbit/s (1e6 bit/s), seconds, FLOP/s.

A per-client quantity is a *distribution*, drawn once per client (``kind``):

- ``constant``: ``value`` for every client;
- ``lognormal``: ``median`` and ``sigma`` (of the log): ``median * exp(sigma * N(0, 1))``;
- ``uniform``: between ``low`` and ``high``;
- ``trace`` (links only): a real per-second capacity trace (``source``: ``mahimahi`` or
  ``fivegophers``, under the data root's ``traces/``); each client draws one trace and a start
  second, and the capacity varies second by second as the trace does, cyclically (``window_s``:
  only that many seconds of it, from the start drawn);
- ``flash`` (links only): a FLASH user's mean and standard deviation for that direction, drawn
  uniformly over its 19 users, then one normal draw around them (floored at 1% of the mean);
- ``ai_benchmark`` (compute only): a phone model drawn uniformly from AI-Benchmark's 333
  scores, as a speed relative to their median;
- ``table``: the column of the user's client table (``system.table``) for that client.

``system.energy`` (optional; absent, no energy is computed or logged): each client-round's joules
from the bits its messages encoded and the FLOPs its local steps computed
(:mod:`fedcomm.system.energy`): J/bit and active and tail power per link technology
(:mod:`fedcomm.system.radios`: sourced defaults for LTE, 3G UMTS and Wi-Fi), J/FLOP per client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedcomm.system.diurnal import Diurnal
from fedcomm.system.oort import OortConfig
from fedcomm.system.radios import SOURCED


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Constant(_Strict):
    kind: Literal["constant"]
    value: float = Field(gt=0)


class LogNormal(_Strict):
    kind: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0, description="standard deviation of the log")


class Uniform(_Strict):
    kind: Literal["uniform"]
    low: float = Field(gt=0)
    high: float = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"high must be >= low (got low={self.low}, high={self.high})")
        return self


class TraceLink(_Strict):
    kind: Literal["trace"]
    source: Literal["mahimahi", "fivegophers"]
    window_s: int | None = Field(
        None, ge=1, description="seconds of the trace a client uses, from its drawn start"
    )


class FlashLink(_Strict):
    kind: Literal["flash"]


class AiBenchmark(_Strict):
    kind: Literal["ai_benchmark"]


class FromTable(_Strict):
    kind: Literal["table"]


LinkDist = Annotated[
    Constant | LogNormal | Uniform | TraceLink | FlashLink | FromTable,
    Field(discriminator="kind"),
]
SpeedDist = Annotated[
    Constant | LogNormal | Uniform | AiBenchmark | FromTable, Field(discriminator="kind")
]


class Latency(_Strict):
    kind: Literal["constant"]
    value: float = Field(ge=0, description="seconds added to every message")


class LinksConfig(_Strict):
    """``system.links``: Mbit/s per client and direction, and a latency per message."""

    down: LinkDist = Field(default_factory=lambda: Constant(kind="constant", value=110.6))
    up: LinkDist = Field(default_factory=lambda: Constant(kind="constant", value=14.0))
    latency_s: Annotated[Latency | LogNormal | FromTable, Field(discriminator="kind")] = Field(
        default_factory=lambda: Latency(kind="constant", value=0.0),
        description="seconds per message (down and up each pay it)",
    )


class ComputeConfig(_Strict):
    """``system.compute``: a client's speed as a multiple of the reference device."""

    reference_flops: float = Field(
        1e10, gt=0, description="FLOP/s of the reference device (speed 1.0)"
    )
    speed: SpeedDist = Field(default_factory=lambda: Constant(kind="constant", value=1.0))


class Probability(_Strict):
    kind: Literal["constant"]
    p: float = Field(gt=0, le=1, description="probability of being online when sampled")


class Windows(_Strict):
    kind: Literal["windows"]
    path: Path = Field(description="CSV/parquet client_id, start_s, end_s (online intervals)")


class AvailabilityTable(_Strict):
    kind: Literal["table"]


Availability = Annotated[
    Probability | Windows | AvailabilityTable | Diurnal, Field(discriminator="kind")
]


class UniformSelection(_Strict):
    """``selection: {kind: uniform}``: the sampled clients drawn uniformly among the online."""

    kind: Literal["uniform"]


# who is sampled: uniformly, or by Oort's utility (system/oort.py)
Selection = Annotated[UniformSelection | OortConfig, Field(discriminator="kind")]


class FixedCompression(_Strict):
    """``compression: {kind: fixed}``: every client's uplink through the run's codec as set."""

    kind: Literal["fixed"]


class FitDeadline(_Strict):
    """``compression: {kind: fit_deadline, ladder: [...]}``: per client and round, the mildest
    of these settings of the uplink codec's knob, or of the algorithm's own (FedBIAD's ``p``),
    whose upload arrives by the deadline (:mod:`fedcomm.simulation.fitting`)."""

    kind: Literal["fit_deadline"]
    ladder: list[float] = Field(
        min_length=1, description="values of the codec's knob (DGC/STC density, FedPAQ levels, "
        "LQ bits, SP keep) or of the algorithm's (FedBIAD's p), tried from the most bits to "
        "the fewest",
    )  # fmt: skip
    vary: Literal["auto", "codec", "algorithm"] = Field(
        "auto", description="whose setting the ladder lists: auto = the codec's when it has "
        "one, else the algorithm's",
    )  # fmt: skip


Compression = Annotated[FixedCompression | FitDeadline, Field(discriminator="kind")]


class ConstantStaleness(_Strict):
    """``s(τ) = 1``: a stale update counts as a fresh one."""

    kind: Literal["constant"]


class PolynomialStaleness(_Strict):
    """``s(τ) = (1 + τ)^(-a)`` (Xie et al. 2019's polynomial; FedBuff's ``1/sqrt(1 + τ)`` is
    ``a = 0.5``)."""

    kind: Literal["polynomial"]
    a: float = Field(0.5, ge=0)


class HingeStaleness(_Strict):
    """``s(τ) = 1`` for ``τ <= b``, else ``1 / (a (τ - b) + 1)`` (Xie et al. 2019's hinge)."""

    kind: Literal["hinge"]
    a: float = Field(gt=0)
    b: int = Field(ge=0)


Staleness = Annotated[
    ConstantStaleness | PolynomialStaleness | HingeStaleness, Field(discriminator="kind")
]
ASYNC_ONLY = ("concurrency", "buffer_size", "staleness", "mixing")  # read by fedbuff/fedasync


class PolicyConfig(_Strict):
    """``system.policy``: how a round treats its slow clients, and how the server aggregates
    (``aggregation``: synchronous rounds, or FedBuff / FedAsync on the same clock,
    :mod:`fedcomm.simulation.asynchronous`)."""

    deadline_s: float | None = Field(
        None, gt=0, description="seconds after the round starts; null: wait for every client"
    )
    over_selection: float = Field(
        0.0, ge=0, le=10, description="sample K(1 + f) online clients, aggregate the first K"
    )
    stragglers: Literal["drop", "partial"] = Field(
        "drop",
        description="a client that misses the deadline: dropped, or trained for as many local "
        "steps as fit before it (FedProx's partial work) and aggregated if it then makes it",
    )
    idle_s: float = Field(
        60.0, gt=0, description="seconds a round with no client online lasts (no deadline)"
    )
    cut_uplink: Literal["not_sent", "partial"] = Field(
        "not_sent",
        description="a dropped client's uplink in the ledger: not sent (0 bits), or the bits it "
        "had sent when the round closed",
    )

    aggregation: Literal["sync", "fedbuff", "fedasync"] = Field(
        "sync",
        description="sync: rounds of train.clients_per_round clients; fedbuff: clients train "
        "concurrently and the server steps every buffer_size arrivals (Nguyen et al. 2022); "
        "fedasync: the server mixes in each arrival at once (Xie et al. 2019). Under both, a "
        "round is one server step (model version) and deadline_s a client's time limit",
    )
    concurrency: int | None = Field(
        None, ge=1, description="fedbuff/fedasync: clients training at once (null: "
        "train.clients_per_round)",
    )  # fmt: skip
    buffer_size: int | None = Field(
        None, ge=1, description="fedbuff: arrivals per server step, K (null: "
        "train.clients_per_round); fedasync: 1",
    )  # fmt: skip
    staleness: Staleness = Field(
        default_factory=lambda: PolynomialStaleness(kind="polynomial", a=0.5),
        description="fedbuff/fedasync: the weight s(τ) of an update τ server steps stale",
    )
    selection: Selection = Field(
        default_factory=lambda: UniformSelection(kind="uniform"),
        description="who is sampled among the online clients: uniform, or oort (Lai et al. "
        "2021: utility from the last loss, a penalty for slow clients, exploration)",
    )
    compression: Compression = Field(
        default_factory=lambda: FixedCompression(kind="fixed"),
        description="fixed: the run's codec as set; fit_deadline: each client's codec setting "
        "the mildest of a ladder whose upload arrives by deadline_s on its own link",
    )
    check: Literal["start", "interval"] = Field(
        "start",
        description="availability checked when a client starts, or over its whole interval: "
        "a client that goes offline before it finishes is dropped (stragglers: partial, its "
        "steps that fit before it leaves), under availability windows or diurnal",
    )
    mixing: float = Field(
        0.9, gt=0, le=1, description="fedasync: α, the new model is (1 - α s) w + α s w_client "
        "(APPFL's default 0.9)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _needs_deadline(self) -> PolicyConfig:
        if self.deadline_s is None and self.stragglers == "partial":
            raise ValueError(
                "stragglers must be 'drop' without a deadline (partial work fits a deadline; "
                "set deadline_s)"
            )
        return self

    @model_validator(mode="after")
    def _fit_needs_deadline(self) -> PolicyConfig:
        if self.compression.kind == "fit_deadline" and self.deadline_s is None:
            raise ValueError(
                "compression fit_deadline fits each upload to deadline_s, and deadline_s is "
                "null: set deadline_s (under fedbuff/fedasync: a client's time limit)"
            )
        return self

    @model_validator(mode="after")
    def _aggregation_keys(self) -> PolicyConfig:
        agg = self.aggregation
        if agg == "sync":
            given = [k for k in ASYNC_ONLY if k in self.model_fields_set]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: read only under aggregation fedbuff or fedasync "
                    "(aggregation is sync)"
                )
            return self
        if self.over_selection:
            raise ValueError(
                f"over_selection must be 0 under aggregation {agg} (got {self.over_selection}): "
                "an asynchronous server waits for no cohort; concurrency sets how many train"
            )
        if self.stragglers != "drop":
            raise ValueError(
                f"stragglers must be 'drop' under aggregation {agg} (deadline_s is a client's "
                "time limit from its start: a client past it is dropped)"
            )
        if agg == "fedasync" and self.buffer_size not in (None, 1):
            raise ValueError(
                f"buffer_size must be 1 (or null) under aggregation fedasync, got "
                f"{self.buffer_size}: FedAsync steps on every arrival (FedBuff buffers K)"
            )
        if agg == "fedbuff" and "mixing" in self.model_fields_set:
            raise ValueError(
                "mixing: read only under aggregation fedasync (FedBuff steps with "
                "the algorithm's server optimizer, algorithm.server)"
            )
        return self


Tech = Literal["lte", "umts", "evdo", "wifi", "5g"]  # a link's radio technology
TECHS: tuple[str, ...] = get_args(Tech)


class TailState(_Strict):
    """One radio state a transfer leaves behind: its seconds and its power."""

    seconds: float = Field(gt=0)
    watts: float = Field(ge=0)


class RadioEnergy(_Strict):
    """``system.energy.radios.<tech>``: one technology's energy, replacing its sourced default
    (or giving one where none is sourced: EVDO, 5G). A message of ``b`` bits taking ``s``
    seconds costs ``j_per_bit · b + active_w · s``, then the tail."""

    down_j_per_bit: float = Field(ge=0, description="J per bit received")
    up_j_per_bit: float = Field(ge=0, description="J per bit sent")
    active_w: float = Field(0.0, ge=0, description="W while a transfer is on")
    tail: tuple[TailState, ...] = Field(
        (), description="the states after a transfer, in order (cut by the next transfer)"
    )


class EnergyLinks(_Strict):
    """``system.energy.links``: each direction's technology; ``auto`` reads it off a trace link
    (Mahimahi: each trace's own, LTE / UMTS / EVDO; 5Gophers: 5g)."""

    down: Literal["auto", "lte", "umts", "evdo", "wifi", "5g"] = "auto"
    up: Literal["auto", "lte", "umts", "evdo", "wifi", "5g"] = "auto"


class JoulesPerFlop(_Strict):
    kind: Literal["constant"]
    j_per_flop: float = Field(ge=0, description="J per FLOP of local work, every client")


class TrainingPower(_Strict):
    kind: Literal["power"]
    watts: float = Field(gt=0, description="W while training: J/FLOP = watts / the client's FLOP/s")


ComputeEnergy = Annotated[JoulesPerFlop | TrainingPower, Field(discriminator="kind")]


class EnergyConfig(_Strict):
    """``system.energy``: joules per client-round from its encoded bits and its FLOPs."""

    links: EnergyLinks = Field(default_factory=EnergyLinks)
    radios: dict[Tech, RadioEnergy] = Field(
        default_factory=dict, description="per technology: replaces or supplies its numbers"
    )
    tails: bool = Field(True, description="charge the radio's tail after each transfer")
    compute: ComputeEnergy | None = Field(
        None, description="J/FLOP: no sourced default, so it must be given"
    )

    @model_validator(mode="after")
    def _compute_given(self) -> EnergyConfig:
        if self.compute is None:
            raise ValueError(
                "compute must be set ({kind: constant, j_per_flop: J} or {kind: power, watts: "
                "W}): fedcomm has no sourced J/FLOP for a phone's training (docs/system.md, "
                "Energy); j_per_flop: 0 leaves compute out"
            )
        return self


class SystemConfig(_Strict):
    """``system``: simulated client links, compute and availability, and the round policy."""

    links: LinksConfig = Field(default_factory=LinksConfig)
    compute: ComputeConfig = Field(default_factory=ComputeConfig)
    availability: Availability = Field(default_factory=lambda: Probability(kind="constant", p=1.0))
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    table: Path | None = Field(
        None,
        description="the user's client table (CSV or parquet: client_id, down_mbps, up_mbps, "
        "compute_speed[, availability, latency_s]), read by every `kind: table`",
    )
    assign: Literal["by_id", "draw"] = Field(
        "by_id",
        description="table rows to clients: by client_id (the table covers every client), or "
        "one row drawn per client from the seed",
    )
    energy: EnergyConfig | None = Field(
        None, description="joules per client-round (absent: none computed, nothing logged)"
    )

    @model_validator(mode="after")
    def _table_given(self) -> SystemConfig:
        kinds = {
            "links.down": self.links.down.kind,
            "links.up": self.links.up.kind,
            "links.latency_s": self.links.latency_s.kind,
            "compute.speed": self.compute.speed.kind,
            "availability": self.availability.kind,
        }
        users = [k for k, v in kinds.items() if v == "table"]
        if users and self.table is None:
            raise ValueError(f"table must be set: {', '.join(users)} read kind 'table'")
        return self

    @model_validator(mode="after")
    def _interval_needs_time(self) -> SystemConfig:
        kind = self.availability.kind
        if self.policy.check == "interval" and kind not in ("windows", "diurnal"):
            raise ValueError(
                f"policy.check is 'interval' and availability is kind {kind!r}, which draws who "
                "is online once a round (nobody leaves mid-round): use availability windows or "
                "diurnal, or check 'start'"
            )
        return self

    @model_validator(mode="after")
    def _energy_techs(self) -> SystemConfig:
        if self.energy is None:
            return self
        given = self.energy.radios
        for direction in ("down", "up"):
            tech = getattr(self.energy.links, direction)
            link = getattr(self.links, direction)
            key = f"energy.links.{direction}"
            if tech == "auto":
                if link.kind != "trace":
                    raise ValueError(
                        f"{key} is 'auto', which reads the technology off a trace link, but "
                        f"links.{direction} is kind {link.kind!r}: set {key} to one of "
                        f"{', '.join(TECHS)}"
                    )
                if link.source != "fivegophers":
                    continue  # Mahimahi's: each trace's own, checked when the traces are read
                tech = "5g"
            if tech not in given and tech not in SOURCED:
                raise ValueError(
                    f"energy.radios.{tech} must be set: links.{direction} is {tech} and fedcomm "
                    f"has no sourced {tech} energy (sourced: {', '.join(SOURCED)}; docs/system.md, "
                    "Energy)"
                )
        return self
