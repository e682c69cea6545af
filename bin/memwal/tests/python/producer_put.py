"""Idempotent producers through `memwal serve`, with pyarrow's Flight client
and ADBC's Flight SQL driver, as a user would (docs/design/idempotent-producers.md).

Usage: producer_put.py GRPC_ADDR TABLE
1. pyarrow: three batches as producer "py-job" (epoch 1, sequences 1-3),
   each sequence in the batch's app_metadata; then sequence 2 again on a
   new stream (a retry after a lost acknowledgement); then sequence 5 (a gap).
2. ADBC: the same bulk ingest twice as producer "adbc-job" (sequence 10,
   sent as request headers through `adbc.flight.sql.rpc.call_header.*`:
   the driver refuses unknown statement options).
Prints one JSON object: the acknowledgements, the gap's error, the two
ingest counts and the table's row count.
"""
import json
import sys

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as flight

addr, table = sys.argv[1], sys.argv[2]
schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.utf8())])
client = flight.connect(f"grpc://{addr}")


def batch(ids, tag):
    return pa.record_batch(
        [pa.array(ids, pa.int64()), pa.array([f"{tag}-{i}" for i in ids])], schema=schema
    )


def send(batches):
    """One DoPut stream; each (batch, sequence) acknowledged before the next."""
    writer, reader = client.do_put(flight.FlightDescriptor.for_path(table), schema)
    acks = []
    for b, sequence in batches:
        meta = {"producer_id": "py-job", "producer_epoch": 1, "sequence": sequence}
        writer.write_with_metadata(b, json.dumps(meta).encode())
        ack = reader.read()
        if ack is None:
            # The stream ended with an error: closing raises it.
            writer.close()
            raise RuntimeError("the stream ended without an acknowledgement")
        acks.append(json.loads(ack.to_pybytes()))
    writer.done_writing()
    writer.close()
    return acks


out = {}
out["first"] = send([(batch([1, 2], "a"), 1), (batch([3], "b"), 2), (batch([4], "c"), 3)])
out["retry"] = send([(batch([3], "b"), 2)])
try:
    send([(batch([9], "gap"), 5)])
    out["gap"] = None
except Exception as e:  # pyarrow raises the status at close()
    out["gap"] = str(e)

headers = {
    "adbc.flight.sql.rpc.call_header.memwal-producer-id": "adbc-job",
    "adbc.flight.sql.rpc.call_header.memwal-producer-epoch": "1",
    "adbc.flight.sql.rpc.call_header.memwal-sequence": "10",
}
rows = pa.table({"id": pa.array([5, 6, 7], pa.int64()), "v": ["d-5", "d-6", "d-7"]})
with flightsql.connect(f"grpc://{addr}", autocommit=True) as conn:
    out["ingests"] = []
    for _ in range(2):
        with conn.cursor() as cur:
            cur.adbc_statement.set_options(**headers)
            out["ingests"].append(cur.adbc_ingest(table, rows, mode="append"))
    with conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {table}")
        out["count"] = cur.fetchall()[0][0]
print(json.dumps(out))
