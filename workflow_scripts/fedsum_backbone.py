from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.papers.fedsum.task import prepare_bert_backbone  # noqa: E402

prepare_bert_backbone(dict(snakemake.params.settings), list(snakemake.input), snakemake.output[0])
