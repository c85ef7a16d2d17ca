#!/usr/bin/env bash
# Set up (or check) the project's environment: Java, a compiler, .venv with the frameworks, and
# Horovod 0.28.1 built from its PyPI sdist with Gloo, TensorFlow and PyTorch support.
# Missing Java or compilers are installed with apt-get when run as root (HVD_MAGICS_NO_APT=1 stops that).
# Idempotent: a second run checks a stamp and returns in about a second. The built Horovod wheel is
# cached under $HVD_MAGICS_CACHE (default ~/.cache/hvd_magics), keyed on everything it was built
# against, so a fresh clone on the same machine installs it in seconds instead of rebuilding.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HVD_MAGICS_VENV:-$ROOT/.venv}
CACHE=${HVD_MAGICS_CACHE:-$HOME/.cache/hvd_magics}
PY=${PYTHON:-python3}

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
is_root() { [ "$(id -u)" = 0 ]; }

apt_install() {
  [ -z "${HVD_MAGICS_NO_APT:-}" ] && is_root && command -v apt-get >/dev/null || return 1
  say "installing Debian packages: $*"
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

java_major() {
  java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1
}

check_java() {
  local major
  major=$(command -v java >/dev/null && java_major || true)
  if [ -z "$major" ] || [ "$major" -lt 17 ]; then
    apt_install openjdk-17-jre-headless || true
    major=$(command -v java >/dev/null && java_major || true)
  fi
  if [ -z "$major" ] || [ "$major" -lt 17 ]; then
    die "Spark 4 needs Java 17 or newer, found: ${major:-no java on PATH}.
  Install it (Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless; macOS: brew install openjdk@17)
  or point JAVA_HOME at a JDK 17+ and put \$JAVA_HOME/bin on PATH, then run this again."
  fi
}

check_compiler() {
  if ! command -v g++ >/dev/null || ! command -v gcc >/dev/null || ! command -v make >/dev/null; then
    apt_install build-essential || true
  fi
  command -v g++ >/dev/null && command -v make >/dev/null || die "building Horovod needs gcc, g++ and make.
  Install them (Debian/Ubuntu: sudo apt-get install build-essential), then run this again."
  "$PY" -c 'import sysconfig, os, sys; h = sysconfig.get_paths()["include"]; sys.exit(not os.path.exists(os.path.join(h, "Python.h")))' \
    || die "Python headers (Python.h) are missing for $PY. Install them (Debian/Ubuntu: sudo apt-get install python3-dev)."
}

stamp_key() {
  cat "$ROOT/constraints.txt" "$ROOT/pyproject.toml" "$ROOT/scripts/setup.sh" "$ROOT"/hvd_magics/horovod/*.py \
    | sha256sum | cut -c1-16
}

make_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtual environment $VENV"
    "$PY" -m venv "$VENV" || die "could not create a virtual environment with $PY -m venv (Debian: apt-get install python3-venv)."
  fi
  pip_logged base install --upgrade pip setuptools wheel
}

# Run a pip command with its output in a log; on failure show the log's tail and stop.
pip_logged() {
  local what=$1; shift
  local log="$CACHE/logs/pip-$what.log"
  mkdir -p "$CACHE/logs"
  if ! "$VENV/bin/python" -m pip "$@" >"$log" 2>&1; then
    grep -v '^WARNING: Location' "$log" | tail -n 25 >&2
    die "pip could not install the $what packages; the last lines are above, the full log is $log"
  fi
}

install_frameworks() {
  say "installing the frameworks (pinned in constraints.txt)"
  pip_logged frameworks install -c "$ROOT/constraints.txt" \
    tensorflow-cpu tf-keras torch "pyspark[connect]" cmake psutil pyyaml packaging cloudpickle
}

install_project() {
  say "installing hvd_magics (editable) with its test dependencies"
  pip_logged project install -c "$ROOT/constraints.txt" -e "$ROOT[dev]"
}

# Our patched Horovod, built (or taken from the cache) by the command the package ships, the same
# one users run in their own environments (hvd_magics/horovod/build.py).
build_horovod() {
  if ! PYTHONPATH="$ROOT" HVD_MAGICS_CACHE="$CACHE" "$VENV/bin/python" -m hvd_magics.horovod build \
      2>&1 | sed -u 's/^/[setup] /'; then
    die "the Horovod build failed; see the lines above (logs in $CACHE/logs)"
  fi
}

# The browser test drives Debian's Chromium (never a browser that Playwright downloads).
check_browser() {
  command -v chromium >/dev/null && return
  apt_install chromium || true
  command -v chromium >/dev/null || die "the browser test needs Chromium at /usr/bin/chromium.
  Install it (Debian/Ubuntu: sudo apt-get install chromium), then run this again."
}

# The several-hosts tier (tests/spark_hosts) makes hosts of network namespaces: ip and bridge
# (iproute2) and unshare (util-linux), as root.
check_host_tools() {
  command -v ip >/dev/null && command -v bridge >/dev/null && command -v unshare >/dev/null \
    && return
  apt_install iproute2 util-linux || true
  command -v ip >/dev/null && command -v bridge >/dev/null && command -v unshare >/dev/null \
    || die "the several-hosts tests need ip and bridge (iproute2) and unshare (util-linux).
  Install them (Debian/Ubuntu: sudo apt-get install iproute2 util-linux), then run this again."
}

# DeepSpeed builds its CPU communication op (torch's JIT build: 27 s, 47 CPU seconds here) on
# an environment's first deepspeed.initialize, and again for another environment's path (the
# build's commands name it). Built here once per environment, so that the suite's DeepSpeed
# tests do not each build it, side by side in two lanes (128 s and 71 s in one fresh clone).
build_deepspeed_op() {
  [ -f "$VENV/.deepspeed-op" ] && return 0
  say "building DeepSpeed's CPU communication op for the tests (once per environment)"
  "$VENV/bin/python" -c "from deepspeed.comm.torch import build_shm_op
assert build_shm_op() is not None, 'DeepSpeed built no CPU communication op'" \
    >"$VENV/deepspeed-op.log" 2>&1 \
    || die "DeepSpeed could not build its CPU communication op (its log: $VENV/deepspeed-op.log)."
  touch "$VENV/.deepspeed-op"
}

# The checkout's modules compiled to bytecode (only those changed since: a second or two). Where
# PYTHONDONTWRITEBYTECODE is set (this machine sets it) no process writes its own, so a fresh
# clone had none and every rank parsed and compiled the package's modules again: 0.06 s of CPU
# a rank, 60% of a warm rank's start (32 driver ranks, issue 85). Installed wheels are compiled
# by pip.
compile_sources() {
  "$VENV/bin/python" -m compileall -q -j 0 hvd_magics tests benchmarks scripts >/dev/null
}

main() {
  if [ "${1:-}" = "--test" ]; then
    check_browser
    check_host_tools
  fi
  local stamp="$VENV/.setup-$(stamp_key)"
  if [ -f "$stamp" ] && [ -z "${HVD_MAGICS_FORCE_SETUP:-}" ]; then
    [ "${1:-}" = "--test" ] && build_deepspeed_op
    compile_sources
    return 0
  fi
  local t0=$SECONDS
  check_java
  check_compiler
  make_venv
  install_frameworks
  build_horovod
  install_project
  rm -f "$VENV"/.setup-*
  touch "$stamp"
  compile_sources
  if [ "${1:-}" = "--test" ]; then
    rm -f "$VENV/.deepspeed-op"
    build_deepspeed_op
  fi
  say "environment ready in $((SECONDS - t0)) s: $VENV"
}

main "$@"
