"""Claim registration (protocol v2): the design fingerprint and the git checks, on throwaway
repositories."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedcomm.errors import InputError
from fedcomm.reporting.registration import (
    AFTER_DATA,
    RegistrationError,
    check_registration,
    design,
    first_added,
    first_registration,
    is_strict_ancestor,
    same_design,
)

CLAIMS = "docs/claims.yaml"
DATA = "docs/data/x_s0.csv"

ENTRY: dict[str, Any] = {
    "id": "p-i-fedavg",
    "paper": "FedBIAD",
    "claim": "(i) P beats FedAvg",
    "paper_value": "+0.14",
    "metric": "global_accuracy",
    "scale": 100,
    "direction": "greater",
    "a": {"label": "P", "curves": "data/x_s*.csv", "run": "p", "seeds": [0, 1]},
    "b": {"label": "FedAvg", "curves": "data/x_s*.csv", "run": "fedavg"},
    "setting": "MNIST",
    "note": "first note",
}


def _entry(**changes: Any) -> dict[str, Any]:
    entry = copy.deepcopy(ENTRY)
    for key, value in changes.items():
        if key in ("a", "b"):
            entry[key].update(value)
        else:
            entry[key] = value
    return entry


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    cmd += ["-c", "commit.gpgsign=false", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    return tmp_path


def _commit(repo: Path, files: dict[str, str], msg: str = "c") -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
        _git(repo, "add", rel)
    _git(repo, "commit", "-q", "--allow-empty", "-m", msg)
    return _git(repo, "rev-parse", "HEAD")


def _claims(*entries: dict[str, Any], section: str = "behaviours") -> str:
    return yaml.safe_dump({"rule": {"alpha": 0.05}, section: list(entries)}, allow_unicode=True)


# --------------------------------------------------------------------------------- design


def test_design_defaults_and_what_it_leaves_out() -> None:
    d = design(ENTRY)
    assert d["margin"] == 0.0 and d["scale"] == 100 and d["direction"] == "greater"
    assert d["a.run"] == "p" and d["a.within_gib"] is None and d["a.axis"] is None
    assert d["a.minus"] is False and not any(k.startswith("protocol.") for k in d)
    relabelled = _entry(note="other", setting="CIFAR", claim="x", paper_value="1", settled_by="x")
    relabelled["a"].update(label="Q", seeds=[0, 1, 2], curves="data/y.csv")
    assert design(relabelled) == d
    assert design({k: v for k, v in ENTRY.items() if k != "scale"})["scale"] == 1.0


def test_design_axis_default_minus_and_protocol() -> None:
    entry = _entry(
        a={"within_gib": 0.5, "minus": {"curves": "d.csv", "run": "q", "at_round": 3}},
        protocol={"registered": "abc", "n": 5, "looks": [3, 5], "measure": "final"},
    )
    d = design(entry)
    assert d["a.axis"] == "up_down" and d["b.axis"] is None
    assert d["a.minus"] is True and d["a.minus.run"] == "q" and d["a.minus.at_round"] == 3
    assert d["protocol.n"] == 5 and d["protocol.looks"] == [3, 5]
    assert "protocol.registered" not in d and "protocol.cap" not in d
    assert design(_entry(a={"within_gib": 0.5, "axis": "up_down"}))["a.axis"] == "up_down"


def test_same_design() -> None:
    now = design(_entry(protocol={"n": 5}))
    assert same_design(design(ENTRY), now)  # no protocol block then: any now
    pending = _entry(a={"run": None, "curves": None, "pending": "run p"})
    del pending["a"]["run"]
    assert same_design(design(pending), design(ENTRY))  # a pending arm had no run yet
    assert not same_design(design(ENTRY), design(pending))  # but a run cannot go away
    assert not same_design(design(pending), design(_entry(a={"within_gib": 1.0})))
    assert not same_design(design(ENTRY), design(_entry(b={"run": "fedprox"})))
    assert not same_design(design(ENTRY), design(_entry(margin=-1.0)))
    assert not same_design(now, design(_entry(protocol={"n": 3})))
    assert not same_design(design(ENTRY), design(_entry(a={"minus": {"run": "q"}})))


def test_a_v2_registration_fixes_its_protocol_block() -> None:
    """A registration with a protocol block fixes every key of it: nothing may be added later
    (n, looks, spending, measure, cap, axis, round), except ``chosen_among``, which may be
    added or raised (it only raises the threshold), never lowered. An unstated key reads as its
    default (spending pocock, chosen_among 1, a capped measure's axis up_down)."""
    v2 = {"registered": "abc", "n": 3, "measure": "final"}
    reg = design(_entry(protocol=v2))
    assert reg["protocol.spending"] == "pocock" and reg["protocol.chosen_among"] == 1
    assert same_design(reg, design(_entry(protocol={**v2, "spending": "pocock"})))
    assert same_design(reg, design(_entry(protocol={**v2, "chosen_among": 2})))
    five = {**v2, "n": 5, "looks": [3, 5]}
    assert not same_design(reg, design(_entry(protocol=five)))
    assert not same_design(reg, design(_entry(protocol={**v2, "spending": "obrien_fleming"})))
    paid = design(_entry(protocol={**v2, "chosen_among": 2}))
    assert same_design(paid, design(_entry(protocol={**v2, "chosen_among": 3})))
    assert not same_design(paid, reg)  # lowered back to 1
    cap = {"registered": "abc", "n": 3, "measure": "best_within_cap", "cap_gib": 1.0}
    capped = design(_entry(protocol=cap))
    assert capped["protocol.axis"] == "up_down"
    assert same_design(capped, design(_entry(protocol={**cap, "axis": "up_down"})))
    assert not same_design(capped, design(_entry(protocol={**cap, "axis": "up"})))


# ------------------------------------------------------------------------------------ git


def test_first_added_and_strict_ancestor(repo: Path) -> None:
    c1 = _commit(repo, {"a.txt": "1"})
    c2 = _commit(repo, {"b.txt": "1"})
    c3 = _commit(repo, {"a.txt": "2"})
    assert first_added(repo, "a.txt") == c1 and first_added(repo, "b.txt") == c2
    assert first_added(repo, "none.txt") is None
    assert is_strict_ancestor(repo, c1, c3) and is_strict_ancestor(repo, c1[:8], "HEAD")
    assert not is_strict_ancestor(repo, c3, c1)
    assert not is_strict_ancestor(repo, c2, c2[:10])
    assert not is_strict_ancestor(repo, "0" * 40, c3)


def test_registration_before_the_data_passes(repo: Path) -> None:
    reg = _commit(repo, {CLAIMS: _claims(ENTRY)})
    _commit(repo, {DATA: "run,seed\n"})
    now = _entry(note="written after the data", protocol={"registered": reg, "n": 5})
    assert check_registration(repo, CLAIMS, "p-i-fedavg", reg, now, [DATA]) == []
    assert check_registration(repo, CLAIMS, "p-i-fedavg", reg[:9], now, [DATA]) == []
    assert check_registration(repo, CLAIMS, "p-i-fedavg", AFTER_DATA, now, [DATA]) == []


def test_registration_in_the_diagnoses_section(repo: Path) -> None:
    reg = _commit(repo, {CLAIMS: _claims(ENTRY, section="diagnoses")})
    _commit(repo, {DATA: "run,seed\n"})
    assert check_registration(repo, CLAIMS, "p-i-fedavg", reg, ENTRY, [DATA]) == []


@pytest.mark.parametrize("order", ["same commit", "data first"])
def test_data_not_after_the_registration(repo: Path, order: str) -> None:
    if order == "same commit":
        reg = _commit(repo, {CLAIMS: _claims(ENTRY), DATA: "x"})
    else:
        _commit(repo, {DATA: "x"})
        reg = _commit(repo, {CLAIMS: _claims(ENTRY)})
    (problem,) = check_registration(repo, CLAIMS, "p-i-fedavg", reg, ENTRY, [DATA])
    assert DATA in problem and "not after the registration" in problem


def test_untracked_data(repo: Path) -> None:
    reg = _commit(repo, {CLAIMS: _claims(ENTRY)})
    (repo / DATA).parent.mkdir(parents=True)
    (repo / DATA).write_text("x")
    (problem,) = check_registration(repo, CLAIMS, "p-i-fedavg", reg, ENTRY, [DATA])
    assert DATA in problem and "not committed" in problem


def test_missing_commit_and_missing_entry(repo: Path) -> None:
    _commit(repo, {"other.txt": "x"})
    c = _commit(repo, {CLAIMS: _claims(_entry(id="other"))})
    _commit(repo, {DATA: "x"})
    (problem,) = check_registration(repo, CLAIMS, "p-i-fedavg", "deadbeef", ENTRY, [DATA])
    assert "deadbeef does not exist" in problem
    (problem,) = check_registration(repo, CLAIMS, "p-i-fedavg", c, ENTRY, [DATA])
    assert "has no behaviour p-i-fedavg" in problem
    first = _git(repo, "rev-list", "--max-parents=0", "HEAD")
    (problem,) = check_registration(repo, CLAIMS, "p-i-fedavg", first, ENTRY, [DATA])
    assert "has no behaviour p-i-fedavg" in problem  # the file did not exist yet


def test_design_changed_since_registration(repo: Path) -> None:
    reg = _commit(repo, {CLAIMS: _claims(ENTRY)})
    _commit(repo, {DATA: "x"})
    now = _entry(a={"within_gib": 0.5}, b={"within_gib": 0.5}, margin=-1.0)
    (problem,) = check_registration(repo, CLAIMS, "p-i-fedavg", reg, now, [DATA])
    assert "design changed" in problem
    for key in ("a.within_gib", "a.axis", "b.within_gib", "margin"):
        assert key in problem
    assert "a.run" not in problem


def test_not_a_repository_and_no_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # even if tmp is in a repo
    with pytest.raises(RegistrationError, match="not a git repository") as info:
        check_registration(tmp_path, CLAIMS, "x", "abc", ENTRY, [])
    assert isinstance(info.value, InputError) and "\n" not in str(info.value)
    with pytest.raises(RegistrationError, match="not a git repository"):
        first_added(tmp_path / "absent", "x")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RegistrationError, match="git is not installed"):
        first_registration(tmp_path, CLAIMS, "x", ENTRY)


