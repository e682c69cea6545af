"""Reads at table scale (issue 36): a release `memwal serve`, a separate
process, over a base table larger than its query budget, against pylance
reading the same base in this process, alternating call by call.

The table: `--rows` base rows (`id` int64 key, `v` random text of
`--value-bytes`), written with pylance into a table `memwal init` created;
then, through the daemon, `--fresh` rows flushed into an SSTable and
`--fresh` more left unflushed (the first overwrite half their keys in
the base, the second are new keys). memwal
answers over Flight SQL (ADBC, batches streamed and dropped as they
arrive) and reads every level; pylance scans the base alone (the plain
dataset scan: it does not see the fresh rows, so it does less work).

Per query form: median seconds over `--reps` for each side, their ratio
(pylance / memwal time: memwal's speed relative to pylance), memwal's
MB/s for full scans, and the daemon's peak RSS during the query
(`VmHWM`, reset before each query through /proc/PID/clear_refs; needs
the daemon to be this user's) and its growth over the RSS the query
started from, and the CPU seconds each side used: the daemon's and its
client's (this process, decoding the rows) for memwal, this process's
for pylance (medians). The selective filter runs again after a
BTREE index on `id` is built with pylance. With `--vector-dim` (16 by
default) the base has a float32 vector column `vec` (the fresh rows
leave it null) and an exact top-10 search runs on both sides.

Usage (from the repository root; pylance, pyarrow, numpy and the ADBC
Flight SQL driver installed, e.g. `bash scripts/py-clients.sh`):
  python benches/read_scale.py --memwal PATH/TO/release/memwal \
      [--dir /var/tmp/read-scale] [--rows 5000000] [--value-bytes 1000] \
      [--fresh 50000] [--reps 3] [--query-memory-mib 512] [--keep] [--write-only] \
      [--only "count,SELECT"]

Two binaries on the same data: write the base once (`--write-only`),
copy `DIR/t` aside, and before each binary's run (`--keep`) copy it back:
a run adds fresh rows and a BTREE index to the table.
"""
import argparse
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import adbc_driver_flightsql.dbapi as flightsql
import lance
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text_batch(start, n, value_bytes, rng):
    ids = pa.array(np.arange(start, start + n, dtype=np.int64))
    raw = rng.integers(0, 256, size=n * (value_bytes // 2), dtype=np.uint8).tobytes()
    hexed = raw.hex().encode()
    offsets = pa.array(np.arange(0, n + 1, dtype=np.int32) * (value_bytes // 2 * 2))
    v = pa.StringArray.from_buffers(n, offsets.buffers()[1], pa.py_buffer(hexed))
    return pa.record_batch({"id": ids, "v": v})


def rss_reset(pid):
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def status_mib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def drain(reader):
    rows = nbytes = 0
    for batch in reader:
        rows += batch.num_rows
        nbytes += batch.nbytes
    return rows, nbytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memwal", required=True)
    ap.add_argument("--dir", default="/var/tmp/read-scale")
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--value-bytes", type=int, default=1000)
    ap.add_argument("--fresh", type=int, default=50_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--query-memory-mib", type=int, default=512)
    ap.add_argument("--vector-dim", type=int, default=16,
                    help="a float32 vector column `vec` in the base (0: none) for exact top-k")
    ap.add_argument("--keep", action="store_true", help="reuse a base table left by an earlier run")
    ap.add_argument("--only", default="",
                    help="run only the forms whose names start with one of these (comma-separated)")
    ap.add_argument("--write-only", action="store_true",
                    help="write the base table and stop (copy it to compare binaries on the same base)")
    a = ap.parse_args()
    path = os.path.join(a.dir, "t")
    rng = np.random.default_rng(7)
    if not (a.keep and os.path.exists(path)):
        shutil.rmtree(a.dir, ignore_errors=True)
        os.makedirs(a.dir)
        fields = [pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.utf8())]
        if a.vector_dim:
            fields.append(pa.field("vec", pa.list_(pa.float32(), a.vector_dim)))
        schema_file = os.path.join(a.dir, "schema.arrows")
        with open(schema_file, "wb") as f:
            pa.ipc.new_stream(f, pa.schema(fields)).close()
        subprocess.run([a.memwal, "init", path, "--schema", schema_file, "--primary-key", "id"],
                       check=True, stdout=subprocess.DEVNULL)
        started = time.time()
        per = 50_000
        schema = lance.dataset(path).schema

        def batches():
            for start in range(0, a.rows, per):
                n = min(per, a.rows - start)
                b = text_batch(start, n, a.value_bytes, rng)
                columns = b.columns
                if a.vector_dim:
                    vals = pa.array(rng.random(n * a.vector_dim, dtype=np.float32))
                    columns = columns + [pa.FixedSizeListArray.from_arrays(vals, a.vector_dim)]
                yield pa.record_batch(columns, schema=schema)

        lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), path, mode="append",
                            max_rows_per_file=1_000_000)
        print(f"base written in {time.time() - started:.0f} s", file=sys.stderr)
    if a.write_only:
        return
    ds = lance.dataset(path)
    on_disk = sum(f.stat().st_size for f in pathlib.Path(path).rglob("*") if f.is_file())
    base_rows = ds.count_rows()
    port, http = free_port(), free_port()
    log = open(os.path.join(a.dir, "serve.log"), "w")
    daemon = subprocess.Popen(
        [a.memwal, "serve", "--table", f"t={path}", "--listen", f"127.0.0.1:{port}",
         "--http", f"127.0.0.1:{http}", "--no-compactor", "--query-memory-mib", str(a.query_memory_mib)],
        stderr=log)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http}/readyz", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        results = run(a, path, port, daemon.pid, rng, base_rows, on_disk)
    finally:
        daemon.terminate()
        daemon.wait(timeout=120)
    print(json.dumps(results, indent=1), file=sys.stderr)
    report(a, results, base_rows, on_disk)


def run(a, path, port, pid, rng, base_rows, on_disk):
    client = flight.connect(f"grpc://127.0.0.1:{port}")
    conn = flightsql.connect(f"grpc://127.0.0.1:{port}", autocommit=True)
    cur = conn.cursor()
    # Fresh levels: the flushed batch overwrites `half` base keys and adds
    # `fresh - half` new ones; the unflushed batch adds `fresh` new keys.
    half = a.fresh // 2
    flushed = text_batch(base_rows - half, a.fresh, 100, rng)
    cur.adbc_ingest("t", pa.Table.from_batches([flushed]), mode="append")
    list(client.do_action(flight.Action("flush", b"t")))
    held = text_batch(base_rows - half + a.fresh, a.fresh, 100, rng)
    cur.adbc_ingest("t", pa.Table.from_batches([held]), mode="append")
    # Keys 0 .. base_rows - half + 2 * fresh, each once.
    expected = base_rows - half + 2 * a.fresh
    ds = lance.dataset(path)
    lo = base_rows // 2
    forms = [
        ("count(*)", "SELECT count(*) FROM t", lambda: ds.count_rows(), False),
        ("SELECT *", "SELECT * FROM t", lambda: drain(ds.to_batches()), True),
        ("SELECT v", "SELECT v FROM t", lambda: drain(ds.to_batches(columns=["v"])), True),
        ("100 ids by range, no index", f"SELECT * FROM t WHERE id BETWEEN {lo} AND {lo + 99}",
         lambda: ds.to_table(filter=f"id >= {lo} AND id <= {lo + 99}").num_rows, False),
        ("LIMIT 10", "SELECT * FROM t LIMIT 10", lambda: ds.to_table(limit=10).num_rows, False),
        ("GROUP BY over every row", "SELECT id % 100 AS g, count(*) AS n FROM t GROUP BY id % 100",
         lambda: group_ids(ds), False),
    ]
    if "vec" in ds.schema.names:
        dim = ds.schema.field("vec").type.list_size
        q = rng.random(dim, dtype=np.float32)
        text = ",".join(repr(float(x)) for x in q)
        forms.append(("exact top-10 (`vector_search`, no vector index)",
                      f"SELECT id, _distance FROM vector_search('t', 'vec', '{text}', 10)",
                      lambda: ds.to_table(nearest={"column": "vec", "q": q, "k": 10, "use_index": False},
                                          columns=["id"]).num_rows, False))
    out = {"expected_rows": expected, "forms": []}
    only = [o for o in a.only.split(",") if o]
    wanted = lambda name: not only or any(name.startswith(o) for o in only)
    for name, sql, pylance_call, scan in forms:
        if wanted(name):
            out["forms"].append(measure(a, cur, pid, name, sql, pylance_call, scan))
    if wanted("100 ids by range, BTREE on id"):
        lance.dataset(path).create_scalar_index("id", "BTREE")
        ds = lance.dataset(path)
        out["forms"].append(measure(
            a, cur, pid, "100 ids by range, BTREE on id", f"SELECT * FROM t WHERE id BETWEEN {lo} AND {lo + 99}",
            lambda: ds.to_table(filter=f"id >= {lo} AND id <= {lo + 99}").num_rows, False))
    cur.execute("SELECT count(*) FROM t")
    out["count"] = cur.fetchall()[0][0]
    cur.close()
    conn.close()
    return out


def group_ids(ds):
    counts = np.zeros(100, dtype=np.int64)
    for b in ds.to_batches(columns=["id"]):
        counts += np.bincount(b.column(0).to_numpy() % 100, minlength=100)
    return int(counts.sum())


def cpu_s(pid):
    """CPU seconds (user + system) process `pid` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_s():
    t = os.times()
    return t.user + t.system


def measure(a, cur, pid, name, sql, pylance_call, scan):
    ours, theirs, peaks, before, rows, nbytes = [], [], [], [], 0, 0
    daemon_cpu, client_cpu, pylance_cpu = [], [], []
    for rep in range(a.reps):
        order = ["memwal", "pylance"] if rep % 2 == 0 else ["pylance", "memwal"]
        for side in order:
            if side == "memwal":
                rss_reset(pid)
                before.append(status_mib(pid, "VmRSS"))
                cpu0, own0 = cpu_s(pid), own_cpu_s()
                started = time.perf_counter()
                cur.execute(sql)
                rows, nbytes = drain(cur.fetch_record_batch())
                ours.append(time.perf_counter() - started)
                daemon_cpu.append(cpu_s(pid) - cpu0)
                client_cpu.append(own_cpu_s() - own0)
                peaks.append(status_mib(pid, "VmHWM"))
            else:
                own0 = own_cpu_s()
                started = time.perf_counter()
                pylance_call()
                theirs.append(time.perf_counter() - started)
                pylance_cpu.append(own_cpu_s() - own0)
    m, p = statistics.median(ours), statistics.median(theirs)
    return {"form": name, "memwal_s": m, "pylance_s": p, "speed": p / m, "rows": rows,
            "mb_s": nbytes / m / 1e6 if scan else None, "peak_rss_mib": max(peaks),
            "rss_growth_mib": max(p - b for p, b in zip(peaks, before)),
            "daemon_cpu_s": statistics.median(daemon_cpu),
            "client_cpu_s": statistics.median(client_cpu),
            "pylance_cpu_s": statistics.median(pylance_cpu),
            "memwal_runs": ours, "pylance_runs": theirs}


def report(a, results, base_rows, on_disk):
    print(f"base {base_rows:,} rows, {on_disk / 1e9:.2f} GB on disk; fresh: {a.fresh:,} rows in an SSTable, "
          f"{a.fresh:,} unflushed; query_memory_mib {a.query_memory_mib}; count(*) through memwal: "
          f"{results['count']:,} (expected {results['expected_rows']:,})")
    print()
    print("| form | rows | memwal over Flight SQL, s | pylance base scan, s | memwal / pylance speed | memwal MB/s | daemon peak RSS (growth during the query), MiB | CPU-s: daemon / its client / pylance |")
    print("|---|---|---|---|---|---|---|---|")
    for f in results["forms"]:
        mb = f"{f['mb_s']:.0f}" if f["mb_s"] else ""
        print(f"| {f['form']} | {f['rows']:,} | {f['memwal_s']:.3f} | {f['pylance_s']:.3f} | {f['speed']:.2f} | {mb} "
              f"| {f['peak_rss_mib']:.0f} (+{f['rss_growth_mib']:.0f}) "
              f"| {f['daemon_cpu_s']:.2f} / {f['client_cpu_s']:.2f} / {f['pylance_cpu_s']:.2f} |")


if __name__ == "__main__":
    main()
