"""Progress and epoch timing from real ranks: Keras with no code change, the track API, text lines."""
from hvd_magics import HorovodRunner
from hvd_magics.job.job_state import JobState
from tests import jobs


class Collect:
    """A view that keeps every event (what widgets would be told)."""

    def __init__(self):
        self.events = []
        self.ticks = 0

    def on_event(self, job, event):
        self.events.append(event)

    def on_tick(self, job):
        self.ticks += 1

    def on_end(self, job):
        self.job = job


def _run(fn, view, np=-2, **kwargs):
    from hvd_magics.launch.payload import serialize_job

    return HorovodRunner(np=np).run_payload(serialize_job(fn, kwargs), views=[view])


def test_keras_fit_reports_epochs_steps_and_metrics_without_code_changes():
    view = Collect()
    record = _run(jobs.keras_epochs, view, epochs=3)
    kinds = [(e["rank"], e["kind"]) for e in view.events]
    for rank in (0, 1):
        assert kinds.count((rank, "epoch_begin")) == 3 and kinds.count((rank, "epoch_end")) == 3
    end = next(e for e in view.events if e["kind"] == "epoch_end")
    assert {"loss", "accuracy"} <= set(end["metrics"]) and end["samples"] == 256
    assert end["epochs"] == 3
    assert [row["epoch"] for row in record.epochs] == [1, 2, 3]
    for row in record.epochs:
        assert set(row["rank_seconds"]) == {0, 1} and row["wall_s"] > 0
        assert row["samples"] == 512 and row["samples_per_s"] > 0
    # the study's measure: first 'Epoch y/z' line to the first 'Epoch y+1/z' line
    assert record.epochs[0]["line_to_line_s"] > 0 and record.epochs[2]["line_to_line_s"] is None
    assert record.startup_s > 0 and record.training_s > 0
    assert "epoch timing" in str(record) and "hvd-epochs" in record._repr_html_()
    assert list(record.to_pandas()["epoch"]) == [1, 2, 3]
    assert view.job.ranks[1].epoch == 3 and view.job.ranks[1].metrics


def test_the_track_api_reports_a_custom_loop_and_is_throttled():
    view = Collect()
    record = _run(jobs.torch_tracked_loop, view, epochs=2, steps=40)
    progress = [e for e in view.events if e["kind"] == "progress"]
    from hvd_magics.rank.api.progress import MIN_INTERVAL_S

    for rank in (0, 1):  # at most one report per MIN_INTERVAL_S of each epoch, whatever its speed
        mine = [e for e in progress if e["rank"] == rank]
        longest = sum(row["rank_seconds"][rank] for row in record.epochs)
        assert 0 < len(mine) <= longest / MIN_INTERVAL_S + len(record.epochs)
    assert [row["samples"] for row in record.epochs] == [640, 640]  # 2 ranks x 40 steps x 8
    assert view.job.ranks[0].samples_per_s > 0


def test_epoch_lines_in_plain_output_move_the_counter_and_time_epochs(tmp_path):
    view = Collect()
    record = _run(jobs.print_epoch_lines, view, np=-1, epochs=3)
    assert view.job.ranks[0].epoch == 3 and view.job.ranks[0].epochs == 3
    study = [row["line_to_line_s"] for row in record.epochs]
    assert study[0] > 0.2 and study[1] > 0.2 and study[2] is None


def test_ticks_reach_views_while_a_job_runs():
    view = Collect()
    _run(jobs.print_epoch_lines, view, np=-1, epochs=2)
    assert view.ticks >= 3


def test_job_state_counts_epoch_lines_only_without_structured_progress(tmp_path):
    job = JobState(1, tmp_path / "log")
    job.handle({"kind": "output", "rank": 0, "lines": ["Epoch 2/5"]})
    assert (job.ranks[0].epoch, job.ranks[0].epochs) == (2, 5)
    job.handle({"kind": "epoch_begin", "rank": 0, "epoch": 1, "epochs": 4})
    job.handle({"kind": "output", "rank": 0, "lines": ["Epoch 3/5"]})
    assert (job.ranks[0].epoch, job.ranks[0].epochs) == (1, 4)
    job.end()


