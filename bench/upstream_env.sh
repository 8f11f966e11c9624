#!/usr/bin/env bash
# The upstream SDK's own environment, for bench/upstream.py: a virtualenv at .bench-upstream/
# (repo root, git-ignored) with dreamlake-lakeshore pinned. Created only if missing; prints its
# python on stdout (everything else goes to stderr). Exits non-zero if it cannot be created,
# e.g. without network.
#
#   py=$(bash bench/upstream_env.sh)
#
# Upstream's import name, dreamlake.lakeshore, is also that of this repo's shim (dreamlake/):
# the two must never meet, so nothing here runs with the repo on sys.path or with PYTHONPATH,
# and upstream is never installed into .venv.
set -euo pipefail
NAME="dreamlake-lakeshore"
VERSION="0.5.0"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/.bench-upstream"
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV
cd /  # never the repo: '' on sys.path would find the shim

installed() {  # the pinned version, read from its metadata (imports nothing of dreamlake)
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -I -c '
import sys
from importlib.metadata import version
sys.exit(version(sys.argv[1]) != sys.argv[2])' "$NAME" "$VERSION" 2>/dev/null
}

# One maker at a time (the suite's processes, a benchmark): a second one waits, then finds
# the venv ready instead of removing it under the first one's feet.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$ROOT/.bench-upstream.lock"
  flock 9
fi

if ! installed; then
  py=""
  for cand in "${PYTHON:-}" python3.11 python3; do
    if [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 \
      && "$cand" -I -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      py="$cand"
      break
    fi
  done
  if [ -z "$py" ]; then
    echo "upstream_env: needs Python >= 3.11 (python3.11 or python3; or set PYTHON=...)" >&2
    exit 2
  fi
  echo "upstream_env: creating $VENV with $NAME==$VERSION" >&2
  rm -rf "$VENV"
  if ! "$py" -m venv "$VENV" >&2 || ! "$VENV/bin/python" -I -m pip install --quiet \
    --disable-pip-version-check "$NAME==$VERSION" >&2 || ! installed; then
    rm -rf "$VENV"  # nothing half-made that could pass for ready
    echo "upstream_env: could not install $NAME==$VERSION (no network?)" >&2
    exit 1
  fi
fi
echo "$VENV/bin/python"
