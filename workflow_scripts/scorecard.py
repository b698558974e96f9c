from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.catalog import scorecard_specs  # noqa: E402
from fedrepro.reporting import scorecard  # noqa: E402

specs, headlines = scorecard_specs()
card = scorecard.build_scorecard(list(snakemake.input.tables), specs, headlines,
                                 scale=snakemake.params.scale)
scorecard.write_scorecard(
    card,
    snakemake.params.scale,
    csv=snakemake.output.csv,
    md=snakemake.output.md,
    html_out=snakemake.output.html,
    figures=dict(zip(snakemake.params.papers, snakemake.output.figures)),
)
