"""FedScale's pickles convert into the client table and windows; a malicious pickle never runs."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from fedcomm.cli import app
from fedcomm.errors import InputError
from fedcomm.system import fedscale
from fedcomm.system.fedscale import convert_fedscale
from fedcomm.system.tables import read_client_table, read_windows

# FedScale's documented formats: ms per sample, kbit/s; seconds, looping every finish_time
DEVICES = {
    1: {"computation": 40.0, "communication": 5000.0},
    2: {"computation": 20.0, "communication": 20000.0},
    3: {"computation": 80.0, "communication": 800.0},
}
BEHAVE: dict[Any, Any] = {
    10: {
        "duration": 300,
        "inactive": [50, 200],
        "finish_time": 300,
        "active": [0, 100],
        "model": "SM-G9550",
    },
    11: {  # a reversed pair (no online time) and an inactive time beyond finish_time
        "duration": 100,
        "inactive": [5, 150],
        "finish_time": 100,
        "active": [30, 60],
        "model": "unknown",
    },
    "12": {"duration": 10, "inactive": [], "finish_time": 10, "active": [], "model": "x"},
}


def dump(path: Path, data: object) -> Path:
    path.write_bytes(pickle.dumps(data))
    return path


def test_device_and_behaviour_pickles_convert_to_the_table_and_windows(tmp_path: Path) -> None:
    device, behave = dump(tmp_path / "dev", DEVICES), dump(tmp_path / "beh", BEHAVE)
    written = convert_fedscale(device, behave, tmp_path / "out")
    assert written == [tmp_path / "out" / "clients.parquet", tmp_path / "out" / "windows.parquet"]

    table = read_client_table(written[0])
    assert table.client_id.tolist() == [1, 2, 3]
    assert table.down_mbps.tolist() == [5.0, 20.0, 0.8]  # kbit/s / 1000, one number...
    assert table.up_mbps.tolist() == table.down_mbps.tolist()  # ...for both directions
    assert table.compute_speed.tolist() == [1.0, 2.0, 0.5]  # median 40 ms / computation
    assert table.availability is None and table.latency_s is None

    windows = read_windows(written[1])
    assert windows.client_id.tolist() == [10, 10, 11]  # client 12 has no window: never online
    assert windows.start_s.tolist() == [0.0, 100.0, 60.0]
    assert windows.end_s.tolist() == [50.0, 200.0, 100.0]  # 150 clipped to finish_time
    assert windows.period_s is not None and windows.period_s.tolist() == [300.0, 300.0, 100.0]
    # FedScale's is_active: t % finish_time in [active[i], inactive[i]]
    assert [windows.online(10, t) for t in (10, 75, 150, 310, 375, 450)] == [
        True,
        False,
        True,
        True,
        False,
        True,
    ]
    assert not windows.online(11, 10) and windows.online(11, 170) and not windows.online(12, 1)


def test_either_input_alone_and_overlapping_pairs_merge(tmp_path: Path) -> None:
    only = convert_fedscale(dump(tmp_path / "dev", DEVICES), None, tmp_path / "a")
    assert [p.name for p in only] == ["clients.parquet"]
    overlapping = {0: {"active": [0, 20, 40], "inactive": [30, 35, 50], "finish_time": 60}}
    only = convert_fedscale(None, dump(tmp_path / "beh", overlapping), tmp_path / "b")
    assert [p.name for p in only] == ["windows.parquet"]
    windows = read_windows(only[0])
    assert windows.start_s.tolist() == [0.0, 40.0] and windows.end_s.tolist() == [35.0, 50.0]
    with pytest.raises(InputError, match="give --device, --behave or both"):
        convert_fedscale(None, None, tmp_path / "c")


class Exploit:
    """Unpickling this would write the marker file (``os.system`` of a shell command)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_malicious_pickle_is_refused_before_any_of_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = {1: {"computation": 40.0, "communication": Exploit(marker)}}
    path = dump(tmp_path / "client_device_capacity", evil)
    with pytest.raises(InputError, match=r"refused: the pickle asks for (posix|os)\.system"):
        convert_fedscale(path, None, tmp_path / "out")
    assert not marker.exists()
    assert not (tmp_path / "out").exists()  # nothing written, not even the folder


