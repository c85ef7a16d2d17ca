"""The package layout is real: the rank side loads nothing of the notebook, job or launch side."""
import functools
import json
import os
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
                        "import hvd_magics.rank.integrations.keras, hvd_magics.rank.api.shard")
    assert "hvd_magics.rank.rank_main" in loaded and "hvd_magics.rank.api.progress" in loaded
    allowed = {"hvd_magics", "hvd_magics.protocol", "hvd_magics.result_codec", "hvd_magics.errors",
               "hvd_magics.causes", "hvd_magics.events", "hvd_magics.thread_cpu"}
    # hvd_magics.common: what the driver and the ranks both use (a floor below both)
    outside = {m for m in loaded if not m.startswith(("hvd_magics.rank", "hvd_magics.common"))
               and m not in allowed}
    assert outside == set(), outside


def test_a_rank_starts_without_importing_a_package_the_executor_may_lack():
    """A rank's start-up (its hooks installed) imported numpy through the shard guard: on an
    executor whose Python lacks numpy every rank failed before the job's code ran."""
    out = subprocess.run(
        [sys.executable, "-c",
         "from hvd_magics.rank import integrations, rank_main\n"
         "from hvd_magics.rank.guards import engine_guard, shard_guard\n"
         "from hvd_magics.rank.instruments import ddp_watch\n"
         "for hook in (integrations, ddp_watch, engine_guard, shard_guard):\n"
         "    hook.install()\n"
         "import sys; print(sorted(m for m in ('numpy', 'torch', 'tensorflow', 'cloudpickle',"
         " 'pyarrow', 'mlflow') if m in sys.modules))"],
        capture_output=True, text=True, check=True, timeout=60,
        env={**os.environ, "HVD_MAGICS_ENGINE": "torch"})
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


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
                 "CellError", "ResultDecodeError", "ShardError", "ShardSpaceError",
                 "MlflowMissing", "SparkSessionLost", "EstimatorInputError",
                 "EnvironmentNotShippable"):
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


#: Which floors each floor may import (the code's folders, by where it runs, top to bottom;
#: ``shared`` is the package's own top-level modules). The entry point ``hvd_magics/__init__``
#: names the public API and may import any floor.
MAY_IMPORT = {
    "notebook": {"notebook", "estimator", "dropins", "job", "launch", "task", "rank", "shared"},
    "estimator": {"estimator", "job", "launch", "task", "rank", "shared"},
    # the peers' launchers (TorchDistributor, @distributed) on our runner, beside estimator/
    "dropins": {"dropins", "job", "launch", "task", "rank", "shared"},
    "job": {"job", "launch", "task", "rank", "shared"},
    "launch": {"launch", "task", "rank", "shared"},
    "task": {"task", "rank", "shared"},
    "rank": {"rank", "shared"},
    # run from a shell before any job: building Horovod for the environment (python -m ...)
    "horovod": {"horovod", "shared"},
    "shared": {"shared"},
}


def _floor(module: str) -> str:
    """The folder a module is in (a folder's own ``__init__`` too), or ``shared``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in MAY_IMPORT else "shared"


def _imports() -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports (a copy each call)."""
    return {module: set(names) for module, names in _parsed_imports().items()}


