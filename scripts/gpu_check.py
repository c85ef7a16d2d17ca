"""The checks that need a real GPU, in one short run on a lent GPU machine (see
docs/development.md, "A GPU machine"). Each part prints what it found; the last line sums up.

1. guard: the notebook-side GPU guard against a real CUDA context (a fresh process: it finds
   nothing before ``torch.cuda`` is touched, then PyTorch's context and the process's
   ``/dev/nvidia*`` descriptors, and its message).
2. nccl: ranks on the driver (``np=-1`` and ``np=-2``) on ``--engine torch`` with NCCL: a DDP
   model trained on the GPU; each rank's device, its allreduce and NCCL's version; the record's
   step split and GPU memory (what the dashboard shows per rank). With one GPU, ``np=-2`` is
   what a user who copies ``torch.cuda.set_device(LOCAL_RANK)`` gets, and what NCCL does with
   two ranks that pick the one GPU they share (``LOCAL_RANK`` modulo the GPUs).
3. straggler: two ranks on the one GPU over gloo, rank 1 doing 30% more GPU work a step: what
   the split (host time on a GPU) and the verdict make of it, and the GPU reading (memory,
   NVML utilisation) a row shows.
4. overhead: one DDP rank on the GPU (NCCL), a small and a wide MLP, steps/s with the split on
   over off (each in a fresh process, in turn, three times).
5. fsdp: FSDP2 (``fully_shard``) over NCCL, a rank per GPU (``np=-G`` for the G GPUs: two ranks
   on one GPU are refused by NCCL), trained, saved with ``checkpoint.save`` (every rank's part,
   PyTorch's distributed checkpoint) and in the background, read back by a second job with
   ``checkpoint.latest(state)``: the full weights' digests, each rank's part files, the step
   split's communication share (FSDP's all-gathers and reduce-scatters) and the GPU's memory;
   then the same with FSDP1 (``FullyShardedDataParallel``, which torch 2.13 refuses on CPU:
   "FSDP needs a non-CPU accelerator device").

6. zero: DeepSpeed ZeRO-3 over NCCL, a rank per GPU, saved through ``checkpoint.save(state)``
   with the engine in it (every rank its partition, DeepSpeed's own files), resumed by a second
   job with ``checkpoint.latest(state)``, against an unbroken run's output; each rank's part
   files, the step split and the GPU's peak memory. Needs DeepSpeed's wheel carried in.

7. trainer_fsdp: the Hugging Face Trainer as users configure FSDP
   (``TrainingArguments(fsdp="full_shard")``) over NCCL, a rank per GPU: whether Accelerate ran
   FSDP (on CPU ranks it runs DDP, and the job says so), its checkpoints, resumed from
   checkpoint-8 by a second job; the split and the GPU's peak memory.

Usage (on the GPU machine, from the repository's root, after installing .gpu_wheels):
    python3 scripts/gpu_check.py [guard,nccl,gloo,overhead,fsdp,zero,trainer_fsdp,profile]
(the parts whose names begin so; all but profile when none is named)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GUARD = """
import sys
sys.path.insert(0, {root!r})
from hvd_magics.notebook.gpu_guard import driver_gpu_holders, driver_gpu_message
import torch
before = driver_gpu_holders()
x = torch.ones(1, device="cuda")
after = driver_gpu_holders()
print("before:", [str(h) for h in before])
print("after:", [str(h) for h in after])
print("message:", driver_gpu_message(after).splitlines()[0] if after else "")
"""


def guard() -> dict:
    out = subprocess.run([sys.executable, "-c", GUARD.format(root=str(ROOT))],
                         capture_output=True, text=True, timeout=120)
    print(out.stdout + out.stderr[-2000:])
    ok = "before: []" in out.stdout and "PyTorch holds cuda:0" in out.stdout
    return {"guard_ok": ok}


def ddp_on_gpu(steps: int = 300, width: int = 4096, share: bool = False):
    """A DDP model on this rank's GPU (NCCL): trains ``steps`` steps of a wide MLP over a
    DataLoader; returns what the rank saw. ``share``: pick the device as ``LOCAL_RANK``
    modulo the GPUs the rank sees (ranks that share a GPU)."""
    import os

    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", 0))
    if share:
        local %= torch.cuda.device_count()
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    total = torch.tensor([float(dist.get_rank() + 1)], device="cuda")
    dist.all_reduce(total)
    net = torch.nn.Sequential(torch.nn.Linear(1024, width), torch.nn.ReLU(),
                              torch.nn.Linear(width, 10)).cuda()
    model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[local])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(steps * 256, 1024),
                                          torch.randint(0, 10, (steps * 256,)))
    loader = torch.utils.data.DataLoader(data, batch_size=256)
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    torch.cuda.synchronize()
    return {"rank": dist.get_rank(), "world": dist.get_world_size(),
            "backend": dist.get_backend(), "device": torch.cuda.get_device_name(local),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "sum": total.item(),
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "peak_gb": round(torch.cuda.max_memory_allocated() / 1024 ** 3, 3)}


def gloo_straggler(steps: int = 150, slower: float = 0.3):
    """Two ranks on the one GPU over gloo (NCCL refuses that): rank 1's steps do ``slower``
    more GPU work; every step reads its loss (``.item()``, as loops that log do)."""
    import os

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                              torch.nn.Linear(4096, 10)).cuda()
    model = torch.nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(steps * 64, 1024),
                                          torch.randint(0, 10, (steps * 64,)))
    heavy = torch.randn(4096, 4096, device="cuda")
    extra = int(20 * slower) if rank == 1 else 0
    for x, y in torch.utils.data.DataLoader(data, batch_size=64):
        x, y = x.cuda(), y.cuda()
        for _ in range(20 + extra):  # the step's GPU work
            heavy = torch.tanh(heavy @ heavy) * 0.5
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()
    return {"rank": rank, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


def gpu_loop(width: int, batch: int, steps: int) -> float:
    """In this process, one DDP rank (world of 1, NCCL) of a MLP on the GPU over a DataLoader
    of batches already on the GPU: seconds per step after 200 warm-up steps (the split is on
    unless ``HVD_MAGICS_STEP_SPLIT=0``)."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(20000 + os.getpid() % 20000),
                      RANK="0", WORLD_SIZE="1")
    if os.environ.get("HVD_MAGICS_STEP_SPLIT", "1") != "0":
        from hvd_magics.rank.instruments import gpu_steps, step_split

        step_split.install()
        variant = os.environ.get("GPU_CHECK_VARIANT", "")
        if variant == "host":  # the split on the host's clock: no GPU timing
            step_split.GpuSteps = lambda: None
        elif variant == "noevents":  # GPU timing's Python, with events that do nothing
            class _Done:
                def query(self):
                    return True

                def synchronize(self):
                    pass

                def elapsed_time(self, _other):
                    return 1.0

            gpu_steps._event = _Done
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    net = torch.nn.Sequential(torch.nn.Linear(1024, width), torch.nn.ReLU(),
                              torch.nn.Linear(width, width), torch.nn.ReLU(),
                              torch.nn.Linear(width, 10)).cuda()
    model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    xs = torch.randn(64, batch, 1024, device="cuda")
    ys = torch.randint(0, 10, (64, batch), device="cuda")
    loader = torch.utils.data.DataLoader(range(steps + 200), batch_size=None)
    began = 0.0
    for i, j in enumerate(loader):
        if i == 200:
            torch.cuda.synchronize()
            began = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(xs[j % 64]), ys[j % 64]).backward()
        optimizer.step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - began) / steps
    dist.destroy_process_group()
    return seconds


