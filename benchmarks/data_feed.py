"""How fast a Spark DataFrame reaches two training ranks, side by side on one warm local[2] session.

One DataFrame of ``--rows`` rows (a 784-float ``features`` array and a ``label``), cached in Spark
memory first, so every candidate starts from the same place. Each candidate goes until every rank
has iterated its whole share once, in batches of 256:
  ours              HorovodRunner(np=2).run(fn, train=df): each rank's Shard, ``to_torch``
  ours_ddp          the same on the torch engine (HorovodRunner(np=2, engine="torch"), Gloo DDP)
  torchdistributor  TorchDistributor(num_processes=2)._train_on_dataframe(fn, df.repartition(2)),
                    each rank reading ``_get_spark_partition_data_loader`` (pyspark's own path)
  topandas          what users do today: ``df.toPandas()`` on the driver, the arrays shipped to
                    HorovodRunner(np=2) through cloudpickle, each rank slicing its half
  spark_arrow       the limit: ``df.repartition(2).mapInArrow(count rows)``: Spark alone handing
                    the same rows to Python as Arrow
Rows per second are over each call's wall time (launch included) for the first pass; each
candidate then goes through its share a second time, as a later epoch does, and that speed on
rank 0 is printed too. Also printed: the time from the call to the first batch on rank 0, and the
driver's peak RSS growth during the call. Every candidate runs once to warm up first.

Usage: .venv/bin/python benchmarks/data_feed.py [--rows 200000] [--runs 3] [--only a,b]
With ours and spark_arrow: a line data_feed_first_pass ours=<rows/s> spark_arrow=<rows/s>
ratio_vs_limit=<x> first_batch_s=<s> driver_peak_rss_mib=<MiB> (ours).
With ours_ddp and torchdistributor: a line data_feed_ddp ours_ddp=<rows/s>
ratio_vs_torchdistributor=<x> later_epoch_ratio_vs_torchdistributor=<x>
Last line: data_feed ours=<rows/s> torchdistributor=<rows/s> topandas=<rows/s> spark_arrow=<rows/s>
ratio_vs_torchdistributor=<x> ratio_vs_limit=<x> later_epoch_ratio_vs_torchdistributor=<x>
(ratios: medians of per-run ratios, with their min and max)
"""
from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import threading
import time

import psutil

from pairs import PhaseTimer, in_turn, local_session, pair_ratios, ratio_text  # benchmarks/pairs.py

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
FEATURES = 784
BATCH = 256


def _two_epochs(batches_of_epoch, rank_rows, allreduce):
    """Go through two epochs; return rank 0's first-batch time, epoch-2 speed and all rows."""
    import time

    first = None
    rows = 0
    for batch_size in batches_of_epoch():
        first = first or time.time()
        rows += batch_size
    began = time.perf_counter()
    second = sum(batches_of_epoch())
    epoch2 = second / (time.perf_counter() - began)
    return {"first": first, "rows": allreduce(rows), "epoch2_rows_per_s": epoch2,
            "rank_rows": rank_rows}


def iterate_shard(train):
    """Ours: every batch of this rank's shard, as torch tensors, two epochs."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    loader = train.to_torch("features", "label", batch_size=BATCH, remainder="drop")
    return _two_epochs(lambda: (len(y) for _, y in loader), len(train),
                       lambda n: int(hvd.allreduce(torch.tensor([n]), op=hvd.Sum).item()))


def iterate_shard_ddp(train):
    """Ours on the torch engine: the same shard and loader under torch.distributed."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")

    def allreduce(n):
        total = torch.tensor([n])
        dist.all_reduce(total)
        return int(total.item())

    loader = train.to_torch("features", "label", batch_size=BATCH, remainder="drop")
    return _two_epochs(lambda: (len(y) for _, y in loader), len(train), allreduce)


