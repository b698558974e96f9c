from pathlib import Path

from fedrepro.logs import to_file

to_file(snakemake.log[0])
from fedrepro.io import write_text_atomic  # noqa: E402
from fedrepro.reporting.site import table_page  # noqa: E402

source = Path(snakemake.input[0])
write_text_atomic(snakemake.output[0], table_page(source.read_text(), source.stem))
