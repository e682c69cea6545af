"""A memwal cluster (issue 39, item 6): etcd and `memwal serve --cluster`
daemons on this machine over one local table, driven with pyarrow Flight.

Three measurements, each printed as medians (and ratios measured in the
same run, alternating):

1. Forwarding cost: an unsharded table (one shard, one owner) with three
   members; `--puts` puts of `--rows` rows alternate between the owner and
   a member that forwards them. Reports p50 put latency and rows/s through
   each, and their ratio.
2. Failover: `--kills` times, SIGKILL the member that owns the shard, then
   put through a survivor (retrying on UNAVAILABLE every 20 ms) until one
   is acknowledged; a replacement member starts so three stay. Reports
   kill -> first acknowledged put, p50 and max, against the configured
   `cluster_failover_ms` (the lease is 60% of it).
3. 1 vs 3 members: a `bucket(id, 8)` table; the same put sequence through
   one member of a one-member cluster, then of a three-member one (two
   thirds of each put is forwarded). On one machine this measures the
   cluster's overhead, not scaling: every member shares the same cores
   and disk (docs/design/cluster.md has the model for N machines).

Usage (from the repository root; pyarrow installed, e.g. the venv of
`bash scripts/py-clients.sh`; `etcd` on PATH):
  python benches/cluster_bench.py --memwal PATH/TO/memwal [--dir /var/tmp/cluster-bench]
      [--puts 200] [--rows 1000] [--kills 20] [--failover-ms 3000]
"""
import argparse
import json
import os
import pathlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import pyarrow as pa
import pyarrow.flight as flight


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    def __init__(self, root):
        self.client = free_port()
        peer = free_port()
        self.dir = root / "etcd"
        self.proc = subprocess.Popen(
            ["etcd", "--name=bench", f"--data-dir={self.dir}",
             f"--listen-client-urls=http://127.0.0.1:{self.client}",
             f"--advertise-client-urls=http://127.0.0.1:{self.client}",
             f"--listen-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-cluster=bench=http://127.0.0.1:{peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.client}/health", timeout=1) as r:
                    if b'"health":"true"' in r.read():
                        return
            except OSError:
                pass
            if time.time() > deadline:
                sys.exit("etcd did not start")
            time.sleep(0.05)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


# Every member started, killed at exit if still running (a run that
# stops early must not leave daemons behind).
STARTED = []


class Member:
    def __init__(self, memwal, table, etcd, failover_ms, prefix):
        self.port = free_port()
        self.http = free_port()
        self.proc = subprocess.Popen(
            [memwal, "serve", "--table", f"t={table}", "--no-compactor",
             "--listen", f"127.0.0.1:{self.port}", "--http", f"127.0.0.1:{self.http}",
             "--cluster", f"etcd://127.0.0.1:{etcd.client}",
             "--advertise", f"grpc://127.0.0.1:{self.port}",
             "--cluster-failover-ms", str(failover_ms), "--cluster-prefix", prefix],
            stderr=subprocess.PIPE, text=True)
        STARTED.append(self)
        for line in self.proc.stderr:
            if "serving" in line and "http://" in line:
                break
        else:
            sys.exit("a member did not start")
        # Keep draining stderr.
        import threading
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()
        self.client = flight.connect(f"grpc://127.0.0.1:{self.port}")

    def status(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/status", timeout=5) as r:
            return json.load(r)["tables"]["t"]["cluster"]

    def metric(self, histogram):
        """(sum, count) of a histogram (a Prometheus summary) in /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/metrics", timeout=5) as r:
            text = r.read().decode()
        total = count = 0.0
        for line in text.splitlines():
            if line.startswith(histogram + "_sum"):
                total += float(line.rsplit(" ", 1)[1])
            elif line.startswith(histogram + "_count"):
                count += float(line.rsplit(" ", 1)[1])
        return total, count

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait()


def settle(members, shards):
    deadline = time.time() + 60
    while time.time() < deadline:
        views = [m.status() for m in members]
        if all(len(v["members"]) == len(members) and len(v["shards"]) == shards
               and all(s["owner"] == s["desired"] for s in v["shards"].values()) for v in views):
            return views[0]
        time.sleep(0.05)
    sys.exit(f"the cluster did not settle: {views}")


SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])


def batch(first, n):
    ids = list(range(first, first + n))
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"v-{i}" for i in ids])], schema=SCHEMA)


def put(member, b):
    writer, reader = member.client.do_put(flight.FlightDescriptor.for_path("t"), b.schema)
    writer.write_batch(b)
    writer.done_writing()
    reader.read()
    writer.close()


def put_retrying(member, b, give_up=60):
    started = time.time()
    while True:
        try:
            put(member, b)
            return
        except flight.FlightUnavailableError:
            pass
        except flight.FlightError as e:
            if "UNAVAILABLE" not in str(e) and "Aborted" not in str(e) and "ABORTED" not in str(e):
                raise
        if time.time() - started > give_up:
            sys.exit("puts refused for a minute")
        time.sleep(0.02)


def init(memwal, table, sharding):
    subprocess.run([memwal, "init", str(table), "--column", "id:int64:key", "--column", "v:utf8",
                    "--sharding", sharding], check=True, capture_output=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memwal", required=True)
    ap.add_argument("--dir", default="/var/tmp/cluster-bench")
    ap.add_argument("--puts", type=int, default=200)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--failover-ms", type=int, default=3000)
    a = ap.parse_args()
    root = pathlib.Path(a.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    etcd = Etcd(root)
    try:
        # 1. Forwarding cost.
        table = root / "one"
        init(a.memwal, table, "unsharded")
        members = [Member(a.memwal, table, etcd, a.failover_ms, "/bench-one") for _ in range(3)]
        # The shard is created by the first put.
        put_retrying(members[0], batch(10**9, 1))
        view = settle(members, 1)
        owner_id = next(iter(view["shards"].values()))["owner"]
        owner = next(m for m in members if m.status()["member"] == owner_id)
        other = next(m for m in members if m is not owner)
        lat = {"owner": [], "forwarded": []}
        key = 0
        for i in range(a.puts):
            for name, m in (("owner", owner), ("forwarded", other)) if i % 2 == 0 else (("forwarded", other), ("owner", owner)):
                b = batch(key, a.rows)
                key += a.rows
                t = time.perf_counter()
                put(m, b)
                lat[name].append(time.perf_counter() - t)
        p50 = {k: statistics.median(v) for k, v in lat.items()}
        print(f"forwarding: p50 put of {a.rows} rows: owner {p50['owner']*1e3:.2f} ms, "
              f"through a non-owner {p50['forwarded']*1e3:.2f} ms "
              f"(ratio {p50['forwarded']/p50['owner']:.2f}); rows/s owner "
              f"{a.rows/p50['owner']:,.0f}, forwarded {a.rows/p50['forwarded']:,.0f}")

        # 2. Failover.
        times = []
        for k in range(a.kills):
            view = settle(members, 1)
            owner_id = next(iter(view["shards"].values()))["owner"]
            owner = next(m for m in members if m.status()["member"] == owner_id)
            survivor = next(m for m in members if m is not owner)
            owner.kill()
            killed = time.perf_counter()
            put_retrying(survivor, batch(key, 10))
            times.append(time.perf_counter() - killed)
            key += 10
            members.remove(owner)
            members.append(Member(a.memwal, table, etcd, a.failover_ms, "/bench-one"))
        print(f"failover over {a.kills} kills (cluster_failover_ms {a.failover_ms}, lease "
              f"{max(2, -(-a.failover_ms * 6 // 10000))} s): kill -> first acknowledged put "
              f"p50 {statistics.median(times):.2f} s, max {max(times):.2f} s")
        # Of that, the claims themselves (record, epoch bump, WAL replay),
        # from the members still running.
        claims = [m.metric("memwal_server_cluster_claim_seconds") for m in members]
        n = sum(c[1] for c in claims)
        if n:
            print(f"  claims seen by the {len(members)} remaining members: {n:.0f}, "
                  f"mean {sum(c[0] for c in claims) / n * 1e3:.0f} ms each")
        for m in members:
            m.stop()

        # 3. 1 vs 3 members.
        rates = {}
        for n in (1, 3):
            table = root / f"eight-{n}"
            init(a.memwal, table, "bucket(id, 8)")
            members = [Member(a.memwal, table, etcd, a.failover_ms, f"/bench-eight-{n}") for _ in range(n)]
            # Shards are created by the first puts; warm up until settled.
            put_retrying(members[0], batch(10**9, 64))
            settle(members, 8)
            t = time.perf_counter()
            for i in range(a.puts):
                put(members[0], batch(i * a.rows, a.rows))
            rates[n] = a.puts * a.rows / (time.perf_counter() - t)
            for m in members:
                m.stop()
        print(f"1 vs 3 members (puts through one member, {a.rows}-row puts, one client): "
              f"{rates[1]:,.0f} vs {rates[3]:,.0f} rows/s (ratio {rates[3]/rates[1]:.2f})")
    finally:
        for m in STARTED:
            if m.proc.poll() is None:
                m.kill()
        etcd.stop()


if __name__ == "__main__":
    main()