def overhead(runs: int = 3) -> dict:
    """Steps/s with the split on over off for a small and a wide DDP model on the GPU, each in a
    fresh process, on and off in turn ``runs`` times (the median of each)."""
    found = {}
    for name, width, batch, steps in (("small", 256, 64, 2000), ("wide", 4096, 512, 1000)):
        times: dict[str, list[float]] = {"on": [], "off": []}
        for _ in range(runs):
            for mode in ("on", "off"):
                code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                        f"sys.path.insert(0, {str(ROOT / 'scripts')!r}); import gpu_check; "
                        f"print(gpu_check.gpu_loop({width}, {batch}, {steps}))")
                env = {**os.environ, "HVD_MAGICS_STEP_SPLIT": "1" if mode == "on" else "0"}
                out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                     text=True, timeout=120, env=env)
                if out.returncode:
                    raise RuntimeError(out.stderr[-2000:])
                times[mode].append(float(out.stdout.strip().splitlines()[-1]))
        on, off = sorted(times["on"])[runs // 2], sorted(times["off"])[runs // 2]
        print(f"{name}: {1000 * on:.3f} ms a step with the split, {1000 * off:.3f} ms without; "
              f"steps/s on over off {off / on:.3f} (runs: on {times['on']}, off {times['off']})",
              flush=True)
        found[f"overhead_{name}_ratio"] = round(off / on, 3)
        found[f"overhead_{name}_step_ms"] = round(1000 * off, 3)
    return found


EVENT_COSTS = """
import time, torch
torch.cuda.init(); torch.ones(1, device="cuda")
def each(f, n=2000):
    t = time.perf_counter()
    for _ in range(n):
        f()
    return round(1e6 * (time.perf_counter() - t) / n, 2)
def make():
    e = torch.cuda.Event(enable_timing=True); e.record(); return e
a, b = make(), make(); torch.cuda.synchronize()
print("us: event made and recorded", each(make), "query", each(a.query),
      "elapsed_time", each(lambda: a.elapsed_time(b)), "perf_counter", each(time.perf_counter))
"""


def profile(runs: int = 3) -> dict:
    """Where the split's cost on the GPU goes: a CUDA event's cost, and the small loop with the
    split off, on, on with events that do nothing, and on the host's clock."""
    out = subprocess.run([sys.executable, "-c", EVENT_COSTS], capture_output=True, text=True,
                         timeout=120)
    print(out.stdout + out.stderr[-1500:], flush=True)
    times: dict[str, list[float]] = {}
    for _ in range(runs):
        for mode in ("off", "on", "noevents", "host"):
            code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                    f"sys.path.insert(0, {str(ROOT / 'scripts')!r}); import gpu_check; "
                    "print(gpu_check.gpu_loop(256, 64, 2000))")
            env = {**os.environ, "HVD_MAGICS_STEP_SPLIT": "0" if mode == "off" else "1",
                   "GPU_CHECK_VARIANT": mode}
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  timeout=120, env=env)
            if done.returncode:
                raise RuntimeError(done.stderr[-2000:])
            times.setdefault(mode, []).append(float(done.stdout.strip().splitlines()[-1]))
    median = {mode: sorted(t)[runs // 2] for mode, t in times.items()}
    print("small loop, ms a step (median of", runs, "):",
          {mode: round(1000 * t, 4) for mode, t in median.items()}, flush=True)
    return {f"profile_{mode}_ms": round(1000 * t, 4) for mode, t in median.items()}


class _KeepGpu:
    """A view that keeps what the ranks said of their GPU."""

    def on_event(self, job, event):
        if event.get("gpu"):
            self.gpu = event["gpu"]

    def on_tick(self, job):
        pass

    def on_end(self, job):
        pass


def straggler_on_gpu() -> dict:
    from hvd_magics import HorovodRunner
    from hvd_magics.launch.payload import serialize_job

    view = _KeepGpu()
    record = HorovodRunner(np=-2, engine="torch").run_payload(
        serialize_job(gloo_straggler, {}), views=[view])
    print(record)
    print("gpu reading:", getattr(view, "gpu", None))
    return {"gloo_status": record.status, "gloo_stragglers": record.stragglers,
            "gpu_reading": getattr(view, "gpu", None)}


def nccl(np: int, share: bool = False) -> dict:
    from hvd_magics import HorovodRunner

    began = time.monotonic()
    try:
        record = HorovodRunner(np=np, engine="torch").run_payload(_payload(share), views=[])
    except Exception as exc:  # noqa: BLE001 - what a user would see is the finding
        text = str(exc)
        print(f"np={np}: {type(exc).__name__}: {text[:3000]}")
        return {f"np{-np}{'_share' if share else ''}":
                f"{type(exc).__name__}: {text.splitlines()[0][:300]}"}
    print(f"np={np}: {time.monotonic() - began:.1f} s; value: {record.value}")
    print(record)
    return {f"np{-np}": record.status, f"np{-np}_split": record.step_split,
            f"np{-np}_stragglers": record.stragglers}


def fsdp_on_gpu(steps: int, save_at: int | None = None, resume: bool = False,
                asynchronous: bool = False, version: int = 2) -> dict:
    """An FSDP2 model (``version=1``: FSDP1's ``FullyShardedDataParallel``, which torch 2.13
    refuses on CPU) on this rank's GPU (NCCL), trained ``steps`` steps on data seeded by the
    step, saved at ``save_at`` (or resumed from the job's checkpoint); rank 0's digest of the
    full weights and where it started."""
    import hashlib
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    from hvd_magics import checkpoint

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    torch.manual_seed(0 if not resume else 7)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).cuda()
    if version == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = FullyShardedDataParallel(model, device_id=local)
    else:
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    state = {"model": model, "optimizer": optimizer, "step": 0}
    start = 0
    if resume:
        found = checkpoint.latest(state)
        assert found is not None, "nothing to resume from"
        start = found[1] + 1
    for step in range(start, steps):
        data = torch.Generator().manual_seed(step)
        batch = torch.randn(32, 2048, generator=data).cuda()
        optimizer.zero_grad()
        model(batch).pow(2).mean().backward()
        optimizer.step()
        state["step"] = step
        if step == save_at:
            checkpoint.save(state, step, asynchronous=asynchronous)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))
    hashed = hashlib.sha256()
    for name in sorted(full):
        hashed.update(full[name].float().numpy().tobytes())
    return {"start": start, "weights": hashed.hexdigest()[:16],
            "peak_gb": torch.cuda.max_memory_allocated() / 2**30}


