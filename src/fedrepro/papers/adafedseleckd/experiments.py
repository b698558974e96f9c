"""AdaFedSelecKD's experiments beyond the main tables: Tables V, VII, VIII and Figs. 4, 6-12.

Every builder takes the experiment's *spec* (:func:`fedrepro.papers.adafedseleckd.grid.experiment_spec`:
its series -> cell folders, options, scale) and the files of its cells, and writes its outputs
atomically.  "Average ROUGE" (Table V, VII and the figures) is the mean of ROUGE-1, ROUGE-2 and
ROUGE-L F1 of a client's test set, averaged over the seeds (the paper: "averaged over three
random runs"; with data re-drawn per run for Figs. 6-8).

Where the paper prints its numbers (Table V, Table VII, §V-C's 86/88/89 %) they come from the
packaged reference CSV (:func:`fedrepro.reporting.reference.paper_values`) and stand beside ours;
the figures whose values the text does not give show ours only and say so.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fedrepro.io import InputError, atomic_path, read_json, read_jsonl, write_text_atomic
from fedrepro.papers.adafedseleckd.report import collect_scores
from fedrepro.reporting.reference import paper_values
from fedrepro.reporting.tables import ROUGE_KEYS

PAPER = "adafedseleckd"
CLIENT_LABELS = {"samsum": "SAMSum", "ami": "AMI", "icsi": "ICSI", "elitr": "ELITR",
                 "meetingbank": "MeetingBank"}
NOT_GIVEN = ("The paper's values for this figure are not given in its text: ours only.")
DEMO = ("DEMO-SCALE numbers: tiny models trained on generated sample data; NOT comparable to the "
        "paper's numbers.")


def client_label(client: str) -> str:
    return CLIENT_LABELS.get(client, client)


def cell_of(score_path: str | os.PathLike) -> str:
    return str(Path(score_path).parent)


def method_of(cell: str) -> str:
    """The method folder (``AdaFedSelectKD~tau3``) of a cell folder."""
    return Path(cell).parts[-3]


def rouge_frame(spec: Mapping, score_files: Sequence[str]) -> pd.DataFrame:
    """One row per (series, method, client, seed): rouge1/2/L and their mean ``rouge_avg``."""
    by_cell = {cell_of(p): p for p in score_files}
    rows = []
    for series, cells in spec["series"].items():
        for cell in cells:
            if cell not in by_cell:
                raise InputError(f"experiment {spec['name']}: no scores.json for cell {cell}")
            df = collect_scores([by_cell[cell]])
            wide = df[df["metric"].isin(ROUGE_KEYS)].pivot_table(
                index=["client", "seed"], columns="metric", values="value").reset_index()
            for _, r in wide.iterrows():
                rows.append({"series": series, "method": method_of(cell), "client": r["client"],
                             "seed": int(r["seed"]), **{k: float(r[k]) for k in ROUGE_KEYS}})
    out = pd.DataFrame(rows)
    if out.empty:
        raise InputError(f"experiment {spec['name']}: no scores")
    out["rouge_avg"] = out[list(ROUGE_KEYS)].mean(axis=1)
    return out


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Mean, std (ddof 1; 0 for one seed) and seed count of ``rouge_avg`` per series/method/client."""
    g = df.groupby(["series", "method", "client"], sort=False)["rouge_avg"]
    out = g.agg(["mean", "count"]).reset_index()
    out["std"] = g.std(ddof=1).fillna(0.0).to_numpy()
    return out.rename(columns={"mean": "ours_mean", "count": "seeds", "std": "ours_std"})


def _header(spec: Mapping) -> list[str]:
    lines = [f"# AdaFedSelecKD {spec['title']}", "",
             f"Scale: {spec['scale']}; backbone: {spec['backbone']}; mean over "
             "seeds of average ROUGE (mean of R-1, R-2, R-L F1)."]
    if spec["scale"] == "demo":
        lines += ["", f"**{DEMO}**"]
    return lines + [""]


