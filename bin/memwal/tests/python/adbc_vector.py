"""Search over SQL through `memwal serve`, with ADBC's Flight SQL driver and
no custom client code. For each probe: the top hit of
`vector_search(TABLE, 'vec', '<its vector>', 1)`, and the hits of
`fts(TABLE, 'txt', '<its word>')`.

Usage: adbc_vector.py GRPC_ADDR TABLE PROBES_JSON ([[id, [floats...], word], ...])
Prints one JSON object: the top vector hit id per probe, and the ids the
full-text search of each probe's word returned, in order.
"""
import json
import sys

import adbc_driver_flightsql.dbapi as flightsql

addr, table, probes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
top, fts = [], []
with flightsql.connect(f"grpc://{addr}", autocommit=True) as conn, conn.cursor() as cur:
    for _, vec, word in probes:
        text = ",".join(repr(float(x)) for x in vec)
        cur.execute(f"SELECT id, _distance FROM vector_search('{table}', 'vec', '{text}', 1)")
        top.append(cur.fetchall()[0][0])
        cur.execute(f"SELECT id, _score FROM fts('{table}', 'txt', '{word}') ORDER BY _score DESC")
        fts.append([row[0] for row in cur.fetchall()])
print(json.dumps({"top": top, "fts": fts}))
