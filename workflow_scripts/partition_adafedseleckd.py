from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.data.partition import natural_partition  # noqa: E402

natural_partition(snakemake.input[0], snakemake.output[0], client=snakemake.wildcards.client)
