"""A soak run (issue 49: a service that runs for months: compaction keeps
pace, the base table stays healthy, and ingest slows before reads
collapse): one `memwal serve` with its compactor, maintenance and GC on
short periods, under a steady upsert load for `--secs`, then `--catchup-secs`
without load; every `--sample-every` seconds the run records what a
long-running daemon must keep bounded, and at the end compares the read
latencies with those of the same rows freshly compacted.

The table: `DIR/t`, `id` int64 key and `v` utf8 (`--value-bytes` of random
hex), sharded `bucket(id, --buckets)`, made by `memwal init`; `--base-rows`
rows written with pylance as one fragment. The load (a thread): rounds of
one Flight DoPut of `--upserts` random existing keys and `--new` new keys,
then the `flush` action (so every round publishes a generation per shard,
each an SSTable the compactor must merge into the base). A put refused
with RESOURCE_EXHAUSTED (a write stall) is counted and retried after a
short pause; other errors are counted and retried too (an upsert of the
same rows is idempotent).

Each sample (during the load and the catch-up): rounds, rows ingested and
the rate since the last sample, refused puts; from `/status`: compaction
lag (sum over shards of `compaction_lag_generations`), `pending_sstables`,
stall strings, published generations, and `maintenance.base` when the
compactor reports it; from pylance (the base itself, the same with or
without maintenance): fragments, live and deleted rows, deletion files,
the latest version and the manifests kept in `_versions/`; bytes on disk
by kind (below); the daemon's bytes written (`/proc/PID/io` `write_bytes`,
`wchar` where the kernel does not account block I/O) over the Arrow bytes
ingested (write amplification) and its RSS; latencies through memwal over
ADBC Flight SQL of `SELECT count(*) FROM t`, `SELECT sum(length(v)) FROM
t` (a full scan) and `SELECT * FROM t WHERE id = K` (a random existing
key), and of a pylance scan of the base's `v` column in this process. A
query past `--query-timeout-secs` (or refused by the daemon's own 30 s
`query_timeout_ms`) is recorded as a timeout, not a failure of the run.

Bytes on disk by kind, from the layout a running daemon leaves in DIR/t:
  data/                              base: data files            -> base_data
  _deletions/                        base: deletion files        -> deletions
  _versions/                         base: manifests (versions)  -> versions
  _indices/                          base: indexes (the MemWAL
                                     system index's details)     -> indices
  _transactions/                     base: transaction files     -> transactions
  _mem_wal/{shard}/wal/              WAL entries                 -> wal
  _mem_wal/{shard}/{8 hex}_gen_{g}/  SSTables (flushed Lance
                                     datasets)                   -> sstables
  _mem_wal/{shard}/manifest/,
  _mem_wal/{shard}/producers/        shard manifests, producer
                                     checkpoints                 -> shard_manifests
  anything else                                                  -> other

After the catch-up: the same queries again (median of 3) on the soak
daemon; then it stops (SIGTERM), DIR/t is copied to DIR/ref/t, `memwal
compact` merges whatever SSTables are left, pylance compacts the copy
(`compact_files(materialize_deletions_threshold=0.0)`) and removes every
older version (`cleanup_old_versions(older_than=0)`), and a second daemon
(`--no-compactor`) serves the copy for the reference figures (median of
3). The issue's goal: final latencies within 1.5x of the reference.

Prints one line per sample while it runs and a summary at the end; writes
`OUT.json` (parameters, samples, final and reference figures) and
`OUT.png` (matplotlib: latencies with the reference as dashed lines, base
fragments and versions, deleted share and compaction lag, bytes on disk by
kind, ingest rate and refused puts, write amplification and RSS).

Usage (from the repository root; pylance, pyarrow, numpy, matplotlib and
the ADBC Flight SQL driver installed, e.g. `bash scripts/py-clients.sh`
and `pip install matplotlib`):
  python benches/soak.py --memwal PATH/TO/release/memwal \
      [--dir /var/tmp/memwal-soak] [--secs 600] [--catchup-secs 120] \
      [--base-rows 400000] [--upserts 2000] [--new 250] [--value-bytes 100] \
      [--sample-every 10] [--compact-every-secs 1] [--gc-grace-secs 1] \
      [--buckets 4] [--out benches/soak] [--no-maintenance]

`--no-maintenance` passes `--no-maintenance` to the daemon: the same load
with the base left to grow, to compare.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import timedelta

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    plt = None

import adbc_driver_flightsql as adbc_flightsql
import adbc_driver_flightsql.dbapi as flightsql
import lance
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

QUERIES = {
    "count": "SELECT count(*) FROM t",
    "scan": "SELECT sum(length(v)) FROM t",
    "lookup": "SELECT * FROM t WHERE id = {k}",
}
LATENCIES = ["count", "scan", "lookup", "pylance_scan"]
KINDS = ["base_data", "deletions", "versions", "indices", "transactions",
         "wal", "sstables", "shard_manifests", "other"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def values(keys, value_bytes, rng):
    n = len(keys)
    half = max(value_bytes // 2, 1)
    raw = rng.integers(0, 256, size=n * half, dtype=np.uint8).tobytes()
    offsets = pa.array(np.arange(0, n + 1, dtype=np.int32) * (half * 2))
    v = pa.StringArray.from_buffers(n, offsets.buffers()[1], pa.py_buffer(raw.hex().encode()))
    return pa.record_batch({"id": pa.array(keys, pa.int64()), "v": v})


def is_exhausted(e):
    text = str(e).lower()
    return ("resource_exhausted" in text or "resource exhausted" in text or "resourceexhausted" in text
            or "stall_stop_sstables" in text)


def error_kind(e):
    text = str(e).lower()
    if "deadline" in text or "timeout" in text or "timed out" in text:
        return "timeout"
    if is_exhausted(e):
        return "resource_exhausted"
    return "error"


# Every daemon started, killed at exit if still running (a run that stops
# early must not leave daemons behind).
STARTED = []


class Daemon:
    def __init__(self, memwal, table, log_path, extra):
        self.port, self.http = free_port(), free_port()
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [memwal, "serve", "--table", f"t={table}", "--listen", f"127.0.0.1:{self.port}",
             "--http", f"127.0.0.1:{self.http}"] + extra,
            stdout=self.log, stderr=subprocess.STDOUT)
        STARTED.append(self)
        self.pid = self.proc.pid
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.http}/readyz", timeout=1)
                break
            except Exception:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.kill()
                    sys.exit(f"memwal serve did not start (exit {self.proc.returncode}); "
                             f"log: {log_path}\n{tail(log_path)}")
                time.sleep(0.1)

    def status(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/status", timeout=10) as r:
            return json.load(r)["tables"]["t"]

    def io(self):
        out = {}
        try:
            with open(f"/proc/{self.pid}/io") as f:
                for line in f:
                    k, v = line.split(":")
                    out[k.strip()] = int(v)
        except OSError:
            pass
        return out

    def rss_mib(self):
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return None

    def stop(self, timeout=120):
        """SIGTERM (flush and close every shard), SIGKILL past `timeout`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                print(f"memwal serve (pid {self.pid}) did not stop in {timeout} s: killed",
                      file=sys.stderr)
                self.kill()
        self.log.close()
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def tail(path, n=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


class Load(threading.Thread):
    """Rounds of one put (upserts + new keys) and one flush, until stopped."""

    def __init__(self, a, port, base_rows):
        super().__init__(daemon=True)
        self.a, self.port = a, port
        self.next_key = base_rows  # keys 0 .. next_key exist
        self.rounds = self.rows = self.arrow_bytes = 0
        self.refused = 0  # put attempts refused with RESOURCE_EXHAUSTED
        self.errors = {}  # other put / flush errors, by kind
        self.flush_errors = 0
        self.round_s = []  # seconds per round (put, retries and flush)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.gave_up = None

    def snapshot(self):
        with self.lock:
            return {"rounds": self.rounds, "rows": self.rows, "arrow_bytes": self.arrow_bytes,
                    "next_key": self.next_key, "refused_puts": self.refused,
                    "put_errors": dict(self.errors), "flush_errors": self.flush_errors,
                    "round_s": list(self.round_s)}

    def run(self):
        a = self.a
        rng = np.random.default_rng(11)
        client = flight.connect(f"grpc://127.0.0.1:{self.port}")
        descriptor = flight.FlightDescriptor.for_path("t")
        failures = 0
        while not self.stopping.is_set():
            upserts = min(a.upserts, self.next_key)
            keys = np.concatenate([rng.choice(self.next_key, size=upserts, replace=False),
                                   np.arange(self.next_key, self.next_key + a.new)]).astype(np.int64)
            batch = values(keys, a.value_bytes, rng)
            started = time.perf_counter()
            while not self.stopping.is_set():
                try:
                    writer, reader = client.do_put(descriptor, batch.schema)
                    writer.write_batch(batch)
                    writer.done_writing()
                    reader.read()
                    writer.close()
                    failures = 0
                    break
                except Exception as e:
                    with self.lock:
                        if is_exhausted(e):
                            self.refused += 1
                        else:
                            kind = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                            self.errors[kind] = self.errors.get(kind, 0) + 1
                            failures += 1
                    if failures >= 200:
                        self.gave_up = f"200 puts failed in a row, last: {e}"
                        return
                    time.sleep(0.2 if is_exhausted(e) else 0.5)
                    if not is_exhausted(e):
                        client = flight.connect(f"grpc://127.0.0.1:{self.port}")
            else:
                return
            with self.lock:
                self.next_key += a.new
                self.rounds += 1
                self.rows += batch.num_rows
                self.arrow_bytes += batch.nbytes
            try:
                list(client.do_action(flight.Action("flush", b"t")))
            except Exception:
                with self.lock:
                    self.flush_errors += 1
            with self.lock:
                self.round_s.append(time.perf_counter() - started)


class Sql:
    """ADBC Flight SQL with a client-side deadline; a new connection after an error."""

    def __init__(self, port, timeout):
        self.uri, self.timeout = f"grpc://127.0.0.1:{port}", timeout
        self.conn = None

    def _connect(self):
        if self.conn is None:
            t = str(float(self.timeout))
            self.conn = flightsql.connect(self.uri, db_kwargs={
                adbc_flightsql.DatabaseOptions.TIMEOUT_QUERY.value: t,
                adbc_flightsql.DatabaseOptions.TIMEOUT_FETCH.value: t}, autocommit=True)
        return self.conn

    def run(self, sql):
        """(seconds, rows, None) or (seconds, None, error kind and message)."""
        started = time.perf_counter()
        try:
            cur = self._connect().cursor()
            try:
                cur.execute(sql)
                rows = cur.fetchall()
            finally:
                cur.close()
            return time.perf_counter() - started, rows, None
        except Exception as e:
            took = time.perf_counter() - started
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = None
            return took, None, f"{error_kind(e)}: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"

    def close(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = None


def pylance_scan(path):
    """Seconds for a fresh open and scan of the base's `v` (retried once: GC may
    remove an old version's files while it is read)."""
    err = None
    for _ in range(2):
        started = time.perf_counter()
        try:
            lance.dataset(path).to_table(columns=["v"])
            return time.perf_counter() - started, None
        except Exception as e:
            err = f"error: {str(e).splitlines()[0][:200]}"
    return None, err


def latencies(sql, path, key_hi, rng):
    """One measurement of every query form: {name: seconds or None}, {name: error}, checks."""
    lat, errs, checks = {}, {}, {}
    for name, text in QUERIES.items():
        k = int(rng.integers(0, key_hi))
        took, rows, err = sql.run(text.format(k=k))
        if err:
            lat[name], errs[name] = None, err
            if err.startswith("timeout"):
                lat[name + "_timed_out_after"] = took
        else:
            lat[name] = took
            if name == "count":
                checks["count"] = rows[0][0]
            elif name == "scan":
                checks["sum_length_v"] = rows[0][0]
            else:
                checks["lookup_rows"] = len(rows)
    lat["pylance_scan"], err = pylance_scan(path)
    if err:
        errs["pylance_scan"] = err
    return lat, errs, checks


def median_latencies(sql, path, key_hi, rng, reps=3):
    runs = [latencies(sql, path, key_hi, rng) for _ in range(reps)]
    out, errs = {}, {}
    for name in LATENCIES:
        ok = [r[0][name] for r in runs if r[0].get(name) is not None]
        out[name] = statistics.median(ok) if ok else None
        for r in runs:
            if name in r[1]:
                errs[name] = r[1][name]
    return out, errs, runs[-1][2]


def disk_by_kind(path):
    """File bytes by kind, and the directories under `_mem_wal/` (all, and empty:
    on a local store an object store's deletes can leave directories behind)."""
    out = dict.fromkeys(KINDS, 0)
    dirs = {"mem_wal_dirs": 0, "mem_wal_empty_dirs": 0}
    for root, subdirs, files in os.walk(path):
        rel = os.path.relpath(root, path).split(os.sep)
        top = rel[0]
        if top == "_mem_wal" and len(rel) > 1:
            dirs["mem_wal_dirs"] += 1
            if not subdirs and not files:
                dirs["mem_wal_empty_dirs"] += 1
        if top == "data":
            kind = "base_data"
        elif top == "_deletions":
            kind = "deletions"
        elif top == "_versions":
            kind = "versions"
        elif top == "_indices":
            kind = "indices"
        elif top == "_transactions":
            kind = "transactions"
        elif top == "_mem_wal" and len(rel) >= 3:
            sub = rel[2]
            if sub == "wal":
                kind = "wal"
            elif "_gen_" in sub:
                kind = "sstables"
            elif sub in ("manifest", "producers"):
                kind = "shard_manifests"
            else:
                kind = "other"
        else:
            kind = "other"
        for f in files:
            try:
                out[kind] += os.stat(os.path.join(root, f)).st_size
            except OSError:
                pass  # removed by GC meanwhile
    return out, dirs


def base_health(path):
    """The base's shape from its latest manifest (pylance)."""
    for _ in range(3):
        try:
            ds = lance.dataset(path)
            frags = [f.metadata for f in ds.get_fragments()]
            physical = sum(f.physical_rows for f in frags)
            deleted = sum(f.num_deletions for f in frags)
            try:
                versions = sum(1 for n in os.listdir(os.path.join(path, "_versions"))
                               if n.endswith(".manifest"))
            except OSError:
                versions = None
            return {"version": ds.version, "fragments": len(frags), "live_rows": physical - deleted,
                    "deleted_rows": deleted, "deleted_share": deleted / physical if physical else 0.0,
                    "deletion_files": sum(1 for f in frags if f.deletion_file is not None),
                    "versions_kept": versions}
        except Exception as e:
            err = str(e).splitlines()[0][:200]
            time.sleep(0.2)
    return {"error": err}


def shard_figures(status):
    shards = status.get("shards") or []
    total = lambda key: sum(s.get(key) or 0 for s in shards)
    return {"compaction_lag": total("compaction_lag_generations"),
            "pending_sstables": total("pending_sstables"),
            "published_generations": total("published_generation"),
            "stalled_puts": total("stalled_puts"), "daemon_refused_puts": total("refused_puts"),
            "stalls": [f"{s['shard'][:8]}: {s['stall']}" for s in shards if s.get("stall")],
            "shard_errors": [f"{s['shard'][:8]} {s.get('state')}: {s['last_error']}"
                             for s in shards if s.get("last_error")],
            "shards_not_serving": sum(1 for s in shards if s.get("state") != "serving")}


def written(io):
    """The daemon's bytes written: block I/O where the kernel accounts it, else write(2) bytes."""
    return io.get("write_bytes") or io.get("wchar") or 0


def take_sample(a, d, load, sql, path, t0, phase, prev, rng):
    s = {"t": time.time() - t0, "phase": phase}
    snap = load.snapshot()
    s.update({k: snap[k] for k in ("rounds", "rows", "arrow_bytes", "refused_puts", "flush_errors")})
    s["put_errors"] = sum(snap["put_errors"].values())
    dt = s["t"] - prev["t"] if prev else s["t"]
    s["rows_per_s"] = (s["rows"] - (prev["rows"] if prev else 0)) / dt if dt > 0 else 0.0
    recent = snap["round_s"][prev["_round_n"] if prev else 0:]
    s["_round_n"] = len(snap["round_s"])
    s["round_p50_s"] = statistics.median(recent) if recent else None
    try:
        st = d.status()
        s.update(shard_figures(st))
        m = st.get("maintenance")
        s["status_base"] = (m or {}).get("base")
        s["status_maintenance_last"] = (m or {}).get("last")
        s["maintenance_in_status"] = bool(m and m.get("base"))
    except Exception as e:
        s["status_error"] = str(e)[:200]
    s["base"] = base_health(path)
    s["disk"], s["dirs"] = disk_by_kind(path)
    s["disk_total"] = sum(s["disk"].values())
    io = d.io()
    s["daemon_write_bytes"], s["daemon_wchar"] = io.get("write_bytes"), io.get("wchar")
    s["write_amp"] = written(io) / s["arrow_bytes"] if s["arrow_bytes"] else None
    s["rss_mib"] = d.rss_mib()
    s["lat"], s["lat_errors"], s["checks"] = latencies(sql, path, max(snap["next_key"], 1), rng)
    return s


def fmt_s(x):
    return "   T/O" if x is None else f"{x:6.2f}" if x < 100 else f"{x:6.0f}"


HEADER = ("     t phase   rounds  rows/s refused  lag pend frags vers del%  disk MB   WA  "
          "count   scan lookup pylnce  stall/errors")


def line(s):
    b = s["base"]
    lat = s["lat"]
    notes = list(s.get("stalls") or [])
    notes += [f"{k} {v}" for k, v in s["lat_errors"].items()]
    if s.get("status_error"):
        notes.append(f"status: {s['status_error']}")
    if "error" in b:
        notes.append(f"base: {b['error']}")
    wa = f"{s['write_amp']:4.1f}" if s["write_amp"] is not None else "   -"
    return (f"{s['t']:6.0f} {s['phase']:7s} {s['rounds']:6d} {s['rows_per_s']:7.0f} {s['refused_puts']:7d} "
            f"{s.get('compaction_lag', -1):4d} {s.get('pending_sstables', -1):4d} {b.get('fragments', -1):5d} "
            f"{b.get('versions_kept') or -1:4d} {100 * b.get('deleted_share', float('nan')):4.1f} "
            f"{s['disk_total'] / 1e6:8.1f} {wa} "
            f"{fmt_s(lat['count'])} {fmt_s(lat['scan'])} {fmt_s(lat['lookup'])} {fmt_s(lat['pylance_scan'])}  "
            f"{'; '.join(notes)[:160]}")


def write_base(a, path):
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    subprocess.run([a.memwal, "init", path, "--column", "id:int64:key", "--column", "v:utf8",
                    "--bucket", f"id:{a.buckets}"], check=True, stdout=subprocess.DEVNULL)
    schema = lance.dataset(path).schema
    rng = np.random.default_rng(7)
    per = 50_000

    def batches():
        for start in range(0, a.base_rows, per):
            b = values(np.arange(start, min(start + per, a.base_rows), dtype=np.int64), a.value_bytes, rng)
            yield pa.record_batch(b.columns, schema=schema)

    started = time.time()
    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), path, mode="append",
                        max_rows_per_file=max(a.base_rows, 1))
    print(f"base: {a.base_rows:,} rows in {len(lance.dataset(path).get_fragments())} fragment(s), "
          f"written in {time.time() - started:.1f} s", flush=True)


