"""One rank of a PyTorch :class:`~hvd_magics.estimator.HorovodEstimator` fit (see
:mod:`hvd_magics.rank.fits.estimator_fit` for the common plan)."""
from __future__ import annotations

import io
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np

from hvd_magics.rank.api import progress
from hvd_magics.protocol import TORCH
from hvd_magics.common.checkpoints import Position
from hvd_magics.rank.fits.fit_common import (FitBook, FitResult, classifier_output, labels_of,
                                        start_state, step_seed)
from hvd_magics.common.fit_spec import DEFAULT_LEARNING_RATE, FitSpec, OptimizerRecipe

_LOSSES = {"cross_entropy": "CrossEntropyLoss", "nll": "NLLLoss", "nll_loss": "NLLLoss",
           "mse": "MSELoss", "mean_squared_error": "MSELoss", "l1": "L1Loss", "mae": "L1Loss",
           "mean_absolute_error": "L1Loss", "bce": "BCELoss", "binary_crossentropy": "BCELoss",
           "bce_with_logits": "BCEWithLogitsLoss", "huber": "HuberLoss",
           "smooth_l1": "SmoothL1Loss"}
_OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop",
               "adagrad": "Adagrad", "adadelta": "Adadelta", "adamax": "Adamax", "nadam": "NAdam"}
#: Metrics a PyTorch fit computes by name (the loss is always there).
TORCH_METRICS = ("accuracy", "mae", "mse")
#: Losses that compare the output with float targets (labels are converted once, not per step).
_FLOAT_TARGETS = ("BCELoss", "BCEWithLogitsLoss", "MSELoss", "L1Loss", "HuberLoss", "SmoothL1Loss")


def torch_loss(loss: Any) -> Callable:
    """A loss callable ``(output, target) -> tensor`` from a name, a loss module or a function."""
    import torch

    if isinstance(loss, str):
        if loss.lower() not in _LOSSES:
            raise ValueError(f"unknown PyTorch loss {loss!r}; use one of {sorted(_LOSSES)}, a "
                             "torch.nn loss module or a function (output, label) -> loss")
        return getattr(torch.nn, _LOSSES[loss.lower()])()
    if not callable(loss):
        raise ValueError(f"loss must be a name, a torch.nn loss module or a function; got {loss!r}")
    return loss


def torch_optimizer(spec: FitSpec, model: Any, size: int) -> Any:
    """The optimizer of ``spec`` over ``model``'s parameters, its learning rate scaled by ``size``
    when the spec says so."""
    import torch

    recipe: OptimizerRecipe = spec.optimizer
    if recipe.kind == "factory":
        optimizer = recipe.value(model.parameters())
    else:
        if recipe.kind == "name":
            name = str(recipe.value).lower()
            if name not in _OPTIMIZERS:
                raise ValueError(f"unknown PyTorch optimizer {recipe.value!r}; use one of "
                                 f"{sorted(_OPTIMIZERS)}, a torch.optim class or instance, or a "
                                 "function of the model's parameters")
            kind = getattr(torch.optim, _OPTIMIZERS[name])
        else:  # "class" or "torch_instance" (its class and defaults)
            kind = recipe.value
        options = dict(recipe.options)
        options["lr"] = spec.learning_rate if spec.learning_rate is not None \
            else options.get("lr", DEFAULT_LEARNING_RATE)
        optimizer = kind(model.parameters(), **options)
    if spec.scale_learning_rate:
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * size
    return optimizer


def _targets(labels: Any, loss_fn: Any) -> Any:
    """The labels as ``loss_fn`` compares them (floats for regression and binary losses)."""
    return labels.float() if type(loss_fn).__name__ in _FLOAT_TARGETS else labels


def _shaped(target: Any, output: Any) -> Any:
    """A 1-D float target beside an ``(n, 1)`` output, as ``(n, 1)`` (no broadcasting)."""
    if target.dim() == 1 and output.dim() == 2 and output.shape[1] == 1 and \
            target.dtype.is_floating_point:
        return target.view(-1, 1)
    return target


def _forward(model: Any, inputs: list[Any], names: list[str] | None) -> Any:
    return model(**dict(zip(names, inputs))) if names else model(*inputs)