def test_a_lightning_fit_reports_epochs_and_its_logged_metrics_and_its_chatter_stays_out(
        capsys):
    """Lightning's Trainer with no line added: two epochs of 4 steps of 8 rows on each rank,
    the loss and what the module logged in the epochs' records; its start-up lines
    (accelerators found, a tip, the process group) only in the log file."""
    from hvd_magics.job.runner import default_views
    from hvd_magics.launch.payload import serialize_job
    from tests import engine_jobs

    view = Collect()
    record = HorovodRunner(np=-2, engine="torch").run_payload(
        serialize_job(engine_jobs.lightning_fit, {"devices": 2, "num_nodes": 1}),
        views=[view, *default_views()])
    assert [row["epoch"] for row in record.epochs] == [1, 2]
    # each rank: a DistributedSampler's half of 64 rows, in batches of 8
    assert all(row["samples"] == 64 for row in record.epochs), record.epochs
    begin = next(e for e in view.events if e["kind"] == "epoch_begin")
    assert (begin["epochs"], begin["steps"]) == (2, 4)
    end = next(e for e in view.events if e["kind"] == "epoch_end")
    assert {"loss", "train_mse"} <= set(end["metrics"]), end
    shown = capsys.readouterr().out
    for chatter in ("Tip:", "GPU available", "Initializing distributed", "distributed_backend"):
        assert chatter not in shown, shown
    log = open(record.log_path, encoding="utf-8").read()
    assert "GPU available" in log  # kept where the rest of the ranks' output is


def test_a_hugging_face_trainer_reports_epochs_and_what_it_logs(tmp_path):
    """transformers' Trainer with no line added, on two torch ranks: its epochs (4 optimizer
    steps of 8 rows each per rank) and the values it logs reach the epochs' records."""
    from hvd_magics.launch.payload import serialize_job
    from tests import engine_jobs

    view = Collect()
    record = HorovodRunner(np=-2, engine="torch").run_payload(
        serialize_job(engine_jobs.hf_trainer_fit, {"out": str(tmp_path)}), views=[view])
    assert record.value == (2, 8)  # a world of two, 2 epochs of 4 steps
    assert [(row["epoch"], row["samples"]) for row in record.epochs] == [(1, 64), (2, 64)]
    begin = next(e for e in view.events if e["kind"] == "epoch_begin")
    assert (begin["epochs"], begin["steps"]) == (2, 4)
    end = [e for e in view.events if e["kind"] == "epoch_end"][-1]
    assert {"loss", "learning_rate", "grad_norm"} <= set(end["metrics"]), end


def test_a_hugging_face_trainer_asked_for_fsdp_on_cpu_ranks_says_it_trains_without_it(
        tmp_path, capsys):
    """``TrainingArguments(fsdp="full_shard")`` on CPU ranks: Accelerate shards only on GPUs,
    and the Trainer trained with DDP, every rank holding the whole model, saying nothing (under
    torchrun it fails: 'Using fsdp only works in distributed training'). It is said once."""
    from hvd_magics.job.runner import default_views
    from hvd_magics.launch.payload import serialize_job
    from tests import engine_jobs

    record = HorovodRunner(np=-2, engine="torch").run_payload(
        serialize_job(engine_jobs.hf_trainer_fit, {"out": str(tmp_path), "fsdp": "full_shard"}),
        views=default_views())
    assert record.value == (2, 8)
    shown = _cell_text(capsys)
    said = "and trains without FSDP here: Accelerate shards a model only on GPUs"
    assert shown.count(said) == 1, shown
    # whole, at the user's line that made the Trainer (it was cut at '...It runs as FSDP on
    # ...' and said at rank/guards/import_hooks.py:69, a patch of ours)
    import inspect

    from hvd_magics.rank.integrations.hugging_face import FSDP_ON_CPU

    lines, first = inspect.getsourcelines(engine_jobs.hf_trainer_fit)
    made = first + next(i for i, text in enumerate(lines) if "= Trainer(" in text)
    assert f"HorovodMagicsWarning (tests/engine_jobs.py:{made}): {FSDP_ON_CPU}" in shown, shown


def _cell_text(capsys) -> str:
    return capsys.readouterr().out


