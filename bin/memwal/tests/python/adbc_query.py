"""Writes with ADBC's Flight SQL driver and reads back with SQL through the
same `memwal serve`, as a user would, with nothing flushed in between.

Usage: adbc_query.py GRPC_ADDR TABLE
Ingests keys 0-9 ("a"), then overwrites 0-4 ("b") and deletes 5 and 6 (a
Flight DoPut on the table's `delete` path), then queries: one key, a
count (by the table's full name), every row, a bad query; and the table's
schema (GetTables). Prints one JSON object.
"""
import json
import sys

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as flight

addr, table = sys.argv[1], sys.argv[2]


def rows(ids, tag):
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"{tag}-{i}" for i in ids]})


out = {}
with flightsql.connect(f"grpc://{addr}", autocommit=True) as conn:
    out["table_schema"] = [f.name for f in conn.adbc_get_table_schema(table)]
    with conn.cursor() as cur:
        cur.adbc_ingest(table, rows(list(range(10)), "a"), mode="append")
        cur.execute(f"SELECT v FROM {table} WHERE id = 4")
        out["key_4_first"] = cur.fetchall()
        cur.adbc_ingest(table, rows(list(range(5)), "b"), mode="append")
        keys = pa.record_batch({"id": pa.array([5, 6], pa.int64())})
        client = flight.connect(f"grpc://{addr}")
        writer, reader = client.do_put(flight.FlightDescriptor.for_path(table, "delete"), keys.schema)
        writer.write_batch(keys)
        reader.read()
        writer.close()
        cur.execute(f"SELECT v FROM {table} WHERE id = 4")
        out["key_4"] = cur.fetchall()
        cur.execute(f"SELECT count(*) AS n FROM memwal.public.{table}")
        out["count"] = cur.fetchall()[0][0]
        cur.execute(f"SELECT id, v FROM {table} ORDER BY id")
        out["rows"] = [[i, v] for i, v in cur.fetchall()]
        try:
            cur.execute(f"SELECT nope FROM {table}")
            out["bad_query"] = None
        except Exception as e:  # the driver's own error types
            out["bad_query"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
