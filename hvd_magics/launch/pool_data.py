"""DataFrames a cell on a warm pool reads: dealt to the pool's ranks once, kept for later cells
(driver side).

A pool's barrier stage holds its task slots, so its ranks cannot get their rows the way a cold
job's do (as the input of their own stage). Instead an ordinary Spark stage over the same
tagged rows (:func:`hvd_magics.launch.dataframe_input.sharded_input`) runs beside the pool and
streams partition ``p`` to rank ``p``'s task (:mod:`hvd_magics.task.deal_task`,
:mod:`hvd_magics.task.shard_receiver`), which writes it to the rank's disk. The rows never pass
through the driver. That stage needs one free task slot besides the pool's.

What was dealt stays with the pool (:class:`PoolShards`): a later cell reading the same
DataFrame, or one Spark finds to have the same plan (``sameSemantics``), gets the same shard
files at once, but only when its data is provably the one dealt
(:func:`hvd_magics.launch.data_identity.data_identity`: the same files, sizes and times, the same
cache, local rows). Equal plans do not mean equal data (a table with rows inserted since, a path
overwritten): anything not proven the same is dealt again, and the cell says which and why.
"""
from __future__ import annotations

import functools
import json
import pickle
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from hvd_magics.errors import DataRefused, HorovodJobError, JobInterrupted, PayloadError
from hvd_magics.launch.data_identity import DataIdentity, data_identity, describe_change
from hvd_magics.launch.dataframe_input import DataFrameSources, check_columns, sharded_input
from hvd_magics.launch.spark_backend import STATUS_SCHEMA, SparkBackend
from hvd_magics.launch.spark_slots import local_master_slots, task_slots
from hvd_magics.protocol import ENV_SHARDS
from hvd_magics.task.deal_task import DealSpec, arrow_deal_task
from hvd_magics.task.shard_files import empty_shards, null_values


@dataclass
class DealtFrame:
    """One DataFrame whose shards the pool's ranks hold."""

    name: str
    frame: Any
    deal: str
    paths: list[str]
    rows_per_rank: list[int]
    bytes: int = 0
    deal_s: float = 0.0
    #: Null values per column over every rank's shard (a column without any is left out).
    nulls: dict[str, int] = field(default_factory=dict)
    #: What its data was when it was dealt (taken just before).
    identity: DataIdentity = field(default_factory=lambda: DataIdentity(None, "not identified"))

    def shard_entry(self, index: int, rank: int, name: str) -> dict[str, Any]:
        """Rank ``rank``'s ``HVD_MAGICS_SHARDS`` entry for this job's source ``index``."""
        return {"index": index, "name": name, "path": self.paths[rank],
                "rows_per_rank": self.rows_per_rank}


class DealStage(SparkBackend):
    """The ordinary Spark stage that deals one cell's new DataFrames to the pool's ranks (its
    thread, job group or tag, cancel and error text are a cold job's)."""

    def __init__(self, pool_backend: SparkBackend, sources: DataFrameSources,
                 spec: DealSpec) -> None:
        super().__init__(pool_backend.spark, pool_backend.np, {}, sources)
        self.spec = spec

    def _stage(self, spec: Any) -> Any:  # noqa: ARG002 - the deal's own spec
        deal = functools.partial(arrow_deal_task, pickle.dumps(self.spec))
        return sharded_input(self.sources, self.np).mapInArrow(deal, STATUS_SCHEMA)


def free_slot_problem(backend: SparkBackend, held: int) -> str | None:
    """Why no task slot is free beside the pools to deal a DataFrame, or ``None``."""
    total: int | None
    if backend.sc is not None:
        free, total = task_slots(backend.sc)
        master = backend.sc.master
        free = min(free, max(total - held, 0))
    else:  # Spark Connect: only a local master tells its size (busy slots unknown)
        master = backend.spark.conf.get("spark.master", "")
        total = local_master_slots(master, int(backend.spark.conf.get("spark.task.cpus", "1")))
        if total is None:
            return None
        free = total - held
    if free >= 1:
        return None
    return (f"dealing its rows to the warm pool needs one free Spark task slot beside the "
            f"{held} the pools hold, and {master} has {total} in all. Fix: a pool with fewer "
            f"ranks (%hvd_pool stop, then %hvd_pool start np={max(backend.np - 1, 1)}), or Spark "
            "with more cores or executors (local[N+1]), or run the cell cold after "
            "%hvd_pool stop")


