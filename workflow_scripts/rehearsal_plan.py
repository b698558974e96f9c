from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.io import write_json_atomic  # noqa: E402
from fedrepro.rehearsal.report import machine  # noqa: E402

write_json_atomic(snakemake.output[0], {**snakemake.params.plan, "machine": machine()})
