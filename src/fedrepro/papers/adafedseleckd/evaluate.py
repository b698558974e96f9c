"""Per-client test evaluation of a trained cell: beam-search generation and ROUGE (§IV-C)."""

from __future__ import annotations



from fedrepro.data.seq2seq import collate
from fedrepro.devices import model_device, to_device
from fedrepro.fl.cell import config_hash, load_final_adapters
from fedrepro.papers.adafedseleckd.task import client_examples, client_split_path, get_model, special_ids
from fedrepro.devices import configure_torch
from fedrepro.fl.limits import rehearsal_limit
from fedrepro.io import read_jsonl, write_json_atomic, write_jsonl_atomic
from fedrepro.metrics.rouge import rouge_scores
from fedrepro.papers.adafedseleckd.methods import get_method
from fedrepro.precision import Precision


def generate_summaries(model, tokenizer, examples, gen: dict, batch_size: int,
                       precision=None) -> list[str]:
    """Decode ``examples`` in file order with the local adapter (beam search per ``gen``), under
    the cell's ``precision`` (bf16-mixed: autocast; tf32: TF32 on CUDA; ``None``: fp32)."""
    pad_id, start_id = special_ids(model)
    model.eval()
    precision, device = Precision.of(precision), model_device(model)
    out: list[str] = []
    for i in range(0, len(examples), batch_size):
        batch = to_device(collate(examples[i : i + batch_size], pad_id, start_id), device)
        with precision.region(device), precision.autocast(device):
            ids = model.generate(
                batch["input_ids"],
                batch["attention_mask"],
                role="local",
                num_beams=int(gen["num_beams"]),
                max_new_tokens=int(gen["max_new_tokens"]),
                min_new_tokens=int(gen.get("min_new_tokens", 0)),
                no_repeat_ngram_size=int(gen.get("no_repeat_ngram_size", 0)),
                length_penalty=float(gen.get("length_penalty", 1.0)),
                early_stopping=True,
                do_sample=False,
            )
        out.extend(s.strip() for s in tokenizer.batch_decode(ids, skip_special_tokens=True))
    return out


def rouge_stemming(cell: dict) -> bool:
    """``adafedseleckd.rouge_stemming``: §IV-C scores with HuggingFace ``evaluate``'s ROUGE, whose
    default is no stemming (``use_stemmer=False``); that is the default here (docs/decisions.md)."""
    return bool(cell.get("rouge_stemming", False))


def evaluate_cell(cell: dict, adapters_path: str, predictions_out: str, scores_out: str) -> dict:
    """Generate for each evaluated client's test set and score with ROUGE-1/2/L F1 (stemming per
    :func:`rouge_stemming`).

    Writes ``predictions_out`` (jsonl: client, id, prediction, reference) and ``scores_out`` in the
    contract read by :func:`fedrepro.papers.adafedseleckd.report.collect_scores`.
    """
    configure_torch(cell["threads"])
    tokenizer, model = get_model(cell)
    finals = load_final_adapters(adapters_path)
    spec = get_method(cell["method"])
    gen = cell["generation"]
    rows, per_client = [], {}
    for client in cell["eval_clients"]:
        model.load_adapter_state("local", finals[client])
        records = rehearsal_limit(cell, read_jsonl(client_split_path(cell, client, "test")), "test")
        examples = list(client_examples(cell, client, "test"))
        preds = generate_summaries(model, tokenizer, examples, gen, int(gen["batch_size"]),
                                   Precision.from_cell(cell))
        refs = [r["target"] for r in records]
        scores = rouge_scores(preds, refs, lang="en", stemming=rouge_stemming(cell))
        per_client[client] = {k: scores[k] for k in ("rouge1", "rouge2", "rougeL")} | {"n": scores["n"]}
        rows.extend(
            {"client": client, "id": r["id"], "prediction": p, "reference": r["target"]}
            for r, p in zip(records, preds)
        )
    write_jsonl_atomic(predictions_out, rows)
    result = {
        "paper": cell["paper"],
        "scale": cell["scale"],
        "backbone": cell["backbone"],
        "method": cell["method"],
        "setting": spec.setting,
        "seed": int(cell["seed"]),
        "per_client": per_client,
        "config_hash": config_hash(cell),
    }
    write_json_atomic(scores_out, result)
    return result


def run_row(cells: list[dict]) -> None:
    """A row job: train and evaluate ``cells`` one after the other in this process, each into its
    own folder (the files of the ``train_cell`` and ``evaluate_cell`` rules).  What a killed
    earlier run of the job finished is restored, not run again: a trained cell is only evaluated,
    an evaluated one skipped (:func:`fedrepro.fl.rows.run_row`)."""
    from pathlib import Path

    from fedrepro.fl.cell import run_cell
    from fedrepro.fl.rows import run_row as run_stages

    def train(cell: dict) -> None:
        folder = Path(cell["out_dir"])
        run_cell(cell, str(folder / "adapters.safetensors"), str(folder / "train_log.json"),
                 str(folder / "provenance.json"))

    def evaluate(cell: dict) -> None:
        folder = Path(cell["out_dir"])
        evaluate_cell(cell, str(folder / "adapters.safetensors"), str(folder / "predictions.jsonl"),
                      str(folder / "scores.json"))

    run_stages(cells, [(("adapters.safetensors", "train_log.json", "provenance.json", "kd_trace.json"), train),
                       (("predictions.jsonl", "scores.json"), evaluate)])
