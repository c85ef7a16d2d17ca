"""TensorFlow's training steps for :mod:`hvd_magics.rank.instruments.step_split`: a Keras ``fit``
or a custom loop under Horovod's TensorFlow API (``horovod.tensorflow.keras``'s and
``horovod.keras``'s ``DistributedOptimizer``, ``hvd.DistributedGradientTape``,
``horovod.tensorflow``'s ``DistributedOptimizer``), and a Keras optimizer's steps under
``MultiWorkerMirroredStrategy`` (the ``tf`` engine: a replica on each worker): Keras 2's, and
Keras 3's ``TFOptimizer`` in a custom loop of ``strategy.run`` steps.

Such a step runs as one graph call, which hides its parts from Python, so the clock is read
inside the graph, by ``tf.timestamp`` ops added where the step's gradients are reduced
(Horovod's ``_make_allreduce_grads_fn``, which each of its APIs calls; Keras 2's
``all_reduce_sum_gradients`` and Keras 3's ``TFOptimizer._all_reduce_sum_gradients`` under the
strategy) and where a ``tf.data`` iterator hands over a
batch:

- a step ends when its gradients' reduction completes; it lasts from the end of the one
  before;
- **communication**: from the moment every gradient of the step was ready to that end (as a DDP
  step's: a rank the others wait for has its last gradient late, and its reduction then ends at
  once); under the strategy, also its check before each step that every worker has a batch
  (a collective: the others wait there for a worker whose batch is late), in the graph or made
  eagerly (a custom loop's ``for batch in dist_dataset``: timed by Python's clock);
- **input**: the time in the step's ``IteratorGetNext`` (the wait for ``tf.data``'s next
  batch), and in batches a custom loop takes eagerly (``for batch in dataset``) since the last
  step;
- **compute**: the rest.

A clock waits for the tensors' values, not for the ops that make them (a control edge from a
``tf.cond`` or a function call, as Horovod's reductions are, waits only for their stateful
ops), and is made before the reduction it precedes (TensorFlow runs stateful ops, clocks and
the strategy's collectives among them, in the order they were made).

The readings go into a ring of :data:`RING` rows in a variable on the CPU (a plain one, never a
strategy's), which a thread of the rank reads every ``SEND_EVERY_S`` seconds
(:mod:`hvd_magics.rank.instruments.step_split`): per step, four clock reads and a few small writes
inside the graph (and a write per batch taken eagerly), nothing read by Python, no device
synchronised. A step run eagerly under Horovod (no ``tf.function``) is timed by Python's clock
around the same calls. The CPU time of a rank's work is not read (TensorFlow computes on threads of
its own), so the straggler's cause is never said to be a wait for a CPU, and a compute verdict says
that a busy host is not told apart (the rows' events say ``cpu_read: false``). On a GPU the clock is
the host's, as for Horovod's torch ops: where the graph's executor sees a kernel done.

Not covered: other ``tf.distribute`` strategies (several replicas in one process), a custom
loop that reduces its gradients itself (``ctx.all_reduce``) rather than through a Keras
optimizer, a graph compiled by XLA (``jit_compile=True``: ``tf.timestamp`` has no XLA kernel,
so such a graph is left as it is), and TensorFlow 1's sessions.
"""
from __future__ import annotations

import functools
import threading
import time
from typing import Any
from collections.abc import Callable

from hvd_magics.rank.guards.import_hooks import after_import

#: Rows the ring keeps: steps shorter than a 1024th of the time between two reads would be lost.
RING = 1024
_PATCHED = "_hvd_magics_step_split_tf"
#: Where a graph keeps its step's waits until the step's row takes them: for input, and in
#: collectives before the gradients' reduction.
_INPUT_WAITS, _COMM_WAITS = "_hvd_magics_input", "_hvd_magics_comm"
#: A ring row: ``(index, input_s, ready, done)``: the step's count from 0 (``-1``: no step
#: yet), its seconds in ``IteratorGetNext``, and the clock when its gradients were all ready
#: and when their allreduce completed.
_COLUMNS = 4