class _Sums:
    """Per-epoch sums of loss and metrics on this rank, kept as one tensor (no conversion per
    step), averaged over every rank's rows at the epoch's end."""

    def __init__(self, metrics: list[str], classifier: bool) -> None:
        self.names = ["loss"] + [m for m in metrics if m != "accuracy" or classifier]
        self.totals: Any = None  # a float64 tensor: one sum per name, then the row count

    def add(self, output: Any, target: Any, loss: Any) -> None:
        import torch

        rows = len(target)
        values = []
        for name in self.names:
            if name == "loss":
                values.append(loss * rows)
            elif name == "accuracy":
                guess = output.argmax(1) if output.dim() == 2 and output.shape[1] > 1 \
                    else (output.view(-1) > 0.5).long()
                values.append((guess == target.view(-1).long()).sum())
            else:
                error = output.view(-1) - target.view(-1).to(output.dtype)
                values.append(error.abs().sum() if name == "mae" else (error ** 2).sum())
        step = torch.stack([v.to(torch.float64) for v in values]
                           + [torch.tensor(float(rows), dtype=torch.float64)])
        self.totals = step if self.totals is None else self.totals + step

    def averages(self, hvd: Any, prefix: str = "") -> dict[str, float]:
        import torch

        totals = self.totals if self.totals is not None else \
            torch.zeros(len(self.names) + 1, dtype=torch.float64)
        summed = hvd.allreduce(totals, op=hvd.Sum, name=f"hvd_magics_metrics_{prefix}")
        rows = max(float(summed[-1]), 1.0)
        return {prefix + name: float(summed[i]) / rows for i, name in enumerate(self.names)}


def _save_final(model: Any, model_dir: str | None, example: list[Any], names: list[str] | None
                ) -> bytes:
    """``model.pt`` (the whole module), ``state_dict.pt`` and, when ``torch.export`` can
    capture it, ``model.pt2`` in the model directory; the module's bytes for ``transform``."""
    import cloudpickle
    import torch

    buffer = io.BytesIO()
    torch.save(model, buffer, pickle_module=cloudpickle)
    blob = buffer.getvalue()
    if model_dir:
        folder = Path(model_dir)
        (folder / "model.pt").write_bytes(blob)
        torch.save(model.state_dict(), folder / "state_dict.pt")
        try:
            batch = torch.export.Dim("batch")
            exported = torch.export.export(
                model, () if names else tuple(example),
                kwargs=dict(zip(names, example)) if names else None,
                dynamic_shapes=({n: {0: batch} for n in names} if names
                                else tuple({0: batch} for _ in example)))
            torch.export.save(exported, str(folder / "model.pt2"))
        except Exception as exc:  # noqa: BLE001 - a convenience; model.pt is there
            print(f"hvd_magics: no model.pt2 ({type(exc).__name__}: {str(exc)[:200]}); "
                  "load model.pt with torch.load(path, weights_only=False)")
    return blob


def fit_torch(spec: FitSpec, model: Any, train: Any, val: Any) -> FitResult | None:
    """Train ``model`` (a ``torch.nn.Module``) on this rank's ``train`` shard (``val``: the
    validation shard, or ``None``) as ``spec`` says.

    Returns
    -------
    FitResult or None
        Rank 0's result; ``None`` on the other ranks.

    Raises
    ------
    ValueError
        For a loss, an optimizer or a metric a PyTorch fit does not know by that name.
    """
    import horovod.torch as hvd
    import torch

    hvd.init()
    output_kind = classifier_output(spec.loss, spec.classifier)
    loss_fn = torch_loss(spec.loss)
    optimizer, book = _start(spec, model, hvd)
    data = _TorchData(spec, train, val, output_kind is not None, loss_fn)
    steps = train.steps_per_epoch(spec.batch_size, spec.remainder)
    metrics = _metric_names(spec)
    global_step, rank = book.position.global_step, hvd.rank()
    for epoch, first, count in book.plan(steps):
        batches = train.batch_rows(spec.batch_size, spec.shuffle, spec.seed + epoch,
                                   spec.remainder)[first:first + count]
        progress.start_epoch(epoch + 1, spec.epochs, steps, spec.batch_size)
        model.train()
        sums = _Sums(metrics, output_kind is not None)
        for index, rows in enumerate(batches):
            loss = _step(spec, model, optimizer, loss_fn, data, rows,
                         step_seed(spec.seed, rank, global_step), sums)
            global_step += 1
            progress.report(first + index + 1, loss=loss)
            book.after_step(epoch, first + index + 1, steps, global_step)
        logs = sums.averages(hvd)
        if data.val_xs is not None:  # (a validation set)
            logs.update(_evaluate(model, loss_fn, data.val_xs, data.val_ys, spec, output_kind,
                                  hvd))
        progress.end_epoch(samples=count * spec.batch_size, **logs)
        book.end_epoch(epoch, first, count, steps, global_step, logs)
    if not book.close():
        return None
    model.eval()
    example = _gather(data.xs, np.arange(min(2, len(data.ys))))
    blob = _save_final(model, spec.model_dir, example, spec.input_names)
    with torch.no_grad():
        output_size = int(np.prod(_forward(model, example, spec.input_names).shape[1:]))
    steps_taken = [int(s["step"]) for s in optimizer.state_dict()["state"].values()
                   if "step" in s]
    return book.result(TORCH, blob, output_kind, output_size, steps,
                       max(steps_taken) if steps_taken else global_step)


