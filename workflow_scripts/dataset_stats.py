from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.data.stats import write_qmsum_stats  # noqa: E402

write_qmsum_stats(snakemake.input.raw, snakemake.output.csv, snakemake.output.md)
