"""A checkpoint of FSDP2's sharded state (real FSDP2 over Gloo, two driver ranks): refused on
every rank with the fix, never written as rank 0's shards alone (issue 72: the sum of the full
weights was -13.95 when saved and -15.04 once loaded, and the job succeeded)."""
import pytest

from hvd_magics import HorovodJobError, HorovodRunner


def _fsdp_save(folder: str) -> None:
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from hvd_magics import checkpoint

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 64)).sum().backward()
    optimizer.step()
    try:
        checkpoint.save({"model": model.state_dict(), "opt": optimizer.state_dict()}, 1)
    finally:
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, f"tried-{dist.get_rank()}"), "w").close()


def test_a_checkpoint_of_fsdp2_shards_is_refused_on_every_rank_with_the_fix(tmp_path):
    runner = HorovodRunner(np=-2, engine="torch", checkpoint_dir=tmp_path / "checkpoints")
    with pytest.raises(HorovodJobError) as raised:
        runner.run(_fsdp_save, folder=str(tmp_path / "tried"))
    text = str(raised.value)
    assert "ShardedStateRefused" in text and "checkpoint.save got sharded tensors" in text, text
    assert "DTensor, this rank's part" in text and "torch.distributed.checkpoint.save" in text
    assert "2 of 2 ranks failed" in text, text  # each refused its own; none only lost a peer
    assert sorted(p.name for p in (tmp_path / "tried").iterdir()) == ["tried-0", "tried-1"]
    assert not list((tmp_path / "checkpoints").glob("**/*.pkl"))  # nothing written
