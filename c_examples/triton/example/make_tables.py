"""Writes the example's HugeCTR sparse folders into <folder>/tables (random rows, fixed seeds):
wdl0 (1000 x 1), wdl1 (5000 x 16), users (2000 x 32), items (10000 x 32). Each folder holds `key`
(int64 keys) and `emb_vector` (float32 rows), as HugeCTR writes them and strata_table_open reads.

    python make_tables.py <folder>      # the folder holding ps.json
"""

import sys
from pathlib import Path

import numpy as np

TABLES = {"wdl0": (1000, 1), "wdl1": (5000, 16), "users": (2000, 32), "items": (10000, 32)}


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    for seed, (name, (rows, dim)) in enumerate(TABLES.items()):
        rng = np.random.default_rng(seed)
        folder = root / "tables" / name
        folder.mkdir(parents=True, exist_ok=True)
        (np.arange(rows, dtype="<i8") * 7 + seed).tofile(folder / "key")  # keys 7i + seed
        rng.standard_normal((rows, dim), dtype=np.float32).tofile(folder / "emb_vector")
        print(f"{folder}: {rows} x {dim}")


if __name__ == "__main__":
    main()
