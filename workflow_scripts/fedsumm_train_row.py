from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.papers.fedsumm.task import run_row  # noqa: E402

run_row([dict(cell) for cell in snakemake.params.cells])
