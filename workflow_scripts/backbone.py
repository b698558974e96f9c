from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.models.backbones import prepare_backbone_from_files  # noqa: E402

prepare_backbone_from_files(snakemake.params.settings, list(snakemake.input), snakemake.output[0])
