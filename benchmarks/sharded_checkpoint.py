"""Sharded checkpoints (issue 74): an FSDP2 model's state of at least 1 GB (its parameters and
Adam's two moments) saved and loaded through ``checkpoint.save`` / ``checkpoint.latest(state)``
(every rank writes its part: PyTorch's distributed checkpoint), against the way a
``TorchDistributor`` job keeps it whole: gather the full state on rank 0
(``get_state_dict(..., full_state_dict=True, cpu_offload=True)``) and ``torch.save`` it there,
then ``torch.load`` it on every rank and ``set_state_dict``. And the stall a save puts in the
training loop: ``save(..., asynchronous=True)`` against a save that returns once written.

Each candidate runs in its own job of driver ranks (``np=-N``, the torch engine, Gloo), in turn
(A B, then B A), ``--runs`` times; each job builds the model, takes one step (so that Adam has
its moments), then times, on every rank, between barriers:
  save_s       the save, until every rank returned from it
  load_s       the load into a fresh model and optimizer, until every rank returned
  stall_s      (async only) the time the loop is held by the save call
  written_s    (async only) the time until the checkpoint is in place
Usage: .venv/bin/python benchmarks/sharded_checkpoint.py [--ranks 2 4] [--gb 1.0] [--runs 2]
Last line per rank count: sharded_checkpoint ranks=<n> state_gb=<g> save_s=<s> full_save_s=<s>
load_s=<s> full_load_s=<s> save_ratio=<full/ours> load_ratio=<full/ours> stall_s=<s>
written_s=<s>  (medians)
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measure(how: str, gb: float, folder: str) -> dict:
    """One job's figures for ``how`` ("sharded", "async" or "full"), on rank 0."""
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                         set_state_dict)
    from torch.distributed.fsdp import fully_shard

    from hvd_magics import checkpoint

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # parameters of gb / 3 (Adam keeps two moments of the same size): 4 square layers
    width = int((gb * 2**30 / 3 / 4 / 4) ** 0.5)

    def build() -> tuple:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False)
                                      for _ in range(4)])
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        return model, optimizer

    model, optimizer = build()
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    state_gb = 3 * sum(p.numel() for p in model.parameters()) * 4 / 2**30  # full, not a shard

    def timed(work) -> float:
        dist.barrier()
        began = time.perf_counter()
        work()
        dist.barrier()
        return time.perf_counter() - began

    figures: dict = {"state_gb": state_gb}
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    path = Path(folder) / "full.pt"
    if how == "full":
        def save_full() -> None:
            weights, moments = get_state_dict(model, optimizer, options=full)
            if rank == 0:
                torch.save({"model": weights, "optimizer": moments}, path)

        figures["save_s"] = timed(save_full)
        model, optimizer = build()

        def load_full() -> None:
            whole = torch.load(path, weights_only=False)
            set_state_dict(model, optimizer, model_state_dict=whole["model"],
                           optim_state_dict=whole["optimizer"],
                           options=StateDictOptions(full_state_dict=True))

        figures["load_s"] = timed(load_full)
    else:
        state = {"model": model, "optimizer": optimizer, "step": 0}
        if how == "async":
            dist.barrier()
            began = time.perf_counter()
            checkpoint.save(state, 1, asynchronous=True)
            figures["stall_s"] = time.perf_counter() - began
            checkpoint.wait()
            dist.barrier()
            figures["written_s"] = time.perf_counter() - began
        else:
            figures["save_s"] = timed(lambda: checkpoint.save(state, 1))
        model, optimizer = build()
        fresh = {"model": model, "optimizer": optimizer, "step": 0}
        # what latest(state) reads once it found the checkpoint (this job started with none,
        # which latest() itself would keep to)
        from hvd_magics.common.checkpoints import latest_checkpoint
        from hvd_magics.rank.api.torch_dcp import load

        found = latest_checkpoint(checkpoint.directory())
        assert found is not None and found[1].is_dir(), found
        figures["load_s"] = timed(lambda: load(fresh, found[1]))
        assert fresh["step"] == 0 and len(optimizer.state_dict()["state"]) == 4
    dist.destroy_process_group()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    from benchmarks.pairs import in_turn
    from hvd_magics import HorovodRunner

    for ranks in args.ranks:
        found: dict = {}
        for run in range(args.runs):
            for how in in_turn(run, ["sharded", "full", "async"]):
                folder = tempfile.mkdtemp(prefix="hvd-sharded-bench-")
                try:
                    figures = HorovodRunner(np=-ranks, engine="torch", checkpoint_dir=folder,
                                            fresh=True).run(measure, how=how, gb=args.gb,
                                                            folder=folder)
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
                print(f"ranks {ranks} run {run} {how:8s} " + " ".join(
                    f"{k}={v:.2f}" for k, v in figures.items()), flush=True)
                for key, value in figures.items():
                    found.setdefault((how, key), []).append(value)

        def median(how: str, key: str) -> float:
            return statistics.median(found[how, key])

        print(f"sharded_checkpoint ranks={ranks} state_gb={median('sharded', 'state_gb'):.2f} "
              f"save_s={median('sharded', 'save_s'):.2f} "
              f"full_save_s={median('full', 'save_s'):.2f} "
              f"load_s={median('sharded', 'load_s'):.2f} "
              f"full_load_s={median('full', 'load_s'):.2f} "
              f"save_ratio={median('full', 'save_s') / median('sharded', 'save_s'):.2f} "
              f"load_ratio={median('full', 'load_s') / median('sharded', 'load_s'):.2f} "
              f"stall_s={median('async', 'stall_s'):.2f} "
              f"written_s={median('async', 'written_s'):.2f}", flush=True)


if __name__ == "__main__":
    main()
