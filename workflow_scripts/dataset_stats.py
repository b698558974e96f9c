from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.data.stats import write_data_stats, write_qmsum_stats  # noqa: E402

write_qmsum_stats(snakemake.input.qmsum_raw, snakemake.output.table2_csv, snakemake.output.table2_md)
write_data_stats(
    dict(zip(snakemake.params.sources, snakemake.input.records)),
    list(snakemake.input.manifests),
    snakemake.output.sources,
    snakemake.output.partitions,
    snakemake.output.figures,
    reports=dict(zip(snakemake.params.sources, snakemake.input.reports)),
)
