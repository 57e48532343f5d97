"""Applies one deliberate ABI change to a scratch copy of the crate, for the abidiff check of
scripts/release-tests.sh: `python3 scratch_change.py CRATE_DIR incompatible|appended-unversioned|compatible`.

- incompatible: a field inserted in the middle of strata_lookup_stats (an out-struct whose
  later fields move: a host built against 0.3 reads `misses` where `retries` now is).
- appended-unversioned: a field appended to strata_lookup_stats and nothing else. Behind a
  pointer that is what the struct_size rules allow, but strata_lookup_stats_default() returns the
  struct by value: a host built against 0.3 passes room for 40 bytes and the new library writes
  48. Incompatible.
- compatible: what the struct_size rules allow, done as docs/releasing.md says: a field appended
  to strata_lookup_stats, its initialiser strata_lookup_stats_default() (which returns the
  struct by value, so a host built against 0.3 has room for 40 bytes only) kept for those hosts
  at STRATA_0.3 with the 0.3 layout and added at a new node, and a new function in that node.

Every edit must match exactly once: a scratch copy left unchanged would make the check pass
for nothing.
"""

import pathlib
import sys


def edit(path: pathlib.Path, old: str, new: str) -> None:
    text = path.read_text()
    if text.count(old) != 1:
        sys.exit(f"scratch_change: {path}: expected exactly one {old!r}, found {text.count(old)}")
    path.write_text(text.replace(old, new))


def main() -> None:
    crate, kind = pathlib.Path(sys.argv[1]), sys.argv[2]
    types = crate / "src" / "ffi" / "lookup.rs"
    if kind == "incompatible":
        edit(types, "    pub hits: u64,\n    /// Keys not in the table", "    pub hits: u64,\n    pub retries: u64,\n    /// Keys not in the table")
        edit(types, "            hits: s.hits,\n", "            hits: s.hits,\n            retries: 0,\n")
    elif kind in ("compatible", "appended-unversioned"):
        edit(types, "    pub persistent_hits: u64,\n}", "    pub persistent_hits: u64,\n    pub evictions: u64,\n}")
        edit(types, "            persistent_hits: s.persistent_hits,\n        }", "            persistent_hits: s.persistent_hits,\n            evictions: 0,\n        }")
        if kind == "appended-unversioned":
            return
        lookup = crate / "src" / "ffi" / "lookup.rs"
        edit(
            lookup,
            "#[unsafe(no_mangle)]\npub extern \"C\" fn strata_lookup_stats_default() -> strata_lookup_stats {\n"
            "    strata_lookup_stats::default()\n}\n",
            "#[unsafe(export_name = \"strata_lookup_stats_default@@STRATA_0.3.2\")]\npub extern \"C\" fn strata_lookup_stats_default() -> strata_lookup_stats {\n"
            "    strata_lookup_stats::default()\n}\n\n"
            "pub mod v0_3 {\n"
            "    #[repr(C)]\n    #[allow(non_camel_case_types)]\n"
            "    pub struct strata_lookup_stats {\n        pub struct_size: usize,\n        pub hits: u64,\n"
            "        pub misses: u64,\n        pub volatile_hits: u64,\n        pub persistent_hits: u64,\n    }\n"
            "    #[unsafe(export_name = \"strata_lookup_stats_default@STRATA_0.3\")]\n    pub extern \"C\" fn strata_lookup_stats_default() -> strata_lookup_stats {\n"
            "        strata_lookup_stats { struct_size: 40, hits: 0, misses: 0, volatile_hits: 0, persistent_hits: 0 }\n    }\n}\n"
            "\n"
            "/// Added in the scratch copy.\n#[unsafe(no_mangle)]\npub extern \"C\" fn strata_abi_check_added() -> u32 {\n    7\n}\n",
        )
        with open(crate / "libstrata.map", "a") as f:
            f.write("\nSTRATA_0.3.2 {\n  global:\n    strata_lookup_stats_default;\n    strata_abi_check_added;\n} STRATA_0.3.1;\n")
    else:
        sys.exit(f"scratch_change: unknown change {kind!r}: expected incompatible, appended-unversioned or compatible")


if __name__ == "__main__":
    main()
