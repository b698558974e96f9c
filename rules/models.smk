rule backbone:
    input:
        backbone_inputs,
    output:
        directory("results/backbones/{backbone}"),
    params:
        settings=lambda wildcards: canonical(wf.backbone_settings(config, wildcards.backbone)),
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    retries: 1
    priority: wf.rule_priority(config, "backbone")
    log:
        "logs/backbone/{backbone}.log",
    benchmark:
        "benchmarks/backbone/{backbone}.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/backbone.py"
