"""pyspark's ``DeepspeedTorchDistributor`` drop-in with real DeepSpeed (0.19, its CPU accelerator
and the gloo backend: no GPU here) on two driver ranks: pyspark's docstring example with a
training function filled in, and a file run with ``--deepspeed --deepspeed_config``."""
import json
import textwrap

import pytest

from hvd_magics import DeepspeedTorchDistributor, HorovodJobError, HorovodRunner, last_run


def test_the_drop_in_runs_pysparks_docstring_example_with_a_deepspeed_function():
    def train(learning_rate):
        import deepspeed
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=learning_rate),
            config={"train_micro_batch_size_per_gpu": 8})
        torch.manual_seed(1 + engine.global_rank)  # each rank its own data
        for _ in range(5):
            loss = engine(torch.randn(8, 4)).pow(2).mean()
            engine.backward(loss)
            engine.step()
        weights = [p.detach().clone() for p in engine.module.parameters()]
        gathered = [torch.zeros_like(weights[0]) for _ in range(engine.world_size)]
        torch.distributed.all_gather(gathered, weights[0])
        return engine.world_size, all(torch.equal(gathered[0], g) for g in gathered[1:])

    distributor = DeepspeedTorchDistributor(numGpus=2, nnodes=1, useGpu=False, localMode=True)
    # two ranks trained one model: its weights are the same on both after five steps
    assert distributor.run(train, 0.01) == (2, True)
    assert last_run().engine == "torch" and last_run().size == 2


