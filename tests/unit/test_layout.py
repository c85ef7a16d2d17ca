"""The package layout is real: the rank side loads nothing of the notebook, job or launch side."""
import json
import subprocess
import sys

import hvd_magics


def _loaded_by(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json\n"
         "print(json.dumps(sorted(m for m in sys.modules if m.startswith('hvd_magics'))))"],
        capture_output=True, text=True, check=True, timeout=60)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_rank_entry_point_loads_only_the_rank_side():
    loaded = _loaded_by("import hvd_magics.rank.rank_main, hvd_magics.rank.cell_runner\n"
                        "from hvd_magics import progress, log_to_driver\n"
                        "import hvd_magics.rank.keras_progress, hvd_magics.rank.shard")
    assert "hvd_magics.rank.rank_main" in loaded and "hvd_magics.rank.progress" in loaded
    allowed = {"hvd_magics", "hvd_magics.protocol", "hvd_magics.result_codec", "hvd_magics.errors"}
    outside = {m for m in loaded if not m.startswith("hvd_magics.rank") and m not in allowed}
    assert outside == set(), outside


def test_a_spark_task_loads_no_notebook_or_job_code():
    loaded = _loaded_by("import hvd_magics.task.spark_task, hvd_magics.task.task_entry, "
                        "hvd_magics.task.shard_files, hvd_magics.task.event_buffer")
    assert not {m for m in loaded if m.startswith(("hvd_magics.notebook", "hvd_magics.job",
                                                   "hvd_magics.launch"))}


def test_importing_the_package_loads_nothing_until_used():
    assert _loaded_by("import hvd_magics") == {"hvd_magics"}


def test_every_error_is_a_horovod_magics_error():
    from hvd_magics import errors

    for name in ("HorovodJobError", "StartTimeoutError", "NotEnoughSlotsError", "PayloadError",
                 "CellError", "ResultDecodeError"):
        assert issubclass(getattr(errors, name), errors.HorovodMagicsError), name
    assert issubclass(errors.JobInterrupted, KeyboardInterrupt)
    # a user mistake renders as its one line in IPython, not a traceback through hvd_magics
    slots = errors.NotEnoughSlotsError("np=9 needs 9 free Spark task slots. Fix: use np<=2")
    assert slots._render_traceback_() == [f"NotEnoughSlotsError: {slots}"]
    assert set(hvd_magics.__all__) >= {"HorovodRunner", "HorovodMagicsError", "progress"}


def test_every_event_kind_is_written_down_once():
    """Each kind the code sends or handles is in protocol.EVENTS (and only there as a string)."""
    import pathlib
    import re

    from hvd_magics import protocol

    root = pathlib.Path(hvd_magics.__file__).parent
    for path in root.rglob("*.py"):
        if path.name == "protocol.py":
            continue
        text = path.read_text()
        for kind in protocol.EVENTS:
            assert not re.search(rf"""(emit|send|sink|_sink|kind\s*==)\(?\s*["']{kind}["']""",
                                 text), f"{path.name} spells the event kind {kind!r}"
