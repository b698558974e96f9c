from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.io import write_json_atomic, write_text_atomic  # noqa: E402
from fedrepro.reporting import site  # noqa: E402

prov = site.provenance(
    snakemake.params.entries,
    site.metadata_records(snakemake.params.metadata_dir),
    dict(snakemake.params.patterns),
    snakemake.config,
    scorecard_missing=snakemake.params.scorecard_missing,
)
write_json_atomic(snakemake.output.json, prov)
write_text_atomic(snakemake.output.html, site.provenance_page(prov))
