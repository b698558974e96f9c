# FedSum (Tables 1-4, the appendix's WikiHow and Reddit tables, Fig. 3-5): BERTSUM's backbone,
# each setting's client data (manifest + oracle labels + test set), one training cell per
# (setting, method, seed) through Flower -- ROUGE after every round, and at the end of the same
# job the reported (best R-R-1) round: scores.json + predictions.jsonl -- the tables and figures.
# With fedsum.cells_per_job: row (demo), one job per (setting, seed) trains every method of
# fedsum.methods in one process (fedsum_train_row); the other runs stay one job each.
# Grid logic: fedrepro.papers.fedsum.grid (wfsum); helpers below.

from fedrepro.papers.fedsum import grid as wfsum

FEDSUM_OUTPUTS = {
    t: (wfsum.target_outputs(t) if "fedsum" in config else []) for t in wfsum.TARGETS
}
FEDSUM_ALL = [f for files in FEDSUM_OUTPUTS.values() for f in files]


FSUM_SETTINGS = wfsum.all_settings(config) if "fedsum" in config else []
# settings trained by one row job (fedsum.cells_per_job: row); none with one job per run
FSUM_ROW_SETTINGS = (
    wfsum.row_settings(config)
    if "fedsum" in config and wfsum.rows_enabled(config)
    else []
)


rule fedsum_backbone:
    input:
        wfsum.bert_train_files(config),
    output:
        directory("results/backbones/bert-base"),
    params:
        settings=canonical(wfsum.bert_settings(config)),
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    retries: 1
    priority: wf.rule_priority(config, "fedsum_backbone")
    log:
        "logs/fedsum_backbone/bert-base.log",
    benchmark:
        "benchmarks/fedsum_backbone/bert-base.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/fedsum_backbone.py"


rule fedsum_scaling_manifest:
    input:
        lambda w: wfsum.dataset_file(config, w.fsum_setting, "records.jsonl"),
    output:
        "results/fedsum/partitions/{fsum_setting}/seed~{seed}/manifest.json",
    wildcard_constraints:
        fsum_setting=wfsum.wildcard_pattern([s for s in FSUM_SETTINGS if "-n" in s]),
    params:
        setting=lambda w: canonical(wfsum.scaled_setting(config, w.fsum_setting)),
    log:
        "logs/fedsum_scaling_manifest/{fsum_setting}/seed~{seed}.log",
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/fedsum_scaling_manifest.py"


rule fedsum_client_data:
    input:
        manifest=lambda w: wfsum.manifest_path(config, w.fsum_setting, w.seed),
        records=lambda w: wfsum.dataset_file(config, w.fsum_setting, "records.jsonl"),
        oracle=lambda w: wfsum.dataset_file(config, w.fsum_setting, "oracle_labels.jsonl"),
    output:
        directory("results/fedsum/data/{fsum_setting}/seed~{seed}"),
    wildcard_constraints:
        fsum_setting=wfsum.wildcard_pattern(FSUM_SETTINGS),
    params:
        max_test_docs=canonical(config.get("fedsum", {}).get("eval", {}).get("max_test_docs")),
        heldout_test_docs=canonical(config.get("fedsum", {}).get("eval", {}).get("heldout_test_docs", 0)),
    priority: wf.rule_priority(config, "fedsum_client_data")
    log:
        "logs/fedsum_client_data/{fsum_setting}/seed~{seed}.log",
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/fedsum_client_data.py"


rule fedsum_train_cell:
    input:
        backbone="results/backbones/bert-base",
        data="results/fedsum/data/{fsum_setting}/seed~{seed}",
    output:
        adapters="results/fedsum/{fsum_setting}/bert-base/{fsum_method}/seed~{seed}/adapters.safetensors",
        train_log="results/fedsum/{fsum_setting}/bert-base/{fsum_method}/seed~{seed}/train_log.json",
        provenance="results/fedsum/{fsum_setting}/bert-base/{fsum_method}/seed~{seed}/provenance.json",
        scores="results/fedsum/{fsum_setting}/bert-base/{fsum_method}/seed~{seed}/scores.json",
        predictions="results/fedsum/{fsum_setting}/bert-base/{fsum_method}/seed~{seed}/predictions.jsonl",
    wildcard_constraints:
        fsum_setting=wfsum.wildcard_pattern(FSUM_SETTINGS),
        fsum_method=wfsum.wildcard_pattern(
            wfsum.method_dirs(config) if "fedsum" in config else []
        ),
    params:
        cell=lambda w: canonical(wfsum.make_fedsum_cell(config, w.fsum_setting, w.fsum_method, w.seed)),
    priority: wf.rule_priority(config, "fedsum_train_cell")
    threads: config.get("fedsum", {}).get("threads_per_cell", 1)
    resources:
        gpu=wf.job_resources(config, "bert-base", "train")["gpu"],
        gpu_mem_mb=wf.gpu_mem_mb(wf.job_resources(config, "bert-base", "train")),
        mem_mb=lambda w: wf.job_mem_mb(config, "bert-base", "train", w.fsum_method),
        runtime=wf.job_resources(config, "bert-base", "train")["runtime"],
    log:
        "logs/fedsum_train_cell/{fsum_setting}/{fsum_method}/seed~{seed}.log",
    benchmark:
        "benchmarks/fedsum_train_cell/{fsum_setting}/{fsum_method}/seed~{seed}.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/fedsum_train_cell.py"


