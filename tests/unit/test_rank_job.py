"""The job's variables on a rank, parsed in one place (hvd_magics/rank/rank_job.py)."""
from pathlib import Path

from hvd_magics.rank.rank_job import DEFAULT_CHECKPOINT_DIR, RankJob


def test_a_rank_reads_its_job_from_the_variables_the_driver_set():
    job = RankJob.read({
        "HVD_MAGICS_ENGINE": "torch", "HVD_MAGICS_RANK": "3", "HVD_MAGICS_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2", "HVD_MAGICS_ATTEMPT": "1",
        "HVD_MAGICS_CHECKPOINT_DIR": "/shared/ckpt", "HVD_MAGICS_RESUME_STEP": "15",
        "HVD_MAGICS_PREIMPORT": "torch,numpy", "HVD_MAGICS_STEP_SPLIT": "0",
        "HVD_MAGICS_SHARDS": '[{"index": 0, "path": "/tmp/s0"}]',
        "TF_CONFIG": '{"task": {"type": "worker", "index": 3}}'})
    assert (job.engine, job.rank, job.size, job.local_size, job.group_size) == ("torch", 3, 4,
                                                                                2, 2)
    assert job.in_a_job and not job.first and job.attempt == 1
    assert job.checkpoint_dir == Path("/shared/ckpt") and job.resume_step == "15"
    assert job.preimport == ("torch", "numpy") and not job.step_split and job.loop_progress
    assert job.shards == [{"index": 0, "path": "/tmp/s0"}]
    assert job.tf_task == {"type": "worker", "index": 3}


def test_outside_a_job_a_process_is_rank_0_of_1_and_a_bad_tf_config_is_tf_s_to_say():
    job = RankJob.read({"TF_CONFIG": "not json", "HOROVOD_RANK": "2"})
    assert not job.in_a_job and job.engine is None and job.size == 1
    assert job.rank == 2  # Horovod's own, where ours is not set
    assert job.checkpoint_dir == DEFAULT_CHECKPOINT_DIR and job.tf_task == {}
