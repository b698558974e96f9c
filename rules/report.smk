# The page a researcher opens first: Snakemake's own report (`make report`, results/report.html).
#
# Every table and figure of the four papers that the config's targets name is marked report() as an
# input of `report_contents`, with its caption under report/ (one RST per table/figure, templated
# with the config), category = the paper, subcategory = Tables / Figures, labels for the filters.
# A table is shown as its HTML rendering (results/report/tables/<name>.html, from the table's
# Markdown); a figure inline. `report_provenance` adds package versions, git commit, config hash,
# machine, per-job wall time (benchmarks/) and CPU/GPU time per table.
#
# Only what exists goes in: `report_contents` lists the tables and figures whose files are on disk
# when the workflow is parsed, so `make report` after one table (`snakemake fedmcp_table1`) reports
# that table. `make report` builds the renderings with only the report's own rules allowed (it
# never trains), then asks Snakemake for the report of `report_contents`.
# `report_contents_full` names every table and figure of the config (for a dry run of the paper
# grid: `snakemake -n --configfile config/paper.yaml report_contents_full`).
from fedrepro.reporting import site as report_site

REPORT_ITEMS = report_site.report_items(
    ADAFEDSELECKD_ALL + FEDMCP_ALL + FEDSUMM_ALL + FEDSUM_ALL, root="."
)
REPORT_SCORECARD = Path(workflow.basedir) / "rules" / "scorecard.smk"


def _report_label(item):
    name = item["name"]
    for word, nice in (("table", "Table "), ("figure", "Figure ")):
        if name.startswith(word):
            rest = name[len(word):].lstrip("_").replace("_", " ")
            return nice + (rest if rest[:1].isdigit() else f"({rest})" if rest else "")
    return name


def _report_entry(item):
    return report(
        item["show"],
        caption=f"../{item['caption']}",
        category=report_site.PAPER_TITLES[item["paper"]],
        subcategory="Tables" if item["kind"] == "table" else "Figures",
        labels={
            "paper": report_site.PAPER_TITLES[item["paper"]],
            "result": _report_label(item),
            "kind": item["kind"],
            "scale": str(config["scale"]),
        },
    )


def _report_inputs(items):
    """The report() entries: the tables and figures of ``items``, the provenance page and, where
    rules/scorecard.smk exists, the scorecard (its table and one figure per paper with a table)."""
    scale = str(config["scale"])
    flag = report  # (a line may not start with the word: Snakemake's parser reads a keyword)
    entries = [_report_entry(i) for i in items]
    entries.append(flag(
        "results/report/provenance.html", caption="../report/provenance.rst",
        category="Provenance", subcategory="Provenance", labels={"page": "provenance", "scale": scale},
    ))
    if REPORT_SCORECARD.exists():
        entries.append(flag(
            "results/scorecard/scorecard.html", caption="../report/scorecard.rst",
            category="Scorecard", subcategory="Scorecard", labels={"page": "scorecard", "scale": scale},
        ))
        for paper in sorted({i["paper"] for i in items if i["kind"] == "table"}):
            entries.append(flag(
                f"results/figures/scorecard_{paper}.png", caption="../report/scorecard_figure.rst",
                category="Scorecard", subcategory="Scorecard",
                labels={"page": report_site.PAPER_TITLES[paper], "scale": scale},
            ))
    return entries


def _report_rule_patterns(wildcards):
    """Each rule's output patterns and benchmark pattern (to find a job's benchmark file)."""
    return {
        r.name: {
            "outputs": [str(o) for o in r.output],
            "benchmark": str(r.benchmark) if r.benchmark else None,
        }
        for r in workflow.rules
    }


REPORT_EXISTING = [i for i in REPORT_ITEMS if i["exists"]]


rule report_contents:
    input:
        _report_inputs(REPORT_EXISTING),
    params:
        runs=report_site.run_summary(config),


rule report_contents_full:
    input:
        _report_inputs(REPORT_ITEMS),
    params:
        runs=report_site.run_summary(config),


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
        entries=REPORT_EXISTING,
        patterns=_report_rule_patterns,
        metadata_dir=".snakemake/metadata",
    log:
        "logs/report_provenance.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/report_provenance.py"


if REPORT_SCORECARD.exists():

    include: "scorecard.smk"
