"""The GPU's default batch judged by quality, on the CPU: the test NLL after the same number of epochs, and after
the same time on a GPU in the launch model of docs/gpu.md, of minibatch fits with the batch that
``batch_size="auto"`` picks on a GPU (``agpc.batch_size.gpu_rule_rows`` for an H100 SXM in float64, 40 GB free)
against the CPU's default batch (200 rows) and batches between the two (issue 42).

A fit's arithmetic does not depend on where it runs: the same seed and batch give the same model on CPU and GPU
(gpu_tests/test_fit_on_device.py), so a fit on the CPU with the GPU's batch forced is the GPU default's model. Each
fit is ``GPClassifier(method, n_inducing=m, batch_size=b, max_iter=epochs, plateau=None, random_state=split)`` with
the test part as ``validation_data``: the history holds the test NLL after every epoch. For each epoch the launch
model gives the time it would take on the H100 (``agpc.batch_size.gpu_step_seconds``: the larger of the launches'
host time and the work's device time, for each step, and once more for the end-of-epoch pass over all rows that
minibatch EP makes). The table reports, per set and batch: steps an epoch, modelled GPU seconds an epoch, the test NLL
after epochs 1, 2, 5, 10 and the last, its difference from the CPU default's after the same epochs, and the NLL each
batch reaches within the modelled GPU time the CPU default's batch needs for one epoch.

Sets: the airline data (all 2,058,097 rows: 90/10 split; ``airline-N``: a random N-row subset) and generated
tables (``clf-NxD``: scikit-learn's ``make_classification``). Features standardised on the training part; one BLAS
thread.

    PYTHONPATH=. python benchmarks/gpu_batch_quality.py --sets airline --ms 100 --batches gpu,231535,25600,1600,800,cpu --epochs 10
    PYTHONPATH=. python benchmarks/gpu_batch_quality.py --sets airline --ms 200 --batches gpu,204800,cpu --epochs 5
    PYTHONPATH=. python benchmarks/gpu_batch_quality.py --sets airline-200000,clf-200000x20 --ms 100 --batches 25000,3200,400,cpu --epochs 10
    PYTHONPATH=. python benchmarks/gpu_batch_quality.py --analyse benchmarks/results/gpu_batch_quality.json

(The runs of benchmarks/results/gpu_batch_quality.md chose agpc.batch_size.GPU_STEPS_PER_EPOCH: their "n/8" batch is
the GPU's rule when they were recorded, 3,200 rows the airline data's now.)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
from _protocol import split_indices
from _runner import begin, end, header, options, parse, parse_list, row, show, standardise, write_json
from stopping import load

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the mocked devices' properties
from cupy_mock import H100_PROPERTIES as H100  # noqa: E402  (an H100 SXM's getDeviceProperties, the keys agpc reads)

FREE_BYTES = 40 * 2**30
CPU_BATCH = "cpu"
GPU_BATCH = "gpu"
OLD_RULE = "n/8"  # (benchmarks/results/gpu_batch_quality.json: the GPU rule when it was recorded, at most n / 8 rows)
REPORT_EPOCHS = (1, 2, 5, 10)


def gpu_rows(method, n, m, d):
    """(rows the GPU rule picks for n rows, the rows of its memory cap) on the H100 in float64."""
    from agpc import backend as B
    from agpc.batch_size import gpu_rule_rows
    from agpc.inference import blocks

    fit = B.rows_for_free_bytes(blocks.block_bytes_per_row(m, d, 8), FREE_BYTES)
    return gpu_rule_rows(method, n, m, B.throughput_from_properties(H100, "float64"), fit), fit


def epoch_gpu_seconds(method, n, m, rows, fit_rows):
    """The launch model's seconds of one epoch on the H100: ceil(n / rows) steps, plus for EP the end-of-epoch pass
    over all n rows (in blocks of what fits in memory)."""
    from agpc import backend as B
    from agpc.batch_size import gpu_step_seconds

    throughput = B.throughput_from_properties(H100, "float64")
    steps = -(-n // rows)
    full, last = divmod(n, rows)
    seconds = full * max(gpu_step_seconds(method, rows, m, throughput))
    if last:
        seconds += max(gpu_step_seconds(method, last, m, throughput))
    if method == "ep":
        seconds += max(gpu_step_seconds(method, n, m, throughput, block_rows=fit_rows))
    return steps, seconds


def record(args):
    from agpc import GPClassifier

    runs = []
    for name in args.sets:
        data = load(name, args.data_dir) if name != "airline" else load_all_airline(args.data_dir)
        if data is None:
            print(f"{name}: data not found, skipped", flush=True)
            continue
        X, y = data
        for split in range(args.splits):
            train, test = split_indices(X.shape[0], split, 0.10)
            X_train, X_test = standardise(X[train], X[test])
            n, d = X_train.shape
            for m in args.ms:
                rule, fit_rows = gpu_rows(args.method, n, m, d)
                for batch in args.batches:
                    rows = {CPU_BATCH: 200, GPU_BATCH: rule}.get(batch) or int(batch)
                    model = GPClassifier(method=args.method, n_inducing=m, batch_size=rows, max_iter=args.epochs,
                                         plateau=None, random_state=split)
                    started = time.perf_counter()
                    model.fit(X_train, y[train], validation_data=(X_test, y[test]))
                    seconds = time.perf_counter() - started
                    h = model.history_
                    steps, gpu_epoch = epoch_gpu_seconds(args.method, n, m, rows, fit_rows)
                    runs.append({"set": name, "split": split, "n_train": n, "m": m, "batch": batch, "rows": rows,
                                 "steps_per_epoch": steps, "gpu_epoch_seconds": gpu_epoch, "cpu_seconds": seconds,
                                 "val_nll": [float(v) for v in h["validation_nll"]],
                                 "val_step": [int(v) for v in h["validation_step"]]})
                    print(f"{name} split {split} m={m} batch {rows}: {seconds:.0f} s on the CPU, "
                          f"{gpu_epoch:.3f} s an epoch on the H100 (modelled), "
                          f"test NLL {h['validation_nll'][-1]:.4f} after {model.n_iter_} epochs", flush=True)
                    write_json(args.out, {"runs": runs, "epochs": args.epochs, "method": args.method})
    return runs


def load_all_airline(data_dir):
    from _runner import load_airline

    path = Path(data_dir) / "airline2008.npz"
    if not path.is_file():
        return None
    X, y, _ = load_airline(path)
    return X, y


def epoch_nll(run):
    """The test NLL after each epoch (the validation record at each epoch's last step)."""
    per_epoch = run["steps_per_epoch"]
    at = dict(zip(run["val_step"], run["val_nll"]))
    return [at.get(per_epoch * (e + 1), float("nan")) for e in range(len(run["val_nll"]))]


def analyse(runs):
    groups = {}
    for run in runs:
        groups.setdefault((run["set"], run["m"], run["split"]), []).append(run)
    columns = ["set", "m", "split", "batch (rows)", "steps an epoch", "H100 s an epoch (model)"]
    columns += [f"NLL after {e}" for e in REPORT_EPOCHS] + ["last (epochs)", "vs CPU default, same epochs",
                                                            "NLL within the CPU default's first epoch's GPU time"]
    header(columns, "lrrlrr" + "r" * (len(REPORT_EPOCHS) + 3),
           title="Test NLL by batch: after the same epochs, and within the same modelled GPU time")
    for (name, m, split), group in sorted(groups.items()):
        cpu = next((r for r in group if r["batch"] == CPU_BATCH), None)
        cpu_nll = epoch_nll(cpu) if cpu else []
        budget = cpu["gpu_epoch_seconds"] if cpu else None
        for run in sorted(group, key=lambda r: r["rows"]):
            nll = epoch_nll(run)
            cells = [show(nll[e - 1], ".4f") if e <= len(nll) else "–" for e in REPORT_EPOCHS]
            epochs = min(len(nll), len(cpu_nll)) if cpu else 0
            diff = f"{nll[epochs - 1] - cpu_nll[epochs - 1]:+.4f} ({epochs})" if epochs else "–"
            within = "–"
            if budget:
                done = int(budget // run["gpu_epoch_seconds"])
                within = (f"{nll[min(done, len(nll)) - 1]:.4f} ({min(done, len(nll))} epochs"
                          f"{', all run' if done > len(nll) else ''})" if done >= 1 else "not one epoch")
            label = {CPU_BATCH: "CPU default", GPU_BATCH: "GPU default", OLD_RULE: "GPU rule before (n / 8)"}.get(
                run["batch"], "between")
            row(name, m, split, f"{label} ({run['rows']:,})", run["steps_per_epoch"],
                f"{run['gpu_epoch_seconds']:.3f}", *cells, f"{nll[-1]:.4f} ({len(nll)})", diff, within)


def main(argv=None):
    p = options(__doc__, "clf-20000x10, m = 20, 3 epochs", data_dir=True, out="gpu_batch_quality", blas_threads=1)
    p.add_argument("--sets", default=None, help="comma list: airline, airline-N, clf-NxD")
    p.add_argument("--ms", default=None, help="comma list of inducing-point counts (default 100,200)")
    p.add_argument("--batches", default=None, help="comma list: cpu, gpu and row counts between (default cpu,gpu)")
    p.add_argument("--epochs", type=int, default=None, help="epochs a fit runs (default 10)")
    p.add_argument("--splits", type=int, default=None, help="random 90/10 splits (default 1)")
    p.add_argument("--method", default="ep", help="the minibatch method (default ep, the default method)")
    p.add_argument("--analyse", nargs="*", default=None, help="JSON files of earlier runs: print their table only")
    args = parse(p, argv, full=dict(sets="airline", ms="100,200", batches="cpu,gpu", epochs=10, splits=1),
                 quick=dict(sets="clf-20000x10", ms="20", batches="cpu,gpu", epochs=3, splits=1))
    run = begin("The GPU's default batch against the CPU's: test NLL after the same epochs and the same GPU time",
                args, argv if argv is not None else sys.argv[1:])
    if args.analyse:
        runs = [r for path in args.analyse for r in json.loads(Path(path).read_text())["runs"]]
    else:
        args.sets, args.batches = parse_list(args.sets), parse_list(args.batches)
        args.ms = parse_list(args.ms, convert=int)
        runs = record(args)
    analyse(runs)
    end(run)


if __name__ == "__main__":
    main()