def fsdp() -> dict:
    import tempfile

    import torch

    from hvd_magics import HorovodRunner, last_run
    from hvd_magics.launch.payload import serialize_job

    np = -torch.cuda.device_count()
    folder = tempfile.mkdtemp(prefix="gpu-check-fsdp-")
    found: dict = {}
    for name, kwargs in (("saved", {"steps": 20, "save_at": 9}),
                         ("resumed", {"steps": 20, "resume": True}),
                         ("async", {"steps": 20, "save_at": 9, "asynchronous": True}),
                         ("fsdp1_saved", {"steps": 20, "save_at": 9, "version": 1}),
                         ("fsdp1_resumed", {"steps": 20, "resume": True, "version": 1})):
        began = time.monotonic()
        try:
            record = HorovodRunner(np=np, engine="torch", checkpoint_dir=folder).run_payload(
                serialize_job(fsdp_on_gpu, kwargs), views=[])
        except Exception as exc:  # noqa: BLE001 - what a user would see is the finding
            found[f"fsdp_{name}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            print(f"fsdp {name}: {exc}")
            continue
        parts = sorted(p.name for p in Path(folder, "checkpoints").glob("ckpt-*/*"))
        split = last_run().step_split
        print(f"fsdp {name}: {time.monotonic() - began:.1f} s; {record.value}; parts {parts}; "
              f"split {split}")
        found[f"fsdp_{name}"] = {**record.value, "parts": parts,
                                 "comm_share": [round(r["comm_s"] / r["step_s"], 3)
                                                for r in split if r.get("step_s")]}
    for first, then in (("fsdp_saved", "fsdp_resumed"),
                        ("fsdp_fsdp1_saved", "fsdp_fsdp1_resumed")):
        saved, resumed = found.get(first), found.get(then)
        if isinstance(saved, dict) and isinstance(resumed, dict):
            found[f"{then}_same_weights"] = saved["weights"] == resumed["weights"]
    return found


def kept_on_gpu(steps: int = 20, kill_at: int | None = None, keep: bool = True) -> dict:
    """An FSDP2 model on this rank's GPU (NCCL) trained ``steps`` steps of AdamW, every step
    kept in the host's memory (``checkpoint.keep``: each rank's CUDA part copied to the host on
    a side stream while the next step runs) unless ``keep`` is false; rank 1 of the first
    attempt SIGKILLed right after keeping ``kill_at``. Rank 0's digest of the full weights,
    where it started, and its median step."""
    import hashlib
    import os
    import signal
    import statistics

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    from hvd_magics import checkpoint

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    state = {"model": model, "optimizer": optimizer}
    found = checkpoint.latest(state) if keep else None
    start = 0 if found is None else found[1] + 1
    times = []
    for step in range(start, steps):
        began = time.perf_counter()
        batch = torch.randn(64, 4096, generator=torch.Generator().manual_seed(step)).cuda()
        optimizer.zero_grad()
        model(batch).pow(2).mean().backward()
        optimizer.step()
        if keep:
            checkpoint.keep(state, step)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
        if step == kill_at and dist.get_rank() == 1 and checkpoint.attempt() == 0:
            os.kill(os.getpid(), signal.SIGKILL)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))
    hashed = hashlib.sha256()
    for name in sorted(full):
        hashed.update(full[name].float().numpy().tobytes())
    return {"start": start, "weights": hashed.hexdigest()[:16],
            "step_s": statistics.median(times[2:]) if len(times) > 4 else None}


