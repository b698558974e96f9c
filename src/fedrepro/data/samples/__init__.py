"""Generators of the committed samples (``resources/samples/<name>/``), in each source's raw schema.

The samples let the whole pipeline run and be tested without the real releases; they are written in
the upstream layouts and parsed by the same code as the real data (:mod:`fedrepro.data.sources`).
Every generator is deterministic: the same arguments give byte-identical files.

* :mod:`~fedrepro.data.samples.qmsum` — QMSum's three domains (``python -m
  fedrepro.data.samples.qmsum resources/samples/qmsum``);
* :mod:`~fedrepro.data.samples.samsum`, :mod:`~fedrepro.data.samples.cnndm`,
  :mod:`~fedrepro.data.samples.pubmed`, :mod:`~fedrepro.data.samples.wikihow`,
  :mod:`~fedrepro.data.samples.reddit_tifu` — the English summarization sources (shared helpers in
  :mod:`~fedrepro.data.samples._english`);
* :mod:`~fedrepro.data.samples.glue` — the six GLUE tasks;
* :mod:`~fedrepro.data.samples.meetings` — AMI, ICSI, ELITR and MeetingBank;
* :mod:`~fedrepro.data.samples.chinese` — CSL, NLPCC2017, LCSTS, THUCNews and EDUCATION
  (``python -m fedrepro.data.samples.chinese resources/samples``).

A source's generator is also reachable through the registry:
``fedrepro.data.sources.get(name).write_samples(out_dir)``.
"""