def _md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(_cell(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def _cell(v) -> str:
    if isinstance(v, float):
        return "—" if np.isnan(v) else f"{v:.2f}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def _tex(df: pd.DataFrame, caption: str) -> str:
    def esc(s: str) -> str:
        for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"),
                     ("#", r"\#"), ("$", r"\$"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}")):
            s = s.replace(a, b)
        return s

    cols = list(df.columns)
    body = [" & ".join(esc(_cell(r[c])) for c in cols) + r" \\" for _, r in df.iterrows()]
    return "\n".join([
        r"\begin{table}[t]", r"\centering", rf"\caption{{{esc(caption)}}}",
        r"\begin{tabular}{" + "l" * len(cols) + "}", r"\hline",
        " & ".join(esc(c) for c in cols) + r" \\", r"\hline", *body, r"\hline",
        r"\end{tabular}", r"\end{table}", ""])


def _write_csv(df: pd.DataFrame, path: str) -> None:
    with atomic_path(path, suffix=".csv") as tmp:
        df.to_csv(tmp, index=False, lineterminator="\n")


def _paper(table: str) -> pd.DataFrame:
    return paper_values(PAPER, table)


# -- tables ------------------------------------------------------------------------------
def table5(spec: Mapping, score_files: Sequence[str], out: Mapping[str, str]) -> pd.DataFrame:
    """Table V: average ROUGE per client of the FL algorithms, ours beside the paper's."""
    s = summarize(rouge_frame(spec, score_files))
    ref = _paper("Table V")
    rows = []
    for method in dict.fromkeys(s["method"]):
        row = {"Method": method}
        for client in spec["clients"]:
            hit = s[(s["method"] == method) & (s["client"] == client)]
            paper = ref[(ref["method"] == method) & (ref["client"] == client)]["value"]
            row[f"{client} ours"] = float(hit["ours_mean"].iloc[0]) if len(hit) else float("nan")
            row[f"{client} paper"] = float(paper.iloc[0]) if len(paper) else float("nan")
        rows.append(row)
    df = pd.DataFrame(rows)
    _emit(spec, df, out, "Average ROUGE of the federated algorithms (paper Table V beside ours).")
    return df


def table7(spec: Mapping, score_files: Sequence[str], out: Mapping[str, str]) -> pd.DataFrame:
    """Table VII: new-domain addition (Baseline / Post-addition / Pre-addition) x client."""
    s = summarize(rouge_frame(spec, score_files))
    ref = _paper("Table VII")
    clients = list(dict.fromkeys(list(spec["clients"]) + list(s["client"])))
    rows = []
    for series in spec["series"]:
        row = {"Setting": series}
        for client in clients:
            hit = s[(s["series"] == series) & (s["client"] == client)]
            paper = ref[(ref["setting"] == series) & (ref["client"] == client_label(client))]["value"]
            row[f"{client_label(client)} ours"] = float(hit["ours_mean"].iloc[0]) if len(hit) else float("nan")
            row[f"{client_label(client)} paper"] = float(paper.iloc[0]) if len(paper) else float("nan")
        rows.append(row)
    df = pd.DataFrame(rows)
    _emit(spec, df, out, "New-domain addition with AdaFedSelectKD (paper Table VII beside ours); "
          "post-addition continues the three-client run with the SAMSum client added.")
    return df


def table8(spec: Mapping, score_files: Sequence[str], prediction_files: Sequence[str],
           data_dir: str, out: Mapping[str, str]) -> pd.DataFrame:
    """Table VIII: for ``options.per_domain`` test examples of every domain (drawn with a
    generator seeded by ``options.seed`` and the domain, recorded in the table), the gold summary
    and each compared method's summary side by side."""
    opts = spec["options"]
    per_domain = int(opts.get("per_domain", 1))
    seed = int(opts.get("seed", 1))
    preds = {}
    for path in prediction_files:
        method = method_of(cell_of(path))
        preds[method] = {(r["client"], r["id"]): r for r in read_jsonl(path)}
    rows = []
    for client in spec["clients"]:
        gold = {r["id"]: r["target"] for r in read_jsonl(Path(data_dir) / client / "test.jsonl")}
        ids = random.Random(f"{seed}/case-study/{client}").sample(sorted(gold), min(per_domain, len(gold)))
        for ex_id in ids:
            for method, table in preds.items():
                if (client, ex_id) not in table:
                    raise InputError(f"{method}'s predictions lack {client}/{ex_id}")
                rows.append({"Domain": client, "Example": ex_id, "Method": method,
                             "Summary": table[(client, ex_id)]["prediction"]})
            rows.append({"Domain": client, "Example": ex_id, "Method": "Gold Standard", "Summary": gold[ex_id]})
    df = pd.DataFrame(rows)
    _emit(spec, df, out, f"Case study: summaries of {per_domain} test example(s) per domain "
          f"(drawn with seed {seed}; random.Random('<seed>/case-study/<domain>')).", rouge=False)
    return df


def _emit(spec: Mapping, df: pd.DataFrame, out: Mapping[str, str], caption: str, rouge: bool = True) -> None:
    _write_csv(df, out["csv"])
    lines = _header(spec) if rouge else [f"# AdaFedSelecKD {spec['title']}", ""] + (
        [f"**{DEMO}**", ""] if spec["scale"] == "demo" else [])
    write_text_atomic(out["md"], "\n".join(lines + [caption, "", _md_table(df), ""]))
    if "tex" in out:
        write_text_atomic(out["tex"], _tex(df, caption))


# -- figures -----------------------------------------------------------------------------
def bar_figure(spec: Mapping, score_files: Sequence[str], out: Mapping[str, str]) -> pd.DataFrame:
    """Figs. 6-10, 12: average ROUGE per client, one bar per (series, method), ours only."""
    s = summarize(rouge_frame(spec, score_files))
    _write_csv(s, out["csv"])
    groups = list(dict.fromkeys(zip(s["series"], s["method"])))
    clients = list(dict.fromkeys(s["client"]))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(clients) + 2), 3.6))
    width = 0.8 / max(len(groups), 1)
    for j, (series, method) in enumerate(groups):
        sub = s[(s["series"] == series) & (s["method"] == method)].set_index("client")
        xs = [i + j * width for i in range(len(clients))]
        ys = [sub["ours_mean"].get(c, np.nan) for c in clients]
        es = [sub["ours_std"].get(c, 0.0) for c in clients]
        label = method if len(spec["series"]) == 1 else f"{method} ({series})"
        ax.bar(xs, ys, width, yerr=es, label=label, capsize=2)
    ax.set_xticks([i + width * (len(groups) - 1) / 2 for i in range(len(clients))])
    ax.set_xticklabels([client_label(c) for c in clients])
    ax.set_ylabel("average ROUGE")
    ax.set_title(f"AdaFedSelecKD {spec['title'].split(':')[0]} (ours, {spec['scale']})", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save_png(fig, out["png"])
    write_text_atomic(out["md"], "\n".join(_header(spec) + [NOT_GIVEN, "", _md_table(s), ""]))
    return s


def tau_figure(spec: Mapping, score_files: Sequence[str], out: Mapping[str, str]) -> pd.DataFrame:
    """Fig. 4: average ROUGE per client against the entropy threshold τ (ours only)."""
    s = summarize(rouge_frame(spec, score_files))
    s.insert(0, "tau", [float(x.split("=", 1)[1]) for x in s["series"]])
    s = s.sort_values(["client", "tau"], kind="stable").reset_index(drop=True)
    _write_csv(s, out["csv"])
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for client, sub in s.groupby("client", sort=False):
        ax.errorbar(sub["tau"], sub["ours_mean"], yerr=sub["ours_std"], marker="o", capsize=2,
                    label=client_label(client))
    ax.set_xlabel("entropy threshold τ (nats)")
    ax.set_ylabel("average ROUGE")
    ax.set_title(f"AdaFedSelecKD Fig. 4 (ours, {spec['scale']})", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save_png(fig, out["png"])
    write_text_atomic(out["md"], "\n".join(_header(spec) + [
        NOT_GIVEN + " The paper chose τ = 5 from this search (§IV-D).", "", _md_table(s), ""]))
    return s


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_png(fig, path: str) -> None:
    """Write ``fig`` atomically (no software tag: same bits on rerun) and close it."""
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=130, metadata={"Software": None})
    _pyplot().close(fig)


# -- Fig. 11 and §V-C ----------------------------------------------------------------------
def figure11(spec: Mapping, trace_files: Sequence[str], provenance_files: Sequence[str],
             pos_files: Sequence[str], backbone_dir: str, out: Mapping[str, str]) -> dict:
    """§V-C: per client, the share of target-summary words trained with the KD term from round 1
    to the reported round (the paper's 86 / 88 / 89 %), and the POS distribution of the words
    learned with and without KD (Fig. 11: the first client's; the paper: "the other two clients
    exhibit similar distributions").  Subword decisions become word decisions by
    ``adafedseleckd.analysis.kd_word_rule`` (:func:`fedrepro.papers.adafedseleckd.pos.words_distilled`)."""
    from transformers import AutoTokenizer

    from fedrepro.papers.adafedseleckd import pos

    rule = spec["analysis"]["kd_word_rule"]
    max_target = int(spec["analysis"]["max_target_length"])
    tokenizer = AutoTokenizer.from_pretrained(backbone_dir)
    tags = {}
    for path in pos_files:
        seed = Path(path).parent.parent.name  # seed~<n>
        client = Path(path).stem
        for rec in read_jsonl(path):
            tags[(seed, client, rec["id"])] = rec
    word_ids_of: dict[tuple, list[int]] = {}  # one tokenisation per example, not per occurrence

    def word_ids(key: tuple, rec: dict) -> list[int]:
        if key not in word_ids_of:
            word_ids_of[key] = pos.word_ids_for_targets(rec["target"], rec["words"], tokenizer, max_target)
        return word_ids_of[key]

    shares: dict[str, list[float]] = {}
    words_by_client: dict[str, list[tuple[str, bool | None]]] = {}
    for trace_path, prov_path in zip(trace_files, provenance_files):
        seed = Path(trace_path).parent.name
        trace = read_json(trace_path)
        selected = (read_json(prov_path).get("selected_rounds") or {}).get("rounds") or {}
        for client, rounds in trace["clients"].items():
            upto = int(selected.get(client, trace["rounds"]))
            per_round = []
            for r in range(1, upto + 1):
                occurrences = []
                for ex_id, bit_lists in (rounds.get(str(r)) or {}).items():
                    rec = tags.get((seed, client, ex_id))
                    if rec is None:
                        raise InputError(f"{trace_path}: no POS tags for {client}/{ex_id} (seed {seed})")
                    ids = word_ids((seed, client, ex_id), rec)
                    for bits in bit_lists:
                        decided = pos.words_distilled([b == "1" for b in bits], ids,
                                                      len(rec["words"]), rule)
                        occurrences.append(decided)
                        words_by_client.setdefault(client, []).extend(
                            (w["pos"], d) for w, d in zip(rec["words"], decided))
                per_round.append(occurrences)
            shares.setdefault(client, []).append(pos.kd_word_share(per_round))
    if not shares:
        raise InputError("figure11: the traces hold no client")
    share = {c: float(np.mean(v)) for c, v in shares.items()}
    first = spec["clients"][0] if spec["clients"][0] in words_by_client else next(iter(words_by_client))
    dist = pos.pos_distribution(words_by_client[first])
    ref = _paper("Sec V-C")
    paper_share = {r["client"]: float(r["value"]) for _, r in ref.iterrows()}
    prefix = str(out["png"]).removesuffix(".png")
    note = (f"AdaFedSelectKD on {spec['backbone']} ({spec['scale']} scale); POS panels: client {first}; "
            f"word rule '{rule}'; rounds 1 to the reported round")
    if spec["scale"] == "demo":
        note += f". {DEMO}"
    pos.write_figure11(dist, share, prefix, paper_share, paper_det_pron_percent=74.0, note=note)
    return {"share": share, "distribution": dist, "client": first}


def pos_tags(data_dir: str, client: str, spacy_model: str, out_path: str) -> None:
    """Tag the target summaries of a client's training split with spaCy (one line per example:
    id, target, words with character offsets and universal POS tags)."""
    from fedrepro.io import write_jsonl_atomic
    from fedrepro.papers.adafedseleckd import pos

    records = read_jsonl(Path(data_dir) / client / "train.jsonl")
    tagger = pos.load_tagger(spacy_model)
    words = pos.tag_words([r["target"] for r in records], tagger)
    write_jsonl_atomic(out_path, [{"id": r["id"], "target": r["target"], "words": w}
                                  for r, w in zip(records, words)])
