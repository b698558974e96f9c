"""FedSum's tables and headline claims for the reproduction scorecard
(:mod:`fedrepro.reporting.scorecard`)."""

from __future__ import annotations

from fedrepro.reporting.scorecard import Columns, Headline, Reference, TableSpec

PAPER = "fedsum"
ROUGE = {
    "R-F-1": "rouge1_f1", "R-F-2": "rouge2_f1", "R-F-L": "rougeL_f1",
    "R-R-1": "rouge1_recall", "R-R-2": "rouge2_recall", "R-R-L": "rougeL_recall",
}
RECALL = ("rouge1_recall", "rouge2_recall", "rougeL_recall")
_MAIN = r"(?P<metric>R-[FR]-[12L]) ours mean"
_DIR01 = {"setting": ("dir=0.1",)}


def _main(target: str, title: str, group: str, reference: tuple[Reference, ...], note=""):
    return TableSpec(PAPER, target, title, method="Method",
                     columns=(Columns(_MAIN, group=group),), metrics=ROUGE,
                     reference=reference, note=note)


TABLES = (
    _main("table1", "Table 1", "CNNDM", (Reference("Table 1", where=_DIR01),)),
    _main("table2", "Table 2", "PubMed", (Reference("Table 2", where=_DIR01),)),
    _main("table_wikihow", "WikiHow (appendix)", "WikiHow", (),
          note="the paper prints no WikiHow numbers in its text (not in paper_results.csv)"),
    _main("table_reddit", "Reddit (appendix)", "Reddit", (),
          note="the paper prints no Reddit numbers in its text (not in paper_results.csv)"),
    TableSpec(
        PAPER, "table3", "Table 3", method="Method",
        columns=(Columns(r"(?P<group>Dir=[0-9.∞]+) (?P<metric>R-R-[12L]) ours mean"),),
        metrics=ROUGE,
        reference=(
            Reference("Table 3", group=("setting",),
                      rename={"setting": {"dir=0.5": "Dir=0.5", "dir=1": "Dir=1",
                                          "dir=8": "Dir=8"}}),
            # Dir = 0.1 is Table 1's setting; Table 3 does not repeat it
            Reference("Table 1", group=("setting",), where={**_DIR01, "metric": RECALL},
                      rename={"setting": {"dir=0.1": "Dir=0.1"}}),
        ),
    ),
    TableSpec(
        PAPER, "table4", "Table 4", method="Method", columns=(Columns(_MAIN, group="CNNDM"),),
        metrics=ROUGE,
        reference=(
            Reference("Table 4", rename={"method": {"FedAvg + depth extension":
                                                    "+ Depth Extension"}}),
            # the ablation's first and last rows are Table 1's FedAvg and FedSum
            Reference("Table 1", where={**_DIR01, "method": ("FedAvg", "FedSum")},
                      rename={"method": {"FedSum": "+ Two Extensions"}}),
        ),
    ),
)

_RESULTS = "§5.2 Experiment Result"
_CLAIMED_VS_FEDAVG = {"rouge1_f1": 1.6, "rouge2_f1": 1.31, "rougeL_f1": 1.52,
                      "rouge1_recall": 2.18, "rouge2_recall": 1.82, "rougeL_recall": 2.05}
HEADLINES = tuple(
    Headline(PAPER, "table1", "FedSum", "FedAvg", (metric,), _RESULTS, claimed=gap,
             claim="the most obvious improvements compared to FedAvg are 1.6%/1.31%/1.52% in R-F "
                   "and 2.18%/1.82%/2.05% in R-R on CNNDM")
    for metric, gap in _CLAIMED_VS_FEDAVG.items()
) + tuple(
    Headline(PAPER, target, "FedSum", "FedProx", tuple(ROUGE.values()), _RESULTS,
             claim="comparing FedSum with the optimal baseline (FedProx in Tables 1-2), there "
                   "exists 0.15% total improvement at least (no per-table number)")
    for target in ("table1", "table2")
) + (
    Headline(PAPER, "table4", "+ Two Extensions", "FedAvg", tuple(ROUGE.values()),
             "Table 4 (ablation)",
             claim="both extensions add to FedAvg, the depth extension alone less "
                   "(no number in the text)"),
)
