from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.gpu_slots import claim_job_gpus, job_label  # noqa: E402

# this job's GPU(s) (rule resources gpu, gpu_mem_mb) before anything starts CUDA
claim_job_gpus(snakemake.resources, label=job_label(snakemake))
import importlib  # noqa: E402

# the paper's evaluation function, named by its rule: params.evaluate = "module:function"
module, _, function = snakemake.params.evaluate.partition(":")
evaluate_cell = getattr(importlib.import_module(module), function)
evaluate_cell(
    dict(snakemake.params.cell),
    snakemake.input.adapters,
    snakemake.output.predictions,
    snakemake.output.scores,
)
