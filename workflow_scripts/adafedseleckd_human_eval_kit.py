from fedrepro.logs import to_file

to_file(snakemake.log[0])
from pathlib import Path  # noqa: E402

from fedrepro.papers.adafedseleckd.experiments import cell_of, method_of  # noqa: E402
from fedrepro.papers.adafedseleckd.human_eval import build_kit  # noqa: E402

spec = dict(snakemake.params.spec)
opts = spec["options"]
predictions = {method_of(cell_of(p)): p for p in snakemake.input.predictions}
meetings = {c: str(Path(snakemake.input.data[0]) / c / "test.jsonl") for c in spec["clients"]}
build_kit(predictions, meetings, snakemake.output[0], per_domain=int(opts.get("per_domain", 20)),
          seed=int(opts.get("seed", 1)))
