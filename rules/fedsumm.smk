# FedSUMM (Table I, Table II, Fig. 3-6): the Chinese BART backbone; one job per table row
# (corpus, N, model, seed) training and evaluating its regimes (single, all, FedAvg and FedSUMM on
# Flower; only the federated two at the other N of Fig. 5b); then the tables and figures.
# fedsumm_dp_tradeoff (ours): ROUGE vs epsilon, one fedsumm_dp_row job per seed trains every sigma.
# Cells and targets: fedrepro.papers.fedsumm.grid (why rows, not cells, are jobs: its docstring).

from fedrepro.papers.fedsumm import grid as wfs

FEDSUMM_OUTPUTS = (
    {
        t: expand(
            f"results/{'tables' if kind == 'table' else 'figures'}/fedsumm_{t}.{{ext}}",
            ext=["csv", "md", "tex"] if kind == "table" else ["png", "csv"],
        )
        for t, kind in wfs.TARGETS.items()
    }
    if "fedsumm" in config
    else {t: [] for t in wfs.TARGETS}
)
FEDSUMM_ALL = [f for files in FEDSUMM_OUTPUTS.values() for f in files]


rule fedsumm_backbone:
    input:
        wfs.backbone_inputs(config),
    output:
        directory(wfs.BACKBONE_DIR),
    params:
        settings=canonical(wfs.backbone_settings(config)),
    threads: 1
    resources:
        mem_mb=lambda w: wfs.job_resources(config, "backbone")["mem_mb"],
        runtime=lambda w: wfs.job_resources(config, "backbone")["runtime"],
    retries: 1
    priority: wf.rule_priority(config, "fedsumm_backbone")
    log:
        "logs/fedsumm_backbone/bart-base-chinese.log",
    benchmark:
        "benchmarks/fedsumm_backbone/bart-base-chinese.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/fedsumm_backbone.py"


rule fedsumm_row:
    input:
        backbone=wfs.BACKBONE_DIR,
        data=lambda w: wfs.clients_dir(config, w.fs_corpus, w.fs_n),
    output:
        wfs.row_outputs("table"),
    wildcard_constraints:
        fs_corpus="|".join(wfs.CORPORA),
        fs_n=wfs.row_clients_constraint(config, "table"),
        fs_model="|".join(wfs.MODELS),
    params:
        cells=lambda w: canonical(wfs.row_cells(config, "table", w.fs_corpus, w.fs_n, w.fs_model, w.seed)),
    priority: wf.rule_priority(config, "fedsumm_row")
    threads: config["fedsumm"]["threads_per_cell"]
    resources:
        gpu=lambda w: wfs.job_resources(config, "train")["gpu"],
        gpu_mem_mb=lambda w: wf.gpu_mem_mb(wfs.job_resources(config, "train")),
        mem_mb=lambda w: wfs.job_resources(config, "train")["mem_mb"],
        runtime=lambda w: wfs.job_resources(config, "train")["runtime"],
    log:
        "logs/fedsumm_row/{fs_corpus}/n{fs_n}/{fs_model}/seed~{seed}.log",
    benchmark:
        "benchmarks/fedsumm_row/{fs_corpus}/n{fs_n}/{fs_model}/seed~{seed}.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/fedsumm_train_row.py"


rule fedsumm_federated_row:
    input:
        backbone=wfs.BACKBONE_DIR,
        data=lambda w: wfs.clients_dir(config, w.fs_corpus, w.fs_n),
    output:
        wfs.row_outputs("federated"),
    wildcard_constraints:
        fs_corpus="|".join(wfs.CORPORA),
        fs_n=wfs.row_clients_constraint(config, "federated"),
        fs_model="|".join(wfs.MODELS),
    params:
        cells=lambda w: canonical(wfs.row_cells(config, "federated", w.fs_corpus, w.fs_n, w.fs_model, w.seed)),
    priority: wf.rule_priority(config, "fedsumm_federated_row")
    threads: config["fedsumm"]["threads_per_cell"]
    resources:
        gpu=lambda w: wfs.job_resources(config, "train")["gpu"],
        gpu_mem_mb=lambda w: wf.gpu_mem_mb(wfs.job_resources(config, "train")),
        mem_mb=lambda w: wfs.job_resources(config, "train")["mem_mb"],
        runtime=lambda w: wfs.job_resources(config, "train")["runtime"],
    log:
        "logs/fedsumm_federated_row/{fs_corpus}/n{fs_n}/{fs_model}/seed~{seed}.log",
    benchmark:
        "benchmarks/fedsumm_federated_row/{fs_corpus}/n{fs_n}/{fs_model}/seed~{seed}.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/fedsumm_train_row.py"


