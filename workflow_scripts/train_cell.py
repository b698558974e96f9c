from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.fl.cell import run_cell  # noqa: E402

run_cell(
    dict(snakemake.params.cell),
    snakemake.output.adapters,
    snakemake.output.train_log,
    snakemake.output.provenance,
)
