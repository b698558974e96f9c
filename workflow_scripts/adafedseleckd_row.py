from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.papers.adafedseleckd.evaluate import run_row  # noqa: E402

run_row([dict(c) for c in snakemake.params.cells])
