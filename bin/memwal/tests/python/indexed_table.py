"""Creates the indexed table of the search test with pylance, as a LanceDB
user would: 3000 rows (`id` int64 primary key, `vec` 16-dim float32
vectors in [0, 1), `txt` utf8, `n` int64), an IVF_PQ index `vec_idx`, an
INVERTED index `txt_fts`, a BTREE index `n_btree`, and
`initialize_mem_wal(unsharded=True)` (which maintains every index).

Usage: indexed_table.py TABLE_PATH
"""
import sys

import lance
import numpy as np
import pyarrow as pa

path = sys.argv[1]
rows = 3000
rng = np.random.default_rng(7)
key = pa.field("id", pa.int64(), nullable=False,
               metadata={"lance-schema:unenforced-primary-key": "true"})
schema = pa.schema([
    key,
    pa.field("vec", pa.list_(pa.float32(), 16)),
    pa.field("txt", pa.utf8()),
    pa.field("n", pa.int64()),
])
vecs = rng.random((rows, 16), dtype=np.float32)
table = pa.table({
    "id": pa.array(range(rows), pa.int64()),
    "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), 16),
    "txt": [f"base{i} common" for i in range(rows)],
    "n": pa.array(range(rows), pa.int64()),
}, schema=schema)
ds = lance.write_dataset(table, path)
ds.create_index("vec", "IVF_PQ", name="vec_idx", num_partitions=4, num_sub_vectors=4)
ds.create_scalar_index("txt", "INVERTED", name="txt_fts")
ds.create_scalar_index("n", "BTREE", name="n_btree")
ds = lance.dataset(path)
ds.initialize_mem_wal(unsharded=True)
print(sorted(i["name"] for i in ds.list_indices()))