# ------------------------------------------------------------------------ first registration


def test_first_registration_after_a_design_change(repo: Path) -> None:
    _commit(repo, {"other.txt": "x"})
    _commit(repo, {CLAIMS: _claims(ENTRY)})
    _commit(repo, {CLAIMS: _claims(_entry(note="second note"))})
    capped = _entry(a={"within_gib": 0.5}, b={"within_gib": 0.5})
    changed = _commit(repo, {CLAIMS: _claims(capped)})
    _commit(repo, {DATA: "x"})
    _commit(repo, {CLAIMS: _claims(_entry(a={"within_gib": 0.5}, b={"within_gib": 0.5}, note="n"))})
    assert first_registration(repo, CLAIMS, "p-i-fedavg", capped) == changed


def test_first_registration_stays_at_the_oldest_when_only_a_note_changes(repo: Path) -> None:
    first = _commit(repo, {CLAIMS: _claims(ENTRY)})
    _commit(repo, {DATA: "x"})
    _commit(repo, {CLAIMS: _claims(_entry(note="second"), _entry(id="another"))})
    now = _entry(note="third, uncommitted", protocol={"registered": first, "n": 5})
    assert first_registration(repo, CLAIMS, "p-i-fedavg", now) == first


def test_first_registration_of_a_pending_arm_and_of_an_uncommitted_design(repo: Path) -> None:
    pending = copy.deepcopy(ENTRY)
    pending["a"] = {"label": "P", "pending": "run p"}
    first = _commit(repo, {CLAIMS: _claims(pending)})
    _commit(repo, {CLAIMS: _claims(ENTRY)})
    assert first_registration(repo, CLAIMS, "p-i-fedavg", ENTRY) == first
    assert first_registration(repo, CLAIMS, "p-i-fedavg", _entry(margin=0.5)) is None
    assert first_registration(repo, CLAIMS, "absent", ENTRY) is None
