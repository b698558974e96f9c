"""FedSum cells through the federated runner (in-process Flower engine): what crosses the wire per
method, SCAFFOLD's control variates and FedDC's permutation across rounds via messages, FedSum's
server state, per-round ROUGE and the reported (best R-R-1) round, resume, errors, and the
simulation engine giving the same bits as the in-process one."""

from __future__ import annotations

import random
import shutil
from collections import OrderedDict
from pathlib import Path

import faults
import pytest
import torch

from fedrepro.data.oracle import oracle_labels
from fedrepro.papers.fedsum import task as fedsum_task
from fedrepro.fl.cell import load_final_adapters, run_cell
from fedrepro.io import InputError, read_json, read_jsonl, write_json_atomic, write_jsonl_atomic
from fedrepro.papers.fedsum.scores import reported_round, write_cell_scores

CLIENTS = ["client01", "client02", "client03", "client04"]
SIZES = [2, 3, 4, 7]
HIDDEN = 16
WORDS = [
    "storm",
    "city",
    "river",
    "police",
    "school",
    "market",
    "council",
    "bridge",
    "team",
    "player",
    "coach",
    "fans",
    "season",
    "league",
    "doctor",
    "patient",
    "study",
    "trial",
    "drug",
    "dose",
    "cells",
    "results",
    "minister",
    "budget",
    "vote",
    "tax",
]


def _records(n_train: int = 16, n_test: int = 6) -> list[dict]:
    rng = random.Random(0)
    out = []
    for split, n in (("train", n_train), ("test", n_test)):
        for i in range(n):
            sents = [
                " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 9))) + " ."
                for _ in range(rng.randint(4, 8))
            ]
            target = " ".join(sents[j] for j in sorted(rng.sample(range(len(sents)), 2)))
            out.append(
                {
                    "id": f"doc-{split}-{i:02d}",
                    "source": "cnndm",
                    "split": split,
                    "input": " ".join(sents),
                    "target": target,
                    "meta": {"sentences": sents},
                }
            )
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fedsum")
    recs = _records()
    write_jsonl_atomic(root / "records.jsonl", recs)
    write_jsonl_atomic(
        root / "oracle.jsonl",
        [
            {
                "id": r["id"],
                "sentences": r["meta"]["sentences"],
                "labels": oracle_labels(r["meta"]["sentences"], r["target"], 3),
            }
            for r in recs
        ],
    )
    train = [r["id"] for r in recs if r["split"] == "train"]
    clients, k = {}, 0
    for c, s in zip(CLIENTS, SIZES):
        clients[c] = {"train": train[k : k + s]}
        k += s
    write_json_atomic(
        root / "manifest.json",
        {
            "clients": clients,
            "meta": {"shared": {"test": [r["id"] for r in recs if r["split"] == "test"]}},
        },
    )
    fedsum_task.write_data_folder(
        str(root / "manifest.json"),
        str(root / "records.jsonl"),
        str(root / "oracle.jsonl"),
        str(root / "data"),
        seed=1,
    )
    fedsum_task.prepare_bert_backbone(
        {
            "kind": "tiny",
            "tiny": {
                "vocab_size": 200,
                "d_model": HIDDEN,
                "encoder_layers": 1,
                "heads": 2,
                "ffn_dim": 32,
                "max_source_length": 128,
            },
        },
        [str(root / "records.jsonl")],
        str(root / "backbone"),
    )
    return root


