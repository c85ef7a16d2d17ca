"""Start-up chatter of the frameworks that a cell does not show (the log file keeps every line).

TensorFlow writes absl/glog lines (``I0000 00:00:... port.cc:153] oneDNN custom operations are
on``, ``cpu_feature_guard``, ``failed call to cuInit`` on a machine without a GPU) from every rank
before the user's code runs, whatever ``TF_CPP_MIN_LOG_LEVEL`` says. ``--verbosity debug`` shows
them again.

In an elastic job, a rank that loses a peer is expected: Horovod's background loop then prints
that the peer closed its connection before the job re-forms, and the reset line says it better.
"""
from __future__ import annotations

import re

#: Lines that are framework start-up noise.
NOISE = re.compile("|".join([
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    # glog/absl info and warning lines from C++ (severity, date, time, thread, file:line])
    r"^[IW]\d{4} [\d:.]+\s+\d+ [\w.-]+\.(?:cc|h|cpp):\d+\] ",
    # error-level lines that only say this machine has no GPU or CUDA plug-ins register twice
    r"^E\d{4} [\d:.]+\s+\d+ [\w.-]+\.(?:cc|h|cpp):\d+\] (?:failed call to cuInit"
    r"|Unable to register cu\w+ factory)",
    r"^To enable the following instructions: .* rebuild TensorFlow with the appropriate "
    r"compiler flags\.",
    r"^Attempting to register factory for plugin cu\w+ when one has already been registered",
]))


#: Lines that are expected when an elastic job loses a rank (the reset line says what happened).
ELASTIC_NOISE = re.compile(
    r"^\[[^\]]*horovod/common/operations\.cc:\d+\] \[\d+\]: Horovod background loop uncaught "
    r"exception: .*(?:Connection closed by peer|Connection reset by peer|Read error|Timed out)")


def is_noise(line: str, elastic: bool = False) -> bool:
    """Whether ``line`` is framework start-up chatter (or, in an ``elastic`` job, the expected
    word of a rank that lost a peer)."""
    return NOISE.match(line) is not None or (elastic and ELASTIC_NOISE.match(line) is not None)
