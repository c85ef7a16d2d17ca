"""Training libraries that start processes of their own, or plan other ranks than the job's,
refused in one line naming the fix (hvd_magics/rank/launcher_guard.py): real Lightning and
accelerate on two torch ranks on the driver."""
import pytest

from hvd_magics import HorovodJobError, HorovodRunner
from tests import engine_jobs


def test_a_lightning_trainer_that_fits_the_job_trains_one_that_does_not_is_refused():
    runner = HorovodRunner(np=-2, engine="torch", timeout=120)
    assert runner.run(engine_jobs.lightning_fit, devices=2, num_nodes=1) == (0, 2, 0)
    # two ranks on one host: devices=1, num_nodes=2 failed deep in Lightning (IndexError)
    with pytest.raises(HorovodJobError, match=r"LaunchMismatchError: Lightning's Trainer\(devices"
                       r"=1, num_nodes=2\) plans 2 processes, 1 per node, and the job runs 2 "
                       r"ranks as 1 node of 2\. Fix: Trainer\(devices=2, num_nodes=1, "
                       r"strategy='ddp'\)"):
        runner.run(engine_jobs.lightning_fit, devices=1, num_nodes=2)
    with pytest.raises(HorovodJobError, match=r"Lightning's strategy starts its processes itself "
                                              r"\(spawn\).*Fix: Trainer\(devices=2"):
        runner.run(engine_jobs.lightning_fit, devices=2, num_nodes=1, strategy="ddp_spawn")


def test_accelerates_notebook_launcher_in_a_cell_is_refused():
    with pytest.raises(HorovodJobError, match=r"accelerate's notebook_launcher starts processes "
                       r"of its own.*Fix: call the training function directly: Accelerator\(\) "
                       r"joins the job's torch.distributed group \(run the cell with --engine "
                       r"torch\)"):
        HorovodRunner(np=-2, timeout=60).run(engine_jobs.accelerate_notebook_launcher)
