from pathlib import Path

from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.data import qmsum  # noqa: E402

# outputs are results/data/qmsum/<Domain>/<split>.jsonl: write them all under their common root
qmsum.prepare(
    snakemake.input.raw,
    Path(snakemake.output[0]).parents[1],
    end_inclusive=snakemake.params.span_end_inclusive,
)
