from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.papers.fedmcp.task import evaluate_cell  # noqa: E402

evaluate_cell(
    dict(snakemake.params.cell),
    snakemake.input.adapters,
    snakemake.output.predictions,
    snakemake.output.scores,
)
