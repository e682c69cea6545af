#!/bin/bash
# What idempotent producers cost (issue 38, benches/RESULTS.md): `memwal
# load` with and without `--producer-id`, alternating, each run on a fresh
# table; through the release daemon (Flight) and in-process (`--embedded`,
# the daemon's write path without Flight). Needs curl.
# Usage: MEMWAL=path/to/release/memwal bash benches/producers_cost.sh
M=${MEMWAL:?set MEMWAL to the release memwal binary}
W=${WORK:-/var/tmp/memwal-producers-cost}
PAIRS=${PAIRS:-4}
rm -rf $W; mkdir -p $W
LOAD=${LOAD:-"--secs 8 --batch 1000 --producers 4"}
daemon_run() { # $1 run, $2 extra load args
  local D=$W/d$1; mkdir -p $D
  $M init $D/t --column id:int64:key --column v:utf8 --sharding "bucket(id, 4)" > /dev/null
  $M serve --table t=$D/t --listen 127.0.0.1:50072 --http 127.0.0.1:9472 --no-compactor 2> $D/serve.log &
  local pid=$!
  for i in $(seq 1 600); do
    if curl -sf http://127.0.0.1:9472/readyz > /dev/null 2>&1; then break; fi
    sleep 0.1
  done
  echo "$($M load --to 127.0.0.1:50072 --table t $LOAD $2 2>&1 | tail -1)"
  kill -TERM $pid; wait $pid
  rm -rf $D
}
embedded_run() { # $1 run, $2 extra load args
  local E=$W/e$1; mkdir -p $E
  $M init $E/t --column id:int64:key --column v:utf8 --sharding "bucket(id, 4)" > /dev/null
  echo "$($M load --embedded $E/t --table t $LOAD $2 2>&1 | tail -1)"
  rm -rf $E
}
for mode in daemon embedded; do
  for r in $(seq 1 $PAIRS); do
    sync
    if [ $((r % 2)) -eq 1 ]; then
      echo "$mode plain $r: $(${mode}_run p$r "")"; sync
      echo "$mode producers $r: $(${mode}_run i$r "--producer-id bench")"
    else
      echo "$mode producers $r: $(${mode}_run i$r "--producer-id bench")"; sync
      echo "$mode plain $r: $(${mode}_run p$r "")"
    fi
  done
done
