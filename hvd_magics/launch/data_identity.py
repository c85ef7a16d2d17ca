"""Whether a DataFrame's data is provably what it was when its shards were dealt (driver side).

Spark compares plans, not data: ``spark.table("events")`` has the same plan before and after an
``INSERT``, and so has ``spark.read.parquet(path)`` before and after the path is overwritten. A
warm pool reuses the shards it dealt only when :func:`data_identity` can prove the data is the
same, and deals again otherwise (:mod:`hvd_magics.launch.pool_data`).

What counts as proof, leaf by leaf of the optimized plan (with Spark's cached data in place):

- rows the plan itself holds or makes (``createDataFrame`` of pandas or local rows,
  ``spark.range``);
- a cached DataFrame (``df.cache()``): the identity of Spark's cache, which Spark replaces when it
  refreshes it (an ``INSERT`` through Spark into a table the cache reads);
- a checkpoint (``df.checkpoint()``, ``df.localCheckpoint()``), or local data made into an RDD;
- files (Parquet, CSV, JSON, ORC, a catalog table's folder): every file under the source's root
  paths listed now, with its size and modification time (Delta's log is a file there too);

and the whole plan deterministic (no ``rand()`` above the leaves; Spark ML's transformers mark their
UDFs non-deterministic for the optimizer's sake only, and count as deterministic). Anything else (a
v2 source, a Hive table, JDBC, a stream) cannot be proven unchanged: it is dealt again, and the cell
says why and how to keep it (cache or checkpoint it). On Spark Connect the server's plan is out of
reach: only a DataFrame of local rows or a checkpoint (``df.localCheckpoint()``) is provably
unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: More files than this under a source's roots are not listed (dealt again instead).
MAX_LISTED_FILES = 20_000
#: What the cell advises for data that cannot be proven unchanged.
KEEP_ADVICE = ("cache or checkpoint it (df.cache(), df.localCheckpoint()) to have a pool deal it "
               "once")


@dataclass(frozen=True)
class DataIdentity:
    """What a DataFrame's data is now, as far as can be proven.

    Attributes
    ----------
    key : tuple or None
        Equal keys mean equal data (for equal plans); ``None`` when it cannot be proven.
    why : str
        What the proof rests on ("spark.range", "2 files unchanged", "cached"), or why there is
        none (for the cell).
    """

    key: tuple | None
    why: str

    @property
    def proven(self) -> bool:
        """Whether the key proves anything."""
        return self.key is not None


def data_identity(frame: Any) -> DataIdentity:
    """What ``frame``'s data is now (classic or Spark Connect); never raises."""
    try:
        if type(frame).__module__.startswith("pyspark.sql.connect"):
            return _connect_identity(frame)
        return _classic_identity(frame)
    except Exception as exc:  # noqa: BLE001 - unprovable, never a failed cell
        return DataIdentity(None, f"its data could not be identified ({type(exc).__name__})")


def _classic_identity(frame: Any) -> DataIdentity:
    # a new plan over the frame, as the dealing stage's is: a frame's own plan was optimized
    # once, maybe before the frame (or a part of it) was cached
    plan = frame.select("*")._jdf.queryExecution().optimizedPlan()  # noqa: SLF001
    random = None if plan.deterministic() else _nondeterministic(plan)
    if random is not None:
        return DataIdentity(None, f"its plan is not deterministic ({random}); {KEEP_ADVICE}")
    jvm = frame.sparkSession.sparkContext._jvm  # noqa: SLF001
    conf = frame.sparkSession.sparkContext._jsc.hadoopConfiguration()  # noqa: SLF001
    leaves = plan.collectLeaves()
    keys: list[tuple] = []
    whys: list[str] = []
    for i in range(leaves.size()):
        key, why = _leaf_identity(leaves.apply(i), jvm, conf)
        if key is None:
            return DataIdentity(None, why)
        keys.append(key)
        whys.append(why)
    return DataIdentity(tuple(keys), ", ".join(dict.fromkeys(whys)))


def _seq(items: Any) -> list[Any]:
    return [items.apply(i) for i in range(items.size())]


def _nondeterministic(plan: Any) -> str | None:
    """The first expression of ``plan`` whose values may differ between two runs, by name;
    ``None`` when Spark marks some non-deterministic only for its optimizer (the UDFs of Spark
    ML's own transformers, VectorAssembler's among them, which compute the same values)."""
    nodes, expressions = [plan], []
    while nodes:
        node = nodes.pop()
        nodes.extend(_seq(node.children()))
        expressions.extend(_seq(node.expressions()))
    while expressions:
        expression = expressions.pop()
        if expression.deterministic():
            continue
        children = _seq(expression.children())
        if all(child.deterministic() for child in children):
            kind = expression.getClass().getSimpleName()
            if kind == "ScalaUDF" and expression.function().getClass().getName() \
                    .startswith("org.apache.spark.ml."):
                continue
            return f"{expression.prettyName()}()"
        expressions.extend(children)
    return None


