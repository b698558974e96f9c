# FedMCP (Table I, Table II, Fig. 3-5): one training cell per (method, seed) over the six
# GLUE-task clients of the cross-task split, its accuracy evaluation, the tables and figures.

from fedrepro.papers.fedmcp import grid as fedmcp

FM = config["fedmcp"]
FEDMCP_OUTPUTS = {
    "table1": expand("results/tables/fedmcp_table1.{ext}", ext=["csv", "md", "tex"]),
    "table2": expand("results/tables/fedmcp_table2.{ext}", ext=["csv", "md", "tex"]),
    "figure3": expand("results/figures/fedmcp_figure3.{ext}", ext=["png", "csv"]),
    "figure4": expand("results/figures/fedmcp_figure4.{ext}", ext=["png", "csv"]),
    "figure5": expand("results/figures/fedmcp_figure5.{ext}", ext=["png", "csv"]),
}
FEDMCP_ALL = [f for files in FEDMCP_OUTPUTS.values() for f in files]


rule fedmcp_train_cell:
    input:
        backbone="results/backbones/{fm_backbone}",
        data=fedmcp.clients_dir(config),
    output:
        adapters="results/fedmcp/crosstask/{fm_backbone}/{fm_method}/seed~{seed}/adapters.safetensors",
        train_log="results/fedmcp/crosstask/{fm_backbone}/{fm_method}/seed~{seed}/train_log.json",
        provenance="results/fedmcp/crosstask/{fm_backbone}/{fm_method}/seed~{seed}/provenance.json",
    wildcard_constraints:
        fm_backbone=FM["backbone"],
        fm_method="|".join(FM["methods"]),
    params:
        cell=lambda w: canonical(fedmcp.make_cell(config, w.fm_backbone, w.fm_method, w.seed)),
    threads: FM["threads_per_cell"]
    resources:
        gpu=lambda wildcards: wf.job_resources(config, wildcards.fm_backbone, "train")["gpu"],
        gpu_mem_mb=lambda wildcards: wf.gpu_mem_mb(wf.job_resources(config, wildcards.fm_backbone, "train")),
        mem_mb=lambda wildcards: wf.job_mem_mb(config, wildcards.fm_backbone, "train", wildcards.fm_method),
        runtime=lambda wildcards: wf.job_resources(config, wildcards.fm_backbone, "train")["runtime"],
    log:
        "logs/fedmcp_train_cell/{fm_backbone}/{fm_method}/seed~{seed}.log",
    benchmark:
        "benchmarks/fedmcp_train_cell/{fm_backbone}/{fm_method}/seed~{seed}.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/train_cell.py"


rule fedmcp_evaluate_cell:
    input:
        adapters="results/fedmcp/crosstask/{fm_backbone}/{fm_method}/seed~{seed}/adapters.safetensors",
        backbone="results/backbones/{fm_backbone}",
        data=fedmcp.clients_dir(config),
    output:
        predictions="results/fedmcp/crosstask/{fm_backbone}/{fm_method}/seed~{seed}/predictions.jsonl",
        scores="results/fedmcp/crosstask/{fm_backbone}/{fm_method}/seed~{seed}/scores.json",
    wildcard_constraints:
        fm_backbone=FM["backbone"],
        fm_method="|".join(FM["methods"]),
    params:
        evaluate="fedrepro.papers.fedmcp.task:evaluate_cell",
        cell=lambda w: canonical(fedmcp.make_cell(config, w.fm_backbone, w.fm_method, w.seed)),
    threads: FM["threads_per_cell"]
    resources:
        gpu=lambda wildcards: wf.job_resources(config, wildcards.fm_backbone, "evaluate")["gpu"],
        gpu_mem_mb=lambda wildcards: wf.gpu_mem_mb(wf.job_resources(config, wildcards.fm_backbone, "evaluate")),
        mem_mb=lambda wildcards: wf.job_mem_mb(config, wildcards.fm_backbone, "evaluate", wildcards.fm_method),
        runtime=lambda wildcards: wf.job_resources(config, wildcards.fm_backbone, "evaluate")["runtime"],
    log:
        "logs/fedmcp_evaluate_cell/{fm_backbone}/{fm_method}/seed~{seed}.log",
    benchmark:
        "benchmarks/fedmcp_evaluate_cell/{fm_backbone}/{fm_method}/seed~{seed}.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/evaluate_cell.py"


rule fedmcp_table:
    input:
        scores=lambda w: fedmcp.target_files(config, w.fm_target, "scores.json"),
        provenance=lambda w: fedmcp.target_files(config, w.fm_target, "provenance.json"),
    output:
        csv="results/tables/fedmcp_{fm_target}.csv",
        md="results/tables/fedmcp_{fm_target}.md",
        tex="results/tables/fedmcp_{fm_target}.tex",
    wildcard_constraints:
        fm_target="table1|table2",
    params:
        scale=canonical(config["scale"]),
        model_cfg=lambda wildcards: canonical(dict(
            FM.get("lora") or {}, bottleneck=wf.backbone_settings(config, FM["backbone"])["bottleneck"],
            baseline_adapters=FM.get("baseline_adapters", "paper"),
        )),
    log:
        "logs/fedmcp_table/{fm_target}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/fedmcp_report.py"


rule fedmcp_figure:
    input:
        scores=lambda w: fedmcp.target_files(config, w.fm_target, "scores.json"),
        logs=lambda w: fedmcp.target_files(config, w.fm_target, "train_log.json"),
        provenance=lambda w: fedmcp.target_files(config, w.fm_target, "provenance.json"),
    output:
        png="results/figures/fedmcp_{fm_target}.png",
        csv="results/figures/fedmcp_{fm_target}.csv",
    wildcard_constraints:
        fm_target="figure3|figure4|figure5",
    params:
        scale=canonical(config["scale"]),
    log:
        "logs/fedmcp_figure/{fm_target}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/fedmcp_report.py"


rule fedmcp_table1:
    input:
        FEDMCP_OUTPUTS["table1"],


rule fedmcp_table2:
    input:
        FEDMCP_OUTPUTS["table2"],


rule fedmcp_figure3:
    input:
        FEDMCP_OUTPUTS["figure3"],


rule fedmcp_figure4:
    input:
        FEDMCP_OUTPUTS["figure4"],


rule fedmcp_figure5:
    input:
        FEDMCP_OUTPUTS["figure5"],


rule fedmcp:
    input:
        FEDMCP_ALL,
