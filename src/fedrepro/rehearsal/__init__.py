"""The paper-scale rehearsal: every code path of the paper grid, a few steps each, at true size.

``snakemake --configfile config/paper.yaml --config rehearsal=true`` (or ``make rehearse`` on a
machine without the model hub, with ``config/rehearsal.yaml``) runs, in the spirit of Lightning's
``fast_dev_run``, the paper grid reduced to its distinct code paths (:mod:`.plan`): one seed, a
round or two of a few optimizer steps on a few examples per client, with the paper's clients,
batch size, sequence lengths, adapter sizes and generation settings (only the number of generated
tokens is capped).  Backbones are the real checkpoints where they can be fetched, else the paper
model's architecture at its true dimensions with random weights (``kind: shape``, with a log line).
Everything is written under ``results/rehearsal/`` (Snakemake's working directory moves there),
so a rehearsal never touches a real run's results; :mod:`.report` writes
``results/rehearsal/report.{json,md}``.
"""
