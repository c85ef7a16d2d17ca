"""Start-up chatter of the frameworks that a cell does not show (the log file keeps every line).

Lightning's ``Trainer`` says which accelerators it found, offers a tip, frames the process
group it joined in rules of 100 dashes, and says why ``fit`` stopped, on every rank.

TensorFlow writes absl/glog lines (``I0000 00:00:... port.cc:153] oneDNN custom operations are
on``, ``cpu_feature_guard``, ``failed call to cuInit`` on a machine without a GPU) from every rank
before the user's code runs, whatever ``TF_CPP_MIN_LOG_LEVEL`` says. ``--verbosity debug`` shows
them again.

torch's store says on every rank of a cluster whose peers' addresses have no name (``[c10d]
The hostname of the client socket cannot be retrieved. err=-3``): harmless, and no fix of ours.

Once a rank has failed (and in an elastic job, where losing a rank is expected), its peers'
Horovod background loops print that the peer closed its connection: the failed rank's own error
(or the reset line) says it better.
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
    # the second line of tf.distribute's "Example stragglers:" while its workers connect
    r"^/job:worker/replica:\d+/task:\d+$",
    # Lightning's start-up: the accelerators it found, its tip, the process group it joined
    # (its ranks are the job's: the dashboard says that), the rule around it
    r"^(?:GPU|TPU|HPU) available: ",
    r"^\N{ELECTRIC LIGHT BULB} Tip: ",
    r"^Initializing distributed: GLOBAL_RANK: \d+, MEMBER: \d+/\d+$",
    r"^distributed_backend=\w+$",
    r"^All distributed processes registered\. Starting with \d+ processes$",
    r"^-{100}$",
    r"^LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES: ",
    r"^`Trainer\.fit` stopped: ",
    # torch's store on a host whose peers' addresses have no name (no DNS, no /etc/hosts line
    # for them): a reverse lookup for its own log line failed, on every rank of every host
    r"^\[W\d{4} [\d:.]+ socket\.cpp:\d+\] \[c10d\] The hostname of the client socket cannot "
    r"be retrieved\. err=-?\d+$",
]))


#: Lines that are expected when a rank is lost (its error or the reset line says what happened).
PEER_LOST_NOISE = re.compile(
    r"^\[[^\]]*horovod/common/operations\.cc:\d+\] \[\d+\]: Horovod background loop uncaught "
    r"exception: .*(?:Connection closed by peer|Connection reset by peer|Read error|Timed out)")


def is_noise(line: str, peer_lost: bool = False) -> bool:
    """Whether ``line`` is framework start-up chatter (or, once a peer is lost, the expected
    word of a rank that lost it)."""
    return NOISE.match(line) is not None or (peer_lost and PEER_LOST_NOISE.match(line) is not None)
