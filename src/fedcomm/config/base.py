"""The base of every params section: frozen, unknown keys refused."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
