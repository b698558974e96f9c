import logging

from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.io import read_json  # noqa: E402
from fedrepro.rehearsal.report import build, summary_lines  # noqa: E402

report = build(read_json(snakemake.input.plan), ".", snakemake.output.json, snakemake.output.md)
for line in summary_lines(report):  # "rehearsal: N ok, W warn, F failed" and every warn's reason
    logging.getLogger("fedrepro.rehearsal").info(line)
