"""One round of the loop as an object: what its clients' work adds up to.

The loop makes a :class:`Round` per round and asks it, client by client, for the steps of the
round (the timed branch, :mod:`fedcomm.simulation.timed`, asks for the same ones):

- :meth:`Round.turns` trains clients on the backend (the cohort, lazily, in cohort order) and
  :meth:`Round.retrain` one client again under other local steps (a straggler's partial work)
  or another setting of the algorithm (``fit_deadline``'s rungs);
- :meth:`Round.send_down` records a client's downlink, :meth:`Round.encode` encodes its uplink,
  :meth:`Round.send_up` records it as sent, :meth:`Round.cut` as cut by the round's close
  (a dropped client: its uplink ``not_sent`` or ``partial`` and a ``dropped`` client row);
- :meth:`Round.take` aggregates a client: its uplink decoded, its model evaluated now or kept
  until local evaluation is due, its state stored, its client row written. A client whose
  loss or update diverged stops the run (``train.on_divergence: stop``) or is skipped: sent
  and charged, left out of the aggregation.

What the server step and the round's metrics read stays on the round: :attr:`Round.uplinks`
and :attr:`Round.payloads` (the aggregated clients, in cohort order), the bits each way, the
clients' wall seconds, losses and metrics, the skipped clients.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedcomm.algorithms.core import FedAlgorithm, RoundContext, Uplink
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm import bits
from fedcomm.comm.codecs import Compressor
from fedcomm.comm.ledger import Ledger, Status
from fedcomm.comm.payload import Payload
from fedcomm.simulation import checkpoint, local_eval
from fedcomm.simulation.backends import Backend, RoundInputs, Turn
from fedcomm.simulation.data import FederatedTensors
from fedcomm.simulation.divergence import DivergenceError, diverged
from fedcomm.simulation.local_eval import ClientRecord


@dataclass(frozen=True)
class RunParts:
    """What every round of one run uses, fixed for the run (the loop builds it once)."""

    algorithm: FedAlgorithm[Any]
    model: nn.Module  # the one model structure: training (sequential) and evaluation
    data: FederatedTensors
    compressor: Compressor
    backend: Backend
    local: LocalConfig  # train.local
    seed: int
    eval_batch_size: int
    on_divergence: str  # "stop" | "skip"
    divergence_loss: float
    numel: int  # the dense model's parameters (without ProgFed's temporary heads)
    evaluates: bool = True  # False on torchrun's ranks other than 0: no local or global eval


@dataclass(frozen=True)
class Encoded:
    """A client's uplink as encoded, with its wall seconds (decode, local work, encoding)."""

    payload: Payload
    comp_state: Any  # the client's compressor state after encoding (error feedback, ...)
    seconds: float