def reference(a, path, key_hi, rng):
    """Copy the stopped table, compact it fully, serve it without a compactor, measure."""
    ref_dir = os.path.join(a.dir, "ref")
    ref = os.path.join(ref_dir, "t")
    shutil.rmtree(ref_dir, ignore_errors=True)
    os.makedirs(ref_dir)
    shutil.copytree(path, ref)
    out = {"path": ref}
    r = subprocess.run([a.memwal, "compact", ref], capture_output=True, text=True)
    out["memwal_compact"] = {"rc": r.returncode, "output": (r.stdout + r.stderr)[-2000:]}
    if r.returncode != 0:
        print(f"memwal compact {ref} failed ({r.returncode}):\n{r.stdout}{r.stderr}", file=sys.stderr)
    ds = lance.dataset(ref)
    started = time.time()
    metrics = ds.optimize.compact_files(materialize_deletions_threshold=0.0)
    out["compact_files"] = {"seconds": time.time() - started,
                            "fragments_removed": getattr(metrics, "fragments_removed", None),
                            "fragments_added": getattr(metrics, "fragments_added", None)}
    stats = lance.dataset(ref).cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
    out["cleanup"] = {"bytes_removed": getattr(stats, "bytes_removed", None),
                      "old_versions": getattr(stats, "old_versions", None)}
    out["base"] = base_health(ref)
    out["disk"], out["dirs"] = disk_by_kind(ref)
    out["disk_total"] = sum(out["disk"].values())
    d = Daemon(a.memwal, ref, os.path.join(a.dir, "serve-ref.log"), ["--no-compactor"])
    try:
        sql = Sql(d.port, a.query_timeout_secs)
        latencies(sql, ref, key_hi, rng)  # warm the page cache as the soak daemon's was
        out["lat"], out["lat_errors"], out["checks"] = median_latencies(sql, ref, key_hi, rng)
        out.update({k: v for k, v in shard_figures(d.status()).items()
                    if k in ("compaction_lag", "pending_sstables")})
        sql.close()
    finally:
        d.stop(timeout=60)
        d.kill()
    return out


