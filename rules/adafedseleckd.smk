# AdaFedSelecKD (Tables III, IV, VI): one training cell per (backbone, method, scope, seed) over
# the QMSum domain clients, its ROUGE evaluation, and the main tables.
# Grid logic: fedrepro.papers.adafedseleckd.grid.
from fedrepro.papers.adafedseleckd import grid as ada

ADA = config["adafedseleckd"]
QMSUM_DOMAINS = ["Academic", "Committee", "Product"]
TABLES = [t for t, b in ada.TABLE_BACKBONES.items() if b in ADA["backbones"]]
ADAFEDSELECKD_TABLES = expand(
    "results/tables/adafedseleckd_{table}.{ext}", table=TABLES, ext=["csv", "md", "tex"]
)


wildcard_constraints:
    method="|".join(ADA["methods"]),
    partition=ADA["partition"],
    client="|".join(QMSUM_DOMAINS),
    scope="|".join(["all"] + QMSUM_DOMAINS),
    table="|".join(ada.TABLE_BACKBONES),


rule train_cell:
    input:
        backbone="results/backbones/{backbone}",
        data=lambda w: ada.clients_dir(w.partition, w.seed),
    output:
        adapters="results/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}/adapters.safetensors",
        train_log="results/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}/train_log.json",
        provenance="results/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}/provenance.json",
    params:
        cell=lambda w: ada.make_cell(config, w.partition, w.backbone, w.method, w.scope, w.seed),
    threads: ADA["threads_per_cell"]
    resources:
        gpu=lambda wildcards: wf.job_resources(config, wildcards.backbone, "train")["gpu"],
        mem_mb=lambda wildcards: wf.job_resources(config, wildcards.backbone, "train")["mem_mb"],
        runtime=lambda wildcards: wf.job_resources(config, wildcards.backbone, "train")["runtime"],
    log:
        "logs/train_cell/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}.log",
    benchmark:
        "benchmarks/train_cell/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/train_cell.py"


rule evaluate_cell:
    input:
        adapters="results/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}/adapters.safetensors",
        backbone="results/backbones/{backbone}",
        data=lambda w: ada.clients_dir(w.partition, w.seed),
    output:
        predictions="results/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}/predictions.jsonl",
        scores="results/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}/scores.json",
    params:
        evaluate="fedrepro.papers.adafedseleckd.evaluate:evaluate_cell",
        cell=lambda w: ada.make_cell(config, w.partition, w.backbone, w.method, w.scope, w.seed),
    threads: ADA["threads_per_cell"]
    resources:
        gpu=lambda wildcards: wf.job_resources(config, wildcards.backbone, "evaluate")["gpu"],
        mem_mb=lambda wildcards: wf.job_resources(config, wildcards.backbone, "evaluate")["mem_mb"],
        runtime=lambda wildcards: wf.job_resources(config, wildcards.backbone, "evaluate")["runtime"],
    log:
        "logs/evaluate_cell/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}.log",
    benchmark:
        "benchmarks/evaluate_cell/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/evaluate_cell.py"


rule adafedseleckd_table:
    input:
        lambda w: [f"{cell}/scores.json" for cell in ada.table_cells(config, w.table)],
    output:
        csv="results/tables/adafedseleckd_{table}.csv",
        md="results/tables/adafedseleckd_{table}.md",
        tex="results/tables/adafedseleckd_{table}.tex",
    params:
        backbone=lambda wildcards: ada.TABLE_BACKBONES[wildcards.table],
        name=lambda wildcards: ada.TABLE_NAMES[wildcards.table],
        title=lambda wildcards: ada.table_title(config, wildcards.table),
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
