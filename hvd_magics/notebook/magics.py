"""The IPython front end: ``%%horovod`` (a cell as a job: cold, on the warm pool, or in the
background), ``%hvd_pool``, ``%hvd_stacks``, ``%hvd_timeline`` and ``%hvd_mlflow``. Each parses
its line as a shell would (:mod:`hvd_magics.notebook.magic_line`: ``np=4`` style words and a
trailing ``# comment`` too) and turns a user's mistake into one ``UsageError`` line; the work is
``HorovodRunner``'s."""
from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from hvd_magics.errors import HorovodMagicsError, MlflowMissing
from hvd_magics.job.background import BackgroundJob, jobs
from hvd_magics.job.environment import environment_status, ship_environment
from hvd_magics.job.records.mlflow_run import requested
from hvd_magics.job.pool import HorovodPool
from hvd_magics.job.runner import HorovodRunner, default_views
from hvd_magics.job.session import SESSION
from hvd_magics.job.records.timeline import COST_WARNING, summarize
from hvd_magics.job.views.widgets_view import WidgetView
from hvd_magics.notebook.cell_job import cell_payload, decode_cell_result, pool_for
from hvd_magics.notebook.gpu_guard import driver_gpu_holders, driver_gpu_message
from hvd_magics.notebook.job_arguments import job_arguments, job_keywords
from hvd_magics.notebook.magic_line import option, parse_env, parse_line

def _start_background(runner: HorovodRunner, payload: Any, args: Any, cell: str,
                      preimport: tuple[str, ...], user_ns: dict[str, Any]) -> BackgroundJob:
    """``%%horovod --background``: the cell's job started, its handle kept in ``-o NAME``."""
    views = default_views(runner.driver_log_verbosity, show_output=not args.quiet,
                          background=True)
    job = runner.start_payload(payload, views, decode_cell_result, cell, preimport,
                               on_success=lambda record: user_ns.update(
                                   record.returned))
    if args.output:
        user_ns[args.output] = job
    name = args.output or "job"
    keep = "" if args.output else " (-o NAME keeps its handle)"
    print(f"hvd_magics: the job runs in the background{keep}; {name}.wait() for its value, "
          f"{name}.stop() to end it, %hvd_stacks {args.output or ''} to see where its "
          "ranks are.".replace("  ", " "))
    return job


