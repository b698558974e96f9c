from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.data.prepare import prepare_source  # noqa: E402

prepare_source(
    snakemake.wildcards.source,
    snakemake.input.raw,
    snakemake.output.records,
    snakemake.output.report,
    **dict(snakemake.params.options),
)
