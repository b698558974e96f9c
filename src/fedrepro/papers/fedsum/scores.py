"""One FedSum cell's reported record (no pandas, no torch: the per-cell evaluation job stays cheap).

FedSum §5.1: "We report the most optimal testing records (with better R-R-1 values) among
different communication rounds".  Every round was evaluated during training (the round log's
``evaluation``); :func:`write_cell_scores` picks the round and writes ``scores.json`` (all six
numbers of that round, and every round's) and that round's extracted sentences
(``predictions.jsonl``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fedrepro.io import InputError, read_json, read_jsonl, write_json_atomic, write_jsonl_atomic

METRICS = ("rouge1_f1", "rouge2_f1", "rougeL_f1", "rouge1_recall", "rouge2_recall", "rougeL_recall")


def reported_round(rounds: list[dict], rule: str = "best_rr1") -> dict:
    """The round FedSum reports: the best ROUGE-1 recall (ties: the earlier round), or the last."""
    if not rounds:
        raise InputError("no evaluated rounds")
    if rule == "best_rr1":
        return max(rounds, key=lambda e: (float(e["metrics"]["rouge1_recall"]), -int(e["round"])))
    if rule == "last":
        return rounds[-1]
    raise InputError(f"fedsum.report_round must be 'best_rr1' or 'last', got {rule!r}")


def write_cell_scores(
    cell: Mapping, train_log: str, test_file: str, scores_out: str, predictions_out: str
) -> dict:
    """``scores.json`` and ``predictions.jsonl`` of one cell from its round log (no model needed:
    every round was evaluated during training)."""
    entries = read_json(train_log).get("rounds") or []
    rounds = []
    for e in entries:
        ev = e.get("evaluation")
        if not ev or "metrics" not in ev:
            raise InputError(
                f"{train_log}: round {e.get('round')} has no evaluation; retrain the cell"
            )
        rounds.append(
            {
                "round": int(e["round"]),
                "metrics": {k: float(ev["metrics"][k]) for k in METRICS},
                "n": int(ev["metrics"]["n"]),
                "evaluated": ev["evaluated"],
                "selected": ev["selected"],
                **({"per_client": ev["per_client"]} if "per_client" in ev else {}),
            }
        )
    from fedrepro.metrics.rouge import scorer_version

    scorer = str(cell.get("rouge_scorer", "rouge"))
    rule = cell.get("report_round", "best_rr1")
    best = reported_round(rounds, rule)
    tests = {r["id"]: r for r in read_jsonl(test_file)}
    rows = []
    for model in sorted(best["selected"]):
        for doc_id in sorted(best["selected"][model]):
            if doc_id not in tests:
                raise InputError(f"{train_log}: document {doc_id} is not in {test_file}")
            sel = [int(j) for j in best["selected"][model][doc_id]]
            sents = tests[doc_id]["meta"]["sentences"]
            rows.append(
                {
                    "model": model,
                    "id": doc_id,
                    "selected": sel,
                    "num_sentences": len(sents),
                    "summary": " ".join(sents[j].strip() for j in sel),
                    "reference": tests[doc_id].get("target", ""),
                }
            )
    write_jsonl_atomic(predictions_out, rows)
    scores = {
        "paper": "fedsum",
        "method": cell["method"],
        "run": Path(cell["out_dir"]).parts[-2],
        "setting": cell["setting"],
        "dataset": cell["dataset"],
        "alpha": cell["alpha"],
        "total": cell["total"],
        "lam": (cell.get("fedsum") or {}).get("lam"),
        "seed": int(cell["seed"]),
        "scale": cell["scale"],
        "report_round": rule,
        "rouge_scorer": scorer,
        "rouge_scorer_version": scorer_version(scorer),
        "round": best["round"],
        "evaluated": best["evaluated"],
        "n": best["n"],
        "metrics": best["metrics"],
        "rounds": [{"round": r["round"], **r["metrics"]} for r in rounds],
    }
    write_json_atomic(scores_out, scores)
    return scores
