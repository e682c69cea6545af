#!/usr/bin/env bash
# A local S3-compatible server (moto) for memwal's S3 tests.
#
#   scripts/s3-server.sh start    install moto if needed, start it, create the
#                                 bucket, print `export ...` lines on stdout
#   scripts/s3-server.sh stop     stop the server this script started
#   scripts/s3-server.sh env      print the `export ...` lines only
#   scripts/s3-server.sh install  only install moto into the venv
#
# Developer use:   eval "$(scripts/s3-server.sh start)" && cargo test --workspace
# Progress goes to stderr, so only the exports land in `eval`.
#
# Settings (environment): MEMWAL_S3_PORT (5555), MEMWAL_S3_BUCKET (memwal-test),
# MEMWAL_S3_VENV (/var/tmp/memwal-moto-venv), MEMWAL_S3_STATE (/var/tmp/memwal-s3:
# pid file and server log).
set -euo pipefail

# Pinned: moto 5.2.5 answers a PUT with `If-None-Match: *` onto an existing key
# with 412 PreconditionFailed, which object_store maps to AlreadyExists. Its
# dependencies are pinned too, in moto-requirements.txt (installed with
# `pip install -r`), so a fresh machine gets the same server as the last one.
MOTO_VERSION=5.2.5
REQUIREMENTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/moto-requirements.txt"

PORT=${MEMWAL_S3_PORT:-5555}
BUCKET=${MEMWAL_S3_BUCKET:-memwal-test}
VENV=${MEMWAL_S3_VENV:-/var/tmp/memwal-moto-venv}
STATE=${MEMWAL_S3_STATE:-/var/tmp/memwal-s3}
ENDPOINT="http://127.0.0.1:${PORT}"
PIDFILE="$STATE/moto-${PORT}.pid"
LOGFILE="$STATE/moto-${PORT}.log"

log() { echo "s3-server: $*" >&2; }

print_env() {
    cat <<EXPORTS
export MEMWAL_TEST_S3_URI=s3://${BUCKET}
export AWS_ENDPOINT_URL=${ENDPOINT}
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
export AWS_REGION=us-east-1
export AWS_DEFAULT_REGION=us-east-1
export AWS_ALLOW_HTTP=true
EXPORTS
}

installed_version() {
    "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("moto"))' 2>/dev/null || true
}

# Records which requirements list the venv was installed from.
STAMP_NAME=.memwal-moto-requirements.sha256
requirements_hash() { sha256sum "$REQUIREMENTS" | cut -d' ' -f1; }

install() {
    [[ -f "$REQUIREMENTS" ]] || { log "missing $REQUIREMENTS"; exit 1; }
    if [[ "$(installed_version)" == "$MOTO_VERSION" ]] && [[ -x "$VENV/bin/moto_server" ]] \
        && [[ "$(cat "$VENV/$STAMP_NAME" 2>/dev/null)" == "$(requirements_hash)" ]]; then
        return 0
    fi
    if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
        log "creating venv $VENV"
        rm -rf "$VENV"
        python3 -m venv "$VENV"
    fi
    log "installing moto $MOTO_VERSION and its pinned dependencies ($REQUIREMENTS) into $VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS" >&2
    local problems
    problems=$("$VENV/bin/python" -m pip check --disable-pip-version-check 2>&1) \
        || { log "installed packages are inconsistent: $problems"; exit 1; }
    [[ "$(installed_version)" == "$MOTO_VERSION" ]] || { log "moto $MOTO_VERSION did not install"; exit 1; }
    requirements_hash >"$VENV/$STAMP_NAME"
}

# True when something answers HTTP on the endpoint.
answers() {
    "$VENV/bin/python" - "$ENDPOINT" <<'PY' 2>/dev/null
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen(sys.argv[1] + "/", timeout=1)
except urllib.error.HTTPError:
    pass  # any HTTP answer means the server is up
sys.exit(0)
PY
}

running_pid() {
    [[ -f "$PIDFILE" ]] || return 1
    local pid
    pid=$(cat "$PIDFILE")
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

create_bucket() {
    AWS_ENDPOINT_URL=$ENDPOINT AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \
        AWS_DEFAULT_REGION=us-east-1 "$VENV/bin/python" - "$BUCKET" <<'PY' >&2
import sys, boto3, botocore.exceptions
s3 = boto3.client("s3")  # endpoint, keys and region from the AWS_* environment
try:
    s3.create_bucket(Bucket=sys.argv[1])
except botocore.exceptions.ClientError as e:
    if e.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
        raise
s3.head_bucket(Bucket=sys.argv[1])
PY
}

start() {
    install
    mkdir -p "$STATE"
    if pid=$(running_pid); then
        log "moto already running (pid $pid) on $ENDPOINT"
    else
        if answers; then
            log "port $PORT already answers but not by a moto this script started; set MEMWAL_S3_PORT"
            exit 1
        fi
        log "starting moto $MOTO_VERSION on $ENDPOINT (log: $LOGFILE)"
        # stdin/stdout/stderr detached so `$(s3-server.sh start)` returns.
        "$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" </dev/null >"$LOGFILE" 2>&1 &
        echo $! >"$PIDFILE"
        local deadline=$((SECONDS + 30))
        until answers; do
            if ! running_pid >/dev/null; then
                log "moto exited during startup:"; tail -n 20 "$LOGFILE" >&2; exit 1
            fi
            if ((SECONDS >= deadline)); then
                log "moto did not answer within 30 s:"; tail -n 20 "$LOGFILE" >&2; stop; exit 1
            fi
            sleep 0.2
        done
        log "moto is up (pid $(cat "$PIDFILE"))"
    fi
    create_bucket
    log "bucket s3://$BUCKET ready"
    print_env
}

stop() {
    local pid
    if pid=$(running_pid); then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        log "stopped moto (pid $pid)"
    fi
    rm -f "$PIDFILE"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    env) print_env ;;
    install) install ;;
    *) echo "usage: $0 start|stop|env|install" >&2; exit 2 ;;
esac
