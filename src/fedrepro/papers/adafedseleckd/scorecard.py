"""AdaFedSelecKD's tables and headline claims for the reproduction scorecard
(:mod:`fedrepro.reporting.scorecard`): how to read our table CSVs, which reference rows are the
paper's numbers, and the gaps the paper's text claims."""

from __future__ import annotations

from fedrepro.reporting.scorecard import Columns, Headline, Reference, TableSpec

PAPER = "adafedseleckd"
ROUGE = {"R-1": "rouge1", "R-2": "rouge2", "R-L": "rougeL"}
MAIN = {"table3": "Table III", "table4": "Table IV", "table6": "Table VI"}
"""The main tables: one backbone each (bart-large, bart-base, led-large)."""

TABLES = tuple(
    TableSpec(PAPER, target, title, method="Method", group=("Client",),
              columns=(Columns(r"(?P<metric>R-1|R-2|R-L) ours mean"),), metrics=ROUGE,
              reference=(Reference(title),))
    for target, title in MAIN.items()
) + (
    TableSpec(PAPER, "table5", "Table V", method="Method",
              columns=(Columns(r"(?P<group>.+) ours", metric="rouge_avg"),),
              reference=(Reference("Table V"),)),
    TableSpec(PAPER, "table7", "Table VII", method="Setting",
              columns=(Columns(r"(?P<group>.+) ours", metric="rouge_avg"),),
              reference=(Reference("Table VII", method="setting"),),
              note="rows are the scenarios (Baseline, Post-addition, Pre-addition) of "
                   "AdaFedSelectKD"),
    TableSpec(PAPER, "table8", "Table VIII", scored=False,
              note="Table VIII is a case study (gold and generated summaries side by side): "
                   "no numbers to compare"),
)

_RESULTS = "§V-A (Research Question 1), 1) Automatic Evaluation"
HEADLINES = tuple(
    Headline(PAPER, target, "AdaFedSelectKD", "AdaFedAvg", tuple(ROUGE.values()), _RESULTS,
             claimed=1.2,
             claim="AdaFedSelectKD outperforms AdaFedAvg, improving the ROUGE score by "
                   "approximately 1.2 points (Tables III, IV, VI; our reading: the mean over "
                   "clients and R-1/R-2/R-L, which in the paper's own tables is 1.07, 0.84, 0.88)")
    for target in MAIN
) + tuple(
    Headline(PAPER, target, "AdaFedSelectKD", "AdaFedKD", tuple(ROUGE.values()), _RESULTS,
             claim="compared with AdaFedKD, AdaFedSelectKD demonstrates superior performance "
                   "(no number given)")
    for target in MAIN
) + (
    Headline(PAPER, "table5", "AdaFedSelectKD", "AdaFedAvg", ("rouge_avg",),
             "§V-A (Research Question 1), Table V",
             claim="AdaFedSelectKD emerges as the most effective beside AdaFedOPT, AdaFedProx "
                   "and AdaFedNova (no number given)"),
    Headline(PAPER, "table7", "Pre-addition", "Post-addition", ("rouge_avg",),
             "§V-B (Research Question 2), 3) Extreme Non-IID, Table VII",
             groups=("Academic", "Committee", "Product", "SAMSum"),
             claim="the pre-addition scenario outperforms the post-addition scenario "
                   "(no number given)"),
)
