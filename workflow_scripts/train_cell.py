from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.gpu_slots import claim_job_gpus, job_label  # noqa: E402

# this job's GPU(s) (rule resources gpu, gpu_mem_mb) before anything starts CUDA
claim_job_gpus(snakemake.resources, label=job_label(snakemake))
from fedrepro.fl.cell import run_cell  # noqa: E402

run_cell(
    dict(snakemake.params.cell),
    snakemake.output.adapters,
    snakemake.output.train_log,
    snakemake.output.provenance,
)