@magics_class
class HorovodMagics(Magics):
    """``%%horovod np=N``: run the cell as a Horovod job with N ranks."""

    @magic_arguments("%horovod")  # a cell magic: its usage reads %%horovod
    @job_arguments()  # HorovodRunner's keywords, declared in hvd_magics.option_table
    @option("--cold", flag=True,
            help="Run on new ranks even while a warm pool (%%hvd_pool) runs.")
    @option("-o", "--output", metavar="NAME", default=None,
            help="Store the run record (timing, exit codes, logs) in the variable NAME; with "
                 "--background, the job's handle.")
    @option("--background", flag=True,
            help="Return at once: the job runs while other cells do (-o NAME keeps its "
                 "handle: NAME.wait(), NAME.stop(), %%hvd_stacks NAME).")
    @option("--return", dest="return_names", metavar="NAME[,NAME...]", default="",
            help="After a successful run, copy these variables from rank 0 into the notebook.")
    @option("-q", "--quiet", flag=True,
            help="Do not print the ranks' output (widgets and the log file still have it).")
    @option("--allow-driver-gpu", flag=True,
            help="Run even when the notebook's own process holds a GPU.")
    @option("--no-mlflow", flag=True, help="Do not record this run in MLflow.")
    @cell_magic
    def horovod(self, line: str, cell: str) -> Any:
        """Run the cell as a Horovod job; return what rank 0's cell evaluates to last."""
        args = parse_line(self.horovod, line, "%%horovod")
        pool = None if args.cold else pool_for(args.np, args.engine)
        if args.cold and args.np is None:
            raise UsageError("%%horovod --cold needs the number of ranks, e.g. "
                             "%%horovod np=2 --cold")
        env = parse_env(args.env, "%%horovod")
        return_names = tuple(n.strip() for n in args.return_names.split(",") if n.strip())
        bad = [n for n in return_names if not n.isidentifier()]
        if bad:
            raise UsageError(f"%%horovod: --return takes variable names, got {', '.join(bad)}")
        timeline = SESSION.timeline
        try:  # the runner checks every option, once
            runner = HorovodRunner(
                pool.np if pool is not None else args.np, pool=pool, **{
                    **job_keywords(args), "env": env,
                    "timeline": timeline.next_path() if timeline.enabled else None,
                    "timeline_mark_cycles": timeline.mark_cycles,
                    "mlflow": False if args.no_mlflow else args.mlflow})
        except ValueError as exc:
            raise UsageError(f"%%horovod: {exc}") from None
        except MlflowMissing as exc:
            raise UsageError(f"%%horovod --mlflow: {exc}") from None
        if not args.allow_driver_gpu:
            holders = driver_gpu_holders()
            if holders:
                raise UsageError(driver_gpu_message(holders))
        payload, preimport = cell_payload(cell, self.shell.user_ns, f"%%horovod {line}".rstrip(),
                                          return_names, runner.engine, pool)
        if args.background:
            return _start_background(runner, payload, args, cell, preimport,
                                     self.shell.user_ns)
        views = default_views(runner.driver_log_verbosity, show_output=not args.quiet)
        try:
            record = runner.run_payload(payload, views, decode_cell_result, cell, preimport)
        finally:
            if args.output:
                self.shell.user_ns[args.output] = SESSION.last_run
        self.shell.user_ns.update(record.returned)
        for view in views:
            if isinstance(view, WidgetView):
                view.hand_over_charts()
        display(record)  # the static summary: shown by exports, terminals and widget-less views
        return record.value

    @magic_arguments()
    @argument("job", nargs="?", default=None,
              help="A background job's handle (the name given to -o); default: the latest "
                   "background job that runs.")
    @line_magic
    def hvd_stacks(self, line: str) -> Any:
        """Show where each rank of a background job is now (its Python stacks), without
        stopping it."""
        args = parse_line(self.hvd_stacks, line, "%hvd_stacks")
        if args.job:
            job = self.shell.user_ns.get(args.job)
            if not isinstance(job, BackgroundJob):
                raise UsageError(f"%hvd_stacks: {args.job!r} is not a background job's handle. "
                                 "Fix: start one with %%horovod --background -o NAME, then "
                                 "%hvd_stacks NAME.")
        else:
            running = jobs()
            if not running:
                raise UsageError("%hvd_stacks: no background job runs. Start one with "
                                 "%%horovod --background -o job (a job in the foreground shows "
                                 "where its ranks are when they stall, at --timeout and when "
                                 "interrupted).")
            job = running[-1]
        if job.done():
            raise UsageError(f"%hvd_stacks: the job has ended ({job!r}); its record: "
                             f"{args.job or 'job'}.record")
        return job.stacks()

    @magic_arguments()
    @argument("action", nargs="?", choices=["start", "stop", "restart", "forget"], default=None,
              help="start: start warm ranks that run the next %%horovod cells; stop: end them; "
                   "restart: new ranks (the kept variables are gone); forget: delete the "
                   "DataFrames' shards the ranks hold (the next cell deals them again). Without "
                   "an action, show the pool.")
    @job_arguments(pool=True)  # HorovodPool's keywords, declared in hvd_magics.option_table
    @line_magic
    def hvd_pool(self, line: str) -> Any:
        """Warm ranks that live across cells: ``%hvd_pool start np=2``, then ``%%horovod``."""
        args = parse_line(self.hvd_pool, line, "%hvd_pool")
        pool = SESSION.pool
        if args.action == "start":
            if pool is not None and pool.alive:
                raise UsageError(f"%hvd_pool start: a warm pool runs already ({pool!r}). Fix: "
                                 "%hvd_pool stop first, or %hvd_pool restart for new ranks.")
            if args.np is None:
                raise UsageError("%hvd_pool start needs the number of ranks, e.g. "
                                 "%hvd_pool start np=2")
            try:
                SESSION.pool = HorovodPool(args.np, parse_env(args.env, "%hvd_pool"),
                                           **job_keywords(args, pool=True))
            except ValueError as exc:
                raise UsageError(f"%hvd_pool start: {exc}") from None
            print(SESSION.pool)
            return None
        if pool is None:
            print("No warm pool: start one with %hvd_pool start np=2")
            return None
        if args.action == "stop":
            pool.close()
            SESSION.pool = None
            print(f"The warm pool of {pool.ranks} on {pool.where} has ended; its slots "
                  "are free.")
            return None
        if args.action == "forget":
            if not pool.alive:
                raise UsageError("%hvd_pool forget: the pool has ended (and its shards with "
                                 f"it); start a new one with %hvd_pool start np={pool.np}")
            dropped = pool.forget_shards()
            print(f"The warm pool forgot the shards of {dropped} DataFrame"
                  f"{'' if dropped == 1 else 's'}; the next cell that reads one deals it again.")
            return None
        if args.action == "restart":
            if not pool.alive:
                raise UsageError("%hvd_pool restart: the pool has ended; start a new one with "
                                 f"%hvd_pool start np={pool.np}")
            try:
                pool.restart()
            except HorovodMagicsError as exc:
                SESSION.pool = None
                raise UsageError(f"%hvd_pool restart: {exc}") from None
        print(pool)
        return None

    @magic_arguments()
    @argument("action", nargs="?", choices=["on", "off", "show"], default=None,
              help="on: record the next %%horovod runs; off: stop; show: summarise a trace. "
                   "Without an action, print the current state.")
    @argument("path", nargs="?", default=None,
              help="on: a file, or a folder for one timestamped file per run (default "
                   "hvd_timelines/ beside the notebook). show: the trace (default: the last "
                   "run's; of a background job that runs: its trace so far).")
    @option("--mark-cycles", flag=True, help="Mark Horovod's cycles in the trace.")
    @line_magic
    def hvd_timeline(self, line: str) -> Any:
        """Record Horovod Timeline for %%horovod runs and show what it recorded."""
        args = parse_line(self.hvd_timeline, line, "%hvd_timeline")
        settings = SESSION.timeline
        if args.action == "on":
            settings.enabled, settings.path = True, args.path
            settings.mark_cycles = args.mark_cycles
            if not settings.warned:
                print(COST_WARNING)
                settings.warned = True
            print(settings)
            return None
        if args.action == "off":
            settings.enabled = False
            print(settings)
            return None
        if args.action == "show":
            running = [job for job in jobs() if job.record is SESSION.last_run]
            path = args.path or (running[0].timeline_so_far() if running else None) or (
                SESSION.last_run.timeline_path if SESSION.last_run is not None else None)
            if not path:
                raise UsageError("%hvd_timeline show: the last run recorded no timeline; turn it "
                                 "on with %hvd_timeline on, or give a trace file")
            try:
                return summarize(path)
            except OSError as exc:
                raise UsageError(f"%hvd_timeline show: cannot read {path}: "
                                 f"{exc.strerror}") from None
        print(settings)
        return None

    @magic_arguments()
    @argument("action", nargs="?", choices=["ship", "off"], default=None,
              help="ship: run every later job's ranks in this notebook's Python environment, "
                   "packed and sent to the executors; off: in the executors' own Python. "
                   "Without an action, say what is shipped.")
    @argument("prefix", nargs="?", default=None,
              help="ship: the environment's folder (default: the kernel's own, sys.prefix).")
    @option("--limit-gb", type=float, default=None,
            help="ship: refuse an environment larger than this, unpacked (default 10).")
    @line_magic
    def hvd_env(self, line: str) -> None:
        """Ship this notebook's Python environment to the executors (or stop), or say what is."""
        args = parse_line(self.hvd_env, line, "%hvd_env")
        if args.action is None and (args.prefix or args.limit_gb):
            raise UsageError("%hvd_env: a folder and --limit-gb go with ship: "
                             "%hvd_env ship [FOLDER] [--limit-gb N]")
        try:
            if args.action == "ship":
                limit = {} if args.limit_gb is None else {"limit_gb": args.limit_gb}
                ship_environment(args.prefix, **limit)
            elif args.action == "off":
                ship_environment(False)
        except HorovodMagicsError as exc:
            raise UsageError(f"%hvd_env: {exc}") from None
        print(environment_status())

    @magic_arguments()
    @argument("action", nargs="?", choices=["on", "off"], default=None,
              help="on: record every %%horovod run in MLflow; off: only when asked (--mlflow) or "
                   "when an MLflow run is active. Without an action, print the current state.")
    @argument("experiment", nargs="?", default=None,
              help="on: the experiment's name (default: the current experiment).")
    @line_magic
    def hvd_mlflow(self, line: str) -> None:
        """Turn MLflow tracking of every %%horovod run on or off for this session."""
        args = parse_line(self.hvd_mlflow, line, "%hvd_mlflow")
        if args.action == "on":
            try:
                SESSION.mlflow = requested(args.experiment or True, None)
            except MlflowMissing as exc:
                raise UsageError(f"%hvd_mlflow: {exc}") from None
        elif args.action == "off":
            SESSION.mlflow = None
        print(SESSION.mlflow if SESSION.mlflow is not None else
              "MLflow tracking is off: a run is recorded with %%horovod --mlflow, or when an "
              "MLflow run is active in the notebook")