def kept() -> dict:
    """Issue 84 on GPUs: FSDP2 parts on CUDA kept every step; the overhead against not keeping,
    and a rank killed at step 9 resumed from the hosts' memory with an unbroken run's weights."""
    import tempfile

    import torch

    from hvd_magics import HorovodRunner, last_run
    from hvd_magics.launch.payload import serialize_job

    np = -max(2, torch.cuda.device_count()) if torch.cuda.device_count() > 1 else -1
    found: dict = {}
    for name, kwargs, restarts in (("none", {"keep": False}, 0), ("kept", {}, 0),
                                   ("killed", {"kill_at": 9}, 1)):
        if name == "killed" and np == -1:
            continue  # one rank: nothing to kill beside it
        began = time.monotonic()
        try:
            record = HorovodRunner(np=np, engine="torch", restarts=restarts,
                                   checkpoint_dir=tempfile.mkdtemp()).run_payload(
                serialize_job(kept_on_gpu, kwargs), views=[])
        except Exception as exc:  # noqa: BLE001 - what a user would see is the finding
            found[f"kept_{name}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            continue
        found[f"kept_{name}"] = {**record.value, "kept": last_run().kept,
                                 "attempts": last_run().attempts}
        print(f"kept {name}: {time.monotonic() - began:.1f} s; {found[f'kept_{name}']}")
    none, kept_, killed = (found.get(f"kept_{n}") for n in ("none", "kept", "killed"))
    if isinstance(none, dict) and isinstance(kept_, dict) and none.get("step_s"):
        found["kept_overhead"] = kept_["step_s"] / none["step_s"] - 1
    if isinstance(kept_, dict) and isinstance(killed, dict):
        found["kept_killed_same_weights"] = kept_["weights"] == killed["weights"]
    return found


def zero_on_gpu(steps: int, stage: int = 3, resume: bool = False) -> dict:
    """A DeepSpeed engine (ZeRO ``stage``) on this rank's GPU (NCCL), trained ``steps`` steps
    on data seeded by the step and rank, saved at step 9 with ``checkpoint.save(state)`` (or
    resumed with ``checkpoint.latest(state)``); the model's output on a fixed batch."""
    import os

    import deepspeed
    import torch

    from hvd_magics import checkpoint

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(0 if not resume else 7)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(),
        config={"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": stage},
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})
    state = {"engine": engine, "step": -1}
    found = checkpoint.latest(state) if resume else None
    start = 0 if found is None else found[1] + 1
    for step in range(start, steps):
        data = torch.Generator().manual_seed(step * 10 + engine.global_rank)
        batch = torch.randn(8, 1024, generator=data).to(engine.device)
        engine.backward(engine(batch).pow(2).mean())
        engine.step()
        if step == 9 and not resume:
            state["step"] = step
            checkpoint.save(state, step)
    with torch.no_grad():
        probe = engine(torch.ones(2, 1024, device=engine.device)).sum().item()
    return {"start": start, "probe": probe,
            "peak_gb": torch.cuda.max_memory_allocated() / 2**30}


