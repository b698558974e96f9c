from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.io import read_json  # noqa: E402
from fedrepro.rehearsal.report import build  # noqa: E402

build(read_json(snakemake.input.plan), ".", snakemake.output.json, snakemake.output.md)
