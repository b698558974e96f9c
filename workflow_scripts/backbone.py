from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.models.backbones import fetch_or_shape, prepare_backbone_from_files  # noqa: E402

fetch_or_shape(
    snakemake.params.settings,
    lambda settings: prepare_backbone_from_files(settings, list(snakemake.input), snakemake.output[0]),
)
