"""``python -m hvd_magics.horovod build | check``: build Horovod for this environment, or say
what the installed one was built for."""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from hvd_magics.errors import HOROVOD_BUILD_COMMAND
from hvd_magics.horovod import build as horovod_build
from hvd_magics.horovod.patches import PatchError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hvd_magics.horovod",
        description="Build our patched Horovod 0.28.1 for this Python environment (its "
                    "TensorFlow and PyTorch), or check the installed one.")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build (or take from the cache), install, check")
    build.add_argument("--gpu", choices=("auto", "cpu", "gpu"), default="auto",
                       help="NCCL operations for GPUs: auto (when PyTorch has CUDA and nvcc is "
                            "found), or always, or never")
    build.add_argument("--cache", type=Path, default=None,
                       help="where wheels and logs are kept (default $HVD_MAGICS_CACHE or "
                            "~/.cache/hvd_magics)")
    build.add_argument("--sdist", type=Path, default=None,
                       help=f"horovod-{horovod_build.HOROVOD_VERSION}.tar.gz, where pip cannot "
                            "download it")
    build.add_argument("--force", action="store_true",
                       help="install again even when this environment's Horovod is up to date")
    commands.add_parser("check", help="say what the installed Horovod was built for, and "
                                      "whether it matches this environment")
    return parser


def _check() -> int:
    installed = horovod_build.installed_target()
    if installed is None:
        other = importlib.util.find_spec("horovod") is not None
        what = ("The Horovod installed in {} was not built by hvd_magics (it lacks our fixes, "
                "and may not load with this environment's frameworks)" if other else
                "No Horovod is installed in {}").format(sys.executable)
        print(f"{what}. Build one: {HOROVOD_BUILD_COMMAND}, after pip install "
              f"\"hvd_magics[horovod]\" (what the build needs), or run jobs with --engine torch.")
        return 1
    wanted = horovod_build.target("auto")
    built_for = horovod_build.Target(installed["python"], installed["frameworks"],
                                     installed.get("gpu_operations", ""))
    if built_for.frameworks != wanted.frameworks or built_for.python != wanted.python:
        print(f"The installed Horovod was built for {built_for.describe()}, but this "
              f"environment has {wanted.describe()}. Rebuild: "
              f"{HOROVOD_BUILD_COMMAND}")
        return 1
    horovod_build.check(built_for)
    print(f"Horovod {installed.get('horovod')} works here, built for {built_for.describe()}.")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "check":
            return _check()
        horovod_build.build(gpu=args.gpu, cache=args.cache, sdist=args.sdist, force=args.force)
        return 0
    except (horovod_build.BuildError, PatchError) as exc:
        print(f"hvd_magics.horovod: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
