from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.data.oracle import write_oracle_labels  # noqa: E402

write_oracle_labels(
    snakemake.input[0],
    snakemake.output[0],
    int(snakemake.params.label_sentences),
    int(snakemake.params.short_sentence_tokens),
)
