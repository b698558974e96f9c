# Every data source of the four papers: download (or samples / local copy) -> normalized records,
# every client-split setting -> a manifest per seed, and the statistics of both.


rule download_source:
    output:
        directory("resources/downloads/{source}"),
    wildcard_constraints:
        source="|".join(s for s in ALL_SOURCES if s != "qmsum"),
    params:
        timeout=lambda wildcards: canonical(config["data"][wildcards.source].get("download_timeout_s", 10)),
    retries: 2
    priority: wf.rule_priority(config, "download_source")
    log:
        "logs/download_source/{source}.log",
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/download_source.py"


rule prepare_source:
    input:
        raw=lambda wildcards: wf.source_raw_dir(config, wildcards.source),
    output:
        records="results/data/{source}/records.jsonl",
        report="results/data/{source}/prepare_report.json",
    params:
        # skip_malformed, parse_options, heldout_test (data.<source>.heldout_test_fraction / _seed)
        options=lambda wildcards: canonical(wf.prepare_options(config, wildcards.source)),
    priority: wf.rule_priority(config, "prepare_source")
    log:
        "logs/prepare_source/{source}.log",
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/prepare_source.py"


rule partition_setting:
    input:
        lambda wildcards: setting_record_files(wildcards).values(),
    output:
        "results/partitions/{setting}/seed~{seed}/manifest.json",
    params:
        setting=lambda wildcards: canonical(SETTINGS[wildcards.setting]),
        record_files=lambda w: canonical(setting_record_files(w)),
    priority: wf.rule_priority(config, "partition_setting")
    log:
        "logs/partition_setting/{setting}/seed~{seed}.log",
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/partition_setting.py"


rule dataset_stats:
    input:
        qmsum_raw=wf.qmsum_raw_dir(config),
        records=expand("results/data/{source}/records.jsonl", source=DATA_SOURCES),
        reports=expand("results/data/{source}/prepare_report.json", source=DATA_SOURCES),
        manifests=ALL_MANIFESTS,
    output:
        table2_csv="results/data/qmsum/table2_stats.csv",
        table2_md="results/data/qmsum/table2_stats.md",
        sources="results/stats/sources.csv",
        partitions="results/stats/partitions.csv",
        figures=directory("results/stats/figures"),
    params:
        sources=canonical(DATA_SOURCES),
    log:
        "logs/dataset_stats/dataset_stats.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/dataset_stats.py"


from fedrepro.data.oracle import LABEL_SENTENCES, SHORT_SENTENCE_TOKENS


rule oracle_labels:
    input:
        "results/data/{source}/records.jsonl",
    output:
        "results/data/{source}/oracle_labels.jsonl",
    wildcard_constraints:
        source="cnndm|pubmed|wikihow|reddit_tifu",
    params:
        # BertSum's oracle: label count (summary_size) and short-sentence filter (min_src_ntokens)
        label_sentences=lambda wildcards: canonical(config["partitions"]["fedsum"].get("label_sentences", {}).get(wildcards.source, LABEL_SENTENCES)),
        short_sentence_tokens=canonical(config["partitions"]["fedsum"].get("short_sentence_tokens", SHORT_SENTENCE_TOKENS)),
    priority: wf.rule_priority(config, "oracle_labels")
    log:
        "logs/oracle_labels/{source}.log",
    conda:
        "../envs/data.yaml"
    script:
        "../workflow_scripts/oracle_labels.py"
