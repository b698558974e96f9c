from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.models.backbones import fetch_or_shape  # noqa: E402
from fedrepro.papers.fedsumm.task import prepare_backbone  # noqa: E402

fetch_or_shape(
    dict(snakemake.params.settings),
    lambda settings: prepare_backbone(settings, list(snakemake.input), snakemake.output[0]),
)
