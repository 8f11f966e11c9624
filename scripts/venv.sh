# Shared by scripts/test and scripts/demo: a project-local virtualenv with the package
# installed in editable mode. Needs Python >= 3.11 (set PYTHON=/path/to/python3.11 to choose).
# The install is editable, so code changes need no reinstall; it is redone only when
# pyproject.toml (dependencies, entry points) is newer than the last install of these extras.
setup_venv() {
  local extras="$1"
  local py="${PYTHON:-python3}"
  local stamp=".venv/.installed-${extras//[^A-Za-z0-9]/_}"
  if [ ! -x .venv/bin/python ]; then
    if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "lakeshore needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2
      exit 2
    fi
    "$py" -m venv .venv
  fi
  if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
    return 0
  fi
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$extras"
  touch "$stamp"
}
