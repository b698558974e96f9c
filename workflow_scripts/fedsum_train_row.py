from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.papers.fedsum.task import run_fedsum_row  # noqa: E402

run_fedsum_row([dict(c) for c in snakemake.params.cells], f"{snakemake.input.data}/test.jsonl")
