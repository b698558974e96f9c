from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.data.settings import write_setting  # noqa: E402

write_setting(
    snakemake.wildcards.setting,
    dict(snakemake.params.setting),
    dict(snakemake.params.record_files),
    int(snakemake.wildcards.seed),
    snakemake.output[0],
)
