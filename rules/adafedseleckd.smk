# AdaFedSelecKD: one training cell per (split, backbone, method[~variant], scope, seed), its ROUGE
# evaluation, the main tables (III, IV, VI) and every other experiment of the paper (Tables V, VII,
# VIII, Figs. 4-12: adafedseleckd_<name>).  Grid logic: fedrepro.papers.adafedseleckd.grid.
from fedrepro.papers.adafedseleckd import grid as ada
from fedrepro.papers.adafedseleckd.methods import METHODS as ADA_METHODS

ADA = config["adafedseleckd"]
TABLES = [t for t, b in ada.TABLE_BACKBONES.items() if b in ADA["backbones"]]
ADAFEDSELECKD_TABLES = expand(
    "results/tables/adafedseleckd_{table}.{ext}", table=TABLES, ext=["csv", "md", "tex"]
)
ADA_EXPERIMENTS = [e for e in ada.EXPERIMENTS if e in ADA.get("experiments", {})]
ADA_EXPERIMENT_FILES = {
    e: ada.experiment_outputs(config, e) for e in ADA_EXPERIMENTS
}
ADAFEDSELECKD_ALL = ADAFEDSELECKD_TABLES + [f for fs in ADA_EXPERIMENT_FILES.values() for f in fs]


wildcard_constraints:
    method="(" + "|".join(ADA_METHODS) + ")(~[A-Za-z0-9.]+)?",
    partition="|".join(ada.PARTITIONS),
    client="|".join(ada.all_clients(config)),
    scope="|".join(["all"] + ada.all_clients(config)),
    table="|".join(ada.TABLE_BACKBONES),


rule train_cell:
    input:
        backbone="results/backbones/{backbone}",
        data=lambda w: ada.clients_dir(w.partition, w.seed),
        init=lambda w: ada.init_inputs(config, w.partition, w.backbone, w.method, w.seed),
    output:
        adapters="results/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}/adapters.safetensors",
        train_log="results/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}/train_log.json",
        provenance="results/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}/provenance.json",
        kd_trace="results/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}/kd_trace.json",
    params:
        cell=lambda w: canonical(ada.make_cell(config, w.partition, w.backbone, w.method, w.scope, w.seed)),
    threads: ADA["threads_per_cell"]
    resources:
        gpu=lambda wildcards: wf.job_resources(config, wildcards.backbone, "train")["gpu"],
        gpu_mem_mb=lambda wildcards: wf.gpu_mem_mb(wf.job_resources(config, wildcards.backbone, "train")),
        mem_mb=lambda wildcards: wf.job_mem_mb(config, wildcards.backbone, "train", wildcards.method),
        runtime=lambda wildcards: wf.job_resources(config, wildcards.backbone, "train")["runtime"],
    priority: wf.rule_priority(config, "train_cell")
    log:
        "logs/train_cell/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}.log",
    benchmark:
        "benchmarks/train_cell/adafedseleckd/{partition}/{backbone}/{method}/{scope}/seed~{seed}.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/train_cell.py"


if ada.rows_enabled(config):

    ruleorder: adafedseleckd_row > adafedseleckd_cell > train_cell
    ruleorder: adafedseleckd_row > adafedseleckd_cell > evaluate_cell

    rule adafedseleckd_row:
        input:
            backbone="results/backbones/{backbone}",
            data=lambda w: ada.clients_dir(w.partition, w.seed),
        output:
            ada.row_outputs(),
        params:
            cells=lambda w: canonical(ada.row_cells(config, w.partition, w.backbone, w.seed)),
        threads: ADA["threads_per_cell"]
        resources:
            gpu=lambda wildcards: wf.job_resources(config, wildcards.backbone, "train")["gpu"],
            gpu_mem_mb=lambda wildcards: wf.gpu_mem_mb(wf.job_resources(config, wildcards.backbone, "train")),
            mem_mb=lambda wildcards: max(wf.job_mem_mb(config, wildcards.backbone, "train", c["method"])
                                         for c in ada.row_cells(config, wildcards.partition, wildcards.backbone, wildcards.seed)),
            runtime=lambda wildcards: 3 * wf.job_resources(config, wildcards.backbone, "train")["runtime"],
        priority: wf.rule_priority(config, "train_cell")
        log:
            "logs/adafedseleckd_row/{partition}/{backbone}/seed~{seed}.log",
        benchmark:
            "benchmarks/adafedseleckd_row/{partition}/{backbone}/seed~{seed}.tsv"
        conda:
            "../envs/train.yaml"
        script:
            "../workflow_scripts/adafedseleckd_row.py"

    # every other cell (Table V methods, variants, single/centralized, the experiments' cells):
    # trained and evaluated by one job instead of two (one Python/torch/Flower start-up less)
    rule adafedseleckd_cell:
        input:
            backbone="results/backbones/{backbone}",
            data=lambda w: ada.clients_dir(w.partition, w.seed),
            init=lambda w: ada.init_inputs(config, w.partition, w.backbone, w.method, w.seed),
        output:
            ada.cell_outputs(),
        params:
            cells=lambda w: canonical([ada.make_cell(config, w.partition, w.backbone, w.method, w.scope, w.seed)]),
        threads: ADA["threads_per_cell"]
        resources:
            gpu=lambda wildcards: wf.job_resources(config, wildcards.backbone, "train")["gpu"],
            gpu_mem_mb=lambda wildcards: wf.gpu_mem_mb(wf.job_resources(config, wildcards.backbone, "train")),
            mem_mb=lambda wildcards: wf.job_mem_mb(config, wildcards.backbone, "train", wildcards.method),
            runtime=lambda wildcards: wf.job_resources(config, wildcards.backbone, "train")["runtime"]
            + wf.job_resources(config, wildcards.backbone, "evaluate")["runtime"],
        priority: wf.rule_priority(config, "train_cell")
        log:
            "logs/adafedseleckd_cell/{partition}/{backbone}/{method}/{scope}/seed~{seed}.log",
        benchmark:
            "benchmarks/adafedseleckd_cell/{partition}/{backbone}/{method}/{scope}/seed~{seed}.tsv"
        conda:
            "../envs/train.yaml"
        script:
            "../workflow_scripts/adafedseleckd_row.py"


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
        cell=lambda w: canonical(ada.make_cell(config, w.partition, w.backbone, w.method, w.scope, w.seed)),
    threads: ADA["threads_per_cell"]
    resources:
        gpu=lambda wildcards: wf.job_resources(config, wildcards.backbone, "evaluate")["gpu"],
        gpu_mem_mb=lambda wildcards: wf.gpu_mem_mb(wf.job_resources(config, wildcards.backbone, "evaluate")),
        mem_mb=lambda wildcards: wf.job_mem_mb(config, wildcards.backbone, "evaluate", wildcards.method),
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
        backbone=lambda wildcards: canonical(ada.TABLE_BACKBONES[wildcards.table]),
        name=lambda wildcards: canonical(ada.TABLE_NAMES[wildcards.table]),
        title=lambda wildcards: canonical(ada.table_title(config, wildcards.table)),
        scale=canonical(config["scale"]),
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


