# The reproduction scorecard (fedrepro.reporting.scorecard): every table the run builds -- the
# same lists as rule all (ADAFEDSELECKD_ALL, FEDMCP_ALL, FEDSUMM_ALL, FEDSUM_ALL) -- beside the
# papers' numbers: |ours - paper|, Kendall tau, the paper's best method, the headline gaps. Each
# paper describes its tables and claims in fedrepro.papers.<paper>.scorecard. Target: scorecard.
from fedrepro.catalog import PAPERS as SCORECARD_ALL_PAPERS

SCORECARD_TABLES = [
    f
    for f in ADAFEDSELECKD_ALL + FEDMCP_ALL + FEDSUM_ALL + FEDSUMM_ALL
    if f.startswith("results/tables/") and f.endswith(".csv")
]
SCORECARD_PAPERS = [
    p for p in SCORECARD_ALL_PAPERS if any(f.startswith(f"results/tables/{p}_") for f in SCORECARD_TABLES)
]
SCORECARD_OUTPUTS = [
    "results/scorecard/scorecard.csv",
    "results/scorecard/scorecard.md",
    "results/scorecard/scorecard.html",
] + expand("results/figures/scorecard_{paper}.png", paper=SCORECARD_PAPERS)


rule scorecard:
    input:
        tables=SCORECARD_TABLES,
    output:
        csv="results/scorecard/scorecard.csv",
        md="results/scorecard/scorecard.md",
        html="results/scorecard/scorecard.html",
        figures=expand("results/figures/scorecard_{paper}.png", paper=SCORECARD_PAPERS),
    params:
        scale=canonical(config["scale"]),
        papers=canonical(SCORECARD_PAPERS),
    log:
        "logs/scorecard.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/scorecard.py"
