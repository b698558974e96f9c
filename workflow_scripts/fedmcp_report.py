from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.papers.fedmcp import report as fedmcp  # noqa: E402

target = snakemake.wildcards.fm_target
if target.startswith("table"):
    fedmcp.build_table(
        target,
        list(snakemake.input.scores),
        list(snakemake.input.provenance),
        snakemake.output.csv[: -len(".csv")],
        snakemake.params.scale,
        dict(snakemake.params.model_cfg),
    )
else:
    fedmcp.build_figure(
        target,
        list(snakemake.input.scores),
        list(snakemake.input.logs),
        list(snakemake.input.provenance),
        snakemake.output.png,
        snakemake.output.csv,
        snakemake.params.scale,
    )
