"""The drain flag file: what the sidecar writes is what the handler reads."""
import json

from handler.drain_flag import DrainFlag
from handler.sidecar.drain.admission import flag_closer, flag_cutter


def test_a_closed_flag_drains_without_cutting(tmp_path):
    flag = DrainFlag(tmp_path / "drain" / "flag")
    assert not flag.draining() and not flag.cutting()
    flag_closer(flag.path, clock=lambda: 100.0)()
    assert flag.draining() and not flag.cutting()


def test_the_cut_keeps_the_drain_start(tmp_path):
    flag = DrainFlag(tmp_path / "flag")
    flag_closer(flag.path, clock=lambda: 100.0)()
    flag_cutter(flag.path, clock=lambda: 130.0)()
    assert flag.draining() and flag.cutting()
    assert json.loads(flag.path.read_text()) == {"draining_since_epoch": 100.0, "cut_since_epoch": 130.0}


def test_a_flag_made_by_hand_drains_but_never_cuts(tmp_path):
    flag = DrainFlag(tmp_path / "flag")
    flag.path.touch()
    assert flag.draining() and not flag.cutting()