rule fedsumm_dp_row:
    input:
        backbone=wfs.BACKBONE_DIR,
        data=lambda w: wfs.clients_dir(config, w.fs_corpus, w.fs_n),
    output:
        wfs.dp_row_outputs(config),
    wildcard_constraints:
        fs_corpus="|".join(wfs.CORPORA),
        fs_n=r"\d+",
        fs_model="|".join(wfs.MODELS),
        fs_regime="FedAvg|FedSUMM",
    params:
        cells=lambda w: canonical(wfs.dp_row_cells(
            config, w.fs_corpus, w.fs_n, w.fs_model, w.fs_regime, w.seed
        )),
    threads: config["fedsumm"]["threads_per_cell"]
    resources:
        gpu=lambda w: wfs.job_resources(config, "train")["gpu"],
        gpu_mem_mb=lambda w: wf.gpu_mem_mb(wfs.job_resources(config, "train")),
        mem_mb=lambda w: wfs.job_resources(config, "train")["mem_mb"],
        runtime=lambda w: wfs.job_resources(config, "train")["runtime"],
    log:
        "logs/fedsumm_dp_row/{fs_corpus}/n{fs_n}/{fs_model}/{fs_regime}/seed~{seed}.log",
    benchmark:
        "benchmarks/fedsumm_dp_row/{fs_corpus}/n{fs_n}/{fs_model}/{fs_regime}/seed~{seed}.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/fedsumm_train_row.py"


rule fedsumm_table:
    input:
        scores=lambda w: wfs.target_files(config, w.fs_target, "scores.json"),
        provenance=lambda w: wfs.target_files(config, w.fs_target, "provenance.json"),
    output:
        csv="results/tables/fedsumm_{fs_target}.csv",
        md="results/tables/fedsumm_{fs_target}.md",
        tex="results/tables/fedsumm_{fs_target}.tex",
    wildcard_constraints:
        fs_target="table1|table2",
    params:
        report=canonical(wfs.report_params(config)),
    log:
        "logs/fedsumm_table/{fs_target}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/fedsumm_report.py"


rule fedsumm_figure:
    input:
        scores=lambda w: wfs.target_files(config, w.fs_target, "scores.json"),
        logs=lambda w: wfs.target_files(config, w.fs_target, "train_log.json"),
    output:
        png="results/figures/fedsumm_{fs_target}.png",
        csv="results/figures/fedsumm_{fs_target}.csv",
    wildcard_constraints:
        fs_target="figure3|figure4|figure5|figure6|dp_tradeoff",
    params:
        report=canonical(wfs.report_params(config)),
    log:
        "logs/fedsumm_figure/{fs_target}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/fedsumm_report.py"


rule fedsumm_table1:
    input:
        FEDSUMM_OUTPUTS["table1"],


rule fedsumm_table2:
    input:
        FEDSUMM_OUTPUTS["table2"],


rule fedsumm_figure3:
    input:
        FEDSUMM_OUTPUTS["figure3"],


rule fedsumm_figure4:
    input:
        FEDSUMM_OUTPUTS["figure4"],


rule fedsumm_figure5:
    input:
        FEDSUMM_OUTPUTS["figure5"],


rule fedsumm_figure6:
    input:
        FEDSUMM_OUTPUTS["figure6"],


rule fedsumm_dp_tradeoff:
    input:
        FEDSUMM_OUTPUTS["dp_tradeoff"],


rule fedsumm:
    input:
        FEDSUMM_ALL,
