"""Messages in waves (``fedsumm.server_state.wave_size``, :class:`fedrepro.fl.strategy.WaveGrid`):
the server never sends to more than ``wave_size`` clients at once, spools replies to disk, and the
cell's outputs are the same bits as one big send."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_fedsumm_runner import _cell, _run, world  # noqa: F401 (fixture)

from fedrepro.fl import engine
from fedrepro.fl.strategy import SortedCheckpointFedAvg, WaveGrid
from fedrepro.io import InputError
from fedrepro.papers.fedsumm.algorithm import ServerStateConfig


@pytest.mark.parametrize("guidance_model", ["ct"])
def test_waves_give_the_same_bits_and_bound_the_messages_in_flight(world, tmp_path, monkeypatch, guidance_model):
    whole = _run(_cell(world, tmp_path, guidance_model, "FedSUMM", "whole", rounds=3))
    sizes: list[int] = []
    spooled_during_aggregation: list[int] = []
    send = engine.InProcessGrid.send_and_receive

    def counting(self, messages, *, timeout=None):
        messages = list(messages)
        sizes.append(len(messages))
        return send(self, messages, timeout=timeout)

    monkeypatch.setattr(engine.InProcessGrid, "send_and_receive", counting)
    from fedrepro.papers.fedsumm import strategy as fs

    aggregate = fs.FedSummStrategy.aggregate_arrays

    def watching(self, absolute_round, replies):
        spooled_during_aggregation.append(len(list(self._spool_root().glob("*.npys"))))
        assert all(len(m.content["arrays"]) == 0 for m in replies)  # the tensors are on disk
        return aggregate(self, absolute_round, replies)

    monkeypatch.setattr(fs.FedSummStrategy, "aggregate_arrays", watching)
    waved = _run(_cell(world, tmp_path, guidance_model, "FedSUMM", "waves", rounds=3,
                       server_state={"wave_size": 1}, keep_round_checkpoints=True))
    assert max(sizes) == 1  # train, evaluate and query messages: one client at a time
    assert spooled_during_aggregation == [3, 3, 3]  # every reply spooled, each round
    assert not list((waved / "checkpoints" / "replies").iterdir())  # cleaned after the round
    for name in ("adapters.safetensors",):
        assert (waved / name).read_bytes() == (whole / name).read_bytes()
    a = json.loads((whole / "train_log.json").read_text())
    b = json.loads((waved / "train_log.json").read_text())
    assert a == b  # bytes up/down, guidance bytes, rho, losses, evaluation: all the same


def test_wave_size_is_checked():
    with pytest.raises(InputError, match="wave_size"):
        ServerStateConfig.from_config({"wave_size": 0})
    with pytest.raises(InputError, match="wave_size"):
        SortedCheckpointFedAvg(out_dir="x", round_offset=0, expected_clients=1, wave_size=0)


def test_fedavg_strategy_refuses_spooled_replies(tmp_path):
    s = SortedCheckpointFedAvg(out_dir=tmp_path, round_offset=0, expected_clients=1, wave_size=1)
    s._spooled[0] = {"path": Path("x"), "shapes": {}, "bytes": 0, "record_bytes": 0}
    with pytest.raises(NotImplementedError, match="wave_size"):
        s.aggregate_arrays(1, [])
    assert isinstance(WaveGrid(engine.InProcessGrid(lambda m, c: m, 1), s).get_node_ids(), list)