ruleorder: fedsum_train_row > fedsum_train_cell


rule fedsum_train_row:
    input:
        backbone="results/backbones/bert-base",
        data="results/fedsum/data/{fsum_setting}/seed~{seed}",
    output:
        wfsum.row_outputs(config),
    wildcard_constraints:
        fsum_setting=wfsum.wildcard_pattern(FSUM_ROW_SETTINGS),
    params:
        cells=lambda w: canonical(wfsum.row_cells(config, w.fsum_setting, w.seed)),
    threads: config.get("fedsum", {}).get("threads_per_cell", 1)
    resources:
        gpu=wf.job_resources(config, "bert-base", "train")["gpu"],
        gpu_mem_mb=wf.gpu_mem_mb(wf.job_resources(config, "bert-base", "train")),
        # the row's methods one after the other: the largest of their declarations
        mem_mb=lambda w: max(wf.job_mem_mb(config, "bert-base", "train", c["method"])
                             for c in wfsum.row_cells(config, w.fsum_setting, w.seed)),
        runtime=wf.job_resources(config, "bert-base", "train")["runtime"],
    log:
        "logs/fedsum_train_row/{fsum_setting}/seed~{seed}.log",
    benchmark:
        "benchmarks/fedsum_train_row/{fsum_setting}/seed~{seed}.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/fedsum_train_row.py"


rule fedsum_table:
    input:
        scores=lambda w: wfsum.target_files(config, w.fsum_target, "scores.json"),
    output:
        csv="results/tables/fedsum_{fsum_target}.csv",
        md="results/tables/fedsum_{fsum_target}.md",
        tex="results/tables/fedsum_{fsum_target}.tex",
    wildcard_constraints:
        fsum_target="table1|table2|table_wikihow|table_reddit|table3|table4",
    params:
        scale=canonical(config["scale"]),
        options=lambda w: canonical(wfsum.report_options(config, w.fsum_target)),
    log:
        "logs/fedsum_table/{fsum_target}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/fedsum_report.py"


rule fedsum_figure:
    input:
        scores=lambda w: wfsum.target_files(config, w.fsum_target, "scores.json"),
        predictions=lambda w: wfsum.target_files(config, w.fsum_target, "predictions.jsonl"),
        extra=lambda w: wfsum.figure_extra_inputs(config, w.fsum_target),
    output:
        png="results/figures/fedsum_{fsum_target}.png",
        csv="results/figures/fedsum_{fsum_target}.csv",
    wildcard_constraints:
        fsum_target="figure3|figure4|figure5",
    params:
        scale=canonical(config["scale"]),
        options=lambda w: canonical(wfsum.report_options(config, w.fsum_target)),
    log:
        "logs/fedsum_figure/{fsum_target}.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/fedsum_report.py"


rule fedsum_table1:
    input:
        FEDSUM_OUTPUTS["table1"],


rule fedsum_table2:
    input:
        FEDSUM_OUTPUTS["table2"],


rule fedsum_table_wikihow:
    input:
        FEDSUM_OUTPUTS["table_wikihow"],


rule fedsum_table_reddit:
    input:
        FEDSUM_OUTPUTS["table_reddit"],


rule fedsum_table3:
    input:
        FEDSUM_OUTPUTS["table3"],


rule fedsum_table4:
    input:
        FEDSUM_OUTPUTS["table4"],


rule fedsum_figure3:
    input:
        FEDSUM_OUTPUTS["figure3"],


rule fedsum_figure4:
    input:
        FEDSUM_OUTPUTS["figure4"],


rule fedsum_figure5:
    input:
        FEDSUM_OUTPUTS["figure5"],


rule fedsum:
    input:
        FEDSUM_ALL,
