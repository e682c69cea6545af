"""Writes through `memwal serve` with pyarrow's Flight client, as a user would.

Usage: flight_put.py GRPC_ADDR TABLE
Puts three batches with do_put (each carrying a request id in its
app_metadata) and reads one acknowledgement per batch before sending the
next; then deletes one key; then puts one ~8 MiB batch. Prints the
acknowledgements as JSON lines.
"""
import json
import sys

import pyarrow as pa
import pyarrow.flight as flight

addr, table = sys.argv[1], sys.argv[2]
client = flight.connect(f"grpc://{addr}")
schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.utf8())])
writer, reader = client.do_put(flight.FlightDescriptor.for_path(table), schema)
for n, ids in enumerate([range(0, 10), range(10, 20), range(0, 5)]):
    batch = pa.record_batch(
        [pa.array(list(ids), pa.int64()), pa.array([f"py{n}-{i}" for i in ids])], schema=schema
    )
    writer.write_with_metadata(batch, json.dumps({"request_id": f"req-{n}"}).encode())
    ack = reader.read()
    print(json.dumps(json.loads(ack.to_pybytes())))
writer.done_writing()
writer.close()

keys = pa.schema([pa.field("id", pa.int64(), nullable=False)])
writer, reader = client.do_put(flight.FlightDescriptor.for_path(table, "delete"), keys)
writer.write_with_metadata(pa.record_batch([pa.array([7], pa.int64())], schema=keys), b"{}")
print(json.dumps(json.loads(reader.read().to_pybytes())))
writer.close()

# One large batch (~8 MiB, above gRPC's 4 MiB default message limit) is one
# message from pyarrow and must be accepted and acknowledged once.
big_ids = list(range(1000, 9000))
big = pa.record_batch(
    [pa.array(big_ids, pa.int64()), pa.array([f"big-{i}-" + "x" * 1000 for i in big_ids])],
    schema=schema,
)
writer, reader = client.do_put(flight.FlightDescriptor.for_path(table), schema)
writer.write_with_metadata(big, json.dumps({"request_id": "big"}).encode())
print(json.dumps(json.loads(reader.read().to_pybytes())))
writer.done_writing()
writer.close()
