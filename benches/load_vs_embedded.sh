#!/bin/bash
# `memwal load` against the release daemon vs `--embedded` (the same write
# path in-process, no Flight), alternating, each run on a fresh table
# (issue 30, benches/RESULTS.md). Needs curl.
# Usage: MEMWAL=path/to/release/memwal bash benches/load_vs_embedded.sh
M=${MEMWAL:?set MEMWAL to the release memwal binary}
W=${WORK:-/var/tmp/memwal-load-vs-embedded}
rm -rf $W; mkdir -p $W
LOAD="--secs 8 --batch 1000 --producers 4"
daemon_run() {
  local D=$W/d$1; mkdir -p $D
  $M init $D/t --column id:int64:key --column v:utf8 --sharding "bucket(id, 4)" > /dev/null
  $M serve --table t=$D/t --listen 127.0.0.1:50071 --http 127.0.0.1:9471 --no-compactor 2> $D/serve.log &
  local pid=$!
  for i in $(seq 1 600); do
    if curl -sf http://127.0.0.1:9471/readyz > /dev/null 2>&1; then break; fi
    sleep 0.1
  done
  echo "daemon $1: $($M load --to 127.0.0.1:50071 --table t $LOAD 2>&1 | tail -1)"
  kill -TERM $pid; wait $pid
  rm -rf $D
}
embedded_run() {
  local E=$W/e$1; mkdir -p $E
  $M init $E/t --column id:int64:key --column v:utf8 --sharding "bucket(id, 4)" > /dev/null
  echo "embedded $1: $($M load --embedded $E/t --table t $LOAD 2>&1 | tail -1)"
  rm -rf $E
}
for r in 1 2 3 4; do
  sync
  if [ $((r % 2)) -eq 1 ]; then daemon_run $r; sync; embedded_run $r; else embedded_run $r; sync; daemon_run $r; fi
done