def _cell(
    world: Path,
    tmp: Path,
    method: str,
    rounds: int = 2,
    engine: str = "inprocess",
    name: str | None = None,
    **over,
) -> dict:
    cell = {
        "paper": "fedsum",
        "scale": "demo",
        "backbone": "bert-base",
        "backbone_dir": str(world / "backbone"),
        "method": method,
        "seed": 1,
        "setting": "fedsum-test",
        "dataset": "cnndm",
        "alpha": "0.1",
        "total": 16,
        "clients": CLIENTS,
        "eval_clients": CLIENTS,
        "client_data": {c: str(world / "data" / "clients" / c) for c in CLIENTS},
        "test_file": str(world / "data" / "test.jsonl"),
        "extract_sentences": 2,
        "block_trigrams": True,
        "report_round": "best_rr1",
        "train": {
            "rounds": rounds,
            "local_epochs": 1,
            "lr": 0.005,
            "batch_size": 2,
            "max_tokens": 128,
            "max_sentence_tokens": 32,
        },
        "clients_per_round": 3,
        "eval_batch_size": 8,
        "save_models": "all",
        "threads": 1,
        "engine": engine,
        "keep_round_checkpoints": False,
        "round_timeout_s": 300,
        "out_dir": str(tmp / (name or f"{method}-{engine}")),
    }
    if method in fedsum_task.VARIANTS:
        cell["fedsum"] = {"lam": 0.5, "gamma": 0.3, "pdt_init": "portraits"}
    cell["baselines"] = {
        "mu": 1.0,
        "scaffold_global_lr": 1.0,
        "daisy_period": 1,
        "aggregation_period": 2,
        "fedproto_lambda": 1.0,
    }
    cell.update(over)
    return cell


def _run(cell: dict) -> Path:
    out = Path(cell["out_dir"])
    run_cell(cell, out / "adapters.safetensors", out / "train_log.json", out / "provenance.json")
    return out


def _log(out: Path) -> list[dict]:
    return read_json(out / "train_log.json")["rounds"]


def _model_keys(world: Path) -> set[str]:
    _, model = fedsum_task.fresh_model({"backbone_dir": str(world / "backbone"), "seed": 1})
    return set(model.federated_state())


def _participants(entry: dict) -> list[str]:
    return [CLIENTS[c["partition_id"]] for c in entry["clients"]]


# -- what crosses the wire -------------------------------------------------------------------------
def test_every_method_sends_what_its_paper_sends(world, tmp_path):
    model = _model_keys(world)
    for method in (
        "FedAvg",
        "FedProx",
        "SCAFFOLD",
        "FedNova",
        "FedProto",
        "FedDC",
        "FedSum",
        "FedSum-depth",
    ):
        log = _log(_run(_cell(world, tmp_path, method)))
        assert [e["round"] for e in log] == [1, 2]
        for e in log:
            assert len(e["clients"]) == 3  # clients_per_round = 3 of 4, seeded
            up = {c: set(x["uplink_tensors"]) for c, x in zip(_participants(e), e["clients"])}
            down, extra_up = e["downlink_records"], e["uplink_records"]
            assert set(down) == set(up) == set(extra_up)
            if method == "FedProto":  # no model ever leaves a client; only prototypes
                assert (
                    all(not keys for keys in up.values())
                    and e["bytes_up"] == 0
                    and e["bytes_down"] == 0
                )
                for c in up:
                    assert set(down[c]) == {"fedproto-prototypes"}
                    assert extra_up[c]["fedproto-upload"] == {
                        "class-0": [HIDDEN],
                        "class-1": [HIDDEN],
                    }
                    assert len(extra_up[c]["fedsum-eval"]["doc-ids"]) == 6
                protos = {c: down[c]["fedproto-prototypes"] for c in down}
                if e["round"] == 1:
                    assert all(p == {} for p in protos.values())
                else:
                    assert all(
                        p == {"class-0": [HIDDEN], "class-1": [HIDDEN]} for p in protos.values()
                    )
                continue
            assert all(keys == model for keys in up.values()), method  # Ω = {θ, ω}
            for c in up:
                if method == "FedAvg":
                    assert down[c] == {} and extra_up[c] == {}
                elif method == "FedProx":
                    assert down[c] == {"fedprox": {"proximal-mu": 1.0}} and extra_up[c] == {}
                elif method == "SCAFFOLD":
                    assert (
                        set(down[c]["scaffold-c"]) == model
                        and set(extra_up[c]["scaffold-delta-c"]) == model
                    )
                elif method == "FedNova":
                    assert down[c] == {} and extra_up[c] == {}
                elif method == "FedDC":
                    assert set(down[c]) == {"arrays"} and set(down[c]["arrays"]) == model
                elif method == "FedSum":
                    cfg = down[c]["fedsum"]
                    assert cfg["round"] == e["round"] and cfg["total-rounds"] == 2
                    assert extra_up[c]["fedsum-upload"] == {
                        "class-0": [HIDDEN],
                        "class-1": [HIDDEN],
                        "portrait": [2 * HIDDEN],
                    }
                    if e["round"] == 1:  # ε̄ = Q̄ = 0, no P̄, no PK yet
                        assert cfg["global-significance"] == 0.0 and cfg["global-bias-level"] == 0.0
                        assert down[c]["fedsum-prototypes"] == {} and "fedsum-heads" not in down[c]
                    else:
                        previous = [p for p in _participants(log[0]) if p != c]
                        assert cfg["knowledge-clients"] == previous
                        assert all(
                            0.0 < z < 1.0 for z in cfg["knowledge-weights"]
                        )  # tanh of a distance
                        assert down[c]["fedsum-heads"] == {
                            f"{p}/{k}": s
                            for p in previous
                            for k, s in (("linear1.bias", [1]), ("linear1.weight", [1, HIDDEN]))
                        }
                        assert down[c]["fedsum-prototypes"] == {
                            "class-0": [HIDDEN],
                            "class-1": [HIDDEN],
                        }
                        assert cfg["global-bias-level"] == pytest.approx(
                            log[0]["server"]["global_bias_level"]
                        )
                elif (
                    method == "FedSum-depth"
                ):  # depth only: ε̄ and Q̄, no prototypes, heads or portraits
                    assert set(down[c]) == {"fedsum"} and extra_up[c] == {}
            if method == "FedNova":
                assert e["server"]["local_steps"] == [x["local_steps"] for x in e["clients"]]
        if (
            method == "FedSum"
        ):  # initial portraits of all K clients before round 1 (pdt_init: portraits)
            assert log[0]["server"]["initial_portraits"]["clients"] == CLIENTS
            assert set(log[1]["server"]["pdt"]) == set(CLIENTS)
            pdt = log[1]["server"]["pdt"]
            assert all(pdt[a][b] == pytest.approx(pdt[b][a]) for a in CLIENTS for b in CLIENTS)