@dataclass
class Round:
    """Round ``number`` of a run: the clients' work taken so far."""

    run: RunParts
    number: int
    state: checkpoint.RunState
    ledger: Ledger
    ctx: RoundContext
    local_due: bool  # local accuracy is evaluated this round (train.local_eval_every)
    uplinks: list[Uplink] = field(default_factory=list)  # aggregated, cohort order
    payloads: list[Payload] = field(default_factory=list)  # theirs, as encoded
    up_bits: int = 0  # over the link this round (a cut uplink: what it had sent)
    down_bits: int = 0
    # the dense model per uplink, in proportion to the part of its encoding it sent: a client
    # taken (diverged ones included) counts whole, a cut one its sent fraction (comm/up_ratio)
    up_dense_bits: float = 0.0
    train_s: list[float] = field(default_factory=list)  # wall seconds per client taken
    losses: list[tuple[float, int]] = field(default_factory=list)  # (train loss, examples)
    client_metrics: list[Mapping[str, float]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # diverged, left out (on_divergence: skip)

    # -- the clients' work ------------------------------------------------------------------

    def turns(
        self,
        clients: Sequence[int],
        local: LocalConfig | None = None,
        algorithm: FedAlgorithm[Any] | None = None,
    ) -> Iterator[Turn]:
        """``clients`` trained on the backend under ``local`` (the run's when None), one
        :class:`Turn` each, lazily and in order; ``algorithm``: another setting of the run's
        (``fit_deadline``'s rungs of FedBIAD's ``p``; its server state and client states)."""
        if not clients:
            return iter(())
        run = self.run
        inputs = RoundInputs(
            clients, algorithm or run.algorithm, self._state_of, self.state.server, self.ctx,
            run.model, run.data, local if local is not None else run.local, run.seed,
        )  # fmt: skip
        return run.backend.turns(inputs)

    def retrain(
        self, client_id: int, local: LocalConfig, algorithm: FedAlgorithm[Any] | None = None
    ) -> Turn:
        """``client_id`` trained again from the round's start under ``local`` (and
        ``algorithm``, as :meth:`turns`)."""
        (turn,) = self.turns([client_id], local, algorithm)
        return turn

    def encode(self, turn: Turn, compressor: Compressor | None = None) -> Encoded:
        """``turn``'s uplink through the run's compressor, or ``compressor`` (another setting of
        it: ``fit_deadline``'s rungs), from the client's compressor state (its seconds: the
        turn's and these)."""
        t0 = time.perf_counter()
        comp = compressor if compressor is not None else self.run.compressor
        record = self.state.clients.get(turn.client_id)
        comp_in = record.compressor_state if record is not None else comp.init()
        payload, comp_state = comp.encode(turn.result.uplink, comp_in, turn.generator, self.number)
        return Encoded(payload, comp_state, turn.seconds + time.perf_counter() - t0)

    # -- the ledger -------------------------------------------------------------------------

    def send_down(self, turn: Turn, version: int | None = None) -> int:
        """``turn``'s downlink recorded (``version``: the model's, None: ``number - 1``); its
        bits."""
        sent = self.ledger.record(self.number, turn.client_id, "down", turn.down, version=version)
        self.down_bits += sent
        return sent

    def send_up(self, client_id: int, payload: Payload, version: int | None = None) -> None:
        """An uplink recorded as sent whole (``version``: the model its client trained on)."""
        self.up_bits += self.ledger.record(self.number, client_id, "up", payload, version=version)

    def cut(
        self,
        turn: Turn,
        payload: Payload,
        sent_bits: int,
        row: Mapping[str, Any],
        version: int | None = None,
    ) -> None:
        """A dropped client: its uplink recorded as cut when the round closed (``sent_bits`` of
        it over the link: ``partial``; none: ``not_sent``) and its client row (``row``: its
        simulated part) written. Its state stays as it was: the server never saw its work."""
        status: Status = "partial" if sent_bits else "not_sent"
        encoded = payload.nbits().total
        self.up_dense_bits += bits.dense(self.run.numel) * min(sent_bits, encoded) / max(1, encoded)
        self.up_bits += self.ledger.record(
            self.number, turn.client_id, "up", payload, status=status, sent_bits=sent_bits,
            version=version,
        )  # fmt: skip
        self.state.client_rows.append(
            {"round": self.number, "client_id": turn.client_id,
             "num_examples": turn.result.num_examples, **row}
        )  # fmt: skip

    # -- aggregation ------------------------------------------------------------------------

    def take(self, turn: Turn, enc: Encoded, extra: Mapping[str, Any]) -> None:
        """Client ``turn`` aggregated: its uplink decoded, its model evaluated or kept, its state
        stored, its row written (``extra``: the row's simulated part, if any)."""
        result = turn.result
        self.train_s.append(enc.seconds)
        self.up_dense_bits += bits.dense(self.run.numel)
        decoded_up = enc.payload.decode()
        uploaded = result.local_params
        if enc.payload is not result.uplink and self.run.algorithm.uploaded_model is not None:
            uploaded = self.run.algorithm.uploaded_model(turn.decoded_down, decoded_up)
        local = self._store(turn, enc.comp_state, uploaded)
        loss = result.metrics.get("train/loss", math.nan)
        if self._diverged(turn, decoded_up):
            self.skipped.append(turn.client_id)  # sent and charged, left out of the aggregation
        else:
            self.uplinks.append(Uplink(turn.client_id, result.num_examples, decoded_up))
            self.payloads.append(enc.payload)
            self.client_metrics.append(result.metrics)
            self.losses.append((loss, result.num_examples))
        self.state.client_rows.append(
            {
                "round": self.number,
                "client_id": turn.client_id,
                "num_examples": result.num_examples,
                "train_s": enc.seconds,
                "train_loss": loss,
                "local_accuracy": local[0],
                "local_loss": local[1],
                "test_n": local[2],
                **extra,
            }
        )

    def _store(
        self, turn: Turn, comp_state: Any, uploaded: Mapping[str, torch.Tensor]
    ) -> tuple[float | None, float | None, int | None]:
        """The client's record: its state, compressor state and local result. Evaluated now
        when local evaluation is due (the result returned); else the upload is kept until it
        is, its last result reused meanwhile (this upload's row: filled in then)."""
        cid, run = turn.client_id, self.run
        if not run.evaluates:  # (another rank evaluates and writes: only the state is kept)
            self.state.clients[cid] = ClientRecord(
                turn.result.state,
                comp_state,
                *(local_eval.last_result(self.state.clients.get(cid))),
            )
            return (None, None, None)
        if self.local_due:
            local = local_eval.evaluate_upload(
                run.model, uploaded, run.data, cid, run.eval_batch_size
            )
            self.state.clients[cid] = ClientRecord(turn.result.state, comp_state, *local)
            return local
        self.state.clients[cid] = ClientRecord(
            turn.result.state,
            comp_state,
            *(local_eval.last_result(self.state.clients.get(cid))),
            pending=local_eval.copy_to(uploaded, torch.device("cpu")),
            pending_row=len(self.state.client_rows),
        )
        return (None, None, None)

    def _diverged(self, turn: Turn, decoded_up: Mapping[str, torch.Tensor]) -> bool:
        """Whether the client diverged and is to be skipped; raises under ``stop``."""
        run = self.run
        why = diverged(turn.result.metrics.get("train/loss"), decoded_up, run.divergence_loss)
        if why is not None and run.on_divergence == "stop":
            raise DivergenceError(
                f"round {self.number}: client {turn.client_id} diverged: {why}. Lower "
                f"train.local.lr (now {run.local.lr:g}), "
                "or set train.on_divergence: skip to leave such clients out"
            )
        return why is not None

    def _state_of(self, client_id: int) -> Any:
        record = self.state.clients.get(client_id)
        return record.state if record is not None else self.run.algorithm.init_client(client_id)
