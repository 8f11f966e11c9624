# Shared by scripts/test and scripts/demo: a project-local virtualenv with the package
# installed in editable mode. Needs Python >= 3.11 (set PYTHON=/path/to/python3.11 to choose).
setup_venv() {
  local extras="$1"
  local py="${PYTHON:-python3}"
  if [ ! -x .venv/bin/python ]; then
    if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "lakeshore needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2
      exit 2
    fi
    "$py" -m venv .venv
  fi
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$extras"
}
