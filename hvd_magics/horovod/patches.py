"""The small changes Horovod 0.28.1 needs to build against today's TensorFlow and PyTorch, and
the fixes hvd_magics relies on (:func:`apply` makes them in an unpacked source tree;
:mod:`hvd_magics.horovod.build` builds the result).

Each change is an exact text replacement; if the text is not found (another Horovod version),
:func:`apply` stops and says which file.

1. ``horovod/torch/CMakeLists.txt`` forces C++14, but PyTorch 2.x headers need C++17.
2. With the torch target at C++17, linking it against Horovod's C++14 ``libgloo.a`` fails
   (``multiple definition of gloo::rendezvous::Store::kDefaultTimeout``: a ``static constexpr``
   member is inline in C++17). Horovod already builds a C++17 Gloo (``compatible17_gloo``) for a
   C++17 TensorFlow, so the torch target links that one when the ABIs match.
3. ``horovod/tensorflow/CMakeLists.txt`` compiles ``xla_mpi_ops.cc``, which includes XLA headers
   (highwayhash, farmhash) that the TensorFlow wheel does not ship. Those ops only serve
   XLA-compiled Horovod ops (``HOROVOD_ENABLE_XLA_OPS``), off by default, so the file is dropped.
4. ``horovod/tensorflow/keras/__init__.py`` and ``callbacks.py`` take their backend ``K`` from
   ``import keras``, which is Keras 3 since TF 2.16, while ``tf.keras`` (what the module wraps,
   ``from tensorflow import keras``) is Keras 2 under ``TF_USE_LEGACY_KERAS=1``. Keras 3's backend has
   no ``constant``/``get_session``/``set_value``, so ``MetricAverageCallback``,
   ``LearningRateWarmupCallback`` and ``hvd.load_model`` failed (``module 'keras.backend' has no
   attribute 'constant'``). The backend is now taken from the same ``tf.keras`` the module wraps.
5. ``horovod/_keras/callbacks.py``: ``LearningRateWarmupCallback`` (and the schedule callback)
   correct the momentum with ``backend.set_value(optimizer.momentum, ...)``. In the Keras 2.11+
   optimizers (tf_keras's default ``SGD``) ``momentum`` is a plain float, not a variable, so the
   callback failed with ``'float' object has no attribute 'dtype'``. The correction is now made
   only where ``momentum`` is a variable (the legacy optimizers); a float momentum is left alone.
6. A rank whose job function returned leaves Horovod with ``hvd.join()`` (so that ranks leave
   together, without "Connection reset by peer"), and a joined rank adds zeros to its peers'
   allreduces: a peer that still trained got a wrong sum and the job "succeeded". A new C call,
   ``horovod_hvd_magics_finished()``, marks this process's next Join as its last (the Join
   request carries ``root_rank = -2``, a field Join does not use otherwise). The coordinator
   keeps the ranks that joined so, and any collective that would need one of them fails with an
   error naming the finished ranks, the ranks that submitted it and the tensor, instead of
   completing with zeros; a finished rank also lets no cached collective through (its cache
   entries are invalidated, so they are negotiated and meet that error). ``hvd.join()`` called
   by the user keeps Horovod's meaning.
7. ``horovod/common/timeline.cc``: the timeline's writer thread (rank 0, whenever
   ``HOROVOD_TIMELINE`` is set) waits for records in a loop of ``std::this_thread::yield()``, so
   it kept a core busy for as long as the timeline was on: for a warm pool's whole life (its ranks
   start with ``HOROVOD_TIMELINE=DYNAMIC`` so that a cell can ask for a timeline), an idle pool of
   2 ranks used 1.5 CPU s a second here. The writer now sleeps 1 ms when its queue is empty
   (the queue holds a million records; a start or stop of the timeline waits in 1 ms steps
   already).
8. ``horovod/torch/mpi_ops_v2.cc``: ``synchronize`` (every ``hvd.allreduce``, ``broadcast``,
   ``allgather`` and the ``DistributedOptimizer``'s step in PyTorch) waits for its collective in a
   loop of ``std::this_thread::yield()``, so a rank waiting for a slower peer kept a core busy for
   the whole wait (measured: 5.6-6.3 CPU s in a 5 s wait for a sleeping peer, at any
   ``HOROVOD_CYCLE_TIME``), taking it from the peer it waited for wherever ranks share cores (the
   driver's ranks, a task of several ranks). It still yields for the first millisecond (a
   collective that is about to complete keeps its latency), then sleeps 1 ms between looks, as
   later Horovod releases do.
9. ``horovod/common/gloo/gloo_context.cc``: ``InitializeForProcessSet`` builds each process
   set's Gloo device (the global process set's included, which every collective uses) from its
   own ``gloo_iface_``, which nothing sets on the non-MPI path, so the device fell back to the
   address the host's name resolves to: Debian's ``127.0.1.1`` line, or a management NIC the
   peers cannot reach. Ranks on other hosts then failed to connect (``connect [10.78.0.2]:...:
   No route to host``, the rank aborted by signal 6) while the global, local and cross
   contexts, made with the interface, were right. ``HOROVOD_GLOO_IFACE`` (which hvd_magics sets
   to the interface of the executor's address) did not help. A process set's device now uses the
   interface of the global context it is made from.
10. ``CMakeLists.txt`` builds the C++17 Gloo (``compatible17_gloo``) only for a C++17
    TensorFlow, so a build with PyTorch alone (no TensorFlow in the environment) linked the C++17
    torch target against the C++14 Gloo and failed as in change 2. The C++17 Gloo is now built
    for the torch target too, with the C++11 ABI when PyTorch has it.
11. ``horovod/common/operations.cc``: the background loop ran a cycle every millisecond
    (``HOROVOD_CYCLE_TIME``) for the rank's whole life, and each cycle is a negotiation among all
    ranks even with nothing to reduce: a rank cost 7% of a core while its Python computed or
    slept (two ranks, ``hvd.init()`` then 5 s asleep: 0.35 CPU s each), taken from the ranks it
    shares cores with, and a warm pool's ranks paid it between cells. Now, when a cycle leaves
    nothing queued or waiting for a response in this process (and there is no process set but
    the global one), the loop waits for the next enqueue, a shutdown, or 50 ms, whichever comes
    first. A collective keeps its latency: it needs every rank to submit it, and each rank's
    submission wakes its own loop, whose cycle then starts on the step of the cycle's grid where
    Horovod's would have (so that tensors enqueued together are still fused together); a rank
    still waiting for its peers keeps the usual cycle.
    The bound keeps a peer's failure, a stall warning and a shutdown from waiting longer than
    that (a shutdown wakes the loop at once). ``HVD_MAGICS_HOROVOD_IDLE_WAIT_MS`` sets the bound;
    ``0`` turns the wait off (a cycle every ``HOROVOD_CYCLE_TIME``, as Horovod does).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from hvd_magics.protocol import ENV_HOROVOD_IDLE_WAIT

CHANGES = [
    (
        "CMakeLists.txt",
        "# Gloo for c++17 TF\n"
        "if(HAVE_GLOO AND (DEFINED Tensorflow_CXX17 AND Tensorflow_CXX17))",
        "# Gloo for c++17 TF, and for the C++17 torch target (hvd_magics)\n"
        "if(HAVE_GLOO AND ((DEFINED Tensorflow_CXX17 AND Tensorflow_CXX17)\n"
        "                  OR (DEFINED Pytorch_CXX11 AND Pytorch_CXX11)))",
    ),
    (
        "CMakeLists.txt",
        "    if (Tensorflow_CXX11)\n"
        "        target_compile_definitions(compatible17_gloo PRIVATE _GLIBCXX_USE_CXX11_ABI=1)",
        "    if (Tensorflow_CXX11 OR (NOT DEFINED Tensorflow_CXX11 AND Pytorch_CXX11))\n"
        "        target_compile_definitions(compatible17_gloo PRIVATE _GLIBCXX_USE_CXX11_ABI=1)",
    ),
    (
        "horovod/torch/CMakeLists.txt",
        "set(CMAKE_CXX_STANDARD 14)",
        "set(CMAKE_CXX_STANDARD 17)  # hvd_magics: PyTorch 2.x needs C++17",
    ),
    (
        "horovod/torch/CMakeLists.txt",
        "    if (Pytorch_CXX11)\n        list(APPEND PYTORCH_LINKER_LIBS gloo)",
        "    if (Pytorch_CXX11 AND ((Tensorflow_CXX11 AND Tensorflow_CXX17)\n"
        "                           OR NOT DEFINED Tensorflow_CXX11))\n"
        "        # hvd_magics: the C++17 torch target must link the C++17 Gloo\n"
        "        list(APPEND PYTORCH_LINKER_LIBS compatible17_gloo)\n"
        "    elseif (Pytorch_CXX11)\n        list(APPEND PYTORCH_LINKER_LIBS gloo)",
    ),
    (
        "horovod/tensorflow/CMakeLists.txt",
        'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")',
        "# hvd_magics: xla_mpi_ops.cc dropped (XLA headers missing from the TF wheel)",
    ),
    (
        "horovod/_keras/callbacks.py",
        "        if hasattr(self.model.optimizer, 'momentum') and self.momentum_correction:",
        "        # hvd_magics: Keras 2.11+ optimizers hold momentum as a float, not a variable\n"
        "        if (hasattr(self.model.optimizer, 'momentum') and self.momentum_correction\n"
        "                and hasattr(self.model.optimizer.momentum, 'dtype')):",
    ),
    (
        "horovod/tensorflow/keras/__init__.py",
        "    from keras import backend as K",
        "    K = keras.backend  # hvd_magics: the backend of tf.keras (Keras 2 under TF_USE_LEGACY_KERAS=1)",
    ),
    (
        "horovod/tensorflow/keras/callbacks.py",
        "    from keras import backend as K",
        "    K = keras.backend  # hvd_magics: the backend of tf.keras (Keras 2 under TF_USE_LEGACY_KERAS=1)",
    ),
]


#: The Join of a rank whose function returned (``root_rank`` of its Join request).
_FINISHED = "-2"
_NOTE_FINISHED_JOIN = (
    "\n        if (message.request_type() == Request::JOIN) {{\n"
    "          process_set.joined_size++;\n"
    "          process_set.last_joined_rank = global_ranks_[{who}];\n"
)

CHANGES += [
    (
        "horovod/common/global_state.h",
        "  std::atomic_bool shut_down{false};",
        "  std::atomic_bool shut_down{false};\n\n"
        "  // hvd_magics: this process's job function returned; its next Join is its last.\n"
        "  std::atomic_bool finished_join{false};",
    ),
    (
        "horovod/common/operations.cc",
        "  message.set_request_type(Request::JOIN);\n",
        "  message.set_request_type(Request::JOIN);\n"
        "  if (horovod_global.finished_join) {\n"
        "    message.set_root_rank(" + _FINISHED + ");  // hvd_magics: a finished rank's Join\n"
        "  }\n",
    ),
    (
        "horovod/common/operations.cc",
        "int horovod_rank() {",
        "// hvd_magics: mark this process's next Join as its last (its job function returned).\n"
        "void horovod_hvd_magics_finished() { horovod_global.finished_join = true; }\n\n"
        "int horovod_rank() {",
    ),
    (
        "horovod/common/controller.h",
        "  MessageTable message_table_;",
        "  MessageTable message_table_;\n\n"
        "  // hvd_magics: global ranks that joined because their job function returned.\n"
        "  std::vector<int> finished_ranks_;",
    ),
    (
        "horovod/common/controller.cc",
        "    for (uint32_t bit : response_cache_.list_all_bits()) {\n"
        "      cache_coordinator.record_hit(bit);\n"
        "    }",
        "    for (uint32_t bit : response_cache_.list_all_bits()) {\n"
        "      if (state.finished_join) {  // hvd_magics: no cached collective gets zeros\n"
        "        cache_coordinator.record_invalid_bit(bit);\n"
        "        cache_coordinator.set_uncached_in_queue(true);\n"
        "      } else {\n"
        "        cache_coordinator.record_hit(bit);\n"
        "      }\n"
        "    }",
    ),
    (
        "horovod/common/controller.cc",
        _NOTE_FINISHED_JOIN.format(who="rank_"),
        _NOTE_FINISHED_JOIN.format(who="rank_")
        + "          if (message.root_rank() == " + _FINISHED + ") {  // hvd_magics\n"
        "            finished_ranks_.push_back(global_ranks_[rank_]);\n"
        "          }\n",
    ),
    (
        "horovod/common/controller.cc",
        "          if (received_message.request_type() == Request::JOIN) {\n"
        "            process_set.joined_size++;\n"
        "            process_set.last_joined_rank = global_ranks_[i];\n",
        "          if (received_message.request_type() == Request::JOIN) {\n"
        "            process_set.joined_size++;\n"
        "            process_set.last_joined_rank = global_ranks_[i];\n"
        "            if (received_message.root_rank() == " + _FINISHED + ") {  // hvd_magics\n"
        "              finished_ranks_.push_back(global_ranks_[i]);\n"
        "            }\n",
    ),
    (
        "horovod/common/controller.cc",
        "        process_set.joined_size = 0;\n"
        "        process_set.last_joined_rank = -1;\n",
        "        process_set.joined_size = 0;\n"
        "        process_set.last_joined_rank = -1;\n"
        "        finished_ranks_.clear();  // hvd_magics\n",
    ),
    (
        "horovod/common/controller.cc",
        "  // If we are doing an allreduce, broadcast, or reducescatter check that all\n"
        "  // tensor shapes are identical.\n",
        "  // hvd_magics: a rank whose job function returned adds nothing to a collective; fail\n"
        "  // the collective rather than complete it with zeros in that rank's place.\n"
        "  if (!error && joined_size > 0 && !finished_ranks_.empty()) {\n"
        "    error = true;\n"
        "    error_message_stream << \"hvd_magics: rank\"\n"
        "                         << (finished_ranks_.size() > 1 ? \"s\" : \"\");\n"
        "    for (size_t f = 0; f < finished_ranks_.size(); ++f) {\n"
        "      error_message_stream << (f ? \", \" : \" \") << finished_ranks_[f];\n"
        "    }\n"
        "    error_message_stream << \" finished (the job's function returned) while rank\"\n"
        "                         << (requests.size() > 1 ? \"s\" : \"\");\n"
        "    for (size_t r = 0; r < requests.size(); ++r) {\n"
        "      error_message_stream << (r ? \", \" : \" \")\n"
        "                           << global_ranks_[requests[r].request_rank()];\n"
        "    }\n"
        "    error_message_stream << \" still submitted \"\n"
        "                         << Request::RequestType_Name(message_type)\n"
        "                         << \" of tensor '\" << name << \"'. A collective needs every \"\n"
        "                         << \"rank, and a finished rank never submits it. Fix: have every \"\n"
        "                         << \"rank run the same collectives (the same number of steps), \"\n"
        "                         << \"or call hvd.join() on a rank that runs out of data early \"\n"
        "                         << \"(the others then go on with zeros in its place).\";\n"
        "  }\n\n"
        "  // If we are doing an allreduce, broadcast, or reducescatter check that all\n"
        "  // tensor shapes are identical.\n",
    ),
    (
        "horovod/common/timeline.cc",
        "    // Allow scheduler to schedule other work for this core.\n"
        "    std::this_thread::yield();\n",
        "    // hvd_magics: sleep while there is nothing to write (yield alone kept a core busy\n"
        "    // for as long as the timeline was on: a warm pool's whole life).\n"
        "    if (record_queue_.empty()) {\n"
        "      std::this_thread::sleep_for(std::chrono::milliseconds(1));\n"
        "    } else {\n"
        "      std::this_thread::yield();\n"
        "    }\n",
    ),
    (
        "horovod/common/gloo/gloo_context.cc",
        "  attr device_attr;\n"
        "  device_attr.iface = gloo_iface_;\n"
        "  device_attr.ai_family = AF_UNSPEC;\n"
        "  auto dev = CreateDevice(device_attr);\n"
        "\n"
        "  global_ctx = global_context.ctx;\n",
        "  // hvd_magics: the interface the global context was given (HOROVOD_GLOO_IFACE), not\n"
        "  // this process set's own, which nothing sets: the device fell back to the host name's\n"
        "  // address, which other hosts may not reach (Debian's 127.0.1.1, a management NIC).\n"
        "  gloo_iface_ = global_context.gloo_iface_;\n"
        "  attr device_attr;\n"
        "  device_attr.iface = gloo_iface_;\n"
        "  device_attr.ai_family = AF_UNSPEC;\n"
        "  auto dev = CreateDevice(device_attr);\n"
        "\n"
        "  global_ctx = global_context.ctx;\n",
    ),
    (
        "horovod/torch/mpi_ops_v2.cc",
        "void WaitAndClear(int handle) {\n"
        "  while (true) {\n"
        "    if (handle_manager.PollHandle(handle)) break;\n"
        "    {\n"
        "      py::gil_scoped_release release_python_gil;\n"
        "      std::this_thread::yield();\n"
        "    }\n"
        "  }\n",
        "void WaitAndClear(int handle) {\n"
        "  // hvd_magics: yield for the first millisecond only, then sleep between looks (yield\n"
        "  // alone kept a core busy for as long as a rank waited for a slower peer).\n"
        "  auto began = std::chrono::steady_clock::now();\n"
        "  while (true) {\n"
        "    if (handle_manager.PollHandle(handle)) break;\n"
        "    {\n"
        "      py::gil_scoped_release release_python_gil;\n"
        "      if (std::chrono::steady_clock::now() - began < std::chrono::milliseconds(1)) {\n"
        "        std::this_thread::yield();\n"
        "      } else {\n"
        "        std::this_thread::sleep_for(std::chrono::milliseconds(1));\n"
        "      }\n"
        "    }\n"
        "  }\n",
    ),
]


#: How long the background loop of a rank with nothing to negotiate waits for an enqueue, in
#: milliseconds, unless :data:`~hvd_magics.protocol.ENV_HOROVOD_IDLE_WAIT` says otherwise.
IDLE_WAIT_MS = 50

CHANGES += [
    (
        "horovod/common/tensor_queue.h",
        "#include <iostream>\n#include <mutex>\n#include <queue>\n",
        "#include <chrono>\n#include <condition_variable>\n#include <cstdint>\n"
        "#include <iostream>\n#include <mutex>\n#include <queue>\n",
    ),
    (
        "horovod/common/tensor_queue.h",
        "  void RemoveJoinTensor();\n",
        "  void RemoveJoinTensor();\n\n"
        "  // hvd_magics: nothing is queued or waiting for a response in this queue.\n"
        "  bool Idle() const;\n\n"
        "  // hvd_magics: an enqueue (or a shutdown) wakes the background loop waiting in\n"
        "  // WaitForWake; Wakes() counts them.\n"
        "  static void Wake();\n"
        "  static uint64_t Wakes();\n"
        "  static void WaitForWake(uint64_t seen, std::chrono::milliseconds timeout);\n",
    ),
    (
        "horovod/common/tensor_queue.cc",
        "  message_queue_.push(std::move(message));\n  return Status::OK();\n}\n",
        "  message_queue_.push(std::move(message));\n"
        "  Wake();  // hvd_magics\n"
        "  return Status::OK();\n}\n",
    ),
    (
        "horovod/common/tensor_queue.cc",
        "    message_queue_.push(std::move(messages[i]));\n  }\n  return Status::OK();\n}\n",
        "    message_queue_.push(std::move(messages[i]));\n  }\n"
        "  Wake();  // hvd_magics\n"
        "  return Status::OK();\n}\n",
    ),
    (
        "horovod/common/tensor_queue.cc",
        "// Remove JoinOp tensor from the table and execute the callback\n",
        "namespace {\n"
        "// hvd_magics: how the background loop, waiting while idle, learns of an enqueue.\n"
        "std::mutex wake_mutex;\n"
        "std::condition_variable wake_signal;\n"
        "uint64_t wakes = 0;\n"
        "} // namespace\n\n"
        "bool TensorQueue::Idle() const {\n"
        "  std::lock_guard<std::mutex> guard(mutex_);\n"
        "  return tensor_table_.empty() && message_queue_.empty();\n"
        "}\n\n"
        "void TensorQueue::Wake() {\n"
        "  {\n"
        "    std::lock_guard<std::mutex> guard(wake_mutex);\n"
        "    ++wakes;\n"
        "  }\n"
        "  wake_signal.notify_all();\n"
        "}\n\n"
        "uint64_t TensorQueue::Wakes() {\n"
        "  std::lock_guard<std::mutex> guard(wake_mutex);\n"
        "  return wakes;\n"
        "}\n\n"
        "void TensorQueue::WaitForWake(uint64_t seen, std::chrono::milliseconds timeout) {\n"
        "  std::unique_lock<std::mutex> lock(wake_mutex);\n"
        "  wake_signal.wait_for(lock, timeout, [seen] { return wakes != seen; });\n"
        "}\n\n"
        "// Remove JoinOp tensor from the table and execute the callback\n",
    ),
    (
        "horovod/common/operations.cc",
        "bool RunLoopOnce(HorovodGlobalState& state) {\n"
        "  // This delay determines thread frequency and communication message latency\n"
        "  auto start_time = std::chrono::steady_clock::now();\n",
        "// hvd_magics: the last cycle left nothing queued or waiting in this process, and the\n"
        "// number of enqueues seen when it began (an enqueue since then ends the wait at once).\n"
        "static bool idle_after_last_cycle = false;\n"
        "static uint64_t wakes_before_last_cycle = 0;\n\n"
        "bool RunLoopOnce(HorovodGlobalState& state) {\n"
        "  // hvd_magics: with nothing to negotiate, wait for an enqueue (or a shutdown) instead of\n"
        "  // negotiating nothing with every rank each cycle; look again after a bounded wait\n"
        "  // (" + ENV_HOROVOD_IDLE_WAIT + "=0: every cycle, as Horovod does).\n"
        "  static const long idle_wait_ms = [] {\n"
        "    const char* value = std::getenv(\"" + ENV_HOROVOD_IDLE_WAIT + "\");\n"
        "    return value != nullptr ? std::strtol(value, nullptr, 10) : " + str(IDLE_WAIT_MS) + "L;\n"
        "  }();\n"
        "  if (idle_after_last_cycle && idle_wait_ms > 0 && !state.shut_down) {\n"
        "    TensorQueue::WaitForWake(wakes_before_last_cycle,\n"
        "                             std::chrono::milliseconds(idle_wait_ms));\n"
        "    // The cycle starts where Horovod's would have: on the next step of its grid, so\n"
        "    // that what is enqueued in the meantime is negotiated (and fused) together.\n"
        "    auto cycle = std::chrono::microseconds(\n"
        "        long(state.parameter_manager.CycleTimeMs() * 1000.));\n"
        "    if (cycle.count() > 0) {\n"
        "      auto behind = (std::chrono::steady_clock::now() - state.last_cycle_start) / cycle;\n"
        "      state.last_cycle_start += behind * cycle;\n"
        "    }\n"
        "  }\n"
        "  wakes_before_last_cycle = TensorQueue::Wakes();\n"
        "  bool performed_any = false;\n\n"
        "  // This delay determines thread frequency and communication message latency\n"
        "  auto start_time = std::chrono::steady_clock::now();\n",
    ),
    (
        "horovod/common/operations.cc",
        "        PerformOperation(response, process_set);\n",
        "        PerformOperation(response, process_set);\n"
        "        performed_any = true;  // hvd_magics\n",
    ),
    (
        "horovod/common/operations.cc",
        "    should_shutdown |= response_list.shutdown();\n  }\n\n  return !should_shutdown;\n}\n",
        "    should_shutdown |= response_list.shutdown();\n  }\n\n"
        "  // hvd_magics: idle when this cycle did nothing and left nothing queued or waiting here\n"
        "  // (with process sets besides the global one, whose negotiations need every rank's\n"
        "  // cycle, the loop keeps its cycle).\n"
        "  auto ids = state.process_set_table.Ids();\n"
        "  idle_after_last_cycle = !should_shutdown && !performed_any && !state.shut_down &&\n"
        "                          ids.size() == 1 &&\n"
        "                          state.process_set_table.Get(ids[0]).tensor_queue.Idle();\n"
        "  return !should_shutdown;\n}\n",
    ),
    (
        "horovod/common/operations.cc",
        "    horovod_global.shut_down = true;\n",
        "    horovod_global.shut_down = true;\n"
        "    TensorQueue::Wake();  // hvd_magics: end an idle wait of the background loop\n",
    ),
]


class PatchError(RuntimeError):
    """A change's text is not in the source tree (another Horovod version than 0.28.1)."""


def apply(tree: Path) -> list[str]:
    """Make every change of :data:`CHANGES` in the Horovod source tree ``tree``.

    Parameters
    ----------
    tree : Path
        An unpacked ``horovod-0.28.1`` source tree.

    Returns
    -------
    list of str
        The files changed (a change already made is left as it is).

    Raises
    ------
    PatchError
        When a change's text is not found exactly once.
    """
    changed = []
    for rel, old, new in CHANGES:
        path = tree / rel
        text = path.read_text()
        if new in text:
            continue  # already applied
        if text.count(old) != 1:
            raise PatchError(f"expected text not found once in {path}: {old!r}; these changes "
                             "are for Horovod 0.28.1's source")
        path.write_text(text.replace(old, new))
        changed.append(rel)
    return changed


def fingerprint() -> str:
    """What the changes are, in 16 hex digits (part of a build's cache key)."""
    return hashlib.sha256(repr(CHANGES).encode()).hexdigest()[:16]
