# Shared by scripts/test and scripts/demo: a project-local virtualenv with the package
# installed in editable mode. Needs Python >= 3.11 (set PYTHON=/path/to/python3.11 to choose).
# The install is editable, so code changes need no reinstall; it is redone only when what it
# was made from changed: pyproject.toml (dependencies, entry points), the extras, the Python.
setup_venv() {
  local extras="$1"
  local py="${PYTHON:-python3}"
  local stamp=".venv/.installed-${extras//[^A-Za-z0-9]/_}"
  if [ ! -x .venv/bin/python ]; then
    if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "lakeshore needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2
      exit 2
    fi
    rm -rf .venv  # a venv whose interpreter is gone: start over, stamps included
    "$py" -m venv .venv
  fi
  local made_from
  made_from="$({ cat pyproject.toml; echo "$extras"; .venv/bin/python -V; } | cksum)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$made_from" ]; then
    return 0
  fi
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$extras"
  echo "$made_from" > "$stamp"
}
