"""Reads a memwal-fed table with pylance's `LsmScanner` (base table plus
the published SSTables of the given shard snapshots, newest row per key)
and prints {id: {column: value}} as JSON, every column but `id`.

Usage: lsm_read.py TABLE_PATH SNAPSHOTS_JSON
  SNAPSHOTS_JSON: [{"shard", "spec_id", "current_generation",
                    "sstables": [[generation, dir], ...]}]
"""
import json
import sys

import lance
from lance.mem_wal import LsmScanner, ShardSnapshot

path, snaps = sys.argv[1], json.loads(sys.argv[2])
snapshots = []
for s in snaps:
    snap = ShardSnapshot(s["shard"]).with_spec_id(s["spec_id"]).with_current_generation(
        s["current_generation"])
    for generation, d in s["sstables"]:
        snap = snap.with_sstable(generation, d)
    snapshots.append(snap)
t = LsmScanner.from_snapshots(lance.dataset(path), snapshots).to_table()
ids = t.column("id").to_pylist()
assert len(set(ids)) == len(ids), "a key appears twice"
others = [n for n in t.column_names if n != "id"]
print(json.dumps({str(i): {n: t.column(n)[k].as_py() for n in others} for k, i in enumerate(ids)}))