@functools.lru_cache(maxsize=1)
def _parsed_imports() -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports (anywhere in it)."""
    import ast
    import pathlib

    root = pathlib.Path(hvd_magics.__file__).parent
    found: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        # a package's __init__ importing its own modules (from pkg import sub) names itself
        found[module] = {n for n in names if n.startswith("hvd_magics.") and n != module}
    modules = set(found)
    return {m: {n if n in modules else n.rsplit(".", 1)[0] for n in names} & modules
            for m, names in found.items()}


def test_every_module_imports_only_its_own_floor_or_below():
    """The table holds for every folder (job/runner once imported notebook/payload)."""
    assert set(MAY_IMPORT) >= {_floor(m) for m in _imports() if m != "hvd_magics"}
    wrong = sorted(f"{m} -> {n}" for m, names in _imports().items() if m != "hvd_magics"
                   for n in names if _floor(n) not in MAY_IMPORT[_floor(m)])
    assert wrong == [], wrong


#: The most of the package's modules one module may import: a module that needs more is a hub
#: doing several jobs (job_life imported 24, the magics 19, the pool 18).
MOST_IMPORTS = 15


def test_no_module_imports_more_than_fifteen_of_the_packages_modules():
    imports = _imports()
    imports.pop("hvd_magics")  # the entry point names the public API
    hubs = sorted(f"{m}: {len(names)}" for m, names in imports.items()
                  if len(names) > MOST_IMPORTS)
    assert hubs == []


def test_no_module_imports_itself_round_a_circle():
    """rank/estimator_fit and rank/fit_keras once imported each other."""
    graph = _imports()
    graph.pop("hvd_magics")  # the entry point imports lazily what it names
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(module):]
                                                                 + [module]))
        if module in done:
            return
        for name in sorted(graph.get(module, ())):
            if name != "hvd_magics":
                visit(name, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_rank_rooms_import_one_way():
    """Within rank/, the integrations use the api and the instruments, the api uses the
    instruments, never the other way round (rank/api and rank/integrations once imported each
    other: checkpoint saved through integrations/torch_dcp, a shard told plain_loops of each
    pass; and rank/api and rank/instruments: the stack reporter passed notices to preemption)."""
    order = ["instruments", "api", "integrations"]

    def room(module: str) -> int:
        parts = module.split(".")
        return order.index(parts[2]) if len(parts) > 3 and parts[1] == "rank" and \
            parts[2] in order else -1

    wrong = sorted(f"{m} -> {n}" for m, names in _imports().items() for n in names
                   if -1 < room(m) < room(n))
    assert wrong == [], wrong


#: job/'s rooms, bottom to top: a module of job/ imports only from its own room or one below. A
#: room is a folder of job/ or one module of job/'s top level named here; ``job`` is the rest of
#: job/'s top level (the runner, the controller, the job's life, the pool, the session ...).
JOB_ROOMS = (
    "readings",   # what the ranks sent, analysed: step splits, waits, output lines, stacks ...
    "records",    # what stays after a job
    "rank_state",  # what the driver knows of one rank
    "rank_output",  # the ranks' output: logged, sorted for the cell
    "job_state",  # the driver's picture of the job, built from the events
    "following",  # the events applied as they arrive; the ranks asked where they are
    "verdicts",   # what the driver judges of the picture: the monitors, the straggler verdict
    "views",      # what the cell shows of it
    "watch",      # the loop that asks the monitors each turn
    "job",
)
#: The imports up a room still needed, and why. job_state builds ``splits``, the step splits
#: with the straggler verdict drawn as they arrive (following, background, the views, the links
#: monitor and the record read ``job.splits.now()``/``verdicts()``): judged at every step.
JOB_UP_IMPORTS = {
    ("hvd_magics.job.job_state", "hvd_magics.job.verdicts.straggler"),
}


def _job_room(module: str) -> str:
    """The room of job/ a module is in (:data:`JOB_ROOMS`), or ``""`` outside job/."""
    parts = module.split(".")
    if parts[:2] != ["hvd_magics", "job"]:
        return ""
    return parts[2] if len(parts) > 2 and parts[2] in JOB_ROOMS else "job"


def test_the_job_rooms_import_only_their_own_room_or_below():
    """job_state imported its readings from verdicts/ (the straggler's step splits, the
    preemption watch, the stacks), and records/run_record the straggler's step parts: what the
    ranks sent sits in readings/, below every judgement of it."""
    imports = _imports()
    assert {_job_room(m) for m in imports} - {""} == set(JOB_ROOMS)
    up = {(m, n) for m, names in imports.items() if _job_room(m) for n in names
          if _job_room(n) and JOB_ROOMS.index(_job_room(n)) > JOB_ROOMS.index(_job_room(m))}
    assert sorted(f"{m} -> {n}" for m, n in up - JOB_UP_IMPORTS) == []
    assert up >= JOB_UP_IMPORTS, "an up-import no longer made: strike it from JOB_UP_IMPORTS"


def test_the_architecture_page_lists_every_module_once():
    """docs/architecture.md's module table is the map a newcomer reads: it must match the tree."""
    import pathlib
    import re

    root = pathlib.Path(hvd_magics.__file__).parent
    page = (root.parent / "docs" / "architecture.md").read_text()
    listed: list[str] = []
    folder = ""
    for row in page.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("`"):
            continue
        if cells[0]:
            folder = "" if cells[0] == "shared" else cells[0].strip("`")
        listed += [folder + name for name in re.findall(r"`([\w]+\.py)`", cells[1])]
    actual = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                    if p.name != "__init__.py")
    assert sorted(listed) == actual


