"""AdaFedSelecKD's experiment reports (Tables V, VII, VIII, Figs. 4, 6-12) on hand-made score files:
the paper's rows and columns, the paper's numbers beside ours, means over seeds by hand."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import helpers
from fedrepro.io import InputError
from fedrepro.papers.adafedseleckd import experiments as ex
from fedrepro.papers.adafedseleckd import grid as ada


def _config():
    return helpers.configs()[0]


def _write_scores(cell: str, root, method: str, scores: dict, seed: int) -> str:
    """``scores``: client -> (r1, r2, rL)."""
    folder = root / cell
    folder.mkdir(parents=True, exist_ok=True)
    per_client = {c: {"rouge1": v[0], "rouge2": v[1], "rougeL": v[2], "n": 3} for c, v in scores.items()}
    setting = {"AdaSingle": "single", "AdaCentralized": "centralized"}.get(method, "federated")
    path = folder / "scores.json"
    path.write_text(json.dumps({"paper": "adafedseleckd", "scale": "demo", "backbone": "bart-large",
                                "method": method, "setting": setting, "seed": seed,
                                "per_client": per_client}))
    return str(path)


def _spec(config, name, root):
    spec = ada.experiment_spec(config, name)
    spec["series"] = {k: [str(root / c) for c in v] for k, v in spec["series"].items()}
    return spec


def _fill(spec, root, value_of) -> list[str]:
    files = []
    for cells in spec["series"].values():
        for cell in cells:
            method = ex.method_of(cell)
            seed = int(cell.rsplit("~", 1)[1])
            clients = ada.partition_clients(_config(), cell.split("/adafedseleckd/")[1].split("/")[0])
            files.append(_write_scores(str(cell).removeprefix(str(root) + "/"), root,
                                       ada.split_method(method)[0],
                                       {c: value_of(method, c, seed) for c in clients}, seed))
    return files


def _outs(tmp_path, name, table=True):
    exts = ("csv", "md", "tex") if table else ("png", "csv", "md")
    return {e: str(tmp_path / f"{name}.{e}") for e in exts}


def test_table5_has_the_papers_rows_and_columns_and_numbers(tmp_path):
    config = _config()
    config["seeds"] = [1, 2]
    spec = _spec(config, "table5", tmp_path)
    files = _fill(spec, tmp_path, lambda m, c, s: (10.0 + s, 20.0, 30.0))  # avg = 20 + s/3
    df = ex.table5(spec, files, _outs(tmp_path, "t5"))
    assert list(df["Method"]) == ["AdaFedAvg", "AdaFedOPT", "AdaFedProx", "AdaFedNova", "AdaFedSelectKD"]
    assert list(df.columns) == ["Method"] + [f"{c} {w}" for c in ("Academic", "Committee", "Product")
                                             for w in ("ours", "paper")]
    assert df["Academic ours"].tolist() == pytest.approx([20.5] * 5)  # mean over seeds 1 and 2
    nova = df[df["Method"] == "AdaFedNova"].iloc[0]
    assert (nova["Academic paper"], nova["Committee paper"], nova["Product paper"]) == (18.09, 24.81, 23.11)
    md = (tmp_path / "t5.md").read_text()
    assert "DEMO" in md and "Table V" in md
    assert "\\begin{tabular}" in (tmp_path / "t5.tex").read_text()


def test_table7_rows_are_the_three_settings_with_the_samsum_column(tmp_path):
    config = _config()
    spec = _spec(config, "table7", tmp_path)
    files = _fill(spec, tmp_path, lambda m, c, s: (30.0, 0.0, 0.0) if c == "samsum" else (3.0, 3.0, 3.0))
    df = ex.table7(spec, files, _outs(tmp_path, "t7"))
    assert list(df["Setting"]) == ["Baseline", "Post-addition", "Pre-addition"]
    assert "SAMSum ours" in df.columns and "SAMSum paper" in df.columns
    assert pd.isna(df.loc[0, "SAMSum ours"]) and pd.isna(df.loc[0, "SAMSum paper"])  # 3 clients
    assert df.loc[1, "SAMSum ours"] == pytest.approx(10.0) and df.loc[1, "SAMSum paper"] == 34.25
    assert df.loc[2, "Committee paper"] == 26.4 and df.loc[0, "Academic ours"] == pytest.approx(3.0)


def test_bar_and_tau_figures_average_over_seeds(tmp_path):
    config = _config()
    config["seeds"] = [1, 2, 3]
    spec = _spec(config, "figure6", tmp_path)
    files = _fill(spec, tmp_path, lambda m, c, s: (float(s), float(s), float(s)))
    s = ex.bar_figure(spec, files, _outs(tmp_path, "f6", table=False))
    assert set(s["client"]) == {"client1", "client2", "client3"}
    assert s["ours_mean"].tolist() == pytest.approx([2.0] * 9) and s["ours_std"].tolist() == pytest.approx([1.0] * 9)
    assert (s["seeds"] == 3).all()
    assert "not given in its text" in (tmp_path / "f6.md").read_text()
    assert (tmp_path / "f6.png").stat().st_size > 0

    spec4 = _spec(_config(), "figure4", tmp_path / "f4")
    files4 = _fill(spec4, tmp_path / "f4", lambda m, c, s: (1.0, 2.0, 3.0))
    t = ex.tau_figure(spec4, files4, _outs(tmp_path, "f4", table=False))
    assert sorted(set(t["tau"])) == [3.0, 5.0, 7.0]


def test_table8_draws_the_recorded_examples_and_shows_gold_beside_each_method(tmp_path):
    config = _config()
    spec = _spec(config, "table8", tmp_path)
    data = tmp_path / "clients"
    preds = []
    for cell in spec["series"]["methods"]:
        rows = []
        for c in spec["clients"]:
            for i in range(5):
                rows.append({"client": c, "id": f"{c}-{i}", "prediction": f"{ex.method_of(cell)} {c} {i}",
                             "reference": f"gold {c} {i}"})
        (tmp_path / cell).mkdir(parents=True, exist_ok=True)
        path = tmp_path / cell / "predictions.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        preds.append(str(path))
    for c in spec["clients"]:
        (data / c).mkdir(parents=True)
        (data / c / "test.jsonl").write_text("".join(
            json.dumps({"id": f"{c}-{i}", "input": "q", "target": f"gold {c} {i}"}) + "\n" for i in range(5)))
    df = ex.table8(spec, [], preds, str(data), _outs(tmp_path, "t8"))
    assert list(dict.fromkeys(df["Domain"])) == ["Academic", "Committee", "Product"]
    assert list(df["Method"][:3]) == ["AdaFedAvg", "AdaFedSelectKD", "Gold Standard"]
    again = ex.table8(spec, [], preds, str(data), _outs(tmp_path, "t8b"))
    assert again.equals(df)  # seeded draw
    ex_id = df["Example"].iloc[0]
    assert df["Summary"].iloc[2] == f"gold Academic {ex_id.split('-')[1]}"
    preds_missing = tmp_path / "bad.jsonl"
    preds_missing.write_text("")
    with pytest.raises(InputError, match="lack"):
        ex.table8(spec, [], [preds[0], str(preds_missing)], str(data), _outs(tmp_path, "t8c"))


def test_an_experiment_without_its_block_names_the_key():
    config = _config()
    del config["adafedseleckd"]["experiments"]["table7"]
    with pytest.raises(InputError, match="adafedseleckd.experiments.table7"):
        ada.experiment_cells(config, "table7")
    assert "results/tables/adafedseleckd_table7.csv" not in ada.all_experiment_cells(config)


def test_every_experiment_lists_outputs_and_inputs_on_both_configs():
    for config in helpers.configs():
        for name in ada.EXPERIMENTS:
            outs = ada.experiment_outputs(config, name)
            assert outs
            ins = ada.experiment_inputs(config, name)
            assert ins["scores"] if name != "figure5" else ins
