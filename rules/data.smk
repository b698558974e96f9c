rule download_qmsum:
    output:
        directory("resources/downloads/qmsum"),
    params:
        commit=canonical(config["data"]["qmsum"].get("commit")),
        timeout=canonical(config["data"]["qmsum"].get("download_timeout_s", 10)),
    retries: 2
    log:
        "logs/download_qmsum/download.log",
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/download_qmsum.py"


rule client_files:
    input:
        manifest="results/partitions/{setting}/seed~{seed}/manifest.json",
        records=lambda wildcards: setting_record_files(wildcards).values(),
    output:
        directory("results/partitions/{setting}/seed~{seed}/clients"),
    params:
        record_files=lambda w: canonical(setting_record_files(w)),
    priority: wf.rule_priority(config, "client_files")
    log:
        "logs/client_files/{setting}/seed~{seed}.log",
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/client_files.py"
