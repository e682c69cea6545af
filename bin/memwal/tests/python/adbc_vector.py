"""Nearest-neighbour search over SQL through `memwal serve`, with ADBC's
Flight SQL driver and no custom client code: for each probe, the top hit
of `vector_search(TABLE, 'vec', '<its vector>', 1)`.

Usage: adbc_vector.py GRPC_ADDR TABLE PROBES_JSON ([[id, [floats...]], ...])
Prints one JSON object: the top hit id per probe, in order.
"""
import json
import sys

import adbc_driver_flightsql.dbapi as flightsql

addr, table, probes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
top = []
with flightsql.connect(f"grpc://{addr}", autocommit=True) as conn, conn.cursor() as cur:
    for _, vec in probes:
        text = ",".join(repr(float(x)) for x in vec)
        cur.execute(f"SELECT id, _distance FROM vector_search('{table}', 'vec', '{text}', 1)")
        top.append(cur.fetchall()[0][0])
print(json.dumps({"top": top}))
