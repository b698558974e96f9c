from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.papers.adafedseleckd.experiments import pos_tags  # noqa: E402

pos_tags(snakemake.input.data, snakemake.wildcards.client, snakemake.params.spacy_model, snakemake.output[0])
