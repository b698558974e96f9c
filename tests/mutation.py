"""Mutation testing of the method code (issue 24): ``make mutation`` / ``python tests/mutation.py``.

Each *module* of :data:`SCOPE` (a file of the method code) is mutated by mutmut (pinned in
``requirements-mutation.txt``; not part of ``make test``) against the module's own fast tests.
mutmut 3 rewrites every function of the file into variants selected at run time, runs the listed
tests once to learn which tests reach which function, then runs, per mutant, only those tests
(forked from one warm process: torch is imported once).  A mutant is *killed* when a test fails,
*survived* when they all pass, *no tests* when no listed test reaches its function.

Every module runs in a folder of its own, ``.mutation/<module>/`` (git-ignored): a snapshot of
``src/``, ``tests/`` and the files the tests read, with a ``pyproject.toml`` whose ``[tool.mutmut]``
names the one file to mutate and its tests -- so the working tree is never mutated in place and
modules can be run one at a time::

    make mutation                                   # every module of SCOPE (hours on 2 cores)
    make mutation MODULES="adafedseleckd.kd"        # one module (or several, space-separated)
    .venv/bin/python tests/mutation.py --list       # the modules and their tests
    .venv/bin/python tests/mutation.py adafedseleckd.kd --max-children 2

The score per module -- killed / (killed + survived + timeout + suspicious), mutants with no
reaching test counted as survivors -- is written to ``.mutation/scores.json`` and printed; the
survivors of a module are listed by ``cd .mutation/<module> && mutmut results`` and shown with
``mutmut show <name>``.  Equivalent mutants left on purpose are listed with the reason in
``docs/mutation.md``.  Lines that only word a message are not mutated (:data:`MESSAGE_LINES`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".mutation"

PAPERS = "src/fedrepro/papers"
ADA_TESTS = ["tests/test_step_adafedseleckd.py", "tests/test_ada_methods.py", "tests/test_adapters_kd.py",
             "tests/test_kd_fires.py", "tests/test_kd_exact.py", "tests/test_ada_strategy_exact.py",
             "tests/test_precision.py"]
MCP_TESTS = ["tests/test_step_fedmcp.py", "tests/test_fedmcp_methods.py", "tests/test_mcp.py",
             "tests/test_mcp_exact.py", "tests/test_precision.py", "tests/test_fedmcp_build_exact.py",
             "tests/test_fedmcp_round_stats.py"]
SUM_TESTS = ["tests/test_step_fedsum.py", "tests/test_fedsum.py", "tests/test_fedsum_baselines.py",
             "tests/test_fedsum_exact.py", "tests/test_precision.py"]
SUMM_TESTS = ["tests/test_step_fedsumm.py", "tests/test_fedsumm.py", "tests/test_fedsumm_readings.py",
              "tests/test_fedsumm_local_update.py"]
# the server arithmetic on a compute device and the exact server round (issue 25 session)
SUMM_SERVER_TESTS = ["tests/test_fedsumm_compute_device.py", "tests/test_fedsumm_strategy_exact.py",
                     "tests/test_fedsumm_server_units.py"]

SCOPE: dict[str, tuple[str, list[str]]] = {
    # module: (file to mutate, its fast tests)
    "adafedseleckd.kd": (f"{PAPERS}/adafedseleckd/kd.py", ADA_TESTS),
    "adafedseleckd.methods": (f"{PAPERS}/adafedseleckd/methods.py", ADA_TESTS),
    "adafedseleckd.strategy": (f"{PAPERS}/adafedseleckd/strategy.py", ADA_TESTS),
    "fedmcp.losses": (f"{PAPERS}/fedmcp/losses.py", MCP_TESTS),
    "fedmcp.methods": (f"{PAPERS}/fedmcp/methods.py", MCP_TESTS),
    "fedsum.algorithm": (f"{PAPERS}/fedsum/algorithm.py", SUM_TESTS),
    "fedsum.strategy": (f"{PAPERS}/fedsum/strategy.py",
                        SUM_TESTS + ["tests/test_fedsum_strategy_exact.py"]),
    "fedsumm.algorithm": (f"{PAPERS}/fedsumm/algorithm.py", SUMM_TESTS + SUMM_SERVER_TESTS),
    "fedsumm.strategy": (f"{PAPERS}/fedsumm/strategy.py",
                         SUMM_TESTS + ["tests/test_fedsumm_strategy_exact.py"]),
    "fl.algorithms": ("src/fedrepro/fl/algorithms.py",
                      ["tests/test_ada_methods.py", "tests/test_ada_strategy_exact.py",
                       "tests/test_step_adafedseleckd.py", "tests/test_fedsum_baselines.py",
                       "tests/test_step_fedsum.py"]),
    "fl.dp": ("src/fedrepro/fl/dp.py", ["tests/test_dp.py", "tests/test_dp_exact.py"]),
    # the lazy tensor mappings the FedSum and FedSUMM servers read replies through
    "fl.tensors": ("src/fedrepro/fl/tensors.py",
                   ["tests/test_fl_tensors.py", "tests/test_fedsum_strategy_exact.py",
                    "tests/test_fedsumm_strategy_exact.py"]),
    # the tasks' client rounds (what a ClientApp calls: load, train, what is sent), against the
    # step tests that call them
    "adafedseleckd.task": (f"{PAPERS}/adafedseleckd/task.py",
                           ["tests/test_step_adafedseleckd.py", "tests/test_kd_fires.py",
                            "tests/test_ada_methods.py", "tests/test_ada_client_round.py"]),
    "fedmcp.task": (f"{PAPERS}/fedmcp/task.py", ["tests/test_step_fedmcp.py", "tests/test_fedmcp_methods.py",
                                                "tests/test_fedmcp_client_round.py"]),
    "fedsum.task": (f"{PAPERS}/fedsum/task.py", ["tests/test_step_fedsum.py", "tests/test_fedsum_exact.py",
                                                 "tests/test_fedsum_client_round.py"]),
    "fedsumm.task": (f"{PAPERS}/fedsumm/task.py", ["tests/test_step_fedsumm.py", "tests/test_fedsumm.py",
                                                  "tests/test_fedsumm_client_round.py"]),
    # which precision a rehearsal's cells train in (rehearsal_settings.precision: auto) and the probe
    # behind it: what decides whether the paper's bf16-mixed runs at all
    # (test ids, not the file: its Snakemake dry runs import the mutated module in a subprocess,
    # where mutmut's trampoline finds no config)
    "rehearsal.plan": ("src/fedrepro/rehearsal/plan.py",
                       [f"tests/test_rehearsal.py::test_{name}" for name in (
                           "precision_auto_decides_once_and_pins_it_for_the_processes_below",
                           "precision_auto_runs_fp32_cells_where_bf16_is_emulated_and_the_paper_s_where_native",
                           "report_says_which_papers_ran_fp32_and_why")]),
    "precision": ("src/fedrepro/precision.py", ["tests/test_precision.py"]),
    # stopping client work the round gave up on (a stalled client must not train on beside the next run)
    "cancellation": ("src/fedrepro/cancellation.py", ["tests/test_cancellation.py"]),
    # one job per GPU, or several where their declared memory fits (issue 25, item 4)
    "gpu_slots": ("src/fedrepro/gpu_slots.py", ["tests/test_gpu_slots.py", "tests/test_gpu_slots_probes.py"]),
    # outputs written atomically, bad input named (every job's files)
    "io": ("src/fedrepro/io.py", ["tests/test_disk_faults.py", "tests/test_data_faults.py", "tests/test_io_atomic.py"]),
    # round and client checkpoints: resume, byte identity, writes off the critical path
    "fl.checkpoint": ("src/fedrepro/fl/checkpoint.py",
                      ["tests/test_round_writes.py", "tests/test_client_writes.py", "tests/test_disk_faults.py",
                       "tests/test_checkpoint_files.py"]),
    # what every paper's table rests on: the clients' data (the partitions the papers state) and ROUGE
    "data.partition": ("src/fedrepro/data/partition.py",
                       ["tests/test_partition.py", "tests/test_data_layer.py", "tests/test_fedsumm_split.py",
                        "tests/test_fedsum_selection.py", "tests/test_fedsum_redraw_feasibility.py",
                        "tests/test_partition_pinned.py"]),
    # the server's round bookkeeping every paper's strategy inherits: the server-step figures the
    # report judges, the round log's per-client entries and bytes, the partial-participation draw,
    # the wave spool (FUNCTIONS)
    "fl.strategy": ("src/fedrepro/fl/strategy.py",
                    ["tests/test_rehearsal_checks.py", "tests/test_fl_tensors.py", "tests/test_strategy_round_log.py"]),
    # the ClientApp every client runs: its partition and folder, the absolute round, the records a
    # task gets and sends, failures and time limits named
    "fl.client_app": ("src/fedrepro/fl/client_app.py",
                      ["tests/test_cancellation.py", "tests/test_client_app_messages.py"]),
    # the in-process engine's Grid: nodes, message ids, error replies, the round's deadline
    "fl.engine": ("src/fedrepro/fl/engine.py", ["tests/test_inprocess_grid.py"]),
    # where a cell computes, and the step timer behind every step time, FLOP count and MFU
    "devices": ("src/fedrepro/devices.py",
                ["tests/test_devices.py", "tests/test_flops.py", "tests/test_step_timer.py"]),
    # the rehearsal report's checks: what turns a cell's measured round log into ok / warn / failed
    # (a FedSUMM modulation 60x too strong once passed with no status flagging it), its GPU-hours
    "rehearsal.report": ("src/fedrepro/rehearsal/report.py",
                         ["tests/test_rehearsal_checks.py", "tests/test_rehearsal_report_rules.py"]
                         + [f"tests/test_rehearsal.py::test_{name}" for name in (
                             "report_measures_and_projects", "report_takes_a_pooled_trainer_s_batch_from_its_round_log",
                             "report_gives_flops_and_mfu_from_the_counted_step_and_the_gpu", "report_names_the_failure",
                             "report_says_which_papers_ran_fp32_and_why")]),
    "metrics.rouge": ("src/fedrepro/metrics/rouge.py",
                      ["tests/test_fedsum_rouge.py", "tests/test_reporting.py", "tests/test_rouge_rules.py"]
                      + [f"tests/test_fedsumm.py::test_{name}" for name in (
                          "char_rouge_drops_punctuation_and_spaces", "char_rouge_hand_computation_unequal_lengths",
                          "char_tokenizer_rule")]),
}

# The task modules are mostly loading, evaluation and row bookkeeping; their mutation scope is the
# client round a ClientApp calls (load what the client kept, train, save, what is sent) and the
# helpers it calls: mutmut's mutant names, matched with fnmatch (``x_<function>__mutmut_<n>``).
# The other functions of the file stay "not checked" and outside the score.
FUNCTIONS: dict[str, list[str]] = {
    "rehearsal.plan": ["resolve_precision", "_apply_precision"],
    "fl.strategy": ["is_measurement", "_flat", "_sq", "_fsum", "_quotient", "_device_tensor",
                    "_add_tensor_numpy", "_add_tensor_torch", "server_step", "payload_bytes", "_npy_view",
                    "metric_record", "SortedCheckpointFedAvg.sample_partitions",
                    "SortedCheckpointFedAvg.missing_replies", "SortedCheckpointFedAvg.configure_train",
                    "SortedCheckpointFedAvg.spool_reply", "SortedCheckpointFedAvg.spooled_arrays",
                    "SortedCheckpointFedAvg.server_step_note", "SortedCheckpointFedAvg.server_step_inputs",
                    "SortedCheckpointFedAvg.server_step", "SortedCheckpointFedAvg.aggregate_train"],
    # what decides a cell's status, row, projection and the summary; not the Markdown rendering
    # (render_md, _render_checks, _check_cell, _fmt, _mfu_text, precision_text) nor machine()
    "rehearsal.report": ["_read_benchmark", "_failure_reason", "_train_sizes", "_epochs", "measure_cell",
                         "_result", "_is_number", "_finite", "_is_loss_key", "_loss_leaves",
                         "check_finite_losses", "_method_base", "adaptive_step_bound", "_nova",
                         "expected_server_step", "_judge_step", "check_server_step", "check_fedsumm_rho",
                         "backbone_weights", "check_kd_share", "check_payload", "run_checks", "read_round_log",
                         "_match", "table_hours", "summary_lines", "build", "main"],
    "precision": ["native_bf16", "_cpu_native_bf16", "cuda_capabilities", "Precision.emulation_warning"],
    # the checkpoint bookkeeping; the background writer's own mutants deadlock its thread until
    # mutmut's limit (each a timeout of minutes): the writer is tested directly (test_client_writes,
    # test_checkpoint_files), outside the score
    "fl.checkpoint": ["snapshot", "save_state", "load_state", "config_hash", "prepare_checkpoints",
                      "discard_checkpoints", "checkpoint_paths", "latest_round", "round_log", "timing_path",
                      "timing_log", "read_failure", "latest_client_round", "client_files_needed_from",
                      "last_participation"],
    "adafedseleckd.task": ["client_train_round", "inherited_local", "hard_kd_examples", "_hard_kd_masks",
                           "initial_state", "special_ids"],
    "fedmcp.task": ["client_train_round", "private_state", "load_private_state", "load_client_state",
                    "epoch_batches", "collate", "build_client_model", "initial_state"],
    "fedsum.task": ["client_train_round", "_initial_portrait", "_fedsum_round", "client_batches",
                    "latest_client_state", "save_client_state", "prototypes_record",
                    "prototypes_from_record", "broadcast_from_records", "broadcast_records",
                    "selections_record", "selections_from_record", "fedsum_hparams", "baseline_hparams",
                    "initial_state"],
    "fedsumm.task": ["client_train_round", "_train_round", "guidance_from_records", "_optimizer",
                     "data_loss", "_bart_logits_and_labels", "epoch_batches", "make_batch",
                     "shared_state", "load_shared_state", "client_model", "initial_state", "_finite"],
}


def mutant_globs(module: str, functions: list[str] | None = None) -> list[str]:
    """The mutant names ``mutmut run`` is given for ``module`` (none: every mutant of the file);
    ``functions`` (``--functions``) narrows them to those functions (methods: ``Class.method``
    is mutmut's ``xǁClassǁmethod``)."""
    dotted = SCOPE[module][0][len("src/"):-len(".py")].replace("/", ".")
    names = functions if functions else FUNCTIONS.get(module, [])
    out = []
    for fn in names:
        if "." in fn:
            cls, meth = fn.split(".", 1)
            out.append(f"{dotted}.x\u01c1{cls}\u01c1{meth}__mutmut_*")
        else:
            out.append(f"{dotted}.x_{fn}__mutmut_*")
    return out


# what the tests read besides src/ and tests/ (configs, the generated samples' code, workflow)
SNAPSHOT = ["src", "tests", "config", "resources", "rules", "workflow_scripts", "envs", "Snakefile",
            "pyproject.toml", "docs", "Makefile"]
KILLED, SURVIVED = "killed", "survived"

# Lines that only word a message (an error's or a log line's text, a string-only continuation
# line) are not mutated: a changed message is not a method training the wrong thing, and counting
# them would bury the score of the arithmetic under hundreds of text variants.  The conditions
# that raise stay mutated (the lines above a ``raise``), as do the exception classes' uses.
MESSAGE_LINES = [
    r"^\s*raise \w+\(",                       # raise InputError(f"...")
    r"^\s*(log|logger|LOG|_log)\.\w+\(",       # log.info("...", ...)
    r"^\s*log\((DEBUG|INFO|WARN|WARNING|ERROR)\b",  # Flower's log(INFO, "...")
    r"^\s*warnings\.warn\(",
    r"^\s*(rf|fr|f|r|b)?\"[^\"]*\"[),]*\s*$",  # a message's continuation line
    r"^\s*(rf|fr|f|r|b)?'[^']*'[),]*\s*$",
]


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(
            "__pycache__", "*.pyc", "downloads", "backbones", ".pytest_cache"))
    elif src.exists():
        shutil.copy2(src, dst)