def zero() -> dict:
    """DeepSpeed ZeRO-3 over NCCL through checkpoint.save(engine) and latest(engine): saved
    at step 9 of 20, resumed at 10 by a second job; the same output as an unbroken run."""
    import tempfile

    import torch

    try:
        import deepspeed  # noqa: F401 - carried in .gpu_wheels when it is to be checked
    except ImportError as exc:
        print(f"zero: DeepSpeed is not installed here ({exc}): carry its wheel to check it")
        return {"zero": "DeepSpeed not installed"}
    from hvd_magics import HorovodRunner, last_run
    from hvd_magics.launch.payload import serialize_job

    np = -torch.cuda.device_count()
    folder = tempfile.mkdtemp(prefix="gpu-check-zero-")
    found: dict = {}
    for name, kwargs, where in (("saved", {"steps": 20}, folder),
                                ("resumed", {"steps": 20, "resume": True}, folder),
                                ("unbroken", {"steps": 20}, tempfile.mkdtemp())):
        try:
            record = HorovodRunner(np=np, engine="torch", checkpoint_dir=where).run_payload(
                serialize_job(zero_on_gpu, kwargs), views=[])
        except Exception as exc:  # noqa: BLE001 - what a user would see is the finding
            found[f"zero_{name}"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            print(f"zero {name}: {exc}")
            continue
        parts = sorted(p.name for p in Path(folder, "checkpoints").glob("ckpt-*/deepspeed/*"))
        print(f"zero {name}: {record.value}; parts {parts}; split {last_run().step_split}")
        found[f"zero_{name}"] = {**record.value, "parts": parts}
    resumed, unbroken = found.get("zero_resumed"), found.get("zero_unbroken")
    if isinstance(resumed, dict) and isinstance(unbroken, dict):
        found["zero_resumed_as_unbroken"] = resumed["probe"] == unbroken["probe"]
    return found


def trainer_fsdp_on_gpu(output_dir: str, steps_done: int | None = None) -> dict:
    """A small BERT classifier trained by the Hugging Face Trainer with
    ``TrainingArguments(fsdp="full_shard")`` on this rank's GPU, saved every 8 steps; with
    ``steps_done``, the checkpoints after that step removed first (rank 0) and training resumed
    from the newest left. Whether Accelerate ran FSDP, the steps and the final loss."""
    import os
    import shutil

    import torch
    from transformers import (BertConfig, BertForSequenceClassification, Trainer,
                              TrainingArguments)

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if steps_done is not None and int(os.environ["RANK"]) == 0:
        for folder in os.listdir(output_dir):
            if folder.startswith("checkpoint-") and int(folder.split("-")[1]) > steps_done:
                shutil.rmtree(os.path.join(output_dir, folder))
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=512, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=1024))
    data = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(0, 512, (64,), generator=data), "labels": i % 2}
            for i in range(512)]
    args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=16,
                             num_train_epochs=1, save_steps=8, report_to=[], fsdp="full_shard",
                             seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()  # rank 0 removed what it removes before any rank looks
    result = trainer.train(resume_from_checkpoint=steps_done is not None or None)
    return {"fsdp": bool(trainer.is_fsdp_enabled), "steps": result.global_step,
            "loss": float(result.training_loss),
            "peak_gb": torch.cuda.max_memory_allocated() / 2**30}


