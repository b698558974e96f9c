# fedrepro — end-to-end reproductions of federated-learning-for-text papers.
#   snakemake --cores all                                  demo scale (CPU, minutes)
#   snakemake --cores all adafedseleckd_table3             one table (also fedmcp_table1, fedsumm_table1, ...)
#   snakemake --cores all scorecard                        every table beside the papers' numbers
#   snakemake --configfile config/paper.yaml --profile profiles/slurm   paper scale
#   snakemake --configfile config/paper.yaml --config rehearsal=true    paper-scale rehearsal
#     (every code path a few steps at true size, all under results/rehearsal/; `make rehearse`)
from snakemake.utils import min_version

min_version("9.19")


configfile: "config/config.yaml"


report: "report/workflow.rst"


if config.get("rehearsal"):
    # a rehearsal reads and writes only under results/rehearsal/ (fedrepro.rehearsal)
    workdir: "results/rehearsal"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/sources.smk"
include: "rules/models.smk"
include: "rules/adafedseleckd.smk"
include: "rules/fedmcp.smk"
include: "rules/fedsumm.smk"
include: "rules/fedsum.smk"
include: "rules/rehearsal.smk"
include: "rules/scorecard.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        ["report.json", "report.md"]
        if config.get("rehearsal")
        else [
        ADAFEDSELECKD_ALL,
        FEDMCP_ALL,
        FEDSUMM_ALL,
        FEDSUM_ALL,
        SCORECARD_OUTPUTS,
        "results/data/qmsum/table2_stats.csv",
        "results/stats/sources.csv",
        expand(
            "results/data/{source}/oracle_labels.jsonl",
            source=config["partitions"]["fedsum"]["datasets"],
        ),
        ],
