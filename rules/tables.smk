rule adafedseleckd_table:
    input:
        table_scores,
    output:
        csv="results/tables/adafedseleckd_{table}.csv",
        md="results/tables/adafedseleckd_{table}.md",
        tex="results/tables/adafedseleckd_{table}.tex",
    params:
        backbone=lambda wildcards: wf.TABLE_BACKBONES[wildcards.table],
        name=lambda wildcards: wf.TABLE_NAMES[wildcards.table],
        title=lambda wildcards: wf.table_title(config, wildcards.table),
        scale=config["scale"],
    log:
        "logs/adafedseleckd_table/{table}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/adafedseleckd_table.py"


rule adafedseleckd_table3:
    input:
        expand("results/tables/adafedseleckd_table3.{ext}", ext=["csv", "md", "tex"]),


rule adafedseleckd_table4:
    input:
        expand("results/tables/adafedseleckd_table4.{ext}", ext=["csv", "md", "tex"]),


rule adafedseleckd_table6:
    input:
        expand("results/tables/adafedseleckd_table6.{ext}", ext=["csv", "md", "tex"]),
