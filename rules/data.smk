rule download_qmsum:
    output:
        directory("resources/downloads/qmsum"),
    params:
        commit=config["data"]["qmsum"].get("commit"),
        timeout=config["data"]["qmsum"].get("download_timeout_s", 10),
    retries: 2
    log:
        "logs/download_qmsum/download.log",
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/download_qmsum.py"


rule prepare_qmsum:
    input:
        raw=wf.qmsum_raw_dir(config),
    output:
        expand(
            "results/data/qmsum/{client}/{split}.jsonl", client=QMSUM_DOMAINS, split=SPLITS
        ),
    params:
        span_end_inclusive=config["data"]["qmsum"].get("span_end_inclusive", True),
    log:
        "logs/prepare_qmsum/prepare.log",
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/prepare_qmsum.py"


rule partition_adafedseleckd:
    input:
        "results/data/qmsum/{client}/{split}.jsonl",
    output:
        "results/partitions/adafedseleckd/{partition}/{client}/{split}.jsonl",
    log:
        "logs/partition_adafedseleckd/{partition}/{client}/{split}.log",
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/partition_adafedseleckd.py"
