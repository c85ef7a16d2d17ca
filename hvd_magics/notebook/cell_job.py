"""A ``%%horovod`` cell made a job: the warm pool it runs on (or none), its payload (the cell
and the notebook values it reads, refused with the fix when the ranks cannot run it as written),
and its value and ``--return`` variables decoded back."""
from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError

from hvd_magics.errors import CellError, PayloadError, PoolError
from hvd_magics.job.session import SESSION
from hvd_magics.launch.payload import JobPayload, serialize_job
from hvd_magics.notebook.cell_capture import capture, keras_3_values
from hvd_magics.options import validate_engine
from hvd_magics.protocol import ENGINE_HOROVOD
from hvd_magics.rank.cell_runner import run_captured_cell
from hvd_magics.rank.guards.engine_guard import KERAS_3_MESSAGE
from hvd_magics.result_codec import RETURN_PREFIX, VALUE, decode_guarded, decode_strict

#: How to bring back an object that the cell's value could not bring.
_RETURN_HINT = ("To bring an object into the notebook, assign it in the cell and name it with "
                "%%horovod --return NAME.")


def decode_cell_result(parts: dict) -> tuple[Any, dict[str, Any]]:
    """The cell's value (only when that imports no framework into the notebook) and the
    ``--return`` variables (always: the user asked for them)."""
    value = decode_guarded(VALUE, parts[VALUE], _RETURN_HINT) if VALUE in parts else None
    returned = {name.removeprefix(RETURN_PREFIX): decode_strict(name, part)
                for name, part in parts.items() if name.startswith(RETURN_PREFIX)}
    return value, returned


def pool_for(np: Any, engine: str | None = None) -> Any:
    """The warm pool a ``%%horovod`` cell runs on: without ``np`` (or with the pool's own), the
    session's pool unless ``engine`` names another; ``None`` for a cold job. Raise
    ``UsageError`` without ``np`` and no pool (or a pool of another engine)."""
    pool = SESSION.pool
    if pool is not None and pool.alive and engine is not None:
        try:
            other = validate_engine(engine) != pool.engine
        except ValueError as exc:
            raise UsageError(f"%%horovod: {exc}") from None
        if other:
            if np is None:
                raise UsageError(f"%%horovod --engine {engine}: the warm pool runs on "
                                 f"{pool.engine}. Fix: give np for a cold job on {engine} "
                                 f"(%%horovod np={pool.np} --engine {engine}), or leave "
                                 "--engine out to run on the pool.")
            return None
    if pool is not None and not pool.alive:
        SESSION.pool = None
        if np is None:
            try:
                pool.check_usable()
            except PoolError as exc:
                raise UsageError(f"%%horovod: {exc}") from None
        print(f"hvd_magics: the warm pool has ended ({pool.ended}); this cell runs cold.")
        return None
    if np is None:
        if pool is None:
            raise UsageError("%%horovod needs the number of ranks, e.g. %%horovod np=2 (or a warm "
                             "pool: %hvd_pool start np=2)")
        return pool
    if pool is not None and np == pool.np:
        return pool
    return None


def cell_payload(cell: str, user_ns: dict[str, Any], line: str, return_names: tuple[str, ...],
                 engine: str, pool: Any) -> tuple[JobPayload, tuple[str, ...]]:
    """The cell as its ranks run it (on ``pool``'s, when not ``None``), and the modules they
    import early; raise ``UsageError`` with the fix for what they cannot run as written."""
    try:
        plan = capture(cell, user_ns, line, return_names)
    except CellError as exc:
        raise UsageError(f"%%horovod: {exc}") from None
    keras_3 = keras_3_values(plan) if engine == ENGINE_HOROVOD else []
    if keras_3:
        raise UsageError(f"%%horovod: the notebook variable {keras_3[0]!r} is a Keras 3 "
                         f"model, and {KERAS_3_MESSAGE}")
    if plan.unbound_returns and pool is None:  # a pool's rank may hold it from a cell before
        unbound = plan.unbound_returns
        raise UsageError(f"%%horovod: --return {', '.join(unbound)}: the cell never assigns "
                         f"{' or '.join(unbound)} at its top level, so rank 0 would have "
                         "nothing to bring back. Fix: assign it in the cell, or leave it out "
                         "of --return.")
    values = plan.cell.values
    if pool is not None:  # what the ranks hold unchanged goes as its digest only
        plan.cell.values = pool.pack_values(values)
    try:
        payload = serialize_job(
            run_captured_cell, {"cell": plan.cell, "kept": pool is not None}, names=values,
            labels={f"the notebook variable {k!r}": v for k, v in values.items()},
            advice="create it inside the cell instead")
    except PayloadError as exc:
        raise UsageError(f"%%horovod: {exc}") from None
    return payload, plan.preimport
