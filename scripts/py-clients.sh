#!/usr/bin/env bash
# A venv with the Python clients the daemon tests drive (pyarrow's Flight
# client, ADBC's Flight SQL driver, pylance), pinned in
# scripts/py-requirements.txt. Idempotent; prints `export MEMWAL_TEST_PYTHON=…`.
#   scripts/py-clients.sh            install if needed, print the export
# Environment: MEMWAL_PY_VENV (default /var/tmp/memwal-py-venv).
set -euo pipefail
VENV=${MEMWAL_PY_VENV:-/var/tmp/memwal-py-venv}
REQ="$(cd "$(dirname "$0")" && pwd)/py-requirements.txt"
check() {
    "$VENV/bin/python" - "$REQ" <<'PY'
import sys
from importlib.metadata import version
import pyarrow.flight, adbc_driver_flightsql.dbapi, lance  # noqa: F401
for line in open(sys.argv[1]):
    line = line.strip()
    if line and not line.startswith("#"):
        name, want = line.split("==")
        assert version(name) == want, (name, version(name), want)
PY
}
if ! check >/dev/null 2>&1; then
    [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQ" >&2
    check >&2
fi
echo "export MEMWAL_TEST_PYTHON=$VENV/bin/python"
