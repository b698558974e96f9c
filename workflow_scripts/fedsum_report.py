from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.papers.fedsum import report as fedsum  # noqa: E402

target = snakemake.wildcards.fsum_target
if target.startswith("table"):
    fedsum.build_table(
        target,
        list(snakemake.input.scores),
        snakemake.output.csv[: -len(".csv")],
        snakemake.params.scale,
        dict(snakemake.params.options),
    )
else:
    fedsum.build_figure(
        target,
        list(snakemake.input.scores),
        snakemake.output.png,
        snakemake.output.csv,
        snakemake.params.scale,
        dict(snakemake.params.options),
        prediction_paths=list(snakemake.input.predictions),
    )
