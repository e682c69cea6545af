#!/usr/bin/env bash
# A venv with the Python clients the daemon tests drive (pyarrow's Flight
# client), pinned. Idempotent; prints `export MEMWAL_TEST_PYTHON=…`.
#   scripts/py-clients.sh            install if needed, print the export
# Environment: MEMWAL_PY_VENV (default /var/tmp/memwal-py-venv).
set -euo pipefail
VENV=${MEMWAL_PY_VENV:-/var/tmp/memwal-py-venv}
PYARROW_VERSION=26.0.1
if ! "$VENV/bin/python" -c "import pyarrow, pyarrow.flight; assert pyarrow.__version__ == '$PYARROW_VERSION'" >/dev/null 2>&1; then
    python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "pyarrow==$PYARROW_VERSION" >&2
fi
echo "export MEMWAL_TEST_PYTHON=$VENV/bin/python"
