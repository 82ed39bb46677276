"""Data-parallel stochastic training: minibatch SEP, EP and SVI in rounds, on a dask cluster or in local worker
processes (``GPClassifier(n_jobs=...)``).

The rows stay where they are. They are cut into *shards*, fixed groups of stored chunks, one shard per
worker at the start of the fit. A *round* is one task per shard: the task runs minibatch steps of the method's own
engine (built by the method's factory, stepped through ``training.Trainer.step_until_taken``: the same step, guard and
retry rule included, as the single-process fit) on minibatches drawn from its shard's chunks, against the global state the driver sent, and
returns the state it ends at. How many steps: ``local_steps`` each when it is given; by default
``DEFAULT_LOCAL_STEPS`` a shard on average, shared out by ``balanced_steps`` in proportion to the speed (steps a
second) each shard's tasks showed in the rounds before, so that a worker whose core other work shares takes fewer
and the round does not wait for it. The driver combines:

* SEP: distributed SEP (Li, Hernandez-Lobato & Turner 2015, sec. 4), one tied factor per chunk of rows,
  F_c = f_c^(n_c), and q = prior x prod_c F_c. A row of chunk c has the cavity q / F_c^(1 / n_c), and a
  step on a minibatch M of chunk c replaces the share |M| / n_c of F_c by the minibatch's sites
  (``ep.factor_cavity``'s ``others`` / ``factor_rows``). A chunk is stepped by one shard only, so the
  driver simply takes each chunk's new F_c; the global factor is their sum (natural parameters add).
* EP: each chunk owns its rows' sites (two floats a row, in a file a chunk, written and read by the task
  that steps the chunk: they never travel) and the running product of its sites, F_c, which travels as
  SEP's does; q = prior x prod_c F_c.
* SVI: its whitened q(v) = N(whitened_mean, whitened_chol whitened_chol^T) is a parameter like the others.
* Parameters (kernel, inducing points, SVI's whitened_mean and whitened_chol) and the optimiser's state: the average of the
  shards' end-of-round values, weighted by the rows each shard stepped in the round. Every shard's engine steps on
  the full-data estimate of the gradient (the n / |M| scaling of Hernandez-Lobato & Hernandez-Lobato (2016), eq. 6),
  so with one local step and a step linear in the gradient this is one step on the average of the round's
  minibatch gradients (every minibatch of the round counts alike). With Adadelta / Adam it is the rows-weighted
  average of the shards' steps.

What travels in a round: to each shard the kernel's parameters, Z, the optimiser's state, the global
factor and the factors of the chunks it will step (m x m each; SVI: whitened_mean and whitened_chol); back the same.
Never rows. A chunk's rows are read by the worker the shard is pinned to (from the cluster's memory or store, or
mapped from the local workers' shared file), kept while the shard is stepping that chunk, and released when it
moves on (worker memory does not grow with n). Each task runs under ``workers.task_scope``: the BLAS thread rule
and the heap thresholds a minibatch step needs, in any worker process.

Per-chunk state kept by the driver: the factor F_c and its random stream, keyed by chunk: the order of a
chunk's rows for its v-th visit is a permutation drawn from ``default_rng([seed, 0, chunk, v])``, and a
shard's order of visiting its chunks from ``default_rng([seed, 1, shard, epoch])``. The driver knows
which minibatches each shard steps in a round before it starts, so when a worker is lost, the scheduler (or the
local pool) runs its shard's task on another worker with the same inputs: the round's outcome is the same. With
``local_steps`` given, so is the model: "the same" means equal to rounding: on one machine, bit for bit (the tests
compare to 1e-12); across machines, within what their BLAS libraries' different summation orders give. With the
default balanced rounds the steps of the rounds after it follow the timing (as every balanced fit's do).

The rounds are the training loop's steps: ``DataParallel.round_engine`` builds the engine ``training.train`` drives,
whose step is a round, so the schedule of epochs (``max_iter`` counts passes over the rows), ``max_time``, the
history, the progress bar and the guard are the single-process ones. A round sees
``n_shards * local_steps * batch_size`` rows (``local_steps``: the average, ``DEFAULT_LOCAL_STEPS`` by default).
"""

from __future__ import annotations

import copy
import functools
import importlib
import math
import os
import re
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace

from .. import checkpoints
from ..backend import array_device, array_namespace, asarray_like, host_rng, is_dask_array, row_chunk_bounds
from ..workers import minor_page_faults, task_scope
from . import multiclass_ep
from .dask_engine import persisted_blocks
from .engines import (ENGINES, Engine, EngineOptions, Outcome, anchor_arrays, anchor_from_arrays, factor_arrays,
                      factor_from_arrays, forwarding)
from .training import Trainer, check_saved_anchor, check_saved_factor
from .posterior import Factor

__all__ = ["DataParallel", "RowsOnWorkers", "DEFAULT_LOCAL_STEPS", "balanced_steps", "shard_chunks",
           "shards_of_holders",
           "chunk_permutation", "weighted_average", "prepare_worker", "refusal"]

# Minibatch steps a shard takes per round (on average, when the rounds are balanced), chosen from
# benchmarks/dask_scaling.py section 3 (docs/results.md): 10^6 airline-like rows, m = 200, 200 rows a step,
# 2 workers on 2 cores. A round costs 13-25 ms beyond its steps (~7 ms each), so few steps waste the workers: SEP
# 8,842 / 17,933 rows/s at 1 / 4 steps under load, 41,186 at 16 and 50,723 at 64 on a quiet machine (one process:
# 33,456); EP 34,035 at 16, 45,934 at 64. The test NLL after one epoch stayed within 0.005 of one process's at every
# count (SEP -0.004 to -0.002, EP +0.003 to +0.004, SVI -0.003 to -0.002), so the largest count measured.
DEFAULT_LOCAL_STEPS = 64


class RowsOnWorkers:
    """What the training loop sees of rows that stay on the workers: how many there are, not their values
    (it lays its rounds over them; the rounds themselves read the rows on the workers)."""

    def __init__(self, shape, dtype):
        self.shape = tuple(int(s) for s in shape)
        self.ndim = len(self.shape)
        self.dtype = dtype

    def __getitem__(self, index):
        raise TypeError("the rows of a data-parallel fit stay on the workers: they are not read on the driver")