class PoolShards:
    """The DataFrames a pool's ranks hold, and the dealing of new ones.

    Parameters
    ----------
    backend : SparkBackend
        The pool's backend (its session, size and channel).
    targets : dict
        ``rank -> (host, port)`` of each rank's shard receiver.
    """

    def __init__(self, backend: SparkBackend, targets: dict[int, tuple[str, int]]) -> None:
        self.backend = backend
        self.targets = targets
        self.kept: list[DealtFrame] = []

    def find(self, frame: Any, identity: DataIdentity) -> tuple[DealtFrame | None, bool]:
        """The kept shards of ``frame`` or of a DataFrame with the same plan, and whether their
        data is provably ``identity``'s (the kept shards of the same data first)."""
        same_plan: list[DealtFrame] = [kept for kept in self.kept if kept.frame is frame]
        for kept in self.kept:
            try:
                if kept.frame is not frame and kept.frame.sameSemantics(frame):
                    same_plan.append(kept)
            except Exception:  # noqa: BLE001,S112 - not comparable (another session, say)
                continue
        for kept in same_plan:
            if identity.proven and kept.identity.key == identity.key:
                return kept, True
        return (same_plan[0] if same_plan else None), False

    def forget(self) -> int:
        """Drop every kept shard (the next cell deals its DataFrames again); how many."""
        dropped = len(self.kept)
        for deal in {kept.deal for kept in self.kept}:
            self.backend.drop_shards(deal)
        self.kept = []
        return dropped

    def rank_env(self, sources: DataFrameSources, held: int) -> tuple[list[dict[str, str]],
                                                                      list[str]]:
        """``HVD_MAGICS_SHARDS`` of each rank for a cell reading ``sources`` (dealing the ones
        not kept), and what the cell says about it.

        Raises
        ------
        PayloadError
            A DataFrame of another session, a column the shards cannot carry, no free slot, or
            (:class:`DataRefused`) a rank without rows or nulls in a column that must hold none
            (before the cell runs; the pool is kept).
        HorovodJobError
            The dealing stage failed (its error; the pool is kept).
        JobInterrupted
            Interrupted while dealing (the stage was cancelled; the pool is kept).
        """
        size = self.backend.np
        envs: list[list[dict[str, Any]]] = [[] for _ in range(size)]
        notes: list[str] = []
        found: dict[int, DealtFrame] = {}
        new = DataFrameSources({id(source.frame): source.name for source in sources})
        identities: dict[int, DataIdentity] = {}
        again: dict[int, str] = {}
        for source in sources:
            if source.frame.sparkSession is not self.backend.spark:
                raise PayloadError(
                    f"the DataFrame {source.name!r} belongs to another SparkSession than the "
                    "warm pool's. Fix: make it from the pool's session, or restart the pool "
                    "(%hvd_pool restart) so it starts on the active session.")
            identity = data_identity(source.frame)
            kept, same_data = self.find(source.frame, identity)
            if kept is not None and same_data:
                found[source.index] = kept
                notes.append(f"the shards of {source.name!r} dealt earlier were reused "
                             f"({sum(kept.rows_per_rank):,} rows; same plan and data: "
                             f"{identity.why})")
                continue
            if kept is not None:
                again[source.index] = describe_change(kept.identity, identity)
            check_columns(source)
            identities[new.index_of(source.frame)] = identity
        if len(new):
            dealt = self._deal(new, held, identities)
            for source in sources:
                if source.index not in found:
                    found[source.index] = dealt[new.index_of(source.frame)]
                    notes.append(self._dealt_note(found[source.index],
                                                  again.get(source.index)))
        refused = null_values([{"source": s.index, "nulls": found[s.index].nulls}
                               for s in sources], {s.index: s.no_nulls for s in sources})
        if refused:
            raise DataRefused(refused)
        for source in sources:
            for rank in range(size):
                envs[rank].append(found[source.index].shard_entry(source.index, rank,
                                                                  source.name))
        return [{ENV_SHARDS: json.dumps(entries)} for entries in envs], notes

    def _dealt_note(self, dealt: DealtFrame, again: str | None) -> str:
        """What the cell says of a DataFrame it dealt: again and why, or what keeps it."""
        size = self.backend.np
        note = (f"dealt {dealt.name!r}{' again' if again else ''} to the pool's {size} "
                f"{'rank' if size == 1 else 'ranks'}: {sum(dealt.rows_per_rank):,} rows in "
                f"{dealt.deal_s:.1f} s")
        if again:
            return f"{note} ({again})"
        if not dealt.identity.proven:
            return f"{note} (each cell that reads it deals it again: {dealt.identity.why})"
        return note

    def _deal(self, sources: DataFrameSources, held: int,
              identities: dict[int, DataIdentity]) -> dict[int, DealtFrame]:
        problem = free_slot_problem(self.backend, held)
        if problem:
            raise PayloadError(f"the cell reads the DataFrame {sources.sources[0].name!r}, but "
                               f"{problem}.")
        missing = sorted(set(range(self.backend.np)) - set(self.targets))
        if missing:
            raise HorovodJobError(f"the warm pool's ranks {missing} did not say where they "
                                  "receive shards. Fix: %hvd_pool restart")
        spec = DealSpec(uuid.uuid4().hex[:12], self.backend.channel_secret,
                        {s.index: s.name for s in sources},
                        tuple(self.targets[rank] for rank in range(self.backend.np)))
        stage = DealStage(self.backend, sources, spec)
        began = time.monotonic()
        # the cold job's submission, for this stage: with no environment to ship, it reads only
        # the spec's job_id, which a DealSpec has too
        stage._submit(spec)  # type: ignore[arg-type]  # a DealSpec  # noqa: SLF001
        try:
            while not stage.join(0.2) and stage.server_gone is None:
                pass
        except KeyboardInterrupt:
            stage.stop()
            self.backend.drop_shards(spec.job_id)
            raise JobInterrupted("interrupted while dealing the DataFrames to the warm pool; "
                                 "the dealing stage was cancelled and the pool keeps its ranks "
                                 "and their variables.") from None
        try:
            return self._dealt(stage, sources, spec, time.monotonic() - began, identities)
        except BaseException:
            self.backend.drop_shards(spec.job_id)
            raise

    def _dealt(self, stage: DealStage, sources: DataFrameSources, spec: DealSpec,
               took: float, identities: dict[int, DataIdentity]) -> dict[int, DealtFrame]:
        failure = stage.describe_failure()
        if failure:
            raise HorovodJobError(f"Dealing the DataFrames to the warm pool failed: {failure}")
        errors = [line["error"] for line in stage.results if "error" in line]
        if errors:
            raise HorovodJobError(f"Dealing the DataFrames to the warm pool failed: {errors[0]}")
        by_rank = {line["rank"]: {s["source"]: s for s in line["shards"]}
                   for line in stage.results}
        size = self.backend.np
        empty = empty_shards([[by_rank[r][s.index]["rows"] for s in sources]
                              for r in range(size)], {s.index: s.name for s in sources})
        if empty:
            raise DataRefused(empty)
        dealt: dict[int, DealtFrame] = {}
        for source in sources:
            shards = [by_rank[rank][source.index] for rank in range(size)]
            nulls: dict[str, int] = {}
            for shard in shards:
                for column, count in shard.get("nulls", {}).items():
                    nulls[column] = nulls.get(column, 0) + count
            dealt[source.index] = DealtFrame(
                source.name, source.frame, spec.job_id, [s["path"] for s in shards],
                [s["rows"] for s in shards], sum(s["bytes"] for s in shards), took, nulls,
                identities[source.index])
        self._keep(list(dealt.values()))
        return dealt

    def _keep(self, dealt: list[DealtFrame]) -> None:
        """Keep new shards; a DataFrame name dealt again replaces its old shards (deleted when
        no kept DataFrame uses their deal any more)."""
        names = {kept.name for kept in dealt}
        old = [kept for kept in self.kept if kept.name in names]
        self.kept = [kept for kept in self.kept if kept.name not in names] + dealt
        in_use = {kept.deal for kept in self.kept}
        for deal in {kept.deal for kept in old} - in_use:
            self.backend.drop_shards(deal)
