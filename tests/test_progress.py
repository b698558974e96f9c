"""Progress for long work: the per-round line (time left from rounds x clients, on a fake clock;
one line per round in a real cell's log) and ``python -m fedrepro.progress`` (cells done / total
per paper and target, from the files present and the grids)."""

from __future__ import annotations

import logging
import re

import pytest
from helpers import ROOT, configs, deep_update
from test_fedmcp_runner import _cell, _run, world  # noqa: F401 (the module's fixture)

from fedrepro import catalog, progress
from fedrepro.logs import RoundProgress, clock_text

LINE = re.compile(r"^round (\d+)/(\d+) · (\d+) clients? · elapsed (\d+:\d\d:\d\d) · "
                  r"~(\d+:\d\d:\d\d) left")


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_time_left_is_elapsed_per_client_round_times_client_rounds_left():
    clock = FakeClock()
    p = RoundProgress(10, 3, clock=clock)
    clock.t = 24.0  # 3 client-rounds in 24 s -> 27 left at 8 s each
    assert p.line(1) == "round 1/10 · 3 clients · elapsed 0:00:24 · ~0:03:36 left"
    clock.t = 50.0
    p.line(2)
    clock.t = 72.0  # 9 client-rounds in 72 s -> 21 left x 8 s = 168 s
    assert p.line(3) == "round 3/10 · 3 clients · elapsed 0:01:12 · ~0:02:48 left"
    clock.t = 100.0  # round 4 with 2 of 3 clients: 11 done in 100 s; 6 x 2 left
    assert p.line(4, clients=2).endswith(f"~{clock_text(100 / 11 * 12)} left")
    clock.t = 500.0
    assert p.line(10, extra="loss 1.5000").endswith("· ~0:00:00 left · loss 1.5000")


def test_a_resumed_run_estimates_from_its_own_rounds_only():
    clock = FakeClock()
    p = RoundProgress(10, 2, start_round=4, clock=clock)
    clock.t = 30.0  # round 5: 2 client-rounds in 30 s; 5 rounds x 2 clients left
    assert p.line(5) == "round 5/10 · 2 clients · elapsed 0:00:30 · ~0:02:30 left"
    assert clock_text(90061) == "1 day, 1:01:01"


@pytest.mark.parametrize("method", ["FedMCP", "Local"])
def test_a_cells_log_has_one_progress_line_per_round(world, tmp_path, caplog, method):  # noqa: F811
    caplog.set_level(logging.INFO)
    _run(_cell(world, tmp_path, method, rounds=3))
    lines = [m for r in caplog.records if (m := LINE.match(r.getMessage()))]
    assert [(m[1], m[2], m[3]) for m in lines] == [(str(r), "3", "3") for r in (1, 2, 3)]
    assert lines[-1][5] == "0:00:00"


def _merged(name: str) -> dict:
    demo, paper = configs()
    if name == "paper.yaml":
        deep_update(demo, paper)
    return demo


def test_progress_counts_cells_done_and_outputs_built(tmp_path, capsys):
    config = _merged("config.yaml")
    cells = catalog.target_cells(config, "fedmcp", "table2")
    assert len(cells) == 3  # FedMCP-noLc, -noLb, FedMCP at one seed
    (tmp_path / cells[0]).mkdir(parents=True)
    (tmp_path / cells[0] / "scores.json").write_text("{}")
    (tmp_path / cells[1]).mkdir(parents=True)  # started, not done
    (tmp_path / "results" / "tables").mkdir(parents=True)
    (tmp_path / "results" / "tables" / "fedmcp_table2.csv").write_text("x\n")
    rows = {(r.paper, r.target): r for r in progress.progress(config, tmp_path)}
    t2 = rows[("fedmcp", "table2")]
    assert (t2.done, t2.total, t2.built, t2.kind) == (1, 3, True, "table")
    fig3 = rows[("fedmcp", "figure3")]  # FedAvg-PEFT and FedMCP: the latter not done
    assert (fig3.done, fig3.total, fig3.built) == (0, 2, False)
    assert rows[("fedsumm", "table1")].total == len(catalog.target_cells(config, "fedsumm",
                                                                         "table1"))
    assert {p for p, _ in rows} == set(catalog.PAPERS)
    # the command line: config/config.yaml first, as the Snakefile, then --configfile over it
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text((ROOT / "config" / "config.yaml").read_text())
    assert progress.main(["--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^fedmcp\s+table2\s+1/3  built$", out, re.MULTILINE)
    assert re.search(r"^fedmcp\s+figure3\s+0/2  -$", out, re.MULTILINE)
    assert progress.distinct_cells(config, tmp_path)[0] == 1
    assert re.search(r"^distinct cells done 1/\d+$", out, re.MULTILINE)
    assert progress.main(["--root", str(tmp_path), "--configfile",
                          str(ROOT / "config" / "paper.yaml")]) == 0
    paper = capsys.readouterr().out
    n_paper = len(catalog.target_cells(_merged("paper.yaml"), "fedsum", "table3"))
    assert re.search(rf"^fedsum\s+table3\s+0/{n_paper}  -$", paper, re.MULTILINE)


def test_adafedseleckd_local_and_sampled_cells_log_each_round(tmp_path, caplog):
    """AdaSingle (one client, local runner) and AdaFedAvg with 2 of 3 clients per round."""
    import helpers

    from fedrepro.fl.cell import run_cell

    caplog.set_level(logging.INFO)
    folders = helpers.make_partitions(tmp_path / "clients")
    backbone = helpers.make_backbone(tmp_path)
    single = helpers.make_cell(tmp_path, "AdaSingle", backbone, folders, rounds=2,
                               out_name="single", clients=["Academic"])
    sampled = helpers.make_cell(tmp_path, "AdaFedAvg", backbone, folders, rounds=2,
                                out_name="sampled")
    sampled["clients_per_round"] = 2
    for cell in (single, sampled):
        caplog.clear()
        out = tmp_path / cell["out_dir"]
        run_cell(cell, out / "adapters.safetensors", out / "train_log.json",
                 out / "provenance.json")
        lines = [m for r in caplog.records if (m := LINE.match(r.getMessage()))]
        k = "1" if cell is single else "2"
        assert [(m[1], m[2], m[3]) for m in lines] == [("1", "2", k), ("2", "2", k)]