def test_scaffold_control_variates_move_through_messages(world, tmp_path):
    """c on the server stays the mean of all N clients' c_i (SCAFFOLD's invariant, c⁰ = c_i⁰ = 0):
    the server's c is built only from the Δc_i the clients sent back."""
    cell = _cell(world, tmp_path, "SCAFFOLD", rounds=3, keep_round_checkpoints=True)
    out = _run(cell)
    log = _log(out)
    from fedrepro.fl.checkpoint import load_state

    for r in (1, 2, 3):
        server_c = torch.load(
            out / "checkpoints" / f"server_state_round_{r:03d}.pt", weights_only=True
        )["control"]
        client_c = {}
        for c in CLIENTS:
            files = sorted((out / "clients" / c).glob("round_*.safetensors"))
            files = [f for f in files if int(f.stem.split("_")[1]) <= r]
            client_c[c] = load_state(files[-1]) if files else None
        assert any(v is not None for v in client_c.values())
        for k, v in server_c.items():
            mean = sum(client_c[c][k].double() for c in CLIENTS if client_c[c] is not None) / len(
                CLIENTS
            )
            assert torch.allclose(v.double(), mean, atol=1e-6), (r, k)
        assert float(v.abs().sum()) > 0
        assert log[r - 1]["server"]["control_norm"] > 0


def test_feddc_permutation_moves_models_between_clients(world, tmp_path):
    """Round 1 ends with a permutation (t mod d = 0): the model a client trains in round 2 is the one
    another client returned in round 1 (recomputed here), never its own."""
    cell = _cell(
        world, tmp_path, "FedDC", rounds=2, clients_per_round=4, keep_round_checkpoints=True
    )
    out = _run(cell)
    log = _log(out)
    assert (
        log[0]["server"]["feddc"]["action"] == "permute"
        and log[1]["server"]["feddc"]["action"] == "aggregate"
    )
    perm = log[0]["server"]["feddc"]["permutation"]
    assert sorted(perm) == CLIENTS and sorted(perm.values()) == CLIENTS
    assert all(receiver != sender for receiver, sender in perm.items())
    held = torch.load(out / "checkpoints" / "server_state_round_001.pt", weights_only=True)["held"]
    initial = fedsum_task.initial_state(cell)
    for receiver, sender in perm.items():
        trained, _, _ = fedsum_task.client_train_round(cell, sender, 1, initial, {})
        for k, v in trained.items():
            assert torch.equal(held[receiver][k], v), (receiver, sender, k)
        assert not torch.equal(
            held[receiver]["head.linear1.weight"], held[sender]["head.linear1.weight"]
        )
    assert (
        log[1]["server"]["holding"] == []
    )  # an aggregation round: every client holds the aggregate