def plot(a, samples, final, ref, out_png):
    t = np.array([s["t"] for s in samples]) / 60
    fig, ax = plt.subplots(3, 2, figsize=(14, 12), sharex=True)
    load_end = a.secs / 60
    colors = {"count": "C0", "scan": "C1", "lookup": "C2", "pylance_scan": "C3"}
    labels = {"count": "count(*) via memwal", "scan": "sum(length(v)) via memwal (full scan)",
              "lookup": "WHERE id = K via memwal", "pylance_scan": "pylance base scan of v"}
    p = ax[0][0]
    for name in LATENCIES:
        y = [s["lat"].get(name) for s in samples]
        p.plot(t, [np.nan if v is None else v for v in y], "o-", ms=3, color=colors[name], label=labels[name])
        timed_out = [tt for tt, v in zip(t, y) if v is None]
        if timed_out:
            p.plot(timed_out, [a.query_timeout_secs] * len(timed_out), "x", color=colors[name])
        if ref and ref["lat"].get(name):
            p.axhline(ref["lat"][name], ls="--", lw=1, color=colors[name])
    p.set_yscale("log")
    p.set_ylabel("seconds")
    p.set_title("query latency (dashed: freshly compacted reference; x: timeout or error)")
    p.legend(fontsize=7)
    p = ax[0][1]
    p.plot(t, [s["base"].get("fragments", np.nan) for s in samples], "o-", ms=3, label="base fragments")
    p.plot(t, [s["base"].get("versions_kept") or np.nan for s in samples], "s-", ms=3,
           label="base versions kept (_versions/)")
    p.plot(t, [s["base"].get("deletion_files", np.nan) for s in samples], "^-", ms=3, label="deletion files")
    p.set_title("base table shape")
    q = p.twinx()
    q.plot(t, [s["dirs"]["mem_wal_dirs"] for s in samples], ":", color="C7", label="directories under _mem_wal/")
    q.plot(t, [s["dirs"]["mem_wal_empty_dirs"] for s in samples], "--", color="C7", lw=0.8,
           label="... of them empty")
    q.set_ylabel("directories")
    h1, l1 = p.get_legend_handles_labels()
    h2, l2 = q.get_legend_handles_labels()
    p.legend(h1 + h2, l1 + l2, fontsize=7)
    p = ax[1][0]
    p.plot(t, [100 * s["base"].get("deleted_share", np.nan) for s in samples], "o-", ms=3, color="C3",
           label="deleted rows, % of stored base rows")
    p.set_ylabel("% deleted", color="C3")
    q = p.twinx()
    q.plot(t, [s.get("compaction_lag", np.nan) for s in samples], "s-", ms=3, color="C0",
           label="compaction lag (generations, all shards)")
    q.plot(t, [s.get("pending_sstables", np.nan) for s in samples], ":", color="C9",
           label="pending SSTables (all shards)")
    q.set_ylabel("generations / SSTables", color="C0")
    p.set_title("deleted share and compaction lag")
    h1, l1 = p.get_legend_handles_labels()
    h2, l2 = q.get_legend_handles_labels()
    p.legend(h1 + h2, l1 + l2, fontsize=7)
    p = ax[1][1]
    stack = [[s["disk"][k] / 1e6 for s in samples] for k in KINDS]
    p.stackplot(t, *stack, labels=KINDS)
    if ref:
        ref_base = sum(ref["disk"][k] for k in ("base_data", "deletions", "versions", "indices", "transactions"))
        p.axhline(ref_base / 1e6, ls="--", color="k", lw=1, label="reference: compacted base files")
    p.set_ylabel("MB")
    p.set_title("bytes on disk by kind")
    p.legend(fontsize=7, loc="upper left")
    p = ax[2][0]
    p.plot(t, [s["rows_per_s"] for s in samples], "o-", ms=3, label="rows/s ingested")
    p.set_ylabel("rows/s")
    q = p.twinx()
    q.plot(t, [s["refused_puts"] for s in samples], "s-", ms=3, color="C3", label="refused puts (cumulative)")
    q.plot(t, [s.get("stalled_puts", np.nan) for s in samples], ":", color="C1",
           label="delayed puts (cumulative, daemon)")
    q.set_ylabel("puts")
    h1, l1 = p.get_legend_handles_labels()
    h2, l2 = q.get_legend_handles_labels()
    p.legend(h1 + h2, l1 + l2, fontsize=7)
    p.set_title("ingest")
    p = ax[2][1]
    p.plot(t, [s["write_amp"] if s["write_amp"] is not None else np.nan for s in samples], "o-", ms=3,
           label="daemon bytes written / Arrow bytes ingested")
    p.set_ylabel("write amplification")
    q = p.twinx()
    q.plot(t, [s["rss_mib"] or np.nan for s in samples], "s-", ms=3, color="C2", label="daemon RSS, MiB")
    q.set_ylabel("MiB")
    h1, l1 = p.get_legend_handles_labels()
    h2, l2 = q.get_legend_handles_labels()
    p.legend(h1 + h2, l1 + l2, fontsize=7)
    p.set_title("write amplification and memory")
    for row in ax:
        for p in row:
            p.axvline(load_end, color="grey", lw=0.8)
            p.grid(alpha=0.3)
    for p in ax[2]:
        p.set_xlabel("minutes (grey line: end of load)")
    fig.suptitle(f"memwal soak: {a.base_rows:,} base rows, {a.upserts} upserts + {a.new} new per round, "
                 f"{a.buckets} buckets, compact every {a.compact_every_secs} s, GC grace {a.gc_grace_secs} s"
                 f"{', no maintenance' if a.no_maintenance else ''}")
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    plt.close(fig)


