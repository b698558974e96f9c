from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.data import sources  # noqa: E402

sources.get(snakemake.wildcards.source).write_samples(
    snakemake.output[0], seed=0, scale=int(snakemake.params.scale)
)