rule adafedseleckd_pos_tags:
    input:
        data=lambda w: ada.clients_dir(w.partition, w.seed),
    output:
        "results/partitions/adafedseleckd-{partition}/seed~{seed}/pos/{client}.jsonl",
    params:
        spacy_model=canonical(ada.spacy_model(config)),
    priority: wf.rule_priority(config, "adafedseleckd_pos_tags")
    log:
        "logs/adafedseleckd_pos_tags/{partition}/seed~{seed}/{client}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/adafedseleckd_pos_tags.py"


rule adafedseleckd_experiment_table:
    input:
        unpack(lambda w: ada.experiment_inputs(config, w.ada_table)),
    output:
        csv="results/tables/adafedseleckd_{ada_table}.csv",
        md="results/tables/adafedseleckd_{ada_table}.md",
        tex="results/tables/adafedseleckd_{ada_table}.tex",
    wildcard_constraints:
        ada_table="table5|table7|table8",
    params:
        spec=lambda w: canonical(ada.experiment_spec(config, w.ada_table)),
    log:
        "logs/adafedseleckd_experiment/{ada_table}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/adafedseleckd_experiment.py"


rule adafedseleckd_experiment_figure:
    input:
        unpack(lambda w: ada.experiment_inputs(config, w.ada_figure)),
    output:
        png="results/figures/adafedseleckd_{ada_figure}.png",
        csv="results/figures/adafedseleckd_{ada_figure}.csv",
        md="results/figures/adafedseleckd_{ada_figure}.md",
    wildcard_constraints:
        ada_figure="figure4|figure6|figure7|figure8|figure9|figure10|figure11|figure12|figure5",
    params:
        spec=lambda w: canonical(ada.experiment_spec(config, w.ada_figure)),
    log:
        "logs/adafedseleckd_experiment/{ada_figure}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/adafedseleckd_experiment.py"


rule adafedseleckd_human_eval_kit:
    input:
        unpack(lambda w: ada.experiment_inputs(config, "figure5", kit=True)),
    output:
        directory("results/human_eval/adafedseleckd"),
    params:
        spec=lambda w: canonical(ada.experiment_spec(config, "figure5")),
    log:
        "logs/adafedseleckd_human_eval_kit/kit.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/adafedseleckd_human_eval_kit.py"


rule adafedseleckd_table5:
    input:
        ADA_EXPERIMENT_FILES.get("table5", []),


rule adafedseleckd_table7:
    input:
        ADA_EXPERIMENT_FILES.get("table7", []),


rule adafedseleckd_table8:
    input:
        ADA_EXPERIMENT_FILES.get("table8", []),


rule adafedseleckd_figure4:
    input:
        ADA_EXPERIMENT_FILES.get("figure4", []),


rule adafedseleckd_figure5:
    input:
        ADA_EXPERIMENT_FILES.get("figure5", []),


rule adafedseleckd_figure6:
    input:
        ADA_EXPERIMENT_FILES.get("figure6", []),


rule adafedseleckd_figure7:
    input:
        ADA_EXPERIMENT_FILES.get("figure7", []),


rule adafedseleckd_figure8:
    input:
        ADA_EXPERIMENT_FILES.get("figure8", []),


rule adafedseleckd_figure9:
    input:
        ADA_EXPERIMENT_FILES.get("figure9", []),


rule adafedseleckd_figure10:
    input:
        ADA_EXPERIMENT_FILES.get("figure10", []),


rule adafedseleckd_figure11:
    input:
        ADA_EXPERIMENT_FILES.get("figure11", []),


rule adafedseleckd_figure12:
    input:
        ADA_EXPERIMENT_FILES.get("figure12", []),


rule adafedseleckd:
    input:
        ADAFEDSELECKD_ALL,