def summary(a, samples, load, final, ref, published):
    loaded = [s for s in samples if s["phase"] == "load"]
    after = [s for s in samples if s["phase"] == "catchup"]
    mx = lambda key, ss=samples: max((s.get(key) or 0 for s in ss), default=0)
    last = samples[-1]
    caught_up = next((s["t"] - a.secs for s in after if s.get("compaction_lag") == 0), None)
    print()
    print(f"rounds {load.rounds:,}, rows {load.rows:,} ({load.rows / a.secs:,.0f}/s), "
          f"Arrow bytes {load.arrow_bytes / 1e6:,.1f} MB; generations published (all shards) "
          f"{published if published is not None else 'n/a'}")
    print(f"put attempts refused (RESOURCE_EXHAUSTED) {load.refused:,}; other put errors "
          f"{sum(load.errors.values())}{' ' + json.dumps(load.errors) if load.errors else ''}; "
          f"flush errors {load.flush_errors}; delayed puts (daemon) {last.get('stalled_puts', 'n/a')}"
          f"{'; load gave up: ' + load.gave_up if load.gave_up else ''}")
    stalls = sorted({x for s in samples for x in s.get("stalls") or []})
    if stalls:
        print(f"stalls seen: {len(stalls)} distinct, e.g. {stalls[0]}")
    print(f"compaction lag: max {mx('compaction_lag')}, "
          f"{last.get('compaction_lag', 'n/a')} at the end; caught up (lag 0) "
          f"{f'{caught_up:.0f} s after the load' if caught_up is not None else 'never'} "
          f"(catch-up {a.catchup_secs} s); max pending SSTables {mx('pending_sstables')}")
    base = [s["base"] for s in samples if "error" not in s["base"]]
    print(f"base: max fragments {max((b['fragments'] for b in base), default='n/a')}, "
          f"final {base[-1]['fragments'] if base else 'n/a'}; max deleted share "
          f"{100 * max((b['deleted_share'] for b in base), default=0):.1f}%, final "
          f"{100 * base[-1]['deleted_share'] if base else float('nan'):.1f}%; versions kept: final "
          f"{base[-1]['versions_kept'] if base else 'n/a'} (latest version {base[-1]['version'] if base else 'n/a'}); "
          f"maintenance in /status: {'yes' if any(s.get('maintenance_in_status') for s in samples) else 'no'}")
    live = base[-1]["live_rows"] if base else 0
    est = live * (8 + a.value_bytes)
    ref_base = sum(ref["disk"][k] for k in ("base_data", "deletions", "versions", "indices", "transactions")) \
        if ref else 0
    ratio_ref = f", {last['disk_total'] / ref_base:.2f}x the compacted reference's base files " \
                f"({ref_base / 1e6:.1f} MB)" if ref_base else ""
    print(f"on disk: {last['disk_total'] / 1e6:.1f} MB for {live:,} live rows (~{est / 1e6:.1f} MB raw: "
          f"{last['disk_total'] / est if est else float('nan'):.2f}x){ratio_ref}; by kind: "
          + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in last["disk"].items() if v))
    print(f"directories under _mem_wal/: {last['dirs']['mem_wal_dirs']:,}, of them empty "
          f"{last['dirs']['mem_wal_empty_dirs']:,}; pending SSTables (/status) at the end "
          f"{final.get('pending_sstables', 'n/a')} with compaction lag {final.get('compaction_lag', 'n/a')}")
    wa = [s["write_amp"] for s in samples if s["write_amp"] is not None]
    print(f"write amplification (daemon {'write_bytes' if last.get('daemon_write_bytes') else 'wchar'} / "
          f"Arrow bytes ingested): {wa[-1] if wa else float('nan'):.1f}; daemon RSS max "
          f"{max((s['rss_mib'] or 0) for s in samples):.0f} MiB")
    if loaded:
        n = max(len(loaded) // 4, 1)
        first, end = loaded[:n], loaded[-n:]
        rate = lambda ss: statistics.mean(s["rows_per_s"] for s in ss)
        print(f"ingest: {rate(first):,.0f} rows/s in the first quarter of the load, {rate(end):,.0f} in the last")
    timeouts = {name: sum(1 for s in samples if s["lat_errors"].get(name, "").startswith("timeout"))
                for name in LATENCIES}
    errors = {name: sum(1 for s in samples if name in s["lat_errors"]) - timeouts[name] for name in LATENCIES}
    if any(timeouts.values()) or any(errors.values()):
        print(f"query timeouts {timeouts}, other query errors {errors}")
    print()
    print(f"{'query':14s} {'max during soak':>16s} {'final (median 3)':>17s} {'reference':>10s} {'final/ref':>10s}")
    for name in LATENCIES:
        during = [s["lat"][name] for s in samples if s["lat"].get(name) is not None]
        f = final["lat"].get(name)
        r = ref["lat"].get(name) if ref else None
        ratio = f"{f / r:9.2f}x" if f and r else "      n/a"
        flag = "  (past the 1.5x goal)" if f and r and f / r > 1.5 else ""
        print(f"{name:14s} {max(during, default=float('nan')):16.3f} "
              f"{f if f is not None else float('nan'):17.3f} {r if r is not None else float('nan'):10.3f} {ratio}{flag}")
    if final.get("checks"):
        c = final["checks"]
        print(f"final count(*) {c.get('count')}, expected {final['expected_rows']}; sum(length(v)) "
              f"{c.get('sum_length_v')}, expected {final['expected_rows'] * (max(a.value_bytes // 2, 1) * 2)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memwal", required=True, help="the memwal binary")
    ap.add_argument("--dir", default="/var/tmp/memwal-soak")
    ap.add_argument("--secs", type=float, default=600, help="load duration")
    ap.add_argument("--catchup-secs", type=float, default=120,
                    help="time after the load for compaction to catch up")
    ap.add_argument("--base-rows", type=int, default=400_000)
    ap.add_argument("--upserts", type=int, default=2000, help="existing random keys upserted per round")
    ap.add_argument("--new", type=int, default=250, help="new keys per round")
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--sample-every", type=float, default=10, help="seconds between samples")
    ap.add_argument("--compact-every-secs", type=int, default=1)
    ap.add_argument("--gc-grace-secs", type=int, default=1)
    ap.add_argument("--buckets", type=int, default=4)
    ap.add_argument("--query-timeout-secs", type=float, default=60,
                    help="client-side deadline per query (the daemon's own is 30 s)")
    ap.add_argument("--out", default="benches/soak", help="prefix of OUT.json and OUT.png")
    ap.add_argument("--no-maintenance", action="store_true", help="pass --no-maintenance to the daemon")
    ap.add_argument("--no-reference", action="store_true", help="skip the freshly compacted reference")
    ap.add_argument("--no-plot", action="store_true", help="write OUT.json only")
    a = ap.parse_args()
    if plt is None and not a.no_plot:
        sys.exit("matplotlib is not installed: `pip install matplotlib` (or pass --no-plot)")
    if os.path.dirname(a.out):
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
    path = os.path.join(a.dir, "t")
    write_base(a, path)
    rng = np.random.default_rng(13)
    extra = ["--compact-every-secs", str(a.compact_every_secs), "--gc-grace-secs", str(a.gc_grace_secs),
             "--min-flush-interval-ms", "0"]
    if a.no_maintenance:
        extra.append("--no-maintenance")
    samples, final, ref, published = [], {}, None, None
    load = None
    try:
        d = Daemon(a.memwal, path, os.path.join(a.dir, "serve.log"), extra)
        sql = Sql(d.port, a.query_timeout_secs)
        load = Load(a, d.port, a.base_rows)
        print(f"memwal serve pid {d.pid} (Flight {d.port}, HTTP {d.http}), log {d.log_path}", flush=True)
        print(HEADER, flush=True)
        t0 = time.time()
        load.start()
        phase, prev, next_at = "load", None, t0 + a.sample_every
        while True:
            now = time.time()
            if phase == "load" and now - t0 >= a.secs:
                load.stopping.set()
                load.join()
                phase = "catchup"
            if now - t0 >= a.secs + a.catchup_secs:
                break
            if now < next_at:
                time.sleep(min(next_at - now, 0.2))
                continue
            next_at = max(next_at + a.sample_every, time.time())
            s = take_sample(a, d, load, sql, path, t0, phase, prev, rng)
            samples.append(s)
            prev = s
            print(line(s), flush=True)
            if d.proc.poll() is not None:
                print(f"memwal serve exited ({d.proc.returncode}); log {d.log_path}:\n{tail(d.log_path)}",
                      file=sys.stderr)
                break
        load.stopping.set()
        load.join()
        # Final figures on the soak daemon, median of 3, nothing ingesting.
        key_hi = load.next_key
        final["lat"], final["lat_errors"], final["checks"] = median_latencies(sql, path, key_hi, rng)
        final["expected_rows"] = key_hi
        try:
            st = d.status()
            figs = shard_figures(st)
            published = figs["published_generations"]
            final.update(figs)
            final["maintenance"] = st.get("maintenance")
        except Exception as e:
            final["status_error"] = str(e)
        final["base"] = base_health(path)
        sql.close()
        rc = d.stop()
        final["daemon_exit"] = rc
        if rc != 0:
            print(f"memwal serve exited {rc} on SIGTERM; log {d.log_path}:\n{tail(d.log_path)}", file=sys.stderr)
        if not a.no_reference:
            ref = reference(a, path, key_hi, rng)
    finally:
        if load is not None:
            load.stopping.set()
        for daemon in STARTED:
            daemon.kill()
    for s in samples:
        s.pop("_round_n", None)
    params = {k: v for k, v in vars(a).items()}
    load_totals = {k: v for k, v in load.snapshot().items() if k != "round_s"}
    load_totals["gave_up"] = load.gave_up
    with open(a.out + ".json", "w") as f:
        json.dump({"params": params, "samples": samples, "load": load_totals, "final": final,
                   "reference": ref, "generations_published": published}, f, indent=1)
    if samples and not a.no_plot:
        plot(a, samples, final, ref, a.out + ".png")
    if samples:
        summary(a, samples, load, final, ref, published)
    print(f"\nwrote {a.out}.json" + ("" if a.no_plot or not samples else f" and {a.out}.png"))


if __name__ == "__main__":
    main()
