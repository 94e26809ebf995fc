//! Links the cdylib as `libibverbs.so.1` with rdma-core's version nodes
//! (libibverbs' and librdmacm's), and puts `libibverbs.so.1` and
//! `librdmacm.so.1` symlinks to it in `<target>/<profile>/uroce-ibverbs/`
//! (the directory `uroce libdir` prints). Both names lead to the same file,
//! which glibc's loader maps once for both sonames.

use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let map = dir.join("libibverbs.map");
    println!("cargo:rerun-if-changed={}", map.display());
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out.
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    if let Some(profile_dir) = out.ancestors().nth(3) {
        let libdir = profile_dir.join("uroce-ibverbs");
        for name in ["libibverbs.so.1", "librdmacm.so.1"] {
            let link = libdir.join(name);
            if std::fs::create_dir_all(&libdir).is_ok() && std::fs::symlink_metadata(&link).is_err()
            {
                let _ = std::os::unix::fs::symlink("../liburoce_ibverbs.so", &link);
            }
        }
    }
}