def shards_of_holders(holders, workers):
    """(shards, their workers) for chunks held by ``holders`` (the worker holding each chunk) on ``workers``: every
    worker gets its share of the chunks (C // W, the first C mod W one more), the chunks it holds first, and the
    chunks left over go to the workers short of their share (their rows travel to that worker when it steps them).
    Data persisted where it was spread follows its workers; data persisted on one worker (``da.from_array(X)
    .persist()`` puts every chunk where the array's one original key lives) is shared out."""
    workers = sorted(workers)
    held = {w: [c for c, h in enumerate(holders) if h == w] for w in workers}
    order = sorted(workers, key=lambda w: (-len(held[w]), w))  # (the larger shares to those holding more)
    share = {w: len(holders) // len(workers) + (k < len(holders) % len(workers)) for k, w in enumerate(order)}
    shards = {w: held[w][:share[w]] for w in workers}
    left = sorted(c for w in workers for c in held[w][share[w]:]) + sorted(
        c for c, h in enumerate(holders) if h not in held)
    for w in workers:
        while len(shards[w]) < share[w] and left:
            shards[w].append(left.pop(0))
    chosen = [w for w in workers if shards[w]]
    return [sorted(shards[w]) for w in chosen], chosen


def shard_chunks(n_chunks, n_shards):
    """The chunks of each shard: chunk c in shard c mod n_shards (neighbouring chunks, often rows stored
    close in time or space, land in different shards)."""
    n_shards = max(1, min(int(n_shards), int(n_chunks)))
    return [list(range(k, n_chunks, n_shards)) for k in range(n_shards)]


@functools.lru_cache(maxsize=16)
def chunk_permutation(seed, chunk, visit, n_rows):
    """The order of a chunk's rows in its ``visit``-th visit (keyed by chunk and visit, not by worker).
    Kept for the next rounds of the same visit (drawing it costs ~4 ms at 250,000 rows: a short round's
    worth); the caller must not write into it."""
    return host_rng([int(seed), 0, int(chunk), int(visit)]).permutation(int(n_rows))


def balanced_steps(total, speeds):
    """``total`` steps shared out among shards: one each, the rest in proportion to ``speeds`` (largest
    remainders first, ties to the lower shard), so that shards that step at these speeds end a round together."""
    n = len(speeds)
    extra = total - n
    if extra <= 0:
        return [1] * n if total >= n else [int(k < total) for k in range(n)]
    whole = sum(speeds)
    shares = [extra * (v / whole if whole > 0 else 1.0 / n) for v in speeds]
    steps = [math.floor(x) for x in shares]
    by_remainder = sorted(range(n), key=lambda k: (steps[k] - shares[k], k))
    for k in by_remainder[:extra - sum(steps)]:
        steps[k] += 1
    return [1 + x for x in steps]


def refusal(factory, method, n_classes):
    """Why the rounds cannot train ``method`` with the engine ``factory`` on ``n_classes`` classes (None: they can):
    the engine's ``round_refusal``; a factory that is not an ``Engine`` class cannot."""
    engine = factory if isinstance(factory, type) and issubclass(factory, Engine) else Engine
    return engine.round_refusal(method, n_classes)


def prepare_worker(modules=()):
    """A task run once on each worker at the start of a data-parallel fit, while the driver places the inducing
    points: unpickling it imports this module (and the engines) there, and it imports ``modules`` (those the
    rounds' other tasks need: dask.array for chunks read through a dask graph), which the first round would
    otherwise wait for. Returns the worker's process id."""
    for name in modules:
        importlib.import_module(name)
    return os.getpid()


def _segment_rows(segments, chunk_rows, batch_size):
    """Rows a shard's segments step (the last minibatch of a chunk may be short)."""
    return sum(min(chunk_rows[c], (first + count) * batch_size) - first * batch_size
               for c, _, first, count in segments)


def _shard_chunk_order(seed, shard, epoch, chunks):
    order = host_rng([int(seed), 1, int(shard), int(epoch)]).permutation(len(chunks))
    return [chunks[int(i)] for i in order]


def weighted_average(values, weights):
    """sum_k weights[k] * values[k] over parallel trees (dicts, tuples, lists) of arrays and floats; ints (counts
    such as Adam's t, equal across shards that took the same number of steps) to the nearest integer; bools,
    strings and None are taken from the first tree."""
    first = values[0]
    if first is None or isinstance(first, (bool, str)):
        return first
    if isinstance(first, int):
        return first if all(v == first for v in values) else int(round(sum(w * v for w, v in zip(weights, values))))
    if isinstance(first, dict):
        return {k: weighted_average([v[k] for v in values], weights) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(weighted_average(list(parts), weights) for parts in zip(*values))
    if isinstance(first, float) and all(v == first for v in values):  # (no rounding drift of equal settings)
        return first
    total = weights[0] * first
    for w, v in zip(weights[1:], values[1:]):
        total = total + w * v
    return total


@dataclass
class _Cursor:
    """Where a shard is in its schedule: the chunk visits left in its current pass over its chunks, and the
    first minibatch of the current visit not yet stepped."""

    epoch: int = 0
    order: list = field(default_factory=list)  # chunks still to visit in this pass, the current one first
    position: int = 0


def _plan(cursor, shard, chunks, visits, seed, chunk_rows, batch_size, steps):
    """The segments (chunk, visit, first minibatch, count) of a shard's next ``steps`` steps, and the cursor
    and visit counts after them (new objects: nothing is committed until the round is)."""
    cursor = _Cursor(cursor.epoch, list(cursor.order), cursor.position)
    visits = dict(visits)
    segments = []
    while steps > 0:
        if not cursor.order:
            cursor.order = _shard_chunk_order(seed, shard, cursor.epoch, chunks)
            cursor.epoch += 1
        chunk = cursor.order[0]
        n_batches = math.ceil(chunk_rows[chunk] / batch_size)
        count = min(steps, n_batches - cursor.position)
        segments.append((chunk, visits[chunk], cursor.position, count))
        steps -= count
        cursor.position += count
        if cursor.position == n_batches:  # the visit is over: the next one draws a new order of the rows
            visits[chunk] += 1
            cursor.order.pop(0)
            cursor.position = 0
    return segments, cursor, visits


def _site_path(directory, chunk, generation):
    return os.path.join(directory, f"chunk-{chunk}-{generation}.npz")


def step_shard(spec, segments, data):
    """A round of one shard (a task on a worker): ``spec["steps"]`` minibatch steps of the method's engine
    through ``Trainer.step``, starting from the driver's state. ``data``: per chunk of the segments, its
    rows (X, y) as arrays. Returns the state the shard ends at (parameters, optimiser, per-chunk factors,
    EP's site files) and the steps' log Z estimates; no rows. Runs under ``workers.task_scope`` (the BLAS thread
    rule and the heap thresholds of a minibatch step, whatever the worker process was started with)."""
    started, cpu, faults = time.perf_counter(), time.thread_time(), minor_page_faults()
    Z = spec["Z"]
    with task_scope(spec["batch_size"], Z.shape[-2], Z.shape[-1]):
        out = _step_segments(spec, segments, data)
    out["seconds"] = time.perf_counter() - started
    out["cpu_seconds"] = time.thread_time() - cpu
    out["page_faults"] = minor_page_faults() - faults
    return out


def _step_segments(spec, segments, data):
    """The steps of a shard's segments (``step_shard``) and the state it ends at."""
    shard = _Shard(spec)
    for chunk, visit, first, count in segments:
        X_chunk, y_chunk, *weights = data[chunk]  # (and the rows' weights, when the fit has them)
        order = chunk_permutation(spec["seed"], chunk, visit, X_chunk.shape[0])
        shard.enter(chunk, visit, first, X_chunk, y_chunk, *weights)
        batch_size = spec["batch_size"]
        stepping_started = time.perf_counter()
        for j in range(first, first + count):
            if not shard.step(X_chunk, y_chunk, order[j * batch_size:(j + 1) * batch_size]):
                break
        shard.step_seconds += time.perf_counter() - stepping_started
        shard.leave(chunk)
        if shard.gave_up:
            break
    return shard.result()


class _Shard:
    """A shard's task: an engine of the method at the driver's state, stepped chunk by chunk."""

    def __init__(self, spec):
        self.spec = spec
        # (a copy: an optimiser object given in the options is this shard's own, also in a threaded cluster)
        options = copy.deepcopy(spec["options"])
        self.engine = engine = spec["factory"](spec["method"], spec["kernel"], spec["Z"], n_total=spec["n_total"],
                                               minibatch=True, options=options)
        self.trainer = Trainer(engine)
        engine.state.update(spec["state"])
        if engine.optimizer is not None:
            engine.optimizer.restore(spec["optimizer"])
        engine.damping = spec["damping"]
        Z = engine.state["Z"]
        self.xp, self.device, self.dtype = array_namespace(Z), array_device(Z), Z.dtype
        self.tied = engine.layout.tied_factor is not None
        self.factors = dict(spec["factors"])
        # EP: where each chunk's factor holds the sites of its rows not yet visited in the chunk's current visit
        # (``ep.Anchor``: the kernel and Z of the visit's rebuild; None: zero sites, the chunk's first visit)
        self.anchors = dict(spec.get("anchors", {}))
        self.total = spec["total"]
        self.site_files, self.sites_now = {}, {}  # EP: per chunk, the file this task wrote and the sites it left
        self.log_z, self.n_invalid = [], 0.0
        self.step_seconds = 0.0  # in the steps themselves (a task's set-up, the same whatever its steps, left out)
        self.sites = self.previous = None
        self.weights = None  # the current chunk's rows' sample weights (a fit with weights), or None
        self.gave_up = False  # the guard gave up on a step: the round ends at the last good state (``step``)

    def enter(self, chunk, visit, first, X_chunk, y_chunk, w_chunk=None):
        """Start a segment of the chunk: its factor and (EP) its sites. ``w_chunk``: its rows' sample weights, which
        its steps weight the rows by, as the engine does in one process (its factor stands for their sum)."""
        engine, n_chunk = self.engine, X_chunk.shape[0]
        if w_chunk is not None:
            self.weights = asarray_like(w_chunk, self.xp, device=self.device, dtype=self.dtype)
        if self.tied:  # this chunk's factor is the one the steps update; the others' product stays as sent
            engine.state["factor"] = self.factors[chunk]
            engine.others = self.total.combine(1.0, self.factors[chunk], -1.0)
            engine.factor_rows = n_chunk if w_chunk is None else self.spec["chunk_weights"][chunk]
        if engine.per_row_sites:  # the chunk's sites: as this task left them, from its file, or zero
            path, Z = self.spec["site_files"][chunk], engine.state["Z"]
            if chunk in self.sites_now:  # (a shard of one chunk whose round crosses into the chunk's next visit)
                sites = self.sites_now[chunk]
            elif path is not None:
                sites = checkpoints.load_site_chunk(path, n_chunk)
            else:
                sites = (engine.passes.zero_sites(n_chunk, Z), engine.passes.zero_sites(n_chunk, Z))
            self.sites = [asarray_like(v, self.xp, device=self.device, dtype=self.dtype) for v in sites]
            engine.state["anchor"] = self.anchors.get(chunk)
            if first == 0 and visit > 0:
                # A new visit: the chunk's site product exactly, at the current hyper-parameters, which anchors it
                # (each row's site then leaves it along the direction it went in along, ``ep.Anchor``: every row
                # is visited once a visit, as the single-process loop visits each once between its rebuilds).
                _rebuild_chunk_factor(engine, X_chunk, y_chunk, *self.sites, self.total, self.weights)
                self.total = engine.others.combine(1.0, engine.state["factor"], 1.0)
        # The guard's revert goes back to before the last good step; on this segment's first step that is
        # its start (not the previous chunk's state).
        self.trainer.hold_as_good()
        self.previous = None  # EP: (rows, sites) of the last step taken; a revert undoes its sites in place

    def step(self, X_chunk, y_chunk, rows):
        """One minibatch step on the chunk's ``rows``, retried by the one retry rule; False where the guard gave up
        (``_end_at_good``: the round ends)."""
        engine, xp = self.engine, self.xp
        X_batch = asarray_like(X_chunk[rows], xp, device=self.device, dtype=self.dtype)
        y_batch = asarray_like(y_chunk[rows], xp, device=self.device, dtype=self.dtype)
        index = asarray_like(rows, xp, device=self.device) if engine.per_row_sites or self.weights is not None else None
        if self.weights is not None:  # the minibatch's rows' weights (``EPEngine``, ``SVIEngine``: ``sample_weight``)
            engine.sample_weight = xp.take(self.weights, index, axis=0)
        self._take_sites(index)

        def repair():  # the guard's first remedy (EP): the chunk's site product rebuilt exactly
            site_precision, site_shift = self.sites
            _rebuild_chunk_factor(engine, X_chunk, y_chunk, site_precision, site_shift, None, self.weights)

        try:
            _, value = self.trainer.step_until_taken(X_batch, y_batch, 0, X_batch.shape[0],
                                                     stepping=engine.has_params,
                                                     after_revert=lambda: self._take_sites(index, reverted=True),
                                                     repair=repair if engine.per_row_sites else None)
        except FloatingPointError:
            self._end_at_good(index)
            return False
        self.log_z.append(value)
        self.n_invalid += float(self.trainer.last.n_invalid)
        if engine.per_row_sites:
            site_precision, site_shift = self.sites
            self.previous = (index, engine.state["nu"], engine.state["mu"])
            site_precision[index] = engine.state["nu"]
            site_shift[index] = engine.state["mu"]
        return True

    def _end_at_good(self, index):
        """The guard gave up on a step of this round (``MAX_FAILURES`` in a row, its step sizes halved each time): the
        shard ends the round at its last good state (the segment's start where it took no step: ``enter``), its step
        sizes kept at their halved values. The driver goes on from the rounds' combined state, or, where no shard took
        a step (the round's start is itself no model: the last round's update went out of the floats), its own guard
        goes back to before that round and halves its steps (``evaluate``: log Z NaN), as one process goes back a step.
        (A shard that raised ended the whole fit: Adam at learning_rate=1e3 on two local workers gave up where one
        process recovered.) What the guards did is in the shards' guard counts, said by the fit."""
        trainer, engine = self.trainer, self.engine
        engine.restore(trainer.good)
        self._take_sites(index, reverted=True)
        for _ in range(trainer.halvings):
            engine.shrink()
        self.gave_up = True

    def _take_sites(self, index, reverted=False):
        """EP: the minibatch's own sites, in the order of its rows; after a revert, which undid the previous
        step's sites too, those are put back first."""
        if self.engine.per_row_sites:
            site_precision, site_shift = self.sites
            if reverted and self.previous is not None:
                site_precision[self.previous[0]], site_shift[self.previous[0]] = self.previous[1], self.previous[2]
            self.engine.state["nu"] = self.xp.take(site_precision, index, axis=0)
            self.engine.state["mu"] = self.xp.take(site_shift, index, axis=0)

    def leave(self, chunk):
        """End a segment: the chunk's new factor, (EP) its sites written to their file."""
        engine = self.engine
        if self.tied:
            self.factors[chunk] = engine.state["factor"]
            self.total = engine.others.combine(1.0, self.factors[chunk], 1.0)
        if engine.per_row_sites:
            self.anchors[chunk] = engine.state["anchor"]
            path = _site_path(self.spec["site_directory"], chunk, self.spec["generation"])
            checkpoints.save_site_chunk(path, *self.sites)
            self.site_files[chunk], self.sites_now[chunk] = path, tuple(self.sites)

    def result(self):
        engine = self.engine
        state = {k: engine.state[k] for k in self.spec["state"]}
        return {"kernel": engine.state["kernel"], "Z": engine.state["Z"], "state": state,
                "optimizer": engine.optimizer.snapshot() if engine.optimizer is not None else None,
                "damping": engine.damping, "factors": dict(self.factors), "site_files": self.site_files,
                "anchors": dict(self.anchors) if engine.per_row_sites else {}, "guard": dict(self.trainer.guard.totals),
                "log_z": self.log_z, "n_invalid": self.n_invalid, "step_seconds": self.step_seconds}


def _chunk_holders(client, X, n_chunks):
    """The worker holding each row chunk of X when X is persisted on the cluster (one key a chunk, under one
    name, indexed by chunk), else None: shards then follow the data instead of moving it."""
    from distributed import futures_of, wait

    futures = futures_of(X)
    names = {f.key[0] for f in futures if isinstance(f.key, tuple)}
    if len(futures) != n_chunks or len(names) != 1:
        return None
    wait(futures)
    holders = [None] * n_chunks
    for key, addresses in client.who_has(futures).items():
        if 0 <= key[1] < n_chunks and addresses:
            holders[key[1]] = sorted(addresses)[0]
    return None if None in holders else holders


def _rebuild_chunk_factor(engine, X_chunk, y_chunk, site_precision, site_shift, total, weights=None):
    """EP: the chunk's factor recomputed exactly from its sites (the passes' ``exact_factor``) at the
    engine's state; ``total`` given: the others' product is set from it first (the chunk's old factor out).
    ``weights``: the chunk's rows' sample weights, the factor holding w_i copies of row i's site (power EP)."""
    if weights is not None:
        site_precision, site_shift = weights * site_precision, weights * site_shift
    if total is not None:
        engine.others = total.combine(1.0, engine.state["factor"], -1.0)
    s = engine.state
    xp, like = array_namespace(s["Z"]), s["Z"]
    X_rows = asarray_like(X_chunk, xp, device=array_device(like), dtype=like.dtype)
    y_rows = asarray_like(y_chunk, xp, device=array_device(like), dtype=like.dtype)
    s["factor"], s["anchor"] = engine.passes.exact_factor(s["kernel"], s["Z"], X_rows, site_precision, site_shift,
                                                          jitter=engine.jitter, block_rows=engine.block_rows, y=y_rows,
                                                          want_anchor=True)
    engine.needs_rebuild = False


class DataParallel:
    """Data-parallel stochastic training of rows that stay on the workers (module docstring): ``round_engine``
    builds the engine ``training.train`` drives, ``train(RowsOnWorkers(X.shape, dtype), ..., dp.round_engine(...),
    TrainSettings(batch_size=dp.rows_per_round, ...))``.

    ``client``: a ``distributed.Client``, with ``X`` (rows chunked, one column chunk) and ``y`` (labels as the
    engine takes them, chunked alike) dask arrays on its cluster; or a ``workers.LocalWorkers`` pool, with ``X``
    and ``y`` ``workers.SharedRows`` that its processes map. The rounds are the same code on both.

    ``batch_size``: rows of a minibatch step. ``local_steps``: an int, the steps every shard takes per round
    (rounds reproducible: the same seed, the same model, also when a worker is lost); None (default): shards take
    ``DEFAULT_LOCAL_STEPS`` a round on average, shared out in proportion to the speed each shard's worker showed
    in the rounds before (``balanced_steps``), so that a round does not wait for a worker whose core is busy with
    other work. ``n_shards``: default one per worker (X persisted on the cluster: ``shards_of_holders``, each
    worker's share of the chunks, those it holds first; else chunk c in shard c mod the number of workers).
    ``seed``: keys the chunks' random streams. ``site_directory`` (EP): where the chunks' sites are kept, a file a
    chunk, reachable by the driver and every worker (default: a temporary directory on this machine: enough for a LocalCluster); ``close()`` removes them.
    """

    def __init__(self, client, X, y, *, batch_size, local_steps=None, n_shards=None, seed=0, site_directory=None,
                 weights=None):
        if local_steps is not None and int(local_steps) < 1:
            raise ValueError(f"local_steps must be None or a positive integer for rounds on local worker processes "
                             f"(n_jobs), got {local_steps!r}; local_steps=0 (the steps on the driver) is for a dask "
                             "array's chunks")
        self.client = client
        self.X, self.y = X, y
        self.batch_size = int(batch_size)
        self.balanced = local_steps is None
        self.local_steps = DEFAULT_LOCAL_STEPS if local_steps is None else int(local_steps)
        self.seed = int(seed)
        bounds = row_chunk_bounds(X)
        self.chunk_rows = [hi - lo for lo, hi in bounds]
        workers = sorted(client.nthreads())  # (asks the scheduler: scheduler_info() may be a stale copy)
        holders = _chunk_holders(client, X, len(bounds)) if n_shards is None and is_dask_array(X) else None
        if holders is not None:  # X persisted: a shard per worker, of the chunks it holds as far as they are its share
            self.shards, self.shard_workers = shards_of_holders(holders, workers)
        else:  # X read where it lives (zarr, a shared file, ...): a shard's chunks read by the worker it is pinned to
            self.shards = shard_chunks(len(bounds), n_shards or max(1, len(workers)))
            self.shard_workers = [workers[k % len(workers)] if workers else None for k in range(len(self.shards))]
        self.speeds = [None] * len(self.shards)  # steps a second each shard's tasks made (balanced rounds)
        # X and y persisted on the cluster: a task takes their chunks' futures as they are (no task to read them)
        self.weights = weights
        blocks = (persisted_blocks(X), persisted_blocks(y)) if is_dask_array(X) else (None, None)
        if weights is not None:
            blocks += (persisted_blocks(weights) if is_dask_array(X) else None,)
        self.persisted = None if None in blocks else list(zip(*blocks))
        # each chunk's rows' total weight, which its tied factor stands for (None: the fit has no weights)
        self.chunk_weights = None if weights is None else _chunk_weights(client, weights, len(bounds))
        self.site_directory = site_directory
        self.site_root = None
        # per round: seconds on the driver, bytes sent and received, steps per shard, the tasks' seconds, their
        # CPU seconds (the task's own thread) and minor page faults
        self.rounds = []

    @property
    def rows_per_round(self):
        return len(self.shards) * self.local_steps * self.batch_size

    def steps_per_shard(self, total):
        """The steps of each shard in a round of ``total`` steps: equal (``local_steps`` given), else
        ``balanced_steps`` by the shards' measured speeds."""
        if not self.balanced or None in self.speeds:
            share, extra = divmod(total, len(self.shards))
            return [share + (k < extra) for k in range(len(self.shards))]
        return balanced_steps(total, self.speeds)

    def measure(self, steps, results):
        """Fold the round's tasks (their steps and the seconds of the steps themselves) into the shards' speeds (an
        average that halves the weight of older rounds each round: a worker's share of a busy machine changes within
        seconds). A task's set-up is left out: it costs a shard given few steps as much as one given many, and
        counted in it would make the first look slower, and so be given fewer still."""
        for k, (taken, result) in enumerate(zip(steps, results)):
            speed = taken / max(result["step_seconds"], 1e-9)
            self.speeds[k] = speed if self.speeds[k] is None else 0.5 * (self.speeds[k] + speed)

    def chunk_data(self, chunk, worker):
        """(X, y) of one chunk as the task takes them: futures of the chunk read on ``worker`` (or another if it is
        gone), the chunk's own futures for rows persisted on the cluster, or for shared rows the blocks the worker
        maps itself."""
        arrays = [self.X, self.y] + ([] if self.weights is None else [self.weights])  # (the rows' weights too)
        if not is_dask_array(self.X):
            return tuple(a.block(chunk) for a in arrays)
        if self.persisted is not None:
            return self.persisted[chunk]
        return tuple(self.client.compute([a.blocks[chunk] for a in arrays], workers=None if worker is None else [worker],
                                         allow_other_workers=True))

    def close(self):
        """Remove EP's site files."""
        if self.site_root is not None:
            shutil.rmtree(self.site_root, ignore_errors=True)

    def __call__(self, method, kernel, Z, *, n_total, minibatch=True, **options):
        """``round_engine`` of the built-in engine of ``method``, its options by name (as ``engines.make_engine``)."""
        if method not in ENGINES:
            raise ValueError(f"unknown method {method!r}")
        return self.round_engine(ENGINES[method], method, kernel, Z, n_total=n_total, options=EngineOptions(**options))

    def round_engine(self, factory, method, kernel, Z, *, n_total, options):
        """The engine ``training.train`` drives, whose step is a round of the shards' minibatch steps of the
        engine ``factory(method, kernel, Z, n_total=, minibatch=True, options=)``."""
        # (the classes as ``round_refusal`` reads them: more than two for a model of one latent GP a class)
        refused = refusal(factory, method, 3 if kernel.n_latent > 1 else 2)
        if refused is not None:
            remedy = ("on minibatches of a dask array pass local_steps=0 (steps on the driver), or train in batch "
                      "passes" if is_dask_array(self.X) else f"train {method!r} with n_jobs=1")
            raise ValueError(f"{refused}: {remedy}")
        # an engine with per-row sites holds those of the minibatch it steps, not n of them (an empty start)
        return _RoundEngine(self, factory, method, kernel, Z, n_total=n_total, options=replace(options, site_rows=0))

    def make_site_root(self):
        """A directory of this fit's own for the chunks' site files (per-row sites), under ``site_directory``. A
        second training on these rounds (the second stage of ``size_rule.choose_inducing``) removes the first's:
        a stage that has ended needs no sites, and ``close`` removes only the last directory."""
        if self.site_root is not None:
            shutil.rmtree(self.site_root, ignore_errors=True)
        directory = self.site_directory if self.site_directory is not None else tempfile.gettempdir()
        os.makedirs(directory, exist_ok=True)
        self.site_root = tempfile.mkdtemp(prefix="agpc-dp-sites-", dir=os.fspath(directory))


class _RoundEngine(forwarding("template", "damping", "names", "optimizer", "has_params", "block_rows", "n_total",
                              "has_damping", "xp", "shared_lengthscales", "likelihood", "objective",
                              "nominal_damping", "requested_jitter", settable=("state", "jitter")),
                     Engine):
    """The engine contract (``engines.Engine``) with a round as its step; the global state lives in a driver-side
    engine of the method (``template``: the same class the shards step), which also gives q, validation
    scores and the guard's revert-and-halve; what the loop reads of its state and settings is the template's."""

    minibatch = True

    def __init__(self, plan, factory, method, kernel, Z, *, n_total, options):
        self.plan = plan
        self.factory = factory
        self.method = self.name = method
        self.options = options
        self.template = factory(method, kernel, Z, n_total=n_total, minibatch=True, options=options)
        # The template's state by role, but no per-row sites (EP's stay with their chunks; the loop has nothing to
        # rebuild), and the rounds' own record in a checkpoint beside the template's (``restore_checkpoint`` checks it)
        self.layout = replace(self.template.layout, per_row=(), extras=("data_parallel",) + self.template.layout.extras)
        self.tied = self.template.layout.tied_factor is not None
        per_row = self.template.per_row_sites
        if per_row:
            plan.make_site_root()
        n_chunks = len(plan.chunk_rows)
        passes = self.template.passes if self.tied else None
        self.factors = {c: passes.uniform_factor(Z) for c in range(n_chunks)} if self.tied else {}
        # EP: each chunk's anchor (``_Shard.anchors``), travelling with its factor
        self.anchors = {c: None for c in range(n_chunks)} if per_row else {}
        self.visits = {c: 0 for c in range(n_chunks)}
        self.cursors = [_Cursor() for _ in plan.shards]
        self.generation = 0
        # EP: each chunk's site file, written by the worker that stepped it last (None: zero sites, no file yet)
        self.site_files = {c: None for c in range(n_chunks)} if per_row else {}
        self.loaded = {}  # chunk -> (futures of X, y) on the worker of the shard stepping it
        self._checkpoint_directory = None  # EP: where the last checkpoint's site files went


    # -- a round ---------------------------------------------------------------------------------------
    def evaluate(self, X, y, lo, hi, *, stepping, weights=None):
        """Run one round (nothing committed): ceil(rows / (shards x batch)) steps a shard on average, at most
        ``local_steps`` (``DataParallel.steps_per_shard`` shares them out). Returns the mean of the steps' log Z
        estimates and the combined state."""
        if weights is not None:
            raise ValueError("data-parallel rounds lay their own minibatches: no row weights")
        plan, client = self.plan, self.plan.client
        steps = max(1, min(plan.local_steps, math.ceil((hi - lo) / (len(plan.shards) * plan.batch_size))))
        allotted = plan.steps_per_shard(steps * len(plan.shards))
        s = self.template.state
        spec = {"factory": self.factory, "method": self.method, "options": self.options, "kernel": s["kernel"],
                "Z": s["Z"],
                "n_total": self.template.n_total, "seed": plan.seed, "batch_size": plan.batch_size,
                "optimizer": self.template.optimizer.snapshot() if self.template.optimizer is not None else None,
                "damping": self.template.damping, "total": s.get("factor"),
                "state": {k: s[k] for k in ("whitened_mean", "whitened_chol") if k in s},
                "site_directory": plan.site_root, "generation": self.generation + 1,
                "chunk_weights": plan.chunk_weights}
        plans, futures, needed, sent = [], [], {}, 0
        started = time.perf_counter()
        for k, chunks in enumerate(plan.shards):
            segments, cursor, visits = _plan(self.cursors[k], k, chunks, self.visits, plan.seed, plan.chunk_rows,
                                             plan.batch_size, allotted[k])
            plans.append((cursor, visits, segments))
            used = sorted({c for c, *_ in segments})
            for c in used:
                needed[c] = self.loaded.get(c) or plan.chunk_data(c, plan.shard_workers[k])
            shard_spec = dict(spec, factors={c: self.factors[c] for c in used} if self.tied else {},
                              anchors={c: self.anchors[c] for c in used} if self.anchors else {},
                              site_files={c: self.site_files[c] for c in used} if self.site_files else {})
            sent += _nbytes(shard_spec)
            futures.append(client.submit(step_shard, shard_spec, segments, {c: needed[c] for c in used},
                                         workers=None if plan.shard_workers[k] is None else [plan.shard_workers[k]],
                                         allow_other_workers=True, pure=False))
        self.loaded = needed  # the chunks no shard steps now are released (their futures dropped)
        results = client.gather(futures)
        received = sum(_nbytes(r) for r in results)
        rows = [_segment_rows(segments, plan.chunk_rows, plan.batch_size) for _, _, segments in plans]
        combined = self._combine(results, rows)
        combined["plans"] = plans
        plan.measure(allotted, results)
        plan.rounds.append({"seconds": time.perf_counter() - started, "bytes_sent": sent,
                            "bytes_received": received, "steps": allotted,
                            "task_seconds": [r["seconds"] for r in results],
                            "task_cpu_seconds": [r["cpu_seconds"] for r in results],
                            "page_faults": [r["page_faults"] for r in results]})
        values = [v for r in results for v in r["log_z"]]
        # (no step taken by any shard: the round's start is no model, which the driver's guard goes back from)
        return (sum(values) / len(values) if values else math.nan), combined

    def _combine(self, results, rows):
        """The shards' end states combined: parameters and the optimiser's state averaged with weights the rows
        each shard stepped in the round (every minibatch of the round counts alike); each chunk's new factor, and
        their sum."""
        weights = [r / sum(rows) for r in rows]
        template = self.template
        names = [k for k in template.names if k not in ("Z", "whitened_mean", "whitened_chol")]
        kernel = results[0]["kernel"]
        params = dict(kernel.params)
        params.update(weighted_average([{k: r["kernel"].params[k] for k in names} for r in results], weights))
        out = {"kernel": kernel.with_params(params),
               "Z": weighted_average([r["Z"] for r in results], weights) if "Z" in template.names else results[0]["Z"],
               "state": weighted_average([r["state"] for r in results], weights),
               "optimizer": weighted_average([r["optimizer"] for r in results], weights),
               "damping": weighted_average([r["damping"] for r in results], weights),
               "n_invalid": sum(r["n_invalid"] for r in results),
               "guard": dict(sum((Counter(r["guard"]) for r in results), Counter()))}
        if self.tied:
            factors = dict(self.factors)
            for r in results:
                factors.update(r["factors"])
            out["factors"] = factors
            out["total"] = _sum_factors(factors.values())
        out["site_files"] = dict(self.site_files)
        out["anchors"] = dict(self.anchors)
        for r in results:
            out["site_files"].update(r["site_files"])
            out["anchors"].update(r["anchors"])
        return out

    def apply(self, work, lo, hi, *, stepping, scalars=None):
        template = self.template
        template.state["kernel"], template.state["Z"] = work["kernel"], work["Z"]
        template.state.update(work["state"])
        if template.optimizer is not None:
            template.optimizer.restore(work["optimizer"])
        template.damping = work["damping"]
        if self.tied:
            self.factors = work["factors"]
            template.state["factor"] = work["total"]
        self.anchors = work["anchors"]
        for k, (cursor, visits, segments) in enumerate(work["plans"]):
            self.cursors[k] = cursor
            self.visits.update({c: visits[c] for c in self.plan.shards[k]})
        if self.site_files:
            self.generation += 1
            old = self.site_files
            self.site_files = work["site_files"]
            for c, path in old.items():
                if path is not None and path != self.site_files[c]:
                    os.remove(path)
        return Outcome(change=None, stepped=stepping, record=True, n_invalid=int(work["n_invalid"]),
                       guard=work["guard"] or None)

    def sample_weight_refusal(self):
        """The rounds weight the rows when ``DataParallel`` was given their weights and the method's engine weights
        them (its shards' engines are given each minibatch's weights)."""
        if self.plan.weights is None:
            return "data-parallel rounds given no row weights cannot weight rows"
        return self.template.sample_weight_refusal()

    def take_sample_weight(self, weights):
        """The rows' weights are the plan's (beside the rows, on the workers): SEP / ADF's factors stand for the rows
        counted by them (n_total their sum, each chunk's factor its rows'), as in one process."""
        super().take_sample_weight(weights)
        if weights is not None and self.tied and not self.template.per_row_sites:
            self.template.n_total = float(sum(self.plan.chunk_weights))

    # -- the guard, early stopping, q --------------------------------------------------------------------
    def snapshot(self):
        return {"template": self.template.snapshot(), "factors": dict(self.factors), "visits": dict(self.visits),
                "anchors": dict(self.anchors), "cursors": [_Cursor(c.epoch, list(c.order), c.position)
                                                           for c in self.cursors]}

    def restore(self, snap):
        if self.site_files:
            raise FloatingPointError("data-parallel EP cannot go back a round: its sites were already replaced")
        self.template.restore(snap["template"])
        self.factors, self.visits = dict(snap["factors"]), dict(snap["visits"])
        self.anchors = dict(snap["anchors"])
        self.cursors = list(snap["cursors"])

    def shrink(self):
        return self.template.shrink()

    def grow(self):
        return self.template.grow()

    def keep(self):
        return {"state": self.template.keep(), "factors": dict(self.factors), "anchors": dict(self.anchors)}

    def put_back(self, kept):
        self.template.put_back(kept["state"])
        self.factors = dict(kept["factors"])
        self.anchors = dict(kept["anchors"])

    def kernel_of(self, kept):
        return self.template.kernel_of(kept["state"])

    def checkpoint_kept(self, kept, path, step):
        """None: a checkpoint holds one record of the rounds (the chunks' factors, anchors and EP's site files)."""
        return None

    def posterior(self, X, y, want_log_z=True):
        post, _ = self.template.posterior(None, None, want_log_z=False)
        return post, None

    def validation_scores(self, post, X_val, y_val):
        return self.template.validation_scores(post, X_val, y_val)

    # -- checkpoints ------------------------------------------------------------------------------------
    def checkpoint_state(self, path, step):
        """The driver's engine's state (parameters, optimiser, q's factor or SVI's q(u)) and the rounds' own
        record: the shards, each chunk's factor and visit count, each shard's cursor, and EP's site files,
        copied beside the checkpoint into ``<path>.sites/step-<step>/`` (the driver reaches the site
        directory: it removes the files there too)."""
        saved = self.template.checkpoint_state(path, step)
        n_chunks = len(self.plan.chunk_rows)
        files = []
        self._checkpoint_directory = None
        if self.site_files:
            self._checkpoint_directory = directory = checkpoints.site_step_directory(path, step)
            for c in range(n_chunks):
                files.append(None if self.site_files[c] is None else os.path.join(directory, f"chunk-{c}.npz"))
                if files[-1] is not None:
                    shutil.copyfile(self.site_files[c], files[-1])
        saved["data_parallel"] = {
            "shards": [list(chunks) for chunks in self.plan.shards],
            "factors": [factor_arrays(self.factors[c]) for c in range(n_chunks)] if self.tied else [],
            "visits": [int(self.visits[c]) for c in range(n_chunks)],
            "cursors": [[int(c.epoch), [int(k) for k in c.order], int(c.position)] for c in self.cursors],
            "site_files": files,
            "anchors": [anchor_arrays(self.anchors[c]) for c in range(n_chunks)] if self.anchors else [],
        }
        return saved

    def checkpoint_written(self, saved):
        """After the file is written: the site files of earlier checkpoints can go."""
        if self._checkpoint_directory is not None:
            checkpoints.release_older_steps(self._checkpoint_directory)

    def restore_checkpoint(self, saved, path):
        """The state ``checkpoint_state`` wrote, its rounds' record checked field by field first (a file does
        not choose what is read: EP's site files must be the checkpoint's own, beside it)."""
        record = self._checked_record(saved.get("data_parallel"), path)
        self.template.restore_checkpoint({k: v for k, v in saved.items() if k != "data_parallel"}, path)
        if self.tied:
            self.factors = {c: factor_from_arrays(f) for c, f in enumerate(record["factors"])}
        self.visits = dict(enumerate(record["visits"]))
        if self.anchors:  # (a checkpoint from before anchors has none: a chunk's rows left in its visit then leave
            # its product along their current directions, as they did then, until its next visit's rebuild)
            saved_anchors = record.get("anchors") or [None] * len(self.anchors)
            self.anchors = {c: anchor_from_arrays(a, self.template.state["kernel"]) for c, a in enumerate(saved_anchors)}
        self.cursors = [_Cursor(epoch, list(order), position) for epoch, order, position in record["cursors"]]
        self.loaded = {}
        if self.site_files:  # copies of their own: the checkpoint's files stay what a later resume reads
            self.generation = 0
            for c, name in enumerate(record["site_files"]):
                self.site_files[c] = None if name is None else _site_path(self.plan.site_root, c, 0)
                if name is not None:
                    shutil.copyfile(name, self.site_files[c])

    def _checked_record(self, record, path):
        plan = self.plan
        n_chunks = len(plan.chunk_rows)

        def refuse(why):
            return ValueError(f"{path} is not a valid agpc checkpoint: engine.data_parallel.{why}")

        def is_count(v):
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0

        fields = {"shards", "factors", "visits", "cursors", "site_files"}
        if not isinstance(record, dict) or set(record) - {"anchors"} != fields:
            raise refuse(f"not the record of data-parallel rounds ({', '.join(sorted(fields))})")
        shards = [list(chunks) for chunks in plan.shards]
        if record["shards"] != shards:
            raise ValueError(f"checkpoint {path} was written by a data-parallel fit with the shards (chunks per "
                             f"worker) {record['shards']}; this fit has {shards}: resume with as many workers and "
                             "the same chunking")
        visits = record["visits"]
        if not (isinstance(visits, list) and len(visits) == n_chunks and all(is_count(v) for v in visits)):
            raise refuse(f"visits: not {n_chunks} counts")
        cursors = record["cursors"]
        if not (isinstance(cursors, list) and len(cursors) == len(shards)):
            raise refuse(f"cursors: not {len(shards)} cursors")
        for k, cursor in enumerate(cursors):
            if not (isinstance(cursor, list) and len(cursor) == 3 and is_count(cursor[0]) and is_count(cursor[2])
                    and isinstance(cursor[1], list) and all(is_count(c) and c in shards[k] for c in cursor[1])
                    and len(set(cursor[1])) == len(cursor[1])
                    and cursor[2] < (math.ceil(plan.chunk_rows[cursor[1][0]] / plan.batch_size) if cursor[1] else 1)):
                raise refuse(f"cursors[{k}]: not [epoch, chunks of shard {k} left to visit, minibatch within the first]")
        Z = self.template.state["Z"]
        factors = record["factors"]
        if not isinstance(factors, list) or len(factors) != (n_chunks if self.tied else 0):
            raise refuse(f"factors: not one factor per chunk ({n_chunks})" if self.tied else "factors: not empty")
        for c, factor in enumerate(factors):
            if factor is None:
                raise refuse(f"factors[{c}]: missing")
            check_saved_factor(factor, Z, f"engine.data_parallel.factors[{c}]",
                               lambda why: ValueError(f"{path} is not a valid agpc checkpoint: {why}"))
        anchors = record.get("anchors", [])
        if not isinstance(anchors, list) or len(anchors) not in ((0, n_chunks) if self.anchors else (0,)):
            raise refuse(f"anchors: not one anchor (or none) per chunk ({n_chunks})" if self.anchors else
                         "anchors: not empty")
        for c, anchor in enumerate(anchors):
            check_saved_anchor(anchor, self.template.state["kernel"], Z, f"engine.data_parallel.anchors[{c}]",
                               lambda why: ValueError(f"{path} is not a valid agpc checkpoint: {why}"))
        files = record["site_files"]
        if not isinstance(files, list) or len(files) != (n_chunks if self.site_files else 0):
            raise refuse("site_files: not one entry per chunk" if self.site_files else "site_files: not empty")
        root = os.path.abspath(os.fspath(path)) + ".sites"
        for c, name in enumerate(files):
            if name is not None and not (
                isinstance(name, str) and os.path.basename(name) == f"chunk-{c}.npz"
                and re.fullmatch(r"step-\d+", os.path.basename(os.path.dirname(name)))
                and os.path.dirname(os.path.dirname(name)) == root
            ):
                raise refuse(f"site_files[{c}]: {name!r} is not a site file of this checkpoint (in {root})")
        return record


def _chunk_weights(client, weights, n_chunks):
    """Each chunk's total weight (floats on the driver), summed where the chunks are."""
    if is_dask_array(weights):
        return [float(v) for v in client.compute([weights.blocks[c].sum() for c in range(n_chunks)], sync=True)]
    return client.gather([client.submit(_total, weights.block(c)) for c in range(n_chunks)])


def _total(values):
    """The sum of a chunk's values, a float (a task: the chunk is mapped where it runs)."""
    return float(array_namespace(values).sum(values))


def _sum_factors(factors):
    factors = list(factors)
    total = factors[0]
    for f in factors[1:]:
        total = total.combine(1.0, f, 1.0)
    return total


def _nbytes(tree):
    """Bytes of the arrays in a round's message (factors, parameters, optimiser state: what travels; the
    pickled envelope around them is small beside them)."""
    if isinstance(tree, dict):
        return sum(_nbytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_nbytes(v) for v in tree)
    if isinstance(tree, Factor):
        return _nbytes((tree.precision, tree.shift))
    if isinstance(tree, multiclass_ep.MultiFactor):
        return _nbytes(tree.factors)
    if hasattr(tree, "params") and isinstance(tree.params, dict):  # a kernel
        return _nbytes(tree.params)
    return int(getattr(tree, "nbytes", 8))
