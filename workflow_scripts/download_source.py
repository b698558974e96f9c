from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.data import sources  # noqa: E402

sources.get(snakemake.wildcards.source).download(snakemake.output[0], timeout=float(snakemake.params.timeout))