def test_separate_and_fedproto_are_evaluated_per_client(world, tmp_path):
    log = _log(_run(_cell(world, tmp_path, "Separate", rounds=2)))
    for e in log:
        ev = e["evaluation"]
        assert (
            ev["evaluated"] == "clients" and sorted(ev["per_client"]) == CLIENTS
        )  # every client, every round
        assert ev["metrics"]["rouge1_recall"] == pytest.approx(
            sum(ev["per_client"][c]["rouge1_recall"] for c in CLIENTS) / 4
        )
        assert e["bytes_up"] == 0 and e["bytes_down"] == 0
    log = _log(_run(_cell(world, tmp_path, "FedProto", rounds=2)))
    assert sorted(log[0]["evaluation"]["per_client"]) == _participants(log[0])


# -- reported round ------------------------------------------------------------------------------
def test_reported_round_is_the_best_rouge1_recall(world, tmp_path):
    rounds = [
        {"round": r, "metrics": {"rouge1_recall": v}}
        for r, v in ((1, 30.0), (2, 35.0), (3, 35.0), (4, 33.0))
    ]
    assert reported_round(rounds)["round"] == 2  # ties: the earlier round
    assert reported_round(rounds, "last")["round"] == 4
    with pytest.raises(InputError, match="report_round"):
        reported_round(rounds, "best_rf1")
    cell = _cell(world, tmp_path, "FedSum", rounds=3)
    out = _run(cell)
    scores = write_cell_scores(
        cell,
        str(out / "train_log.json"),
        cell["test_file"],
        str(out / "scores.json"),
        str(out / "predictions.jsonl"),
    )
    log = _log(out)
    best = max(log, key=lambda e: (e["evaluation"]["metrics"]["rouge1_recall"], -e["round"]))
    assert scores["round"] == best["round"]
    assert scores["metrics"] == {k: best["evaluation"]["metrics"][k] for k in scores["metrics"]}
    preds = read_jsonl(out / "predictions.jsonl")
    assert len(preds) == 6 and {p["model"] for p in preds} == {"global"}
    assert all(p["selected"] == best["evaluation"]["selected"]["global"][p["id"]] for p in preds)
    assert all(1 <= len(p["selected"]) <= 2 for p in preds)
    # the logged ROUGE of the last round is that of the saved final global model
    finals = load_final_adapters(out / "adapters.safetensors")
    assert fedsum_task.evaluate_state(cell, finals["global"])["metrics"] == pytest.approx(
        log[-1]["evaluation"]["metrics"]
    )


# -- determinism ---------------------------------------------------------------------------------
def test_rerun_and_resume_are_bit_identical(world, tmp_path):
    for method in ("FedSum", "SCAFFOLD"):
        cell = _cell(world, tmp_path, method, rounds=3, name=f"{method}-full")
        full = _run(cell)
        again = _run(dict(cell, out_dir=str(tmp_path / f"{method}-again")))
        assert (full / "adapters.safetensors").read_bytes() == (
            again / "adapters.safetensors"
        ).read_bytes()
        # a run killed after round 2 (round 3's JSON missing): round 3 is redone from the checkpoint
        cut = dict(cell, out_dir=str(tmp_path / f"{method}-cut"), keep_round_checkpoints=True)
        _run(cut)
        (tmp_path / f"{method}-cut" / "checkpoints" / "server_round_003.json").unlink()
        for f in ("adapters.safetensors", "train_log.json"):
            (tmp_path / f"{method}-cut" / f).unlink()
        _run(cut)
        for f in ("adapters.safetensors", "train_log.json"):
            assert (tmp_path / f"{method}-cut" / f).read_bytes() == (full / f).read_bytes(), (
                method,
                f,
            )


