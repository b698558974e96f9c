from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.data.partition import materialize  # noqa: E402

materialize(snakemake.input.manifest, list(snakemake.params.record_files.values()), snakemake.output[0])