def iterate_arrays(x, y):
    """toPandas: the arrays came in the job's pickle; each rank takes its half, two epochs."""
    import horovod.torch as hvd
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    hvd.init()
    mine = slice(hvd.rank(), None, hvd.size())
    loader = DataLoader(TensorDataset(torch.from_numpy(x[mine]), torch.from_numpy(y[mine])),
                        batch_size=BATCH)
    return _two_epochs(lambda: (len(labels) for _, labels in loader), len(x[mine]),
                       lambda n: int(hvd.allreduce(torch.tensor([n]), op=hvd.Sum).item()))


def iterate_partition(rows_per_rank):
    """TorchDistributor: pyspark's loader over this task's partition, two epochs (the loader
    wraps around after ``num_samples``; each epoch reads the partition's file again)."""
    import torch
    import torch.distributed as dist
    from pyspark.ml.torch.distributor import _get_spark_partition_data_loader

    dist.init_process_group("gloo")
    loader = _get_spark_partition_data_loader(rows_per_rank, BATCH, num_workers=0)

    def allreduce(n):
        total = torch.tensor([n])
        dist.all_reduce(total)
        return int(total.item())

    result = _two_epochs(lambda: (len(batch[1]) for batch in loader), rows_per_rank, allreduce)
    dist.destroy_process_group()
    return result


def later_epochs(train, init_horovod: bool = False, with_tf: bool = True):
    """On each rank, after the shard is open: one epoch of each way to read it against the
    machine's limit, a plain numpy copy of the same mapped columns (rows/s each, rank 0's);
    ``init_horovod``: with Horovod initialised, as a Horovod training loop reads."""
    import time

    import numpy as np

    if init_horovod:
        import horovod.torch as hvd

        hvd.init()

    def rate(epoch) -> float:
        """Rows/s of the second of two epochs (the first touches the mapped pages, imports the
        framework and builds its pipeline)."""
        epoch()
        began = time.perf_counter()
        rows = epoch()
        return rows / (time.perf_counter() - began)

    import pyarrow as pa

    # the limit: the shard's mapped columns copied batch by batch into arrays allocated once
    # (a loader's batches reuse freed memory too; a fresh 1.5 GB array each time would time the
    # kernel's page faults, not the copy)
    reader = pa.ipc.open_file(pa.memory_map(train.path, "r"))
    batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    pieces = [(b.column("features").flatten().to_numpy().reshape(b.num_rows, -1),
               b.column("label").to_numpy()) for b in batches]
    x = np.empty((len(train), pieces[0][0].shape[1]), np.float32)
    y = np.empty(len(train), pieces[0][1].dtype)

    def copy() -> int:
        at = 0
        for features, labels in pieces:
            np.copyto(x[at:at + len(labels)], features)
            np.copyto(y[at:at + len(labels)], labels)
            at += len(labels)
        return at

    loader = train.to_torch("features", "label", batch_size=BATCH, shuffle=True, seed=1,
                            remainder="drop")
    speeds = {"copy": rate(copy),
              "batches": rate(lambda: sum(len(b["label"]) for b in
                                          train.batches(BATCH, shuffle=True, seed=1,
                                                        remainder="drop"))),
              "to_torch": rate(lambda: sum(len(labels) for _, labels in loader))}
    if with_tf:
        dataset = train.to_tf_dataset("features", "label", batch_size=BATCH, shuffle=True,
                                      seed=1, remainder="drop")
        speeds["to_tf_dataset"] = rate(lambda: sum(int(labels.shape[0])
                                                   for _, labels in dataset))
    return speeds


def count_rows(batches):
    import pyarrow as pa

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


