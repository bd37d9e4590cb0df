//! Generate `tiermem.h` from the crate's declarations into `OUT_DIR` (the test
//! `header_is_current` compares it with `include/tiermem.h`, the copy installed).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let config = cbindgen::Config::from_file(format!("{dir}/cbindgen.toml"))
        .expect("cbindgen.toml is readable");
    cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .expect("the C declarations are well-formed")
        .write_to_file(format!("{out}/tiermem.h"));
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
}
