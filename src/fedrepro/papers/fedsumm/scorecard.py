"""FedSUMM's tables and headline claims for the reproduction scorecard
(:mod:`fedrepro.reporting.scorecard`)."""

from __future__ import annotations

from fedrepro.reporting.scorecard import Columns, Headline, Reference, TableSpec

PAPER = "fedsumm"
ROUGE = {"R-1": "rouge1", "R-2": "rouge2", "R-L": "rougeL"}
MODELS = {"bart-base-chinese": "BART", "copy-transformer": "CT"}

TABLES = (
    TableSpec(
        PAPER, "table1", "Table I", method="Regime", group=("Dataset", "Model"),
        columns=(Columns(r"(?P<metric>R-[12L]) ours"),), metrics=ROUGE,
        reference=(Reference("Table I", group=("client", "backbone"),
                             rename={"backbone": MODELS}),),
    ),
    TableSpec(
        PAPER, "table2", "Table II", method="Model",
        columns=(Columns(r"(?P<group>[A-Z]+) ours", metric="rougeL"),),
        reference=(Reference("Table II"),),
    ),
)

_RESULTS = "§IV-B Experimental Results"
HEADLINES = tuple(
    Headline(PAPER, "table1", "FedSUMM", "FedAvg", (metric,), _RESULTS, claimed=gap,
             groups=(f"CSL / {model}",),
             claim=f"on CSL, FedSUMM improves on FedAvg by about {text} (R1, R2, RL) with "
                   f"{'Bart' if model == 'BART' else 'CopyTransformer'}")
    for model, gaps, text in (("CT", (1.2, 0.9, 1.7), "1.2%, 0.9% and 1.7%"),
                              ("BART", (1.9, 5.6, 2.4), "1.9%, 5.6% and 2.4%"))
    for metric, gap in zip(ROUGE.values(), gaps)
) + (
    Headline(PAPER, "table1", "FedSUMM", "FedAvg", tuple(ROUGE.values()), _RESULTS,
             claim="FedSUMM outperforms FedAvg (Table I, every corpus and model; no number "
                   "beyond CSL)"),
)
