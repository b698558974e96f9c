from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.data.stats import write_data_stats  # noqa: E402

write_data_stats(
    dict(zip(snakemake.params.sources, snakemake.input.records)),
    list(snakemake.input.manifests),
    snakemake.output.sources,
    snakemake.output.partitions,
    snakemake.output.figures,
)
