"""Which backend runs a job's ranks: a warm pool's, Spark tasks (elastic or not, reading
DataFrames or not) or the driver's processes."""
from __future__ import annotations

from hvd_magics.errors import PayloadError
from hvd_magics.job.launch_request import LaunchRequest
from hvd_magics.job.session import SESSION
from hvd_magics.launch.backend import Backend
from hvd_magics.launch.dataframe_input import check_columns, common_session
from hvd_magics.launch.driver_backend import DriverBackend
from hvd_magics.launch.spark_backend import SparkBackend
from hvd_magics.launch.spark_session import active_session, start_local_session
from hvd_magics.options import ElasticSize


def make_backend(request: LaunchRequest) -> Backend:
    """Where the job's ranks run: a warm pool's, Spark tasks (elastic or not, reading
    DataFrames or not) or the driver's processes."""
    np, env, sources = request.size, request.rank_env(), request.payload.sources
    if request.pool is not None:
        return request.pool.cell(request.env, sources)
    if isinstance(np, ElasticSize):
        if sources:
            raise PayloadError(
                f"the job reads the DataFrame {sources.sources[0].name!r}, but an elastic job "
                f"(np={np}) cannot reshard a DataFrame when its ranks change. Fix: run it with a "
                f"fixed np={np.max_np}, or have each rank read its part of the data itself (for "
                "PyTorch, Horovod's hvd.elastic.ElasticSampler reshards at every reset).")
        from hvd_magics.launch.elastic_backend import ElasticSparkBackend

        spark = active_session() or start_local_session(np.max_np)
        return ElasticSparkBackend(spark, np, env, request.start_timeout,
                                   request.options.elastic_timeout, request.options.reset_limit,
                                   SESSION.environment)
    if sources:
        if np < 0:
            raise PayloadError(
                f"the job reads the DataFrame {sources.sources[0].name!r}, whose rows reach the "
                "ranks through Spark tasks, but np<0 runs the ranks on the driver without "
                f"Spark. Fix: use np={-np}.")
        for source in sources:
            check_columns(source)
        return SparkBackend(common_session(sources), np, env, sources,
                            slot_wait_s=request.slot_wait_s,
                            held_slots=SESSION.held_slots(request.live),
                            background=request.live is not None,
                            environment=SESSION.environment,
                            ranks_per_task=request.options.ranks_per_task,
                            ignore_ssl=request.ignore_ssl)
    if np < 0:
        return DriverBackend(-np, env)
    spark = active_session() or start_local_session(np)
    return SparkBackend(spark, np, env, slot_wait_s=request.slot_wait_s,
                        held_slots=SESSION.held_slots(request.live),
                        background=request.live is not None,
                        environment=SESSION.environment,
                        ranks_per_task=request.options.ranks_per_task,
                        gone_wait_s=request.start_timeout, ignore_ssl=request.ignore_ssl)
