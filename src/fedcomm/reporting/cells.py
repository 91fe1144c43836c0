"""Markdown cells of the verdict pages: safe cell text, a paired difference in shown units,
a link from one page to another."""

from __future__ import annotations

import os
from pathlib import Path

from fedcomm.reporting.claims import Registry
from fedcomm.reporting.verdict import Paired, shown_decimals, t_text


def cell(text: str) -> str:
    """Text safe inside a markdown table cell (no pipes, no line breaks)."""
    return " ".join(text.split()).replace("|", "\\|")


def difference_text(p: Paired) -> str:
    """``n = 3: d = +0.21 ± 0.05, t = 4.20 (2 df)``, in shown units, with the margin when it is not
    0 (``t = +∞`` when SE is 0)."""
    if p.mean is None:
        return f"n = {p.n}"
    places = shown_decimals(p.se, p.mean)
    text = f"n = {p.n}: d = {p.mean:+.{places}f}"
    if p.se is None:
        return text
    text += f" ± {p.se:.{places}f}"
    if p.margin:
        text += f" (margin {p.margin:+g})"
    if p.t is None:
        return text + ", t undefined (every d on the margin)"
    return f"{text}, t = {t_text(p.t)} ({p.df} df)"


def page_link(registry: Registry, page: str, base: Path) -> str:
    return os.path.relpath(registry.root / page, base).replace(os.sep, "/")