def prepare(module: str) -> Path:
    """A fresh ``.mutation/<module>/`` with the snapshot and its mutmut config."""
    path, tests = SCOPE[module]
    missing = [t for t in tests if not (ROOT / t.split("::")[0]).exists()]
    if missing:
        raise SystemExit(f"mutation: {module}: test files {missing} do not exist (tests/mutation.py SCOPE)")
    work = WORK / module
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for name in SNAPSHOT:
        _copy(ROOT / name, work / name)
    base = (ROOT / "pyproject.toml").read_text()
    also = [n for n in SNAPSHOT if n not in ("src", "tests", "pyproject.toml") and (ROOT / n).exists()]
    cfg = (
        "\n[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        f"only_mutate = [{json.dumps(path)}]\n"
        f"also_copy = {json.dumps(also)}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
        'pytest_add_cli_args = ["-q", "-p", "no:cacheprovider", "-x"]\n'
        f"do_not_mutate_patterns = {json.dumps(MESSAGE_LINES)}\n"
    )
    (work / "pyproject.toml").write_text(base + cfg)
    return work


def score(work: Path, path: str) -> dict:
    """Counts per status from mutmut's ``.meta`` of the mutated file."""
    from mutmut.stats import status_by_exit_code  # noqa: PLC0415 (only installed for make mutation)

    meta = work / "mutants" / (path + ".meta")
    if not meta.exists():
        return {"error": f"{meta} not written (mutmut failed: see {work}/mutmut.log)"}
    codes = json.loads(meta.read_text()).get("exit_code_by_key", {})
    counts: dict[str, int] = {}
    for code in codes.values():
        status = status_by_exit_code[code]
        counts[status] = counts.get(status, 0) + 1
    judged = sum(v for k, v in counts.items() if k not in ("skipped", "caught by type check", "not checked"))
    killed = counts.get(KILLED, 0)
    return {"mutants": len(codes), **counts, "score": round(killed / judged, 4) if judged else None}


