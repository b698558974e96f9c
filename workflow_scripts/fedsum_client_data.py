from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.papers.fedsum.task import write_data_folder  # noqa: E402

write_data_folder(
    snakemake.input.manifest,
    snakemake.input.records,
    snakemake.input.oracle,
    snakemake.output[0],
    int(snakemake.wildcards.seed),
    max_test_docs=snakemake.params.max_test_docs,
    heldout_test_docs=int(snakemake.params.heldout_test_docs),
)
