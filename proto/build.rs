//! Compiles `memwal.proto` with prost. `protoc` comes from the
//! `protoc-bin-vendored` crate unless `PROTOC` names another one, so a fresh
//! machine needs no system package to build this crate.

fn main() -> std::io::Result<()> {
    let proto = "memwal.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-env-changed=PROTOC");
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()
            .map_err(|e| std::io::Error::other(format!("no vendored protoc: {e}")))?;
        // SAFETY: build scripts are single-threaded; prost-build reads PROTOC.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let mut config = prost_build::Config::new();
    // Ordered maps make encoding deterministic: equal messages, equal bytes.
    config.btree_map(["."]);
    config.compile_protos(&[proto], &["."])
}
