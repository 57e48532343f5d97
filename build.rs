//! Generates the C header into OUT_DIR with cbindgen. The committed `include/strata.h` is
//! compared with it by the `header_is_fresh` test; build.rs never writes into the source tree.

fn main() {
    let crate_dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    let out_dir = std::env::var("OUT_DIR").unwrap();
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let config = cbindgen::Config::from_file(format!("{crate_dir}/cbindgen.toml")).expect("cbindgen.toml");
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen failed to generate strata.h")
        .write_to_file(format!("{out_dir}/strata.h"));
}