def _mutmut_run(work: Path, max_children: int, names: list[str], log_name: str) -> int:
    """``mutmut run`` of ``names`` (mutant names or globs; none: all) in ``work``, its output in
    ``work/log_name``; returns its exit status."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    with open(work / log_name, "w") as log:
        return subprocess.call([str(Path(sys.executable).parent / "mutmut"), "run",
                                "--max-children", str(max_children), *names], cwd=work, env=env,
                               stdout=log, stderr=subprocess.STDOUT)


def run(module: str, max_children: int, functions: list[str] | None = None) -> dict:
    path, _ = SCOPE[module]
    work = prepare(module)
    t0 = time.monotonic()
    rc = _mutmut_run(work, max_children, mutant_globs(module, functions), "mutmut.log")
    scope = {"functions": functions or FUNCTIONS[module]} if functions or module in FUNCTIONS else {}
    return {"module": module, "file": path, "rc": rc, "wall_s": round(time.monotonic() - t0, 1),
            **scope, **score(work, path)}


def rerun_survivors(module: str, max_children: int) -> dict:
    """Run again, against today's tests, only the mutants of ``module``'s last run that no test
    caught (survived, timeout, suspicious, no tests): the snapshot's ``tests/`` and its test
    selection (``SCOPE``) are refreshed first, the source snapshot is kept (a changed source file
    needs a full run).  The score then counts every mutant of the last full run."""
    from mutmut.stats import status_by_exit_code  # noqa: PLC0415 (only installed for make mutation)

    path, tests = SCOPE[module]
    work = WORK / module
    meta = work / "mutants" / (path + ".meta")
    if not meta.exists():
        raise SystemExit(f"mutation: {module}: no earlier run in {work}; run `make mutation MODULES={module}` first")
    codes = json.loads(meta.read_text()).get("exit_code_by_key", {})
    done = (KILLED, "skipped", "caught by type check", "not checked")
    left = sorted(k for k, c in codes.items() if status_by_exit_code[c] not in done)
    for dst in (work / "tests", work / "mutants" / "tests"):
        if dst.exists():
            shutil.rmtree(dst)
            _copy(ROOT / "tests", dst)
    cfg = work / "pyproject.toml"
    cfg.write_text(re.sub(r"^pytest_add_cli_args_test_selection = .*$",
                          lambda _: f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
                          cfg.read_text(), flags=re.M))
    t0 = time.monotonic()
    rc = 0
    if left:
        rc = _mutmut_run(work, max_children, left, "mutmut-rerun.log")
        # mutmut may forget the results of the mutants it was not asked to run: keep the last
        # run's for those, today's for the rerun ones
        data = json.loads(meta.read_text())
        new = data.get("exit_code_by_key", {})
        data["exit_code_by_key"] = {**codes, **{k: new[k] for k in left if new.get(k) is not None}}
        meta.write_text(json.dumps(data))
    previous = json.loads((work / "score.json").read_text()) if (work / "score.json").exists() else {}
    scope = {k: previous[k] for k in ("functions",) if k in previous}
    return {"module": module, "file": path, "rc": rc, "rerun_of": len(left),
            "rerun_wall_s": round(time.monotonic() - t0, 1), **scope, **score(work, path)}


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modules", nargs="*", help=f"default: all of {list(SCOPE)}")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--survivors", action="store_true",
                    help="rerun only the mutants the module's last run left alive, against today's tests")
    ap.add_argument("--functions", nargs="+", metavar="NAME",
                    help="only these functions of the module (Class.method for a method): a partial "
                         "run, its score covers them only")
    args = ap.parse_args(argv)
    if args.list:
        for name, (path, tests) in SCOPE.items():
            only = f"\n{'':24s} functions: {' '.join(FUNCTIONS[name])}" if name in FUNCTIONS else ""
            print(f"{name:24s} {path}\n{'':24s} tests: {' '.join(tests)}{only}")
        return 0
    unknown = [m for m in args.modules if m not in SCOPE]
    if unknown:
        raise SystemExit(f"mutation: unknown module(s) {unknown}; known: {list(SCOPE)}")
    results_path = WORK / "scores.json"
    for module in args.modules or list(SCOPE):
        res = (rerun_survivors(module, args.max_children) if args.survivors
               else run(module, args.max_children, args.functions))
        _write_json(WORK / module / "score.json", res)
        print(json.dumps(res), flush=True)
    # every module's last score (runs of single modules, in parallel or not, each add theirs)
    results = {p.parent.name: json.loads(p.read_text()) for p in sorted(WORK.glob("*/score.json"))}
    _write_json(results_path, results)
    bad = [m for m, r in results.items() if (r.get("score") or 0) < 0.9]
    print(f"mutation: scores in {results_path}; below 90 %: {bad or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
