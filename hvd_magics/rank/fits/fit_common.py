"""What the Keras and PyTorch loops of a :class:`~hvd_magics.estimator.HorovodEstimator` fit
share: the fit's skeleton around the framework's steps (:class:`FitBook`: the start state from
the latest checkpoint, the epochs still to run, timed and per-epoch checkpoints, the history and
event files, rank 0's result), how a classifier's output becomes probabilities, the shard's
inputs and labels, the learning rate, the seed of each step, and the result rank 0 sends back
(:class:`FitResult`). Each framework supplies its steps and how its state is written and read."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np

from hvd_magics.protocol import (OUTPUT_EXP, OUTPUT_PROBABILITY, OUTPUT_SIGMOID,
                                 OUTPUT_SOFTMAX)
from hvd_magics.rank.api import preemption
from hvd_magics.common.checkpoints import Position, epoch_plan, latest_checkpoint, write_checkpoint
from hvd_magics.rank.fits.event_files import EventFiles
from hvd_magics.common.fit_spec import FitSpec

SOFTMAX, SIGMOID, EXP, PROBABILITY = OUTPUT_SOFTMAX, OUTPUT_SIGMOID, OUTPUT_EXP, OUTPUT_PROBABILITY

_CLASSIFICATION_LOSSES = {
    # name (a string loss, or a loss class's name, lower case) -> output unless from_logits
    "sparse_categorical_crossentropy": PROBABILITY, "sparsecategoricalcrossentropy": PROBABILITY,
    "categorical_crossentropy": PROBABILITY, "categoricalcrossentropy": PROBABILITY,
    "binary_crossentropy": PROBABILITY, "binarycrossentropy": PROBABILITY,
    "cross_entropy": SOFTMAX, "crossentropyloss": SOFTMAX,
    "nll": EXP, "nll_loss": EXP, "nllloss": EXP,
    "bce": PROBABILITY, "bceloss": PROBABILITY,
    "bce_with_logits": SIGMOID, "bcewithlogitsloss": SIGMOID,
}


@dataclass
class FitResult:
    """What rank 0 of a fit sends back: the trained model and what the driver's model tells of
    it (see :class:`~hvd_magics.estimator.HorovodModel`)."""

    framework: str  # protocol.KERAS or protocol.TORCH
    model: bytes  # model.keras, or the torch module saved with cloudpickle
    output: str | None  # how a classifier's output becomes probabilities; None: not one
    output_size: int
    history: list[dict[str, Any]]
    position: dict[str, int]
    resumed_from: dict[str, int] | None
    steps_per_epoch: int
    optimizer_step: int


#: ``write(path, position, history)``: a framework writes its whole training state to ``path``.
StateWriter = Callable[[Path, Position, list], None]


def start_state(spec: FitSpec, rank: int, fresh: Callable[[], dict[str, Any]],
                load: Callable[[Path], dict[str, Any]], broadcast: Callable[[Any], Any]
                ) -> tuple[dict[str, Any], tuple[Position, Path] | None]:
    """The state every rank starts from (rank 0 reads the latest checkpoint of the model
    directory with ``load``, or takes ``fresh()``; ``broadcast`` hands it to every rank), and
    the checkpoint it came from (rank 0 only; ``None`` elsewhere or when none was found)."""
    found = latest_checkpoint(spec.model_dir) if rank == 0 else None
    state = (load(found[1]) if found else fresh()) if rank == 0 else None
    return broadcast(state), found


@dataclass
class FitBook:
    """The bookkeeping of one rank's fit, the same for every framework: where training stands,
    the epochs still to run, the history of every fit so far, the event files and checkpoints
    (written by rank 0 only, with the framework's ``write``), and rank 0's result."""

    spec: FitSpec
    rank: int
    state: dict[str, Any]  # the start state (see :func:`start_state`)
    found: tuple[Position, Path] | None
    write: StateWriter
    extension: str  # of the checkpoint files: "pkl", "pt"
    history: list[dict[str, Any]] = field(init=False)
    position: Position = field(init=False)
    events: EventFiles | None = field(init=False)
    saved_at: float = field(init=False)
    #: A preemption notice came at an epoch's last step: the attempt ends once the epoch is
    #: recorded and saved (:meth:`end_epoch`).
    noticed: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.history = list(self.state.get("history") or [])  # of earlier fits too
        self.position = Position(**self.state["position"])
        model_dir = self.spec.model_dir  # (set where this rank writes)
        self.events = EventFiles(model_dir) if self.writes and model_dir is not None else None
        self.saved_at = time.monotonic()

    @property
    def writes(self) -> bool:
        """Whether this rank writes the fit's files (rank 0, with a model directory)."""
        return bool(self.spec.model_dir) and self.rank == 0

    def plan(self, steps: int) -> list[tuple[int, int, int]]:
        """The ``(epoch, first step, steps)`` still to run (see
        :func:`~hvd_magics.common.checkpoints.epoch_plan`)."""
        return epoch_plan(self.position, steps, self.spec.epochs, self.spec.max_steps)

    def checkpoint_due(self, done: int, steps: int) -> bool:
        """Whether rank 0 saves inside the epoch after step ``done`` of ``steps``
        (``checkpoint_secs`` have passed since the last save, and the epoch is not over)."""
        return self.writes and self.spec.checkpoint_secs is not None and done < steps and \
            time.monotonic() - self.saved_at >= self.spec.checkpoint_secs

    def after_step(self, epoch: int, done: int, steps: int, global_step: int) -> None:
        """After step ``done`` of ``steps`` of ``epoch`` (``global_step`` optimizer steps in
        all), on every rank: rank 0's timed checkpoint when due; on a preemption notice (the same
        step on every rank; asked only by a fit with a model directory), rank 0's checkpoint of
        this step and the attempt's end (:class:`~hvd_magics.errors.Preempted`), at an epoch's
        last step once the epoch is recorded."""
        if self.spec.model_dir and preemption.preempting():
            if done >= steps:  # end_epoch records the epoch and saves where the next begins
                self.noticed = True
                return
            if self.writes:
                self.save(Position(epoch, done, global_step))
            preemption.after_save(global_step)
        if self.checkpoint_due(done, steps):
            self.save(Position(epoch, done, global_step))

    def save(self, at: Position) -> None:
        assert self.spec.model_dir is not None  # only a rank that writes saves
        write_checkpoint(self.spec.model_dir, at, self.extension,
                         lambda path: self.write(path, at, self.history),
                         self.spec.keep_checkpoints)
        self.saved_at = time.monotonic()

    def end_epoch(self, epoch: int, first: int, count: int, steps: int, global_step: int,
                  logs: dict[str, float]) -> Position:
        """Record an epoch (or the part of one) that ran ``count`` steps from ``first``: its
        history line and event files, and rank 0's checkpoint; return where training stands."""
        done = first + count == steps
        self.position = Position(epoch + 1, 0, global_step) if done else \
            Position(epoch, first + count, global_step)
        self.history.append({"epoch": epoch + 1, "global_step": global_step, **logs})
        if self.events is not None:
            self.events.write(epoch + 1, logs)
        if self.writes:
            self.save(self.position)
        if self.noticed:
            preemption.after_save(global_step)
        return self.position

    def close(self) -> bool:
        """Close the event files; whether this rank sends the result (rank 0)."""
        if self.events is not None:
            self.events.close()
        return self.rank == 0

    def result(self, framework: str, model: bytes, output: str | None, output_size: int,
               steps: int, optimizer_step: int) -> FitResult:
        return FitResult(framework, model, output, output_size, self.history,
                         asdict(self.position), asdict(self.found[0]) if self.found else None,
                         steps, optimizer_step)


def classifier_output(loss: Any, classifier: bool | None) -> str | None:
    """How ``transform`` gets probabilities from the model's output (``None``: not a classifier),
    from the loss (its name, its class and ``from_logits``) unless ``classifier`` says."""
    name = loss if isinstance(loss, str) else type(loss).__name__
    if not isinstance(loss, str) and getattr(loss, "__name__", None):
        name = loss.__name__  # a loss function
    kind = _CLASSIFICATION_LOSSES.get(str(name).lower())
    config: Any = getattr(loss, "get_config", lambda: {})()
    if kind == PROBABILITY and isinstance(config, dict) and config.get("from_logits"):
        kind = SIGMOID if "binary" in str(name).lower() else SOFTMAX
    if classifier is False:
        return None
    return kind or (PROBABILITY if classifier else None)


def inputs_of(shard: Any, spec: FitSpec) -> list[np.ndarray]:
    """The model inputs of ``shard``'s rows: one 2-D float32 array per feature column."""
    return [shard.feature_matrix(column) for column in spec.features]


def labels_of(shard: Any, spec: FitSpec, classifier: bool) -> np.ndarray:
    labels = shard.to_numpy(spec.label)
    if classifier and labels.dtype.kind in "fiub" and labels.ndim == 1:
        if labels.dtype.kind == "f" and not np.all(np.mod(labels, 1) == 0):
            return labels.astype(np.float32)
        return labels.astype(np.int64)
    return labels.astype(np.float32) if labels.dtype.kind in "fiub" else labels


def scaled_learning_rate(spec: FitSpec, size: int, default: float) -> float:
    rate = spec.learning_rate if spec.learning_rate is not None else default
    return rate * size if spec.scale_learning_rate else rate


def step_seed(seed: int, rank: int, global_step: int) -> int:
    """The random seed of one rank's training step: what a step draws (dropout) depends only on
    the fit's seed, the rank and the step, so a resumed fit draws what the uninterrupted one
    did."""
    return (seed * 1_000_003 + global_step * 1_009 + rank) % (2 ** 31 - 1)
