from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.data.sources import qmsum  # noqa: E402

qmsum.download(snakemake.output[0], commit=snakemake.params.commit, timeout=float(snakemake.params.timeout))
