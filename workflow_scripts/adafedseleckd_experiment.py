from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.papers.adafedseleckd import experiments as ex  # noqa: E402

spec = dict(snakemake.params.spec)
name = spec["name"]
inp, out = snakemake.input, dict(snakemake.output)
if name == "table5":
    ex.table5(spec, list(inp.scores), out)
elif name == "table7":
    ex.table7(spec, list(inp.scores), out)
elif name == "table8":
    ex.table8(spec, list(inp.scores), list(inp.predictions), inp.data[0], out)
elif name == "figure4":
    ex.tau_figure(spec, list(inp.scores), out)
elif name == "figure5":
    from pathlib import Path

    from fedrepro.papers.adafedseleckd.human_eval import aggregate, write_figure5

    df = aggregate(list(inp.sheets), str(Path(inp.kit[0]) / "key" / "key.json"))
    write_figure5(df, out["png"].removesuffix(".png"), spec["scale"])
elif name == "figure11":
    ex.figure11(spec, list(inp.traces), list(inp.provenance), list(inp.pos), inp.backbone[0], out)
else:  # figures 6-10, 12
    ex.bar_figure(spec, list(inp.scores), out)