def test_a_hugging_face_trainer_as_written_shows_its_epochs_and_evaluations_not_its_chatter(
        tmp_path, capsys):
    """The Trainer with its tqdm bar, printed logs and an evaluation each epoch: the epochs
    carry the evaluation's loss (an epoch ends with its evaluation, as Keras' does); the cell
    shows each kind of warning once and no bar, log dict or repeated line; the run log keeps
    the Trainer's logs."""
    from hvd_magics.job.runner import default_views
    from hvd_magics.launch.payload import serialize_job
    from tests import engine_jobs

    view = Collect()
    record = HorovodRunner(np=-2, engine="torch").run_payload(
        serialize_job(engine_jobs.hf_trainer_as_written, {"out": str(tmp_path)}),
        views=[view, *default_views()])
    eval_loss, steps = record.value
    assert steps == 8 and [row["epoch"] for row in record.epochs] == [1, 2]
    ends = [e for e in view.events if e["kind"] == "epoch_end" and e["rank"] == 0]
    assert [e["epoch"] for e in ends] == [1, 2]
    assert abs(ends[-1]["metrics"]["eval_loss"] - eval_loss) < 1e-6, ends[-1]
    assert {"loss", "learning_rate"} <= set(ends[-1]["metrics"])
    assert not any(name.endswith("_per_second") for name in ends[-1]["metrics"])
    shown = _cell_text(capsys)
    for chatter in ("{'loss'", "{'eval_loss'", "it/s]", "%|", "  warnings.warn("):
        assert chatter not in shown, shown
    assert shown.count("find_unused_parameters") <= 1, shown  # PyTorch's warning, once
    log = open(record.log_path, encoding="utf-8").read()
    assert "{'loss'" in log and "'eval_loss'" in log


def test_lightning_as_written_shows_its_summary_once_and_its_bar_only_in_the_dashboard(
        tmp_path, capsys):
    from hvd_magics.job.runner import default_views
    from hvd_magics.launch.payload import serialize_job
    from tests import engine_jobs

    view = Collect()
    record = HorovodRunner(np=-2, engine="torch").run_payload(
        serialize_job(engine_jobs.lightning_as_written, {"out": str(tmp_path)}),
        views=[view, *default_views()])
    assert record.value == 8 and [row["epoch"] for row in record.epochs] == [1, 2]
    shown = _cell_text(capsys)
    assert shown.count("Total params") == 1, shown
    for chatter in ("\x1b[2K", "\x1b[1A", "\x1b[?25h", "Epoch 0/1", "Tip:", "fit` stopped"):
        assert chatter not in shown, shown
    assert shown.count("is deprecated") <= 1, shown  # a warning of every rank's, once


def test_a_plain_ddp_loop_is_seen_without_a_line_added(capsys):
    """Steps from the DDP module's training calls (not its validation ones), epochs from
    DistributedSampler.set_epoch, the loss backward() was called on: each epoch's end carries
    the loop's own last loss; 256 rows over 2 ranks in batches of 8."""
    from hvd_magics.launch.payload import serialize_job
    from tests import engine_jobs

    view = Collect()
    record = HorovodRunner(np=-2, engine="torch").run_payload(
        serialize_job(engine_jobs.plain_ddp_loop, {}), views=[view])
    assert [row["epoch"] for row in record.epochs] == [1, 2, 3]
    assert all(row["samples"] == 256 for row in record.epochs), record.epochs
    ends = [e for e in view.events if e["kind"] == "epoch_end" and e["rank"] == 0]
    assert [round(e["metrics"]["loss"], 6) for e in ends] == [round(v, 6) for v in record.value]
    begin = next(e for e in view.events if e["kind"] == "epoch_begin")
    assert begin["steps"] == 16


def test_a_plain_ddp_loop_without_set_epoch_counts_passes_over_its_training_loader():
    from hvd_magics.launch.payload import serialize_job
    from tests import engine_jobs

    record = HorovodRunner(np=-2, engine="torch").run_payload(
        serialize_job(engine_jobs.plain_ddp_loop, {"epochs": 2, "set_epoch": False}),
        views=[Collect()])
    assert [(row["epoch"], row["samples"]) for row in record.epochs] == [(1, 256), (2, 256)]