def test_every_backend_has_what_the_runner_asks_of_a_backend():
    """The runner types its backend as the Backend Protocol and asks no hasattr of it."""
    from hvd_magics.job.pool_cell import PoolCell
    from hvd_magics.launch.backend import Backend
    from hvd_magics.launch.driver_backend import DriverBackend
    from hvd_magics.launch.elastic_backend import ElasticSparkBackend
    from hvd_magics.launch.spark_backend import SparkBackend

    members = {name for name in vars(Backend) if not name.startswith("_")} | set(
        Backend.__annotations__)
    assert {"start", "stop", "join", "refused", "request_stacks", "where"} <= members
    for kind in (DriverBackend, SparkBackend, ElasticSparkBackend, PoolCell):
        instance_attributes = {"where", "restart_note"}  # set in __init__
        missing = {m for m in members - instance_attributes if not hasattr(kind, m)}
        assert not missing, f"{kind.__name__} lacks {sorted(missing)}"
    from pathlib import Path

    for path in (Path(hvd_magics.__file__).parent / "job").rglob("*.py"):
        text = path.read_text()
        assert "hasattr(backend" not in text and "isinstance(backend" not in text, path


def test_no_module_uses_an_undefined_name_or_imports_what_it_does_not_use():
    """pyflakes over the package and the tests: a name used but never defined or imported fails
    only when its line runs (a module split once left five behind); an unused import is noise
    (``# noqa: F401`` marks one imported for its effect)."""
    import ast
    from pathlib import Path

    from pyflakes import checker, messages

    wrong = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport,
             messages.UnusedImport)
    found = []
    for root in (Path(hvd_magics.__file__).parent, Path(__file__).parents[1]):
        for path in sorted(root.rglob("*.py")):
            text = path.read_text()
            lines = text.splitlines()
            for message in checker.Checker(ast.parse(text), filename=str(path)).messages:
                if isinstance(message, wrong) and "noqa: F401" not in lines[message.lineno - 1]:
                    said = message.message % message.message_args
                    found.append(f"{path.name}:{message.lineno}: {said}")
    assert found == []


def test_a_rank_is_named_by_one_helper():
    """``rank 1``, ``task 1``, ``ranks 0, 2`` and the ``[1]`` tags of output lines come from
    ``hvd_magics.rank_names``, not from labels built in each module."""
    import re
    from pathlib import Path

    from hvd_magics.rank_names import line_tag, ranks_named, unit_of

    assert (ranks_named([1]), ranks_named([0, 2], unit_of(True))) == ("rank 1", "tasks 0, 2")
    assert (line_tag(1), line_tag(1, unit_of(True)), line_tag(0, host="h")) == \
        ("[1]", "[task1]", "[0@h]")
    # a label, not a name such as the record's ``rank{r}_s`` column
    label = re.compile(r"""f["'][\[ ]?(rank|task)s? ?\{[^}]*\}(?!_)""")
    root = Path(hvd_magics.__file__).parent
    built = [f"{path.relative_to(root)}: {line.strip()}" for path in root.rglob("*.py")
             if path.name != "rank_names.py" for line in path.read_text().splitlines()
             if label.search(line)]
    assert built == []


def test_every_environment_variable_name_is_spelled_once_in_protocol():
    """The names the driver, tasks and ranks pass each other (ours, Horovod's, torchrun's, Spark's)
    are constants of ``hvd_magics.protocol``, not strings in the modules that use them."""
    import re
    from pathlib import Path

    name = re.compile(r"""["']((HVD_MAGICS|HOROVOD|TF|GLOO|MASTER|LOCAL|WORLD|GROUP|CUDA|NCCL|"""
                      r"""PYSPARK)_[A-Z0-9_]+|RANK|WORLD_SIZE|TF_CONFIG)["']""")
    root = Path(hvd_magics.__file__).parent
    spelled = [f"{path.relative_to(root)}: {match.group(1)}" for path in root.rglob("*.py")
               if path.name != "protocol.py" for match in name.finditer(path.read_text())]
    assert spelled == []


def test_the_modules_the_docs_name_at_the_top_import_as_written():
    """``import hvd_magics.checkpoint`` (the README's name) failed with ModuleNotFoundError;
    only ``from hvd_magics import checkpoint`` worked."""
    import importlib

    checkpoint = importlib.import_module("hvd_magics.checkpoint")
    progress = importlib.import_module("hvd_magics.progress")
    from hvd_magics import checkpoint as same
    from hvd_magics.rank.api import progress as real

    assert checkpoint is same and progress is real and callable(checkpoint.save)
