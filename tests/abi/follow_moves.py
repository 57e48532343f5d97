"""Follow C structs that moved between Rust modules, before abidiff compares two ABIs.

scripts/release-tests.sh: `python3 follow_moves.py BASELINE.abi CURRENT.abi OUT.abi`.

abidw names a type by its Rust path (`strata::ffi::types::strata_lookup_stats`), so moving a
`#[repr(C)]` struct to another module of `ffi` reads to abidiff as a renamed type, although a C
host sees the same name, size and fields. This writes a copy of the baseline in which each
`strata_*` struct under `strata::ffi::<module>` that CURRENT no longer has there, but has under
exactly one other module of `strata::ffi`, sits in that module instead. Nothing else changes:
the struct's fields, size and type id are the baseline's, so abidiff still reports every change
of layout (tests/abi/scratch_change.py's inserted field shows it).
"""

import sys
import xml.etree.ElementTree as ET


def ffi_structs(root: ET.Element) -> dict[str, set[str]]:
    """C struct name -> the modules of `strata::ffi` that declare it."""
    found: dict[str, set[str]] = {}
    for strata in root.iter("namespace-decl"):
        if strata.get("name") != "strata":
            continue
        for ffi in strata.findall("namespace-decl[@name='ffi']"):
            for module in ffi.findall("namespace-decl"):
                for struct in module.findall("class-decl"):
                    name = struct.get("name", "")
                    if name.startswith("strata_"):
                        found.setdefault(name, set()).add(module.get("name", ""))
    return found


def main() -> None:
    baseline_path, current_path, out_path = sys.argv[1:4]
    tree = ET.parse(baseline_path)
    now = ffi_structs(ET.parse(current_path).getroot())
    moved = []
    for strata in tree.getroot().iter("namespace-decl"):
        if strata.get("name") != "strata":
            continue
        for ffi in strata.findall("namespace-decl[@name='ffi']"):
            for module in list(ffi.findall("namespace-decl")):
                old = module.get("name", "")
                for struct in list(module.findall("class-decl")):
                    name = struct.get("name", "")
                    homes = now.get(name, set())
                    if not name.startswith("strata_") or old in homes or len(homes) != 1:
                        continue
                    new = next(iter(homes))
                    target = ffi.find(f"namespace-decl[@name='{new}']")
                    if target is None:
                        target = ET.SubElement(ffi, "namespace-decl", {"name": new})
                    module.remove(struct)
                    target.append(struct)
                    moved.append(f"strata::ffi::{old}::{name} -> strata::ffi::{new}::{name}")
    tree.write(out_path, encoding="unicode")
    for line in moved:
        print(f"   followed {line}")


if __name__ == "__main__":
    main()