def test_an_accelerate_loop_is_seen_with_what_it_logs():
    from hvd_magics.launch.payload import serialize_job
    from tests import engine_jobs

    view = Collect()
    record = HorovodRunner(np=-2, engine="torch").run_payload(
        serialize_job(engine_jobs.accelerate_loop, {}), views=[view])
    processes, wrapped, logged = record.value
    assert (processes, wrapped) == (2, "DistributedDataParallel")
    assert [(row["epoch"], row["samples"]) for row in record.epochs] == [(1, 256), (2, 256),
                                                                         (3, 256)]
    ends = [e for e in view.events if e["kind"] == "epoch_end" and e["rank"] == 0]
    assert [round(e["metrics"]["train_loss"], 6) for e in ends] == [round(v, 6) for v in logged]
    assert all("epoch" not in e["metrics"] for e in ends)


def test_a_shards_loader_made_anew_each_epoch_is_an_epoch_each_pass(tmp_path):
    """``for epoch in range(2): for (xb,) in df.to_torch(..., seed=epoch)``: one epoch of
    twice the samples was recorded, and the dashboard showed ``epoch 1/?``."""
    from hvd_magics.launch.payload import serialize_job
    from tests import engine_jobs

    view = Collect()
    record = HorovodRunner(np=-2, engine="torch").run_payload(
        serialize_job(engine_jobs.ddp_on_a_shard_per_epoch, {"folder": str(tmp_path)}),
        views=[view])
    ran = record.value  # rank 0's own count: (steps, rows) per epoch
    assert ran == [(6, 501), (6, 501)], ran  # 501 rows in 6 batches of 100, every epoch
    assert [(row["epoch"], row["samples"]) for row in record.epochs] == [(1, 1002), (2, 1002)]
    begins = [e for e in view.events if e["kind"] == "epoch_begin" and e["rank"] == 0]
    assert [(e["epoch"], e["steps"]) for e in begins] == [(1, 6), (2, 6)]
    ends = [e for e in view.events if e["kind"] == "epoch_end" and e["rank"] == 0]
    assert [e["samples"] for e in ends] == [501, 501]


def test_an_accelerate_loop_accumulating_gradients_shows_its_loss_and_optimizer_steps():
    """``Accelerator(gradient_accumulation_steps=4)``: the dashboard showed the loss Accelerate
    had divided by 4 and counted 16 micro-batches a epoch where Accelerate made 4 steps."""
    from hvd_magics.launch.payload import serialize_job
    from tests import engine_jobs

    view = Collect()
    record = HorovodRunner(np=-2, engine="torch").run_payload(
        serialize_job(engine_jobs.accelerate_accumulating, {"pause": 0.05}), views=[view])
    losses, steps = record.value
    assert steps == 4 and len(losses) == 16  # 128 rows a rank, batches of 8, 4 to a step
    begin = next(e for e in view.events if e["kind"] == "epoch_begin" and e["rank"] == 0)
    assert begin["steps"] == 4
    shown = [e for e in view.events if e["kind"] == "progress" and e["rank"] == 0]
    assert shown and all(e["step"] <= 4 for e in shown), shown
    for event in shown:  # the rate counts every batch of a step: 32 samples a step
        seen = event["samples_per_s"] * (event["rtime"] - begin["rtime"])
        assert 0.9 < seen / (32 * event["step"]) < 1.1, (event, begin)
    assert (view.job.ranks[0].step, view.job.ranks[0].steps) == (4, 4)
    end = next(e for e in view.events if e["kind"] == "epoch_end" and e["rank"] == 0)
    assert round(end["metrics"]["loss"], 4) == round(losses[-1], 4), (end, losses[-4:])
    assert end["samples"] == 128 and [row["samples"] for row in record.epochs] == [256]


def test_horovods_first_broadcast_is_not_called_a_slow_callback_but_a_users_slow_one_is():
    """Every Keras job with BroadcastGlobalVariablesCallback (the README's) printed tf_keras's
    'Callback method `on_train_batch_end` is slow compared to the batch time' on each rank: the
    broadcast at the first batch's end waits for every peer, and Keras averages it in."""
    warned = HorovodRunner(np=-2).run(jobs.keras_callback_timing_warnings, slow_s=0.05)
    assert warned["broadcast"] == [], warned
    assert len(warned["slow"]) == 1 and "`on_train_batch_end` is slow" in warned["slow"][0], warned