class _Recorder:
    """The ring variable (made on the first step traced) and the reader's place in it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ring: Any = None
        self.count: Any = None
        #: Seconds of the step under way spent in batches taken eagerly (a custom loop's
        #: ``for batch in dataset``), and in the strategy's check for every worker's batch
        #: made eagerly (that loop over a distributed dataset), until a step's row takes them
        #: (CPU variables).
        self.pending: Any = None
        self.pending_comm: Any = None
        #: The latest index read, the end of that step (``None``: none yet, or a new cell)
        #: and the index below which rows belong to an earlier cell.
        self.read = -1
        self.last_done: float | None = None
        self.first = 0


_recorder = _Recorder()
def _on_first_step() -> None:
    return None


def _make_ring(tf: Any) -> None:
    """The ring and its counters: plain variables on the CPU, made eagerly, never a
    strategy's (``ResourceVariable`` itself passes by the creators a ``tf.distribute`` scope
    sets, which would mirror them and sync their writes)."""
    from tensorflow.python.ops.resource_variable_ops import ResourceVariable

    with tf.init_scope(), tf.device("/cpu:0"):
        if _recorder.ring is None:
            _recorder.ring = ResourceVariable(
                tf.fill([RING, _COLUMNS], tf.constant(-1.0, tf.float64)), trainable=False,
                name="hvd_magics_step_split")
            _recorder.count = ResourceVariable(tf.constant(0, tf.int64), trainable=False,
                                               name="hvd_magics_step_count")
            _recorder.pending = ResourceVariable(tf.constant(0.0, tf.float64),
                                                 trainable=False, name="hvd_magics_step_input")
            _recorder.pending_comm = ResourceVariable(
                tf.constant(0.0, tf.float64), trainable=False, name="hvd_magics_step_comm")


def _traceable(tf: Any) -> bool:
    """Whether the graph being built can take the clock ops (a ``tf.function``'s, not XLA's,
    not TensorFlow 1's)."""
    from tensorflow.python.framework import func_graph
    from tensorflow.python.ops import control_flow_util

    graph = tf.compat.v1.get_default_graph()
    return (isinstance(graph, func_graph.FuncGraph)
            and not control_flow_util.GraphOrParentsInXlaContext(graph))


def _workers_in_sync(tf: Any) -> bool:
    """Whether a ``tf.distribute`` strategy with a replica on each worker (and more than one
    worker) is in force: ``MultiWorkerMirroredStrategy``'s, one per worker, as the ``tf``
    engine starts it (several replicas in one process would each make a row a step)."""
    if not tf.distribute.has_strategy():
        return False
    strategy = tf.distribute.get_strategy()
    return (strategy.num_replicas_in_sync > 1
            and len(getattr(strategy.extended, "worker_devices", ())) == 1)


def _waited_eagerly(kind: str, call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)`` made eagerly, its seconds added to the next step's wait of ``kind``
    (``"pending"``: input, ``"pending_comm"``: communication; once a step made the ring)."""
    start = time.time()
    try:
        return call(*args)
    finally:
        pending = getattr(_recorder, kind)
        if pending is not None:
            pending.assign_add(time.time() - start)


def _timed_get_next(tf: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """An iterator's ``_next_internal`` (or ``get_next_as_optional``), adding its time to the
    step's input."""
    if getattr(original, _PATCHED, False):
        return original

    @functools.wraps(original)
    def get_next(self: Any) -> Any:
        if tf.executing_eagerly():
            return _waited_eagerly("pending", original, self)
        if not _traceable(tf):
            return original(self)
        with tf.device("/cpu:0"):
            start = tf.timestamp()
        element = original(self)
        _note_wait(tf, _INPUT_WAITS, start, element)
        return element

    setattr(get_next, _PATCHED, True)
    return get_next


def _timed_allreduce_grads(tf: Any, make: Callable[..., Any]) -> Callable[..., Any]:
    """Horovod's ``_make_allreduce_grads_fn``, whose functions record the step's clock."""
    if getattr(make, _PATCHED, False):
        return make

    @functools.wraps(make)
    def make_timed(*args: Any, **kwargs: Any) -> Callable[..., Any]:
        allreduce_grads = make(*args, **kwargs)

        @functools.wraps(allreduce_grads)
        def timed(grads: Any, *rest: Any, **more: Any) -> Any:
            if tf.executing_eagerly():
                ready = time.time()
                reduced = allreduce_grads(grads, *rest, **more)
                done = time.time()
                _write(tf, tf.constant(0.0, tf.float64), tf.constant(ready, tf.float64),
                       tf.constant(done, tf.float64))
                return reduced
            if not _traceable(tf) or _workers_in_sync(tf):
                return allreduce_grads(grads, *rest, **more)
            ready = _clock_after(tf, grads)
            reduced = allreduce_grads(grads, *rest, **more)
            _record(tf, ready, reduced)
            return reduced

        return timed

    setattr(make_timed, _PATCHED, True)
    return make_timed


def _timed_gradient_sum(tf: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """Keras 2's ``all_reduce_sum_gradients`` (where its optimizers reduce the gradients under a
    ``tf.distribute`` strategy), recording the step's clock under ``MultiWorkerMirroredStrategy``
    (:func:`_workers_in_sync`)."""
    if getattr(original, _PATCHED, False):
        return original

    @functools.wraps(original)
    def timed(grads_and_vars: Any) -> Any:
        return _timed_reduction(tf, original, grads_and_vars)

    setattr(timed, _PATCHED, True)
    return timed


def _timed_reduction(tf: Any, reduce: Callable[[list[Any]], Any], grads_and_vars: Any) -> Any:
    """``reduce(pairs)`` of a step's ``(gradient, variable)`` pairs, with the step's clock
    recorded around it under ``MultiWorkerMirroredStrategy`` in a graph being traced."""
    pairs = list(grads_and_vars)
    if tf.executing_eagerly() or not _traceable(tf) or not _workers_in_sync(tf):
        return reduce(pairs)
    ready = _clock_after(tf, [grad for grad, _ in pairs])
    reduced = reduce(pairs)
    _record(tf, ready, [grad for grad, _ in reduced])
    return reduced


def _timed_batch_check(tf: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``tf.distribute``'s check, before each step, that every worker has a batch (a
    collective: a worker whose batch is late keeps the others in it), counted as the step's
    communication."""
    if getattr(original, _PATCHED, False):
        return original

    @functools.wraps(original)
    def timed(strategy: Any, input_workers: Any, optional_list: Any) -> Any:
        if tf.executing_eagerly():  # a custom loop's ``for batch in dist_dataset``
            return _waited_eagerly("pending_comm", original, strategy, input_workers,
                                   optional_list)
        if not _traceable(tf) or not _workers_in_sync(tf):
            return original(strategy, input_workers, optional_list)
        ready = _clock_after(tf, tf.nest.flatten(optional_list, expand_composites=True))
        found = original(strategy, input_workers, optional_list)
        _note_wait(tf, _COMM_WAITS, ready, found)
        return found

    setattr(timed, _PATCHED, True)
    return timed


def _note_wait(tf: Any, kind: str, since: Any, outputs: Any) -> None:
    """Add to the graph being built the seconds from ``since`` (a clock) to the moment
    ``outputs`` are there, as one of the step's waits of ``kind`` (:data:`_INPUT_WAITS`,
    :data:`_COMM_WAITS`), which the step's row takes (:func:`_record`)."""
    after = _data_of(tf, tf.nest.flatten(outputs, expand_composites=True))
    with tf.device("/cpu:0"), tf.control_dependencies(after + [since]):
        waited = tf.timestamp() - since
    graph = tf.compat.v1.get_default_graph()
    setattr(graph, kind, getattr(graph, kind, []) + [waited])


def _clock_after(tf: Any, grads: Any) -> Any:
    """The clock once every gradient is there (made before their reduction: TensorFlow runs
    stateful ops, clocks and ``tf.distribute``'s collectives among them, in the order they
    were made, so a clock made after a collective would wait for it)."""
    after = _data_of(tf, grads)
    with tf.device("/cpu:0"), tf.control_dependencies(after):
        return tf.timestamp()


def _record(tf: Any, ready: Any, reduced: Any) -> None:
    """Add to the graph the ops that write the step's row, from ``ready`` to the moment the
    ``reduced`` gradients are there."""
    graph = tf.compat.v1.get_default_graph()
    waits, checks = getattr(graph, _INPUT_WAITS, []), getattr(graph, _COMM_WAITS, [])
    setattr(graph, _INPUT_WAITS, [])
    setattr(graph, _COMM_WAITS, [])
    after = _data_of(tf, reduced)
    with tf.device("/cpu:0"):
        with tf.control_dependencies(after + [ready]):
            done = tf.timestamp()
        waited = tf.add_n(waits) if waits else tf.constant(0.0, tf.float64)
        if checks:  # moved back by the step's other waits in collectives: its comm grows
            ready = ready - tf.add_n(checks)
    _write(tf, waited, ready, done)


def _data_of(tf: Any, tensors: Any) -> list[Any]:
    """Ops that run once the tensors' values are there, one per device: a control edge from a
    tensor's own op would not wait for it when that op is a function call or a ``tf.cond``
    (Horovod's reductions are both): TensorFlow lowers such an edge to one that waits only for
    their stateful ops."""
    by_device: dict[str, list[Any]] = {}
    for tensor in tf.nest.flatten(tensors):
        if tensor is None:
            continue
        if isinstance(tensor, tf.IndexedSlices):
            tensor = tensor.values
        by_device.setdefault(tensor.device, []).append(tensor)
    found = []
    for device, group in by_device.items():
        with tf.device(device):
            found.append(tf.raw_ops.IdentityN(input=group)[0].op)
    return found


def _write(tf: Any, waited: Any, ready: Any, done: Any) -> None:
    """Write a step's row into the ring (in the graph being built, or at once when eager),
    with the batches taken eagerly since the last step's in its input."""
    first = _recorder.ring is None
    _make_ring(tf)
    with tf.device("/cpu:0"):
        waited = waited + _recorder.pending.read_value()
        _recorder.pending.assign(tf.constant(0.0, tf.float64))
        ready = ready - _recorder.pending_comm.read_value()  # its comm grows by the check's
        _recorder.pending_comm.assign(tf.constant(0.0, tf.float64))
        index = _recorder.count.assign_add(1) - 1
        row = tf.stack([tf.cast(index, tf.float64), waited, ready, done])
        _recorder.ring.scatter_nd_update([[tf.math.floormod(index, RING)]], [row])
    if first:
        _on_first_step()


def new_rows() -> list[list[float]]:
    """The steps completed since the last call, as
    :mod:`hvd_magics.rank.instruments.step_split`'s rows ``[step, step_s, input_s, comm_s, 0,
    0]`` (a step's CPU times are not read); the first step of a cell has no start and makes no
    row."""
    with _recorder.lock:
        if _recorder.ring is None:
            return []
        ring = _recorder.ring.numpy()
        fresh = ring[ring[:, 0] > _recorder.read]
        rows = []
        for index, waited, ready, done in fresh[fresh[:, 0].argsort()].tolist():
            index = int(index)
            _recorder.read = index
            if index < _recorder.first:
                continue
            last, _recorder.last_done = _recorder.last_done, done
            if last is not None and done >= last:
                rows.append([index - _recorder.first, done - last, min(waited, done - last),
                             max(0.0, done - ready), 0.0, 0.0])
        return rows


def reset() -> None:
    """A new cell: its steps are counted from its first, which has no start."""
    new_rows()
    with _recorder.lock:
        _recorder.first = _recorder.read + 1
        _recorder.last_done = None


def install(on_first_step: Callable[[], None]) -> None:
    """Time TensorFlow's steps once Horovod's TensorFlow API or Keras 2's optimizers are
    imported; call ``on_first_step()`` when the first step is traced or run."""
    global _on_first_step
    _on_first_step = on_first_step
    after_import(("horovod.tensorflow",), _patch_horovod)
    after_import(("tf_keras.src.optimizers.utils",), _patch_keras_optimizers)
    after_import(("keras.src.backend.tensorflow.optimizer",), _patch_keras_3_optimizers)


def _patch_horovod(module: Any) -> None:
    """``horovod.tensorflow``: time the steps its gradient reductions end."""
    import tensorflow as tf
    from tensorflow.python.data.ops import iterator_ops

    make = getattr(module, "_make_allreduce_grads_fn", None)
    if make is None:
        return
    module._make_allreduce_grads_fn = _timed_allreduce_grads(tf, make)
    patch_iterator(tf, iterator_ops.OwnedIterator)


def _patch_keras_optimizers(module: Any) -> None:
    """A Keras 2 optimizers' ``utils`` module: time the steps whose gradients
    ``MultiWorkerMirroredStrategy`` reduces, and the strategy's check for every worker's
    batch."""
    import tensorflow as tf

    if callable(getattr(module, "all_reduce_sum_gradients", None)):
        module.all_reduce_sum_gradients = _timed_gradient_sum(
            tf, module.all_reduce_sum_gradients)
        _patch_strategy_input(tf)


def _patch_keras_3_optimizers(module: Any) -> None:
    """Keras 3's TensorFlow optimizers (``TFOptimizer``, whose ``_all_reduce_sum_gradients``
    reduces a step's gradients under a ``tf.distribute`` strategy: a custom loop of
    ``strategy.run`` steps, as Keras 3's ``fit`` does not train under two workers): time their
    steps as Keras 2's, and the strategy's input."""
    import tensorflow as tf

    owner = getattr(module, "TFOptimizer", None)
    original = getattr(owner, "_all_reduce_sum_gradients", None)
    if owner is None or not callable(original) or getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def timed(self: Any, grads_and_vars: Any) -> Any:
        return _timed_reduction(tf, functools.partial(original, self), grads_and_vars)

    setattr(timed, _PATCHED, True)
    owner._all_reduce_sum_gradients = timed
    _patch_strategy_input(tf)


def _patch_strategy_input(tf: Any) -> None:
    """Time ``tf.data``'s batches and the strategy's check for every worker's batch."""
    from tensorflow.python.data.ops import iterator_ops
    from tensorflow.python.distribute import input_lib

    patch_iterator(tf, iterator_ops.OwnedIterator)
    if callable(getattr(input_lib, "_calculate_replicas_with_values", None)):
        input_lib._calculate_replicas_with_values = _timed_batch_check(
            tf, input_lib._calculate_replicas_with_values)


def patch_iterator(tf: Any, owned: Any) -> None:
    """Time the batches ``tf.data``'s iterators (``owned``: ``OwnedIterator``) hand over (as an
    element, or as an optional one: ``tf.distribute``'s iterators take them so)."""
    owned._next_internal = _timed_get_next(tf, owned._next_internal)
    owned.get_next_as_optional = _timed_get_next(tf, owned.get_next_as_optional)
