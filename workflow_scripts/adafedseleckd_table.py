from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.papers.adafedseleckd.report import build_adafedseleckd_table  # noqa: E402

build_adafedseleckd_table(
    list(snakemake.input),
    backbone=snakemake.params.backbone,
    table=snakemake.params.name,
    out_prefix=snakemake.output.csv.removesuffix(".csv"),
    title=snakemake.params.title,
    scale=snakemake.params.scale,
)
