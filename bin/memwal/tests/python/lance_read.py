"""Reads a base table with pylance (lance's Python reader) and prints {id: v} as JSON.

Usage: lance_read.py TABLE_PATH
"""
import json
import sys

import lance

t = lance.dataset(sys.argv[1]).to_table()
ids, vs = t.column("id").to_pylist(), t.column("v").to_pylist()
assert len(set(ids)) == len(ids), "a key appears twice"
print(json.dumps({str(i): v for i, v in zip(ids, vs)}))