def test_the_refusal_is_what_protects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same pickle through plain ``pickle.load`` does run its code: the test above can
    fail, and it passes only because the unpickler refuses globals."""
    marker = tmp_path / "pwned"
    path = dump(tmp_path / "evil", {1: {"computation": Exploit(marker), "communication": 1.0}})
    monkeypatch.setattr(fedscale, "_DataOnlyUnpickler", pickle.Unpickler)
    with pytest.raises(InputError):  # os.system returned 0, not a number > 0
        convert_fedscale(path, None, tmp_path / "out")
    assert marker.exists()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "expected a non-empty dict client_id -> .*, got list"),
        ({}, "expected a non-empty dict"),
        ({1: {"computation": 1.0}}, r"client 1: expected \{'computation'"),
        (
            {1: {"computation": 0.0, "communication": 1.0}},
            r"computation is 0.0 \(expected finite, > 0\)",
        ),
        ({1: {"computation": "fast", "communication": 1.0}}, "computation is 'fast' .*a number"),
        ({1: {"computation": 1.0, "communication": float("nan")}}, "communication is nan"),
        ({1: {"computation": True, "communication": 1.0}}, "computation is True"),
        ({-1: {"computation": 1.0, "communication": 1.0}}, "client id -1 is not an integer >= 0"),
        ({"a": {"computation": 1.0, "communication": 1.0}}, "client id 'a' is not an integer"),
        (
            {7: {"computation": 1.0, "communication": 1.0}, "7": DEVICES[1]},
            "client ids repeat",
        ),
    ],
)
def test_bad_device_pickles_are_one_clear_error(tmp_path: Path, data: Any, message: str) -> None:
    path = dump(tmp_path / "dev", data)
    with pytest.raises(InputError, match=message) as err:
        convert_fedscale(path, None, tmp_path / "out")
    assert str(path) in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"active": [0], "inactive": [5]}, "expected a dict with 'active', 'inactive', 'finish"),
        ({"active": [0, 9], "inactive": [5], "finish_time": 10}, "2 active but 1 inactive"),
        ({"active": 0, "inactive": [5], "finish_time": 10}, "active is 0 .*expected a list"),
        ({"active": [-1], "inactive": [5], "finish_time": 10}, r"active\[0\] is -1"),
        ({"active": [0], "inactive": [5], "finish_time": 0}, "finish_time is 0"),
    ],
)
def test_bad_behaviour_pickles_are_one_clear_error(tmp_path: Path, spec: Any, message: str) -> None:
    good = dump(tmp_path / "dev", DEVICES)
    path = dump(tmp_path / "beh", {4: spec})
    with pytest.raises(InputError, match=message):
        convert_fedscale(good, path, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # the good device table is not written either


def test_damaged_or_missing_pickles_and_a_file_as_out(tmp_path: Path) -> None:
    (tmp_path / "cut").write_bytes(pickle.dumps(DEVICES)[:-5])
    with pytest.raises(InputError, match="cut: not a readable pickle"):
        convert_fedscale(tmp_path / "cut", None, tmp_path / "out")
    with pytest.raises(InputError, match="absent: no such file"):
        convert_fedscale(tmp_path / "absent", None, tmp_path / "out")
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="exists and is not a folder"):
        convert_fedscale(dump(tmp_path / "dev", DEVICES), None, tmp_path / "file")


def test_the_command_converts_and_exits_2_on_bad_input(tmp_path: Path) -> None:
    device = dump(tmp_path / "dev", DEVICES)
    out = tmp_path / "out"
    runner = CliRunner()
    done = runner.invoke(
        app, ["system", "convert-fedscale", "--device", str(device), "--out", str(out)]
    )
    assert done.exit_code == 0, done.output
    assert f"wrote {out / 'clients.parquet'}" in done.output
    assert np.allclose(read_client_table(out / "clients.parquet").compute_speed, [1.0, 2.0, 0.5])
    neither = runner.invoke(app, ["system", "convert-fedscale", "--out", str(out)])
    assert neither.exit_code == 2 and "give --device, --behave or both" in neither.output
    evil = dump(tmp_path / "evil", {1: Exploit(tmp_path / "pwned")})
    refused = runner.invoke(
        app, ["system", "convert-fedscale", "--behave", str(evil), "--out", str(out)]
    )
    assert refused.exit_code == 2 and "refused" in refused.output
    assert not (tmp_path / "pwned").exists()
