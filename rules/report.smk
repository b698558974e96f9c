# The page a researcher opens first: Snakemake's own report (`make report`, results/report.html).
#
# Every table and figure of the four papers that the config's targets name is marked report() as an
# input of `report_contents`, with its caption under report/ (one RST per table/figure, templated
# with the config), category = the paper, subcategory = Tables / Figures, labels for the filters
# (fedrepro.reporting.site.report_entries). A table is shown as its HTML rendering
# (results/report/tables/<name>.html, from the table's Markdown); a figure inline.
# `report_provenance` adds package versions, git commit, config hash, machine, per-job wall time
# (benchmarks/) and CPU/GPU time per table.
#
# Only what exists goes in: `report_contents` lists the tables and figures whose files are on disk
# when the workflow is parsed, so `make report` after one table (`snakemake fedmcp_table1`) reports
# that table. `make report` (fedrepro.reporting.make_report) builds the renderings with only the
# report's own rules allowed (it never trains), then asks Snakemake for the report of
# `report_contents`. `report_contents_full` names every table and figure of the config (a dry run
# of the paper grid: `snakemake report_contents_full -n --configfile config/paper.yaml`).
from fedrepro.reporting import site as report_site

REPORT_ITEMS = report_site.report_items(
    ADAFEDSELECKD_ALL + FEDMCP_ALL + FEDSUMM_ALL + FEDSUM_ALL, root="."
)
REPORT_EXISTING = [i for i in REPORT_ITEMS if i["exists"]]
# The reproduction scorecard of the tables on disk (`report_scorecard`, the same code as
# rules/scorecard.smk's `scorecard`, which `rule all` builds over every table of the config): after
# one table the report's scorecard covers that table; the provenance page names the config's tables
# not built yet.
REPORT_SCORECARD_TABLES = [
    i["source"][: -len(".md")] + ".csv"
    for i in REPORT_EXISTING
    if i["kind"] == "table" and Path(i["source"][: -len(".md")] + ".csv").exists()
]
REPORT_SCORECARD_PAPERS = sorted({Path(t).name.split("_")[0] for t in REPORT_SCORECARD_TABLES})
REPORT_SCORECARD_MISSING = [
    i["source"][: -len(".md")] + ".csv"
    for i in REPORT_ITEMS
    if i["kind"] == "table" and i["source"][: -len(".md")] + ".csv" not in REPORT_SCORECARD_TABLES
]
REPORT_SCORECARD = bool(REPORT_SCORECARD_TABLES)


rule report_contents:
    input:
        [
            report(path, **flags)
            for path, flags in report_site.report_entries(
                REPORT_EXISTING, str(config["scale"]), REPORT_SCORECARD_PAPERS
            )
        ],
    params:
        runs=canonical(report_site.run_summary(config)),


rule report_contents_full:
    input:
        [
            report(path, **flags)
            for path, flags in report_site.report_entries(
                REPORT_ITEMS, str(config["scale"]),
                SCORECARD_PAPERS,  # the full scorecard of rule all (rules/scorecard.smk)
                ("results/scorecard/scorecard.html", "results/figures/scorecard_{paper}.png"),
            )
        ],
    params:
        runs=canonical(report_site.run_summary(config)),


rule report_table_html:
    input:
        "results/tables/{report_table}.md",
    output:
        "results/report/tables/{report_table}.html",
    wildcard_constraints:
        report_table="|".join(i["stem"] for i in REPORT_ITEMS if i["kind"] == "table") or "^$",
    log:
        "logs/report_table_html/{report_table}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/report_table_html.py"


rule report_provenance:
    input:
        [i["source"] for i in REPORT_EXISTING],
    output:
        html="results/report/provenance.html",
        json="results/report/provenance.json",
    params:
        entries=canonical(REPORT_EXISTING),
        scorecard_missing=canonical(REPORT_SCORECARD_MISSING),
        patterns=lambda wildcards: canonical(report_site.rule_patterns(workflow.rules)),
        metadata_dir=".snakemake/metadata",
    log:
        "logs/report_provenance.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/report_provenance.py"



rule report_scorecard:
    input:
        tables=REPORT_SCORECARD_TABLES,
    output:
        csv="results/report/scorecard/scorecard.csv",
        md="results/report/scorecard/scorecard.md",
        html="results/report/scorecard/scorecard.html",
        figures=expand("results/report/scorecard/scorecard_{paper}.png", paper=REPORT_SCORECARD_PAPERS),
    params:
        scale=canonical(config["scale"]),
        papers=canonical(REPORT_SCORECARD_PAPERS),
    log:
        "logs/report_scorecard.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/scorecard.py"
