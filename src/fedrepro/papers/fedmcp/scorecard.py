"""FedMCP's tables and headline claims for the reproduction scorecard
(:mod:`fedrepro.reporting.scorecard`)."""

from __future__ import annotations

from fedrepro.reporting.scorecard import Columns, Headline, Reference, TableSpec

PAPER = "fedmcp"
TASKS = ("MRPC", "RTE", "SST-2", "QNLI", "QQP", "MNLI")
_ACC = Columns(r"(?P<group>MRPC|RTE|SST-2|QNLI|QQP|MNLI|Avg) ours mean", metric="accuracy")

TABLES = (
    TableSpec(
        PAPER, "table1", "Table I", method="Method",
        columns=(
            _ACC,
            # the shares at the true roberta-base size (the run's own backbone may be tiny)
            Columns(r"param_pct roberta-base", group="all", metric="trainable_param_pct"),
            Columns(r"comm_pct roberta-base", group="all", metric="comm_pct"),
        ),
        reference=(Reference("Table I"),),
        unranked=("trainable_param_pct", "comm_pct"),
        note="trainable and communicated parameter shares are counted at roberta-base's size",
    ),
    TableSpec(
        PAPER, "table2", "Table II", method="Method", columns=(_ACC,),
        reference=(
            Reference("Table II"),
            # the per-task numbers of the full FedMCP are Table I's (Table II gives the average)
            Reference("Table I", where={"method": ("FedMCP",), "metric": ("accuracy",),
                                        "client": TASKS}),
        ),
        note="the ablations' per-task numbers are not in the paper (Table II reports the average)",
    ),
)

HEADLINES = (
    Headline(PAPER, "table1", "FedMCP", "FedAvg (PEFT)", ("accuracy",),
             "§I Introduction (contributions); §V-D Experimental Results", claimed=1.5,
             groups=("Avg",),
             claim="FedMCP outperforms state-of-the-art FL methods by approximately 1.5% in "
                   "average client accuracy"),
    Headline(PAPER, "table1", "FedMCP", "Local", ("accuracy",), "§V-D Experimental Results",
             groups=("Avg",),
             claim="FedMCP achieves the best or second-best accuracy on all six clients; "
                   "personalization beats local training (no number given)"),
    Headline(PAPER, "table2", "FedMCP", "FedMCP w/o BL", ("accuracy",), "§V-E Ablation Studies",
             claimed=0.64, groups=("Avg",),
             claim="the average accuracy drops by 0.64% when the BL is removed"),
    Headline(PAPER, "table2", "FedMCP", "FedMCP w/o CL", ("accuracy",), "§V-E Ablation Studies",
             claimed=1.27, groups=("Avg",),
             claim="the average accuracy drops by 1.27% when the CL is removed"),
)