def trainer_fsdp() -> dict:
    """The Hugging Face Trainer with fsdp="full_shard" over NCCL, a rank per GPU: trained and
    saved every 8 steps, then resumed from checkpoint-8 by a second job."""
    import tempfile

    import torch

    from hvd_magics import HorovodRunner, last_run
    from hvd_magics.launch.payload import serialize_job

    np = -torch.cuda.device_count()
    folder = tempfile.mkdtemp(prefix="gpu-check-trainer-fsdp-")
    found: dict = {}
    for name, kwargs in (("trained", {"output_dir": folder}),
                         ("resumed", {"output_dir": folder, "steps_done": 8})):
        try:
            record = HorovodRunner(np=np, engine="torch").run_payload(
                serialize_job(trainer_fsdp_on_gpu, kwargs), views=[])
        except Exception as exc:  # noqa: BLE001 - what a user would see is the finding
            found[f"trainer_fsdp_{name}"] = (f"{type(exc).__name__}: "
                                              f"{str(exc).splitlines()[0][:300]}")
            print(f"trainer fsdp {name}: {exc}")
            continue
        saved = sorted(p.name for p in Path(folder).glob("checkpoint-*/*"))[:12]
        print(f"trainer fsdp {name}: {record.value}; files {saved}; split "
              f"{last_run().step_split}")
        found[f"trainer_fsdp_{name}"] = record.value
    return found