def test_size_proportional_selection_through_the_runner(world, tmp_path):
    """fedsum.client_selection: proportional -- the rounds' participants are the seeded
    size-proportional draw over the data folder's sizes (2, 3, 4, 7 documents), for FedSum and
    FedProx alike, and a rerun draws them again."""
    from fedrepro.papers.fedsum.strategy import size_proportional_sample

    sizes = dict(zip(CLIENTS, SIZES))
    expected = [
        sorted(size_proportional_sample(list(range(4)), SIZES, 3, random.Random(f"1/sample/{r}")))
        for r in (1, 2, 3)
    ]
    for method in ("FedProx", "FedSum"):
        cell = _cell(world, tmp_path, method, rounds=3, client_selection="proportional")
        assert fedsum_task.client_sizes(cell) == sizes  # sizes.json of write_data_folder
        log = _log(_run(cell))
        assert [sorted(c["partition_id"] for c in e["clients"]) for e in log] == expected
        assert [sum(c["num_examples"] for c in e["clients"]) for e in log] == [
            sum(SIZES[i] for i in ids) for ids in expected
        ]


@pytest.mark.slow
def test_inprocess_engine_gives_the_same_bits_as_flower_simulation(world, tmp_path):
    # size-proportional selection (FedSum's default): the same participants on both engines
    a = _run(_cell(world, tmp_path, "FedSum", engine="inprocess", client_selection="proportional"))
    b = _run(_cell(world, tmp_path, "FedSum", engine="simulation", client_selection="proportional"))
    assert (a / "adapters.safetensors").read_bytes() == (b / "adapters.safetensors").read_bytes()
    assert (a / "train_log.json").read_bytes() == (b / "train_log.json").read_bytes()
    assert read_json(b / "provenance.json")["engine"] == "simulation"


