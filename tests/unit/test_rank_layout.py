"""Several ranks per Spark task, without Spark: the layout a session's settings give, the option's
checks, the GPUs each rank sees, a task's shard split among its ranks, the meeting of its ranks."""
import json

import pytest

from hvd_magics.errors import NotEnoughSlotsError
from hvd_magics.launch.spark_slots import TaskLayout, task_layout
from hvd_magics.options import ElasticSize, validate_ranks_per_task
from hvd_magics.protocol import MEET_OFFER
from hvd_magics.task.gpus import rank_devices, task_share
from hvd_magics.task.shard_files import split_shards, write_shards
from hvd_magics.task.task_meeting import BY_SPARK, TaskMeeting, meet


def _conf(**settings):
    values = {k.replace("_", "."): str(v) for k, v in settings.items()}
    return values.get


def test_the_layout_follows_the_option_then_the_gpus_per_task():
    assert task_layout(_conf(), "spark://m:7077", 4, None) == TaskLayout(4, 1, slots=4)
    gpus = _conf(spark_task_resource_gpu_amount=2, spark_task_cpus=1)
    layout = task_layout(gpus, "spark://m:7077", 4, None)
    assert (layout.tasks, layout.ranks_per_task, layout.task_cpus, layout.task_gpus) == (
        2, 2, 2, 2.0)
    assert layout.describe() == " (2 tasks x 2 ranks)" and layout.slots == 2
    assert task_layout(gpus, "spark://m:7077", 4, 1).ranks_per_task == 1  # the option wins
    # tasks that already hold a CPU per rank need no profile, and take a slot each
    wide = task_layout(_conf(spark_task_cpus=4), "spark://m:7077", 8, 4)
    assert (wide.task_cpus, wide.slots, wide.resource_profile) == (0, 2, None)
    # a local master: the ranks share its cores, a slot counted per rank
    local = task_layout(_conf(), "local[4]", 4, 2)
    assert (local.tasks, local.task_cpus, local.slots) == (2, 0, 4)
    # a fractional GPU amount is not a rank count
    assert task_layout(_conf(spark_task_resource_gpu_amount=0.5), "local[2]", 2,
                       None).ranks_per_task == 1


def test_a_layout_spark_cannot_give_is_refused_with_the_fix():
    with pytest.raises(NotEnoughSlotsError, match=r"np=6 ranks do not fill tasks of 4 ranks each "
                       r"\(the default: spark.task.resource.gpu.amount=4, a rank per GPU\)\. "
                       r"Fix: np=4 or np=8, or ranks_per_task=1"):
        task_layout(_conf(spark_task_resource_gpu_amount=4), "spark://m:7077", 6, None)
    with pytest.raises(NotEnoughSlotsError, match="dynamic allocation on.*spark.task.cpus=2"):
        task_layout(_conf(spark_dynamicAllocation_enabled="true"), "yarn", 4, 2)
    # executors of one core: Spark's raw "The number of cores per executor (=1) has to be >=
    # the number of cpus per task = 2" at submission, said in our words before it
    with pytest.raises(NotEnoughSlotsError, match=r"ranks_per_task=2 needs each Spark task to "
                       r"hold 2 CPUs .* spark.executor.cores=1: no executor can run such a "
                       r"task\. Fix: ranks_per_task=1 \(--ranks-per-task\), or executors of at "
                       r"least 2 cores"):
        task_layout(_conf(spark_executor_cores=1), "spark://m:7077", 4, 2)
    assert task_layout(_conf(spark_executor_cores=2), "spark://m:7077", 4, 2).task_cpus == 2


def test_the_option_is_checked_against_np():
    assert validate_ranks_per_task(None, 4) is None
    with pytest.raises(ValueError, match=r"takes a number, not text: got '2'\. Fix: "
                                         r"ranks_per_task=2"):
        validate_ranks_per_task("2", 4)  # as np="2" is: the magic's line gives it 2
    for bad in (0, -1, 1.5, "two", True):
        with pytest.raises(ValueError, match="must be a whole number >= 1"):
            validate_ranks_per_task(bad, 4)
    with pytest.raises(ValueError, match=r"np=5 is not a multiple of ranks_per_task=2.*"
                                         r"Fix: np=4 or np=6"):
        validate_ranks_per_task(2, 5)
    with pytest.raises(ValueError, match=r"np=1 is not a multiple.*Fix: np=2"):
        validate_ranks_per_task(2, 1)
    with pytest.raises(ValueError, match="ranks on the driver are a process each"):
        validate_ranks_per_task(2, -2)
    with pytest.raises(ValueError, match="elastic"):
        validate_ranks_per_task(2, ElasticSize(2, 4))


