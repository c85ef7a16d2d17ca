"""TensorFlow's steps timed inside the graph (rank/instruments/step_split_tf.py), with real TensorFlow in one
process: Horovod's gradient reduction is stood in for by a function of the same shape (a
``tf.cond`` around a stateless op, as Horovod's ``_allreduce_cond``) whose reduction waits, as a
rank waits for its peers; the ranks' tests run Horovod itself (tests/driver/test_straggler.py)."""
import threading
import time

import numpy as np
import pytest

from hvd_magics.rank.instruments import step_split, step_split_tf


def _tensorflow():
    """TensorFlow, imported by the tests that use it, not when the module is collected (every
    lane of ``make test-fast`` collects every module: 7 s each at the top of the module;
    tests/conftest.py keeps this file's tests in one lane)."""
    import tensorflow

    return tensorflow


@pytest.fixture
def recorder(monkeypatch):
    """A recorder of this test's own, read by the test alone: no reader thread is started, and
    one an earlier test in this process started (through ``step_split.install()``) is stopped,
    or it would take the rows."""
    from tensorflow.python.data.ops import iterator_ops

    tf = _tensorflow()
    step_split._stopped.set()
    for thread in threading.enumerate():
        if thread.name == "hvd_magics step split":
            thread.join(timeout=10)
    step_split._stopped.clear()
    monkeypatch.setattr(step_split_tf, "_on_first_step", lambda: None)
    monkeypatch.setattr(step_split_tf, "_recorder", step_split_tf._Recorder())
    monkeypatch.setattr(iterator_ops.OwnedIterator, "_next_internal",
                        iterator_ops.OwnedIterator._next_internal)
    step_split_tf.patch_iterator(tf, iterator_ops.OwnedIterator)
    return step_split_tf._recorder


def _reductions(tf, wait_s: float):
    """A ``_make_allreduce_grads_fn`` whose reduction of each gradient waits ``wait_s``."""
    def pause(x):
        time.sleep(wait_s)
        return x

    def make(*_args, **_kwargs):
        def allreduce_grads(grads, _vars=None):
            if not wait_s:
                return [tf.cond(tf.constant(True), lambda g=g: g * 1.0, lambda g=g: g)
                        for g in grads]
            return [tf.cond(tf.constant(True),
                            lambda g=g: tf.numpy_function(pause, [g], g.dtype, stateful=False),
                            lambda g=g: g)
                    for g in grads]
        return allreduce_grads

    return step_split_tf._timed_allreduce_grads(tf, make)


def test_a_graph_step_s_communication_is_its_reductions_wait_not_zero(recorder):
    """A control edge from a ``tf.cond``'s (or a function call's) output does not wait for its
    value: the end of the step must wait for the reduced gradients themselves."""
    tf = _tensorflow()
    reduce_grads = _reductions(tf, 0.05)()
    weights = tf.Variable(tf.ones([4]))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(weights * x)
        (grad,) = reduce_grads([tape.gradient(loss, weights)], [weights])
        weights.assign_sub(0.1 * grad)

    for _ in range(4):
        step(tf.ones([4]))
    rows = step_split_tf.new_rows()
    assert [row[0] for row in rows] == [1, 2, 3]  # the first step has no start
    for _step, step_s, input_s, comm_s, *cpu in rows:
        assert 0.05 <= comm_s <= step_s and input_s == 0.0 and cpu == [0.0, 0.0]
    assert step_split_tf.new_rows() == []


def test_a_graph_s_batches_and_a_custom_loop_s_eager_ones_are_its_input(recorder):
    tf = _tensorflow()
    reduce_grads = _reductions(tf, 0.0)()
    weights = tf.Variable(tf.ones([4]))
    slow = tf.data.Dataset.from_tensors(tf.ones([4])).repeat().map(
        lambda x: tf.numpy_function(lambda a: (time.sleep(0.03), a)[1], [x], tf.float32))

    @tf.function
    def step(iterator):
        x = next(iterator)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(weights * x)
        reduce_grads([tape.gradient(loss, weights)], [weights])

    iterator = iter(slow)
    for _ in range(3):
        step(iterator)
    in_graph = step_split_tf.new_rows()

    @tf.function
    def eager_fed_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(weights * x)
        reduce_grads([tape.gradient(loss, weights)], [weights])

    for x in slow.take(3):
        eager_fed_step(x)
    eager = step_split_tf.new_rows()
    assert len(in_graph) == 2 and len(eager) == 3
    # tf.data prefetches on its own (its injected prefetch): a wait may be shorter than the
    # 30 ms the pipeline takes a batch (a batch made while the step before ran: 19.9 ms was
    # measured on a busy machine), never longer than its step; input not counted is about 0
    assert all(0.01 <= row[2] for row in in_graph), in_graph
    assert all(0 <= row[2] <= row[1] for row in in_graph + eager), in_graph + eager
    assert sum(row[2] for row in eager) >= 0.03, eager


def test_an_xla_compiled_step_is_left_as_it_is_and_a_new_cell_counts_from_its_first(recorder):
    tf = _tensorflow()
    reduce_grads = _reductions(tf, 0.0)()
    weights = tf.Variable(tf.ones([4]))

    def body(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(weights * x)
        return reduce_grads([tape.gradient(loss, weights)], [weights])[0]

    compiled = tf.function(body, jit_compile=True)
    assert np.allclose(compiled(tf.ones([4])), 1.0)  # tf.timestamp has no XLA kernel
    assert recorder.ring is None
    plain = tf.function(body)
    for _ in range(3):
        plain(tf.ones([4]))
    assert [row[0] for row in step_split_tf.new_rows()] == [1, 2]
    step_split_tf.reset()
    for _ in range(2):
        plain(tf.ones([4]))
    assert [row[0] for row in step_split_tf.new_rows()] == [1]
