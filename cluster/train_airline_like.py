"""Train agpc on the synthetic airline-like data in a zarr store, over a Dask cluster.

Generates the store if it is not there (``agpc.datasets.make_airline_like``, a chunk at a time: 10^7 rows
never need more than a chunk in memory), opens it as a dask.array chunked by rows, trains batch SEP (or EP)
with one task per chunk each pass, and prints progress and the figures on held-out rows.

    python cluster/train_airline_like.py --rows 1000000                       # a LocalCluster on this machine
    python cluster/train_airline_like.py --scheduler tcp://head:8786 --rows 10000000 --store /shared/air.zarr

The workers need agpc installed and (for a store on disk) the same path mounted.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="training rows to generate / use (default 1e6)")
    p.add_argument("--test-rows", type=int, default=20_000, help="held-out rows, generated with another seed")
    p.add_argument("--store", default="airline_like", help="folder holding data.zarr (created if missing)")
    p.add_argument("--chunk-rows", type=int, default=250_000, help="rows per dask chunk (one task each)")
    p.add_argument("--scheduler", default=None, help="address of a running dask scheduler (default: LocalCluster)")
    p.add_argument("--workers", type=int, default=None, help="LocalCluster workers (default: one per core)")
    p.add_argument("--method", default="sep", choices=["sep", "ep", "adf"])
    p.add_argument("--inducing", type=int, default=200)
    p.add_argument("--max-iter", type=int, default=50, help="batch iterations (each one pass over all rows)")
    p.add_argument("--max-time", type=float, default=None, help="stop after this many seconds")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import dask.array as da
    import zarr
    from distributed import Client, LocalCluster

    from agpc import GPClassifier
    from agpc.datasets import airline_like_bayes_error, make_airline_like

    store = os.path.join(args.store, "data.zarr")
    if not os.path.exists(store):
        t0 = time.perf_counter()
        make_airline_like(args.rows, random_state=0, path=args.store, format="zarr")
        print(f"wrote {args.rows:,} rows to {store} in {time.perf_counter() - t0:.1f} s", flush=True)
    root = zarr.open_group(store, mode="r")
    X = da.from_zarr(root["X"]).rechunk((args.chunk_rows, -1))[: args.rows]
    y = da.from_zarr(root["y"]).rechunk(args.chunk_rows)[: args.rows]
    X_test, y_test = make_airline_like(args.test_rows, random_state=1)

    if args.scheduler:
        client, cluster = Client(args.scheduler), None
    else:
        cluster = LocalCluster(n_workers=args.workers or os.cpu_count(), threads_per_worker=1, dashboard_address=None)
        client = Client(cluster)
    print(f"cluster: {client}", flush=True)
    try:
        t0 = time.perf_counter()
        model = GPClassifier(method=args.method, n_inducing=args.inducing, max_iter=args.max_iter, max_time=args.max_time,
                             batch_size=None, random_state=0, client=client, verbose=True).fit(X, y)
        seconds = time.perf_counter() - t0
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    proba = model.predict_proba(X_test)
    p_true = proba[np.arange(len(y_test)), np.searchsorted(model.classes_, y_test)]
    error = float(np.mean(model.predict(X_test) != y_test))
    print(f"{args.method}: {model.n_iter_} iterations in {seconds:.0f} s ({seconds / max(1, model.n_iter_):.1f} s each, "
          f"{args.rows * model.n_iter_ / seconds:,.0f} rows/s); test NLL {-np.mean(np.log(p_true)):.4f}, error "
          f"{error:.4f} (Bayes error of the generator {airline_like_bayes_error():.3f})")


if __name__ == "__main__":
    main()