# -- errors --------------------------------------------------------------------------------------
def test_bad_inputs_fail_clearly(world, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(world / "data" / "clients" / "client02", bad)
    recs = read_jsonl(bad / "train.jsonl")
    del recs[1]["labels"]
    write_jsonl_atomic(bad / "train.jsonl", recs)
    cell = _cell(world, tmp_path, "FedAvg", rounds=1)
    cell["client_data"]["client02"] = str(bad)
    cell["clients_per_round"] = 4
    with pytest.raises(RuntimeError) as err:
        _run(cell)
    assert (
        "train.jsonl" in str(err.value)
        and "record 2" in str(err.value)
        and recs[1]["id"] in str(err.value)
    )
    if not torch.cuda.is_available():  # fedsum.device: cuda without a GPU names the key
        with pytest.raises(InputError, match="device"):
            fedsum_task.fresh_model(dict(_cell(world, tmp_path, "FedAvg"), device="cuda"))
    with pytest.raises(InputError, match="unknown FedSum method"):
        fedsum_task.check_method("FedMagic")
    with pytest.raises(InputError, match="proximal-mu"):
        fedsum_task.client_train_round(
            _cell(world, tmp_path, "FedProx"),
            "client01",
            1,
            fedsum_task.initial_state(_cell(world, tmp_path, "FedProx")),
            {},
        )
    with pytest.raises(InputError, match="'fedsum' record"):
        fedsum_task.client_train_round(
            _cell(world, tmp_path, "FedSum"), "client01", 1, OrderedDict(), {}
        )
    # a source without a test split needs held-out documents
    m = read_json(world / "manifest.json")
    m["meta"]["shared"] = {}
    write_json_atomic(tmp_path / "m.json", m)
    with pytest.raises(InputError, match="heldout_test_docs"):
        fedsum_task.write_data_folder(
            str(tmp_path / "m.json"),
            str(world / "records.jsonl"),
            str(world / "oracle.jsonl"),
            str(tmp_path / "d"),
            seed=1,
        )
    with pytest.raises(
        InputError, match="only 0 training records outside"
    ):  # every one is a client's
        fedsum_task.write_data_folder(
            str(tmp_path / "m.json"),
            str(world / "records.jsonl"),
            str(world / "oracle.jsonl"),
            str(tmp_path / "d"),
            seed=1,
            heldout_test_docs=3,
        )


def test_rouge_recall_beside_f1():
    from fedrepro.metrics.rouge import rouge_f1_recall, rouge_scores

    pred, ref = ["the cat sat on the mat today"], ["the cat sat on a mat"]
    both = rouge_f1_recall(pred, ref)
    f1 = rouge_scores(pred, ref)
    for t in ("rouge1", "rouge2", "rougeL"):
        assert both[f"{t}_f1"] == pytest.approx(f1[t])
    assert both["rouge1_recall"] == pytest.approx(
        100 * 5 / 6
    )  # the, cat, sat, on, mat of 6 reference words
    assert both["rouge2_recall"] == pytest.approx(100 * 3 / 5)  # the cat, cat sat, sat on
    assert both["n"] == 1


def test_only_the_methods_shared_tensors_and_scalars_reach_the_server(world, tmp_path, wire):
    """Issue 17, item 5, at the engine: one round of every federated FedSum method; each reply
    holds Ω (the tensors the server broadcasts) or, for FedProto, no model; the extra records
    each method declares with their shapes (prototypes [H], portraits [2H], SCAFFOLD's Δc_i); and
    scalars.  FedProto's ``fedsum-eval`` carries its test selections on the *shared* test set
    (doc ids and sentence indices: the personalised evaluation), never a training document."""
    from helpers import array_shapes, check_wire

    from fedrepro.papers.fedsum.algorithm import VARIANTS
    from fedrepro.papers.fedsum.baselines import BASELINES

    test_ids = {r["id"] for r in read_jsonl(world / "data" / "test.jsonl")}
    protos = array_shapes({"class-0": [HIDDEN], "class-1": [HIDDEN]})

    def selections(record, pid) -> None:
        assert set(record.keys()) == {"doc-ids", "selected"}
        assert set(record["doc-ids"]) <= test_ids and len(record["selected"]) == len(record["doc-ids"])
        assert all(s == "" or all(j.isdigit() for j in s.split(",")) for s in record["selected"])

    methods = [m for m in (*BASELINES, *VARIANTS) if m != "Separate"]
    for method in methods:
        wire.replies.clear()
        cell = _cell(world, tmp_path, method, rounds=1)
        _run(cell)
        model = {k: tuple(v.shape) for k, v in fedsum_task.initial_state(cell).items()}
        declared = {
            "SCAFFOLD": {"scaffold-delta-c": array_shapes(model)},
            "FedProto": {"fedproto-upload": protos, "fedsum-eval": selections},
            "FedSum": {"fedsum-upload": array_shapes({"class-0": [HIDDEN], "class-1": [HIDDEN],
                                                      "portrait": [2 * HIDDEN]}),
                       "fedsum-portrait": array_shapes({"portrait": [2 * HIDDEN]})},
            "FedSum-breadth": {"fedsum-upload": array_shapes({"class-0": [HIDDEN], "class-1": [HIDDEN],
                                                              "portrait": [2 * HIDDEN]}),
                               "fedsum-portrait": array_shapes({"portrait": [2 * HIDDEN]})},
        }.get(method, {})
        shared = {} if method == "FedProto" else model
        # FedSum's portrait pass before round 1 (pdt_init: portraits): SP_i only, no model
        portraits = [r for r in wire.replies if "fedsum-portrait" in r[2]]
        for _, _, content in portraits:
            assert set(content) == {"arrays", "metrics", "fedsum-portrait"} and len(content["arrays"]) == 0
        assert len(portraits) == (len(CLIENTS) if method in ("FedSum", "FedSum-breadth") else 0), method
        wire.replies[:] = [r for r in wire.replies if r not in portraits] + [
            (kind, pid, {k: v for k, v in content.items() if k != "arrays"}) for kind, pid, content in portraits]
        counts = check_wire(wire, shared, examples=dict(enumerate(SIZES)), declared=declared)
        assert counts["train"] >= 3, method  # clients_per_round of the cell
    assert len(methods) == 9


# -- kill at a random moment, rerun, compare (issue 17; tests/faults.py) ------------------------------
KILL_ROUNDS = 3
OUT = "FedSum/seed~1"
ROW = ["Separate", "FedAvg", "FedSum"]  # a local-only method, a baseline and FedSum


@pytest.fixture(scope="module")
def killable(world, tmp_path_factory):
    """A 3-round FedSum cell job (training + its scores), a row job of ``ROW`` (2 rounds each,
    ``run_fedsum_row``), and the uninterrupted run of each (the references)."""
    root = tmp_path_factory.mktemp("fedsum-kill")
    test_file = str(world / "data" / "test.jsonl")
    cell = dict(_cell(world, root, "FedSum", rounds=KILL_ROUNDS), out_dir=OUT)  # scores.json: run = parts[-2]
    cell_job = ("fedrepro.papers.fedsum.task:run_fedsum_cell",
                [cell, *(f"{OUT}/{f}" for f in ("adapters.safetensors", "train_log.json",
                                              "provenance.json", "scores.json", "predictions.jsonl")),
                 test_file])
    cells = [dict(_cell(world, root, m, rounds=2), out_dir=f"cells/{m}/seed~1") for m in ROW]
    row_job = ("fedrepro.papers.fedsum.task:run_fedsum_row", [cells, test_file])
    return {
        "cell": (root / "cell", cell_job, faults.run(root / "cell" / "reference", *cell_job)),
        "row": (root / "row", row_job, faults.run(root / "row" / "reference", *row_job)),
    }


def test_a_cell_killed_inside_a_checkpoint_write_reruns_to_the_bytes_of_an_uninterrupted_run(killable):
    root, job, seconds = killable["cell"]
    res = faults.check_kill_and_rerun(root, job, [OUT], KILL_ROUNDS, "write", 0, seconds)
    assert res["rerun"] is not None


def test_a_killed_row_job_restores_its_finished_runs_instead_of_retraining_them(killable):
    """Issue 17's bug: SIGKILL inside the first checkpoint write of the row's second run (FedAvg):
    the rerun trains no round of Separate (finished: restored from its receipt), FedAvg from
    round 1, FedSum from scratch -- and every file equals the uninterrupted row's."""
    root, job, seconds = killable["row"]
    dirs = [f"cells/{m}/seed~1" for m in ROW]
    work = root / "second-run"
    res = faults.kill_and_rerun(work, *job, dirs, "write", match="/cells/FedAvg/seed~1/checkpoints/server_round_")
    assert res["at_kill"][dirs[0]]["trained"]
    assert res["rerun"] == dict(zip(dirs, [[], [1, 2], [1, 2]]))
    for d in dirs:
        faults.assert_same_tree(root / "reference" / d, work / d)
    assert "cells/Separate/seed~1 finished before the job was stopped" in (work / "rerun.err").read_text()


@pytest.mark.exhaustive
@pytest.mark.parametrize("kind,seed", [("start", 0), ("after_round", 1), ("random", 2),
                                       ("random", 3), ("write", 4), ("write", 5)])
def test_a_cell_killed_at_seeded_moments_reruns_to_the_same_bytes(killable, kind, seed):
    root, job, seconds = killable["cell"]  # a FedSum cell writes no client files: server writes
    faults.check_kill_and_rerun(root, job, [OUT], KILL_ROUNDS, kind, seed, seconds)


@pytest.mark.exhaustive
@pytest.mark.parametrize("kind,seed", [("random", 0), ("random", 1), ("random", 2), ("random", 3),
                                       ("write", 4), ("write", 5)])
def test_a_row_job_killed_at_seeded_moments_reruns_to_the_same_bytes(killable, kind, seed):
    root, job, seconds = killable["row"]  # Separate writes each client's model every round
    faults.check_kill_and_rerun(root, job, [f"cells/{m}/seed~1" for m in ROW], 2, kind, seed, seconds,
                                writes_per_round=4)


@pytest.mark.parametrize("method", ["FedAvg", "SCAFFOLD", "FedProto", "FedDC", "FedSum"])
def test_declared_payload_matches_the_wire(world, tmp_path, method):
    """parameter_report's shared_per_round is what crosses the wire per client and round (the
    rehearsal's payload check: 4 B per entry up, clients x that down; FedProto sends no model)."""
    from fedrepro.rehearsal.report import check_payload

    out = _run(_cell(world, tmp_path, method))
    prov = read_json(out / "provenance.json")
    rounds = _log(out)
    result = check_payload(prov, rounds)
    assert result["status"] == "ok", result
    shared = prov["parameters"]["shared_per_round"]
    assert (shared == 0) == (method == "FedProto")
    assert shared in (0, prov["parameters"]["model"])
