"""Bulk-ingests through `memwal serve` with ADBC's Flight SQL driver, as a user would.

Usage: adbc_ingest.py GRPC_ADDR TABLE TOKEN
Two `adbc_ingest(..., mode="append")` calls (the second overwrites keys
0-4), then the refusals a user can hit: mode "create" on an existing table,
an unknown table, a wrong token. Prints one JSON object.
"""
import json
import sys

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa

addr, table, token = sys.argv[1], sys.argv[2], sys.argv[3]


def connect(tok):
    return flightsql.connect(
        f"grpc://{addr}",
        db_kwargs={"adbc.flight.sql.authorization_header": f"Bearer {tok}"},
        autocommit=True,
    )


def rows(ids, tag):
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"{tag}-{i}" for i in ids]})


def refusal(fn):
    try:
        fn()
    except Exception as e:  # the driver's own error types
        return f"{type(e).__name__}: {e}"
    return None


out = {}
with connect(token) as conn:
    info = conn.adbc_get_info()
    out["vendor_name"] = info.get("vendor_name")
    with conn.cursor() as cur:
        out["counts"] = [
            cur.adbc_ingest(table, rows(list(range(0, 10)), "a"), mode="append"),
            cur.adbc_ingest(table, rows(list(range(0, 5)) + list(range(10, 15)), "b"), mode="append"),
        ]
        out["create_refused"] = refusal(lambda: cur.adbc_ingest(table, rows([1], "c"), mode="create"))
        out["unknown_refused"] = refusal(lambda: cur.adbc_ingest("nope", rows([1], "c"), mode="append"))
with connect("wrong") as bad:
    with bad.cursor() as cur:
        out["token_refused"] = refusal(lambda: cur.adbc_ingest(table, rows([1], "c"), mode="append"))
print(json.dumps(out))