def _leaf_identity(leaf: Any, jvm: Any, conf: Any) -> tuple[tuple | None, str]:
    name = leaf.nodeName()
    if name in ("LocalRelation", "OneRowRelation"):
        return (name,), "rows in the plan"
    if name == "Range":
        return (name,), "spark.range"
    if name == "InMemoryRelation":
        return ("cache", leaf.cacheBuilder().cachedColumnBuffers().id()), "cached"
    if name == "LogicalRDD":
        return _rdd_identity(leaf.rdd())
    if name == "LogicalRelation":
        relation = leaf.relation()
        if relation.getClass().getSimpleName() == "HadoopFsRelation":
            return _files_identity(relation.location().rootPaths(), jvm, conf)
        return None, (f"it reads {relation.getClass().getSimpleName()}, whose data cannot be "
                      f"proven unchanged; {KEEP_ADVICE}")
    return None, f"it reads a {name}, whose data cannot be proven unchanged; {KEEP_ADVICE}"


def _rdd_identity(rdd: Any) -> tuple[tuple | None, str]:
    """An RDD is fixed when each line of its lineage ends in a checkpoint or in local data."""
    todo, checkpointed = [rdd], False
    while todo:
        current = todo.pop()
        if current.isCheckpointed():
            checkpointed = True
            continue
        if current.getClass().getSimpleName() == "ParallelCollectionRDD":
            continue
        deps = current.dependencies()
        if deps.size() == 0:
            return None, (f"it reads an RDD ({current.getClass().getSimpleName()}) whose data "
                          f"cannot be proven unchanged; {KEEP_ADVICE}")
        todo.extend(deps.apply(i).rdd() for i in range(deps.size()))
    return ("rdd", rdd.id()), "checkpointed" if checkpointed else "local rows"


def _files_identity(roots: Any, jvm: Any, conf: Any) -> tuple[tuple | None, str]:
    """Every file under ``roots`` now: path, size and modification time."""
    files: list[tuple[str, int, int]] = []
    for i in range(roots.size()):
        root = roots.apply(i)
        fs = root.getFileSystem(conf)
        if not fs.exists(root):
            files.append((root.toString(), -1, -1))
            continue
        listing = fs.listFiles(root, True)
        while listing.hasNext():
            status = listing.next()
            files.append((status.getPath().toString(), status.getLen(),
                          status.getModificationTime()))
            if len(files) > MAX_LISTED_FILES:
                return None, (f"it reads more than {MAX_LISTED_FILES:,} files, too many to "
                              f"check for changes; {KEEP_ADVICE}")
    count = sum(1 for _, size, _ in files if size >= 0)
    return ("files", tuple(sorted(files))), f"{_plural(count, 'file')} unchanged"


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'s' * (count != 1)}"


def describe_change(old: DataIdentity, new: DataIdentity) -> str:
    """Why data dealt as ``old`` is dealt again as ``new`` (the same plan), for the cell: what
    changed between two proven identities, or why one of them proves nothing."""
    for identity in (new, old):
        if not identity.proven:
            return identity.why
    def files(identity: DataIdentity) -> dict[str, tuple[int, int]]:
        return {path: (size, mtime) for leaf in identity.key or () if leaf[0] == "files"
                for path, size, mtime in leaf[1]}

    before, after = files(old), files(new)
    counts = {"added": len(after.keys() - before.keys()),
              "removed": len(before.keys() - after.keys()),
              "rewritten": sum(1 for path in before.keys() & after.keys()
                               if before[path] != after[path])}
    said = [f"{_plural(n, 'file') if not i else n} {what}"
            for i, (what, n) in enumerate((w, n) for w, n in counts.items() if n)]
    if said:
        return f"its files changed since it was dealt: {', '.join(said)}"
    if any(leaf[0] == "cache" for leaf in old.key or ()):
        return "Spark refreshed its cache since it was dealt"
    return "its data changed since it was dealt"


#: Spark Connect plans whose data the plan itself fixes.
_CONNECT_FIXED = {"LocalRelation": "local rows", "CachedLocalRelation": "local rows",
                  "CachedRemoteRelation": "checkpointed"}


def _connect_identity(frame: Any) -> DataIdentity:
    plan = frame._plan  # noqa: SLF001 - the client's plan, the only one in reach
    name = type(plan).__name__
    if name in _CONNECT_FIXED:  # the plan node holds its rows (or the server's checkpoint)
        key = getattr(plan, "_relation_id", None) or id(plan)
        return DataIdentity((name, key), _CONNECT_FIXED[name])
    return DataIdentity(None, "on Spark Connect only a DataFrame of local rows or a checkpoint "
                              "is provably unchanged; check it out of the server with "
                              "df.localCheckpoint() to have a pool deal it once")