def test_a_file_gets_deepspeed_and_its_config_after_its_own_arguments(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''\
        import argparse, json, os, sys
        import deepspeed, torch
        parser = argparse.ArgumentParser()
        parser.add_argument("out")
        parser = deepspeed.add_config_arguments(parser)
        args = parser.parse_args()
        model = torch.nn.Linear(4, 1)
        engine, _, _, _ = deepspeed.initialize(args=args, model=model,
                                               model_parameters=model.parameters())
        loss = engine(torch.randn(4, 4)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        if engine.global_rank == 0:
            with open(args.out, "w") as f:
                json.dump({"argv": sys.argv[1:3], "world": engine.world_size,
                           "batch": engine.train_micro_batch_size_per_gpu()}, f)
        '''))
    out = tmp_path / "out.json"
    config = {"train_micro_batch_size_per_gpu": 4,
              "optimizer": {"type": "Adam", "params": {"lr": 0.001, "torch_adam": True}}}
    assert DeepspeedTorchDistributor(numGpus=2, useGpu=False, deepspeedConfig=config).run(
        str(script), str(out)) is None
    seen = json.loads(out.read_text())
    assert seen == {"argv": [str(out), "--deepspeed"], "world": 2, "batch": 4}


def test_bad_arguments_are_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="numGpus must be a positive whole number, got 0"):
        DeepspeedTorchDistributor(numGpus=0)
    with pytest.raises(TypeError, match="deepspeedConfig must be a JSON file's path, a dict"):
        DeepspeedTorchDistributor(useGpu=False, deepspeedConfig=3)
    # pyspark's default useGpu=True on a driver without a GPU: named as the user wrote it
    with pytest.raises(RuntimeError, match=r"useGpu=True, but the driver has no GPU\. Fix: .*"
                                           r"or useGpu=False to train on CPU"):
        DeepspeedTorchDistributor(numGpus=2, localMode=True).run(print)


def test_a_deepspeed_build_killed_halfway_does_not_hang_the_next_job(tmp_path, monkeypatch,
                                                                     capsys):
    """DeepSpeed builds its CPU communication op on the first ``deepspeed.initialize`` of a
    host, under torch's lock file in the build folder. A rank killed during that build (a job
    stopped or interrupted then) left the file, and every later DeepSpeed job on the host
    waited for it for ever, saying nothing (the suite's two DeepSpeed tests ran into their
    600 s timeouts on a machine where an earlier run had been killed)."""
    import shutil
    from pathlib import Path

    from torch.utils import cpp_extension

    from tests.unit.test_torch_extension_locks import _lock_of_a_killed_build

    root = tmp_path / "extensions"
    built = Path(cpp_extension._get_build_directory("deepspeed_shm_comm", False))
    if (built / "deepspeed_shm_comm.so").exists():  # an earlier job's build: none again
        # (without its lock: a DeepSpeed test of another lane may hold it now)
        shutil.copytree(built, root / "deepspeed_shm_comm",
                        ignore=shutil.ignore_patterns("lock"))
    (root / "deepspeed_shm_comm").mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    lock = root / "deepspeed_shm_comm" / "lock"
    _lock_of_a_killed_build(lock)

    def train():
        import deepspeed
        import torch
        model = torch.nn.Linear(4, 1)
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
            config={"train_micro_batch_size_per_gpu": 8})
        return engine.world_size

    assert DeepspeedTorchDistributor(numGpus=2, useGpu=False).run(train) == 2
    shown = capsys.readouterr()
    said = [line for line in (shown.out + shown.err).splitlines() if "hvd_magics: removed" in line]
    assert len(said) == 1 and str(lock) in said[0], said
    assert not lock.exists()


def _zero_steps(steps: int, stage: int = 3, kill_at: int | None = None,
                catch: bool = True) -> dict:
    """A DeepSpeed engine (ZeRO ``stage``, Adam) trained ``steps`` steps on data seeded by the
    step and rank, saved with the step beside it every 5 steps through ``checkpoint.save`` and
    resumed from ``checkpoint.latest``; rank 1 of the first attempt killed after step
    ``kill_at``. Returns where it started, the step the dict got back, the model's output on a
    fixed batch, and what a dict with the optimizer beside the engine and a load on this number
    of ranks said (``catch=False``: raised)."""
    import os
    import signal

    import deepspeed
    import torch

    from hvd_magics import checkpoint
    from hvd_magics.errors import CheckpointMismatch, ShardedStateRefused

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    engine, optimizer, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(),
        config={"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": stage},
                "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}}})
    said = {}
    try:
        checkpoint.save({"engine": engine, "optimizer": optimizer}, 0)
    except ShardedStateRefused as refused:
        said["refused"] = str(refused)
    state = {"engine": engine, "step": -1}
    try:
        found = checkpoint.latest(state)
    except CheckpointMismatch as mismatch:  # saved by another number of ranks
        if not catch:
            raise
        return {"mismatch": str(mismatch)}
    start, loaded = (0, None) if found is None else (found[1] + 1, state["step"])
    for step in range(start, steps):
        data = torch.Generator().manual_seed(step * 10 + engine.global_rank)
        engine.backward(engine(torch.randn(8, 16, generator=data)).pow(2).mean())
        engine.step()
        if step % 5 == 4:
            state["step"] = step
            checkpoint.save(state, step)
        if step == kill_at and engine.global_rank == 1 and checkpoint.attempt() == 0:
            os.kill(os.getpid(), signal.SIGKILL)
    with torch.no_grad():
        probe = engine(torch.ones(4, 16)).sum().item()
    return {"start": start, "step": loaded, "probe": probe, **said}


def test_a_zero_3_engine_saved_by_every_rank_resumes_after_a_lost_rank_as_an_unbroken_run(
        tmp_path):
    """ZeRO stage 3 (each rank holds a part of the parameters and of Adam's state): saved
    through checkpoint.save(engine) at steps 4 and 9, rank 1 killed at step 12; the next
    attempt resumes from step 9 and ends with the model's output of a run that never stopped,
    bit for bit. One rank cannot read two ranks' ZeRO partitions: said with the fix."""
    folder = tmp_path / "lost"
    resumed = HorovodRunner(np=-2, engine="torch", restarts=1, checkpoint_dir=folder).run(
        _zero_steps, steps=15, kill_at=12)
    assert "rank 1" in last_run().attempts[0] and last_run().attempts[-1] == "succeeded"
    assert (resumed["start"], resumed["step"]) == (10, 9), resumed
    assert "saves its model and its optimizer itself" in resumed["refused"], resumed
    saved = sorted(p.name for p in (folder / "checkpoints" / "ckpt-14-e0-s0.dcp" / "deepspeed")
                   .iterdir())
    assert saved == [f"zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt"
                     for r in (0, 1) for kind in ("model", "optim")], saved
    unbroken = HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path / "whole").run(
        _zero_steps, steps=15)
    assert resumed["probe"] == unbroken["probe"], (resumed, unbroken)
    one = HorovodRunner(np=-1, engine="torch", checkpoint_dir=folder).run(_zero_steps, steps=20)
    assert "saved by 2 ranks, and this job has 1" in one["mismatch"], one
    assert "Fix:" in one["mismatch"], one
    # on more ranks than wrote it, every rank says it: the error's first line names the counts
    # (it named rank 3's bare AssertionError, and DeepSpeed's words only on rank 0's line)
    with pytest.raises(HorovodJobError) as four:
        HorovodRunner(np=-4, engine="torch", checkpoint_dir=folder).run(
            _zero_steps, steps=20, catch=False)
    first = str(four.value).splitlines()[0]
    assert "CheckpointMismatch" in first and "saved by 2 ranks, and this job has 4" in first, \
        str(four.value)
    assert ".." not in str(four.value).replace("...", ""), str(four.value)
    assert {f.message for f in four.value.failures} == {one["mismatch"].replace(
        "this job has 1", "this job has 4")}, str(four.value)


def _trainer_with_zero_2(output_dir: str, kill_at: int | None = None) -> dict:
    """A small BERT classifier trained by the Hugging Face Trainer with DeepSpeed ZeRO-2 (its
    config as users write it, "auto" values filled by the Trainer), 2 epochs of 16 steps,
    saved every 8; rank 1 of the first attempt killed after step ``kill_at``. Returns the
    steps done, the step this attempt resumed from and a digest of the final weights."""
    import hashlib
    import os
    import signal

    import torch
    from transformers import (BertConfig, BertForSequenceClassification, Trainer,
                              TrainerCallback, TrainingArguments)

    from hvd_magics import checkpoint

    class KillRank1(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if (state.global_step == kill_at and int(os.environ["RANK"]) == 1
                    and checkpoint.attempt() == 0):
                os.kill(os.getpid(), signal.SIGKILL)

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64))
    data = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(0, 64, (12,), generator=data), "labels": i % 2}
            for i in range(256)]
    zero = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
            "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 2},
            "optimizer": {"type": "AdamW", "params": {"lr": "auto", "torch_adam": True}}}
    args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=8,
                             num_train_epochs=2, save_steps=8, report_to=[], use_cpu=True,
                             deepspeed=zero, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=[KillRank1()])
    resumed = []
    trainer.add_callback(type("Start", (TrainerCallback,), {
        "on_train_begin": lambda self, a, state, c, **k: resumed.append(state.global_step)}))
    result = trainer.train()
    hashed = hashlib.sha256()
    for name, value in sorted(trainer.model.state_dict().items()):
        hashed.update(value.detach().float().numpy().tobytes())
    return {"steps": result.global_step, "resumed_at": resumed[0],
            "weights": hashed.hexdigest()[:16]}


def test_a_trainer_with_zero_2_restarts_after_a_lost_rank_from_its_checkpoint_as_unbroken(
        tmp_path):
    """The Trainer as users configure DeepSpeed (``TrainingArguments(deepspeed=...)``, ZeRO-2
    on CPU ranks): rank 1 killed at step 20 of 32; the next attempt's train() resumes by itself
    from checkpoint-16 (DeepSpeed's partitions of Adam's state, each rank's) and ends with the
    weights of a run that never stopped, bit for bit."""
    resumed = HorovodRunner(np=-2, engine="torch", restarts=1).run(
        _trainer_with_zero_2, output_dir=str(tmp_path / "lost"), kill_at=20)
    assert "rank 1" in last_run().attempts[0] and last_run().attempts[-1] == "succeeded"
    assert (resumed["steps"], resumed["resumed_at"]) == (32, 16), resumed
    parts = sorted(p.name for p in (tmp_path / "lost" / "checkpoint-16" / "global_step16")
                   .iterdir())
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" in parts, parts
    unbroken = HorovodRunner(np=-2, engine="torch").run(
        _trainer_with_zero_2, output_dir=str(tmp_path / "whole"))
    assert resumed["weights"] == unbroken["weights"], (resumed, unbroken)