def _start(spec: FitSpec, model: Any, hvd: Any) -> tuple[Any, FitBook]:
    """Every rank restored to rank 0's start state (its latest checkpoint, else the fresh model
    and optimizer); Horovod's optimizer, which steps, and the fit's book, which saves it."""
    import torch

    optimizer = torch_optimizer(spec, model, hvd.size())
    state, found = start_state(
        spec, hvd.rank(), lambda: {"model": model.state_dict(),
                                   "optimizer": optimizer.state_dict(),
                                   "position": asdict(Position()), "history": []},
        lambda path: torch.load(path, weights_only=False),
        lambda value: hvd.broadcast_object(value, root_rank=0, name="hvd_magics_start_state"))
    model.load_state_dict(state["model"])
    # Horovod's DistributedOptimizer is a new optimizer over the same parameter groups, with a
    # state of its own: that one steps, so that one is restored and saved.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    optimizer.load_state_dict(state["optimizer"])
    book = FitBook(spec, hvd.rank(), state, found, lambda path, at, history: torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
         "position": asdict(at), "history": history}, path), "pt")
    return optimizer, book


class _TorchData:
    """The shard's inputs, left in its mapped files (a batch is gathered from them), and its
    labels, small, made tensors once as the loss compares them; the same of the validation
    shard (``None`` without one)."""

    def __init__(self, spec: FitSpec, train: Any, val: Any, classifier: bool,
                 loss_fn: Any) -> None:
        import torch

        self.xs = [train.feature_rows(column) for column in spec.features]
        self.val_xs = ([val.feature_rows(column) for column in spec.features]
                       if val is not None else None)
        with warnings.catch_warnings():  # read-only views of the shard file, never written
            warnings.simplefilter("ignore", UserWarning)
            self.ys = _targets(torch.as_tensor(labels_of(train, spec, classifier)), loss_fn)
            self.val_ys = _targets(torch.as_tensor(labels_of(val, spec, classifier)),
                                   loss_fn) if val is not None else None


def _metric_names(spec: FitSpec) -> list[str]:
    """The metrics of ``spec`` a PyTorch fit computes by name.

    Raises
    ------
    ValueError
        For a metric not in :data:`TORCH_METRICS`.
    """
    metrics = [m for m in spec.metrics if isinstance(m, str)]
    unknown = [m for m in metrics if m not in TORCH_METRICS]
    if unknown:
        raise ValueError(f"unknown PyTorch metrics {unknown}; use {list(TORCH_METRICS)}")
    return metrics


def _step(spec: FitSpec, model: Any, optimizer: Any, loss_fn: Any, data: _TorchData,
          rows: np.ndarray, seed: int, sums: _Sums) -> Any:
    """One training step over the batch ``rows``, its draws seeded by ``seed``, added to
    ``sums``; its loss (detached)."""
    import torch

    # the CPU generator, where the fit's draws come from: torch.manual_seed also
    # seeds every accelerator backend: 0.85 ms a step, a quarter of a 784-256-10 MLP's
    torch.default_generator.manual_seed(seed)
    optimizer.zero_grad()
    output = _forward(model, _gather(data.xs, rows), spec.input_names)
    target = _shaped(data.ys[torch.from_numpy(rows)], output)
    loss = loss_fn(output, target)
    loss.backward()
    optimizer.step()
    sums.add(output.detach(), target, loss.detach())
    return loss.detach()


def _gather(xs: list[Any], rows: np.ndarray) -> list[Any]:
    """The model inputs of the rows ``rows`` (an index array): one numpy gather out of each
    input's mapped file (faster than indexing a tensor made from it), made a tensor without a
    copy."""
    import torch

    return [torch.from_numpy(x[rows]) for x in xs]


def _evaluate(model: Any, loss_fn: Any, xs: list[Any], ys: Any, spec: FitSpec,
              output_kind: str | None, hvd: Any) -> dict[str, float]:
    import torch

    model.eval()
    sums = _Sums([m for m in spec.metrics if isinstance(m, str)], output_kind is not None)
    size = spec.batch_size
    with torch.no_grad():
        for start in range(0, len(ys), size):
            rows = np.arange(start, min(start + size, len(ys)))
            output = _forward(model, _gather(xs, rows), spec.input_names)
            target = _shaped(ys[start:start + size], output)
            sums.add(output, target, loss_fn(output, target))
    return sums.averages(hvd, "val_")