def test_each_rank_holds_its_share_of_the_tasks_gpus():
    assert [task_share(["0", "1", "2", "3"], 4, i) for i in range(4)] == [["0"], ["1"], ["2"],
                                                                         ["3"]]
    assert task_share(["0", "1", "2", "3"], 2, 1) == ["2", "3"]
    assert task_share(["0", "1", "2"], 2, 1) == ["0", "1", "2"]  # shared: all of them
    assert task_share([], 2, 0) == []


def test_horovod_and_torch_ranks_see_their_hosts_gpus_in_local_rank_order_tf_its_own():
    host = [["4"], ["5"], ["6"], ["7"]]  # two tasks of two ranks on one host
    assert rank_devices("horovod", host, 2) == "4,5,6,7"
    assert rank_devices("torch", host, 3) == "4,5,6,7"
    assert rank_devices("tf", host, 2) == "6"
    assert rank_devices("torch", [["0", "1"], ["2", "3"]], 1) == "2,3"  # two each: its own
    assert rank_devices("horovod", [["5"], ["5"]], 1) == "5"  # one GPU shared
    assert rank_devices("horovod", [[], []], 0) is None


def test_a_tasks_shard_splits_into_even_contiguous_runs_one_file_per_rank(tmp_path):
    import pyarrow as pa

    rows = pa.StructArray.from_arrays([pa.array(range(7)), pa.array([1.0, None] * 3 + [1.0])],
                                      names=["id", "x"])
    other = pa.StructArray.from_arrays([pa.array([0] * 7)], names=["y"])  # source 1: no rows
    batch = pa.RecordBatch.from_arrays([pa.array([0] * 7), pa.array(range(7)), rows, other],
                                       names=["__source", "__key", "__s0", "__s1"])
    shards = write_shards([batch], tmp_path, {0: "train", 1: "empty"})
    split = split_shards(shards, 3, {0: "train", 1: "empty"})
    assert [[s.rows for s in mine] for mine in split] == [[2, 0], [2, 0], [3, 0]]
    ids = [pa.ipc.open_file(mine[0].path).read_all().column("id").to_pylist() for mine in split]
    assert ids == [[0, 1], [2, 3], [4, 5, 6]]
    assert [mine[0].nulls for mine in split] == [{"x": 1}, {"x": 1}, {"x": 1}]
    assert not (tmp_path / "0.arrow").exists()  # the task's own file is gone
    assert split_shards(shards, 1, {}) == [shards]


class _Gather:
    def __init__(self, others):
        self.others = others

    def allGather(self, message):  # noqa: N802 - Spark's name
        return [message, *self.others]


def test_a_tasks_ranks_meet_in_one_all_gather_or_each_through_the_driver():
    lanes = [(TaskMeeting(), 0, {"port": 1}), (TaskMeeting(), 1, {"port": 2})]
    meet(_Gather([json.dumps([{"port": 3}, {"port": 4}])]), lanes, None)
    assert all(m.wait() == [{"port": p} for p in (1, 2, 3, 4)] and m.by == BY_SPARK
               for m, _, _ in lanes)
    offered = []
    lanes = [(TaskMeeting(), 2, {"port": 5}), (TaskMeeting(), 3, {"port": 6})]
    for meeting, _, _ in lanes:  # the driver's answer, as if every rank had offered
        meeting.answer([{"port": 0}] * 4, "driver")
    meet(None, lanes, [offered.append] * 2)
    assert offered == [{"kind": MEET_OFFER, "partition": 2, "message": {"port": 5}},
                       {"kind": MEET_OFFER, "partition": 3, "message": {"port": 6}}]