def _payload(share: bool) -> bytes:
    from hvd_magics.launch.payload import serialize_job

    return serialize_job(ddp_on_gpu, {"share": share})  # a function of __main__: pickled by value


def main() -> None:
    import torch

    only = sys.argv[1].split(",") if len(sys.argv) > 1 else []

    print("torch", torch.__version__, "cuda", torch.version.cuda, "devices",
          torch.cuda.device_count(), torch.cuda.get_device_name(0))
    found: dict = {}
    for name, part in (("guard", guard), ("nccl np=-1", lambda: nccl(-1)),
                       ("nccl np=-2", lambda: nccl(-2)),
                       ("nccl np=-2 sharing", lambda: nccl(-2, share=True)),
                       ("gloo straggler on the GPU", straggler_on_gpu),
                       ("overhead of the split on the GPU", overhead),
                       ("fsdp over nccl with sharded checkpoints", fsdp),
                       ("zero: deepspeed over nccl with its checkpoints", zero),
                       ("trainer_fsdp: the hugging face trainer with fsdp", trainer_fsdp),
                       ("kept: every step kept in the hosts' memory", kept),
                       ("profile", profile)):
        if only and not any(name.startswith(part) for part in only) or (
                not only and name == "profile"):
            continue
        print(f"== {name}", flush=True)
        try:
            found.update(part())
        except Exception:  # noqa: BLE001 - one part's failure must not hide the others
            traceback.print_exc()
            found[name] = "crashed"
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_check.json").write_text(json.dumps(found, indent=1, default=str))
    print("gpu_check", json.dumps({k: v for k, v in found.items() if "split" not in k},
                                  default=str))


if __name__ == "__main__":
    main()
