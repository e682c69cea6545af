"""Searches a memwal-fed table with pylance's LSM planners, as a pylance
user reads fresh rows: vector search (`LsmVectorSearchPlanner`) for each
probe's own vector (the probe must be the nearest hit), the same filtered
to fresh rows, and full-text search (`LsmScanner`'s FTS is not exposed in
Python, so each SSTable dataset is searched with pylance's
`full_text_query`, and its index list reported). Prints JSON:
{"top_hits": N, "misses": [[id, hit ids, distances]], "filtered_fresh_only":
bool, "fts_hits": N, "sstable_indexes": [[names] per SSTable]}.

Usage: lsm_search.py TABLE_PATH SNAPSHOTS_JSON PROBES_JSON
  SNAPSHOTS_JSON: [{"shard", "spec_id", "current_generation",
                    "sstables": [[generation, dir], ...]}]
  PROBES_JSON: [[id, [16 floats], "unique word"], ...]
"""
import json
import sys

import lance
import pyarrow as pa
from lance.mem_wal import LsmVectorSearchPlanner, ShardSnapshot

path, snaps, probes = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
ds = lance.dataset(path)
snapshots = []
for s in snaps:
    snap = ShardSnapshot(s["shard"]).with_spec_id(s["spec_id"]).with_current_generation(
        s["current_generation"])
    for generation, d in s["sstables"]:
        snap = snap.with_sstable(generation, d)
    snapshots.append(snap)

top_hits, misses = 0, []
for pid, vec, _ in probes:
    planner = LsmVectorSearchPlanner(ds, snapshots, "vec", pk_columns=["id"])
    # k=10: lance searches HNSW with ef = k + k/2, so k=1 is a greedy walk
    # that can stop at a local minimum of any HNSW graph (upstream's too).
    t = planner.plan_search(pa.array(vec, pa.float32()), k=10).to_table()
    if t.num_rows and t.column("id")[0].as_py() == pid:
        top_hits += 1
    else:
        misses.append([pid, t.column("id").to_pylist(), t.column("_distance").to_pylist()])

fresh_min = min(p[0] for p in probes)
filtered = LsmVectorSearchPlanner(ds, snapshots, "vec", pk_columns=["id"],
                                  filter=f"n >= {fresh_min}")
t = filtered.plan_search(pa.array(probes[0][1], pa.float32()), k=10).to_table()
filtered_fresh_only = t.num_rows > 0 and all(i >= fresh_min for i in t.column("id").to_pylist())

fts_hits, sstable_indexes = 0, []
for s in snaps:
    for _, d in s["sstables"]:
        sst = lance.dataset(f"{path}/_mem_wal/{s['shard']}/{d}")
        sstable_indexes.append(sorted(i["name"] for i in sst.list_indices()))
        for pid, _, word in probes:
            hit = sst.to_table(full_text_query={"query": word, "columns": ["txt"]},
                               columns=["id"])
            if pid in hit.column("id").to_pylist():
                fts_hits += 1
print(json.dumps({"top_hits": top_hits, "misses": misses,
                  "filtered_fresh_only": filtered_fresh_only, "fts_hits": fts_hits,
                  "sstable_indexes": sstable_indexes}))
