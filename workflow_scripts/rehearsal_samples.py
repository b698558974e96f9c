from fedrepro.logs import to_file

to_file(snakemake.log[0])
import logging  # noqa: E402

from fedrepro.data import sources  # noqa: E402

used = sources.write_samples_for(
    snakemake.wildcards.source, snakemake.output[0], seed=0,
    scale=int(snakemake.params.scale), min_train=int(snakemake.params.min_train),
)
logging.getLogger("rehearsal_samples").info(
    "%s: samples at scale %d (min train records %d)", snakemake.wildcards.source, used,
    int(snakemake.params.min_train))