class PeakRss:
    """The driver's (this process's) peak RSS growth while the block runs, sampled every 20 ms."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.peak = 0

    def __enter__(self) -> "PeakRss":
        self.base = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.proc.memory_info().rss - self.base)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss - self.base)


def make_frame(spark, rows: int):
    from pyspark.sql import functions as F

    features = F.transform(F.sequence(F.lit(0), F.lit(FEATURES - 1)),
                           lambda i: ((F.col("id") * 7919 + i * 104729) % 1000).cast("float")
                           / F.lit(1000.0))
    df = (spark.range(0, rows, 1, 8)
          .select(features.cast("array<float>").alias("features"),
                  (F.col("id") % 10).cast("long").alias("label"))
          .cache())
    df.count()
    return df


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated candidates (default: all)")
    parser.add_argument("--later-epochs", action="store_true",
                        help="also: a later epoch of batches, to_torch and to_tf_dataset on one "
                             "rank against a numpy copy of the same columns")
    args = parser.parse_args()

    from pyspark.ml.torch.distributor import TorchDistributor

    from hvd_magics import HorovodRunner

    spark = local_session("data_feed", driver_memory="8g")
    df = make_frame(spark, args.rows)
    half = args.rows // 2

    phases: list[dict[str, float]] = []

    def ours():
        from hvd_magics.launch.payload import serialize_job

        timer = PhaseTimer()
        record = HorovodRunner(np=2).run_payload(
            serialize_job(iterate_shard, {"train": df}), views=[timer],
            source=inspect.getsource(iterate_shard))
        phases.append({**timer.marks, "write_s": max(s["write_s"] for s in record.shards),
                       "wait_s": max(s["wait_s"] for s in record.shards)})
        return record.value

    def ours_ddp():
        return HorovodRunner(np=2, engine="torch").run(iterate_shard_ddp, train=df)

    def torchdistributor():
        distributor = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
        return distributor._train_on_dataframe(iterate_partition, df.repartition(2), half)

    def topandas():
        import numpy as np

        frame = df.toPandas()
        x = np.stack(frame["features"].to_numpy()).astype(np.float32)
        y = frame["label"].to_numpy()
        del frame
        return HorovodRunner(np=2).run(iterate_arrays, x=x, y=y)

    def spark_arrow():
        rows = df.repartition(2).mapInArrow(count_rows, "rows long").collect()
        return {"first": None, "rows": sum(r.rows for r in rows), "epoch2_rows_per_s": None}

    candidates = {"ours": ours, "torchdistributor": torchdistributor, "topandas": topandas,
                  "spark_arrow": spark_arrow, "ours_ddp": ours_ddp}
    if args.only:
        candidates = {n: candidates[n] for n in args.only.split(",")}
    speed: dict[str, list[float]] = {name: [] for name in candidates}
    first: dict[str, list[float]] = {name: [] for name in candidates}
    rss: dict[str, list[float]] = {name: [] for name in candidates}
    epoch2: dict[str, list[float]] = {name: [] for name in candidates}
    for name, candidate in candidates.items():  # warm up: Python workers, JIT, page cache
        candidate()
    for run in range(args.runs):
        for name in in_turn(run, list(candidates)):
            began = time.time()
            with PeakRss() as peak:
                result = candidates[name]()
            wall = time.time() - began
            rows = result["rows"]  # the first pass, on all ranks
            if name != "torchdistributor":  # pyspark's loader ends at num_samples of its part
                assert rows >= args.rows - 2 * BATCH, (name, rows)
            if result["epoch2_rows_per_s"]:
                epoch2[name].append(result["epoch2_rows_per_s"])
            speed[name].append(rows / wall)
            if result["first"]:
                first[name].append(result["first"] - began)
            rss[name].append(peak.peak / 2**20)
            print(f"run {run} {name:16s} {rows:,} rows in {wall:6.2f} s = "
                  f"{rows / wall:10,.0f} rows/s; first batch after "
                  f"{(result['first'] - began) if result['first'] else float('nan'):5.2f} s; "
                  f"driver RSS +{peak.peak / 2**20:,.0f} MiB; epoch 2 on rank 0 "
                  f"{result['epoch2_rows_per_s'] or float('nan'):,.0f} rows/s", flush=True)
    for name in candidates:
        firsts = f"{statistics.median(first[name]):.2f} s" if first[name] else "-"
        again = f"{statistics.median(epoch2[name]):,.0f} rows/s" if epoch2[name] else "-"
        print(f"{name:16s} median {statistics.median(speed[name]):10,.0f} rows/s, first batch "
              f"{firsts}, driver peak RSS +{max(rss[name]):,.0f} MiB, a later epoch on one "
              f"rank {again}")
    if phases:
        last = phases[-1]
        print("ours, where the time went (driver clock, s from the call; the last run): "
              + ", ".join(f"{kind} {last[kind]:.2f}" for kind in
                          ("sharding", "task_started", "started", "end") if kind in last)
              + f"; the slowest task wrote its shard file in {last['write_s']:.2f} s and "
              f"waited {last['wait_s']:.2f} s for Spark's rows")
    for engine in ("torch", "horovod") if args.later_epochs else ():
        # the ranks only read: Horovod is initialised (its background loop runs) or not
        speeds = HorovodRunner(np=2, engine=engine).run(later_epochs, train=df,
                                                        init_horovod=engine == "horovod")
        copy = speeds["copy"]
        print(f"data_feed_later_epoch engine={engine} " + " ".join(
            f"{name}={value:.0f}" for name, value in speeds.items()) + " " + " ".join(
            f"{name}_vs_copy={value / copy:.3f}" for name, value in speeds.items()
            if name != "copy") + " (rows/s on rank 0; copy: the mapped columns copied into arrays "
            "allocated once)",
            flush=True)
    if "ours_ddp" in candidates and "torchdistributor" in candidates:
        ddp = pair_ratios(speed["ours_ddp"], speed["torchdistributor"])
        ddp_later = pair_ratios(epoch2["ours_ddp"], epoch2["torchdistributor"])
        print(f"data_feed_ddp ours_ddp={statistics.median(speed['ours_ddp']):.0f} "
              f"ratio_vs_torchdistributor={ddp[0]:.2f} ratio_vs_torchdistributor_min={ddp[1]:.2f} "
              f"ratio_vs_torchdistributor_max={ddp[2]:.2f} later_epoch_ratio_vs_torchdistributor="
              f"{ddp_later[0]:.1f}")
    if {"ours", "spark_arrow"} <= set(candidates):
        print(f"data_feed_first_pass ours={statistics.median(speed['ours']):.0f} "
              f"spark_arrow={statistics.median(speed['spark_arrow']):.0f} "
              + ratio_text("ratio_vs_limit", speed["ours"], speed["spark_arrow"])
              + f" first_batch_s={statistics.median(first['ours']):.2f}"
              f" driver_peak_rss_mib={max(rss['ours']):.0f}", flush=True)
    if not {"ours", "torchdistributor", "topandas", "spark_arrow"} <= set(candidates):
        return
    vs_td = pair_ratios(speed["ours"], speed["torchdistributor"])
    vs_limit = pair_ratios(speed["ours"], speed["spark_arrow"])
    epoch2_vs_td = pair_ratios(epoch2["ours"], epoch2["torchdistributor"])
    print("data_feed " + " ".join(f"{n}={statistics.median(v):.0f}" for n, v in speed.items())
          + f" ratio_vs_torchdistributor={vs_td[0]:.2f} ratio_vs_torchdistributor_min="
          f"{vs_td[1]:.2f} ratio_vs_torchdistributor_max={vs_td[2]:.2f} ratio_vs_limit="
          f"{vs_limit[0]:.3f} ratio_vs_limit_min={vs_limit[1]:.3f} "
          f"ratio_vs_limit_max={vs_limit[2]:.3f} later_epoch_ratio_vs_torchdistributor="
          f"{epoch2_vs_td[0]:.1f} later_epoch_ratio_vs_torchdistributor_min={epoch2_vs_td[1]:.1f} "
          f"later_epoch_ratio_vs_torchdistributor_max={epoch2_vs_td[2]:.1f}")
    spark.stop()


if __name__ == "__main__":
    main()
