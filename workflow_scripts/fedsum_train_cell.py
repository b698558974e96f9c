from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.papers.fedsum.task import run_fedsum_cell  # noqa: E402

run_fedsum_cell(
    dict(snakemake.params.cell),
    snakemake.output.adapters,
    snakemake.output.train_log,
    snakemake.output.provenance,
    snakemake.output.scores,
    snakemake.output.predictions,
    f"{snakemake.input.data}/test.jsonl",
)
