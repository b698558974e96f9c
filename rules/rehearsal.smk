# The paper-scale rehearsal (fedrepro.rehearsal; `make rehearse`): only with `rehearsal: true`,
# when the Snakefile has moved the working directory to results/rehearsal/ and common.smk has
# reduced the config (fedrepro.rehearsal.plan.apply).  Every path below is relative to it.
if config.get("rehearsal"):
    import os

    from fedrepro.devices import COUNT_FLOPS_ENV
    from fedrepro.rehearsal import plan as rplan

    REHEARSAL = rplan.document(config)
    # every cell job counts one training step's FLOPs per method (fedrepro.devices.StepTimer):
    # the report's MFU; jobs inherit Snakemake's environment (a SLURM job too: --export=ALL)
    os.environ[COUNT_FLOPS_ENV] = "1"

    localrules:
        rehearsal_plan,
        rehearse,

    rule rehearsal_samples:
        output:
            directory("samples/{source}"),  # rplan.SAMPLES_DIR
        wildcard_constraints:
            source="|".join(ALL_SOURCES),
        params:
            scale=canonical(REHEARSAL["settings"]["sample_scale"]),
            # FedSum's datasets: enough train records for the partition's total (rplan.min_train_records)
            min_train=lambda w: canonical(REHEARSAL["min_train_records"].get(w.source, 0)),
        priority: wf.rule_priority(config, "rehearsal_samples")
        log:
            "logs/rehearsal_samples/{source}.log",
        conda:
            "../envs/data.yaml"
        script:
            "../workflow_scripts/rehearsal_samples.py"

    rule rehearsal_plan:
        output:
            "plan.json",
        params:
            plan=canonical(REHEARSAL),
        log:
            "logs/rehearsal_plan.log",
        conda:
            "../envs/data.yaml"
        script:
            "../workflow_scripts/rehearsal_plan.py"

    rule rehearse:
        input:
            plan="plan.json",
            cells=[f for c in REHEARSAL["cells"] for f in c["files"]],
            data=REHEARSAL["data_files"],
        output:
            json="report.json",
            md="report.md",
        log:
            "logs/rehearse.log",
        conda:
            "../envs/data.yaml"
        script:
            "../workflow_scripts/rehearsal_report.py"
