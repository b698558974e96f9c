from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.papers.fedsumm import report as fedsumm  # noqa: E402

fedsumm.build(
    snakemake.wildcards.fs_target,
    {name: list(files) for name, files in snakemake.input.items()},
    {name: str(path) for name, path in snakemake.output.items()},
    dict(snakemake.params.report),
)
