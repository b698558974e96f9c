from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.data import qmsum  # noqa: E402

qmsum.prepare(snakemake.input.raw, snakemake.params.out_dir)
