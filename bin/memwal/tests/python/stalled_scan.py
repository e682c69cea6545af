"""A reader that stops pulling: how much of the table the daemon reads
ahead of it.

Usage:
  stalled_scan.py write TABLE_PATH FRAGMENTS ROWS
      appends FRAGMENTS fragments of ROWS rows each (`id`, `v`: 1000
      characters that do not compress) to the base table with pylance;
      prints the bytes of the table's data files.
  stalled_scan.py stall GRPC_ADDR TABLE PID
      runs `SELECT * FROM TABLE` through ADBC, takes one batch, then waits
      until the daemon (PID) has stopped reading (its `rchar` unchanged for
      0.5 s, at most 20 s), reads the rest; prints {"read_ahead": bytes
      the daemon read between the query's start and the end of the wait,
      "rows": rows read in all} as JSON.
"""
import base64
import json
import os
import sys
import time

mode = sys.argv[1]
if mode == "write":
    import lance
    import pyarrow as pa

    path, fragments, rows = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    schema = lance.dataset(path).schema
    for f in range(fragments):
        ids = pa.array(range(f * rows, (f + 1) * rows), pa.int64())
        v = pa.array([base64.b64encode(os.urandom(750)).decode() for _ in range(rows)])
        lance.write_dataset(pa.table({"id": ids, "v": v}, schema=schema), path, mode="append")
    data = os.path.join(path, "data")
    print(sum(os.path.getsize(os.path.join(data, n)) for n in os.listdir(data)))
elif mode == "stall":
    import adbc_driver_flightsql.dbapi as flightsql

    addr, table, pid = sys.argv[2], sys.argv[3], sys.argv[4]

    def rchar():
        with open(f"/proc/{pid}/io") as f:
            return int(f.read().split("rchar:")[1].split()[0])

    with flightsql.connect(f"grpc://{addr}", autocommit=True) as conn:
        with conn.cursor() as cur:
            start = rchar()
            cur.execute(f"SELECT * FROM {table}")
            reader = cur.fetch_record_batch()
            rows = reader.read_next_batch().num_rows
            last, still_since, until = rchar(), time.monotonic(), time.monotonic() + 20
            while time.monotonic() < until and time.monotonic() - still_since < 0.5:
                time.sleep(0.05)
                now = rchar()
                if now != last:
                    last, still_since = now, time.monotonic()
            read_ahead = last - start
            for batch in reader:
                rows += batch.num_rows
    print(json.dumps({"read_ahead": read_ahead, "rows": rows}))
else:
    sys.exit(f"unknown mode {mode}")
