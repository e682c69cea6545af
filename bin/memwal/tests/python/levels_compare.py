"""The same reads of an indexed table two ways: over SQL through `memwal
serve` (ADBC's Flight SQL driver, no client code), and with pylance's own
LSM readers over the published view (`LsmScanner`, `LsmPointLookupPlanner`,
`LsmVectorSearchPlanner`). Either side may be skipped with "-".

Reads: every row (id -> [txt, n]); each key of KEYS looked up (its
[txt, n], or null when absent); each probe's nearest row (k = 10, the top
hit's id).

Usage: levels_compare.py GRPC_ADDR|- TABLE_PATH SNAPSHOTS_JSON|- VECTOR_SNAPSHOTS_JSON KEYS_JSON PROBES_JSON
  SNAPSHOTS_JSON: the view for scans and lookups; VECTOR_SNAPSHOTS_JSON:
  the view of the vector index (SSTables above its catch-up), each
  [{"shard", "spec_id", "current_generation", "sstables": [[generation, dir], ...]}]
  PROBES_JSON: [[id, [floats...]], ...]
Prints {"sql": READS|null, "pylance": READS|null}, READS = {"rows": {..},
"lookups": {..}, "nearest": {probe id: top id}}.
"""
import json
import sys

import pyarrow as pa

addr, path, snaps_json, vec_snaps_json, keys_json, probes_json = sys.argv[1:7]
keys, probes = json.loads(keys_json), json.loads(probes_json)


def row_map(table):
    ids = table.column("id").to_pylist()
    assert len(set(ids)) == len(ids), "a key appears twice"
    txt, n = table.column("txt").to_pylist(), table.column("n").to_pylist()
    return {str(i): [txt[k], n[k]] for k, i in enumerate(ids)}


def over_sql():
    import adbc_driver_flightsql.dbapi as flightsql

    out = {"rows": {}, "lookups": {}, "nearest": {}}
    with flightsql.connect(f"grpc://{addr}", autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, txt, n FROM t")
        out["rows"] = row_map(cur.fetch_arrow_table())
        for k in keys:
            cur.execute(f"SELECT id, txt, n FROM t WHERE id = {k}")
            got = row_map(cur.fetch_arrow_table())
            out["lookups"][str(k)] = got.get(str(k))
        for pid, vec in probes:
            text = ",".join(repr(float(x)) for x in vec)
            cur.execute(f"SELECT id FROM vector_search('t', 'vec', '{text}', 10)")
            out["nearest"][str(pid)] = cur.fetchall()[0][0]
    return out


def snapshots(text):
    from lance.mem_wal import ShardSnapshot

    out = []
    for s in json.loads(text):
        snap = ShardSnapshot(s["shard"]).with_spec_id(s["spec_id"]).with_current_generation(
            s["current_generation"])
        for generation, d in s["sstables"]:
            snap = snap.with_sstable(generation, d)
        out.append(snap)
    return out


def with_pylance():
    import lance
    from lance.mem_wal import LsmPointLookupPlanner, LsmScanner, LsmVectorSearchPlanner

    ds = lance.dataset(path)
    snaps, vec_snaps = snapshots(snaps_json), snapshots(vec_snaps_json)
    out = {"rows": row_map(LsmScanner.from_snapshots(ds, snaps).to_table()),
           "lookups": {}, "nearest": {}}
    lookup = LsmPointLookupPlanner(ds, snaps, pk_columns=["id"])
    for k in keys:
        got = row_map(lookup.plan_lookup(pa.array([k], pa.int64())).to_table())
        out["lookups"][str(k)] = got.get(str(k))
    for pid, vec in probes:
        planner = LsmVectorSearchPlanner(ds, vec_snaps, "vec", pk_columns=["id"])
        t = planner.plan_search(pa.array(vec, pa.float32()), k=10).to_table()
        out["nearest"][str(pid)] = t.column("id")[0].as_py() if t.num_rows else None
    return out


print(json.dumps({"sql": over_sql() if addr != "-" else None,
                  "pylance": with_pylance() if snaps_json != "-" else None}))
