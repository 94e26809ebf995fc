//! `uroce libdir`: the directory holding uroce's `libibverbs.so.1` and
//! `librdmacm.so.1`, for `LD_LIBRARY_PATH=$(uroce libdir) ibv_devinfo`.
//!
//! `cargo build` puts the library (`liburoce_ibverbs.so`, package
//! `uroce-ibverbs`) next to the `uroce` binary, and its build script
//! `uroce-ibverbs/libibverbs.so.1` and `uroce-ibverbs/librdmacm.so.1`
//! symlinks to it (one file is both libraries); this finds that directory
//! (making the links if they are missing).

use std::path::{Path, PathBuf};

/// The subdirectory of the binary's directory that holds the link.
pub const SUBDIR: &str = "uroce-ibverbs";

/// The directory for `exe_dir` (the directory of the `uroce` binary).
pub fn find(exe_dir: &Path) -> Result<PathBuf, String> {
    let lib = exe_dir.join("liburoce_ibverbs.so");
    if !lib.exists() {
        return Err(format!(
            "{} is missing: build it with `cargo build --release` (package uroce-ibverbs)",
            lib.display()
        ));
    }
    let dir = exe_dir.join(SUBDIR);
    for name in ["libibverbs.so.1", "librdmacm.so.1"] {
        let link = dir.join(name);
        if !link.exists() {
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink("../liburoce_ibverbs.so", &link)
                .map_err(|e| format!("{}: {e}", link.display()))?;
        }
    }
    Ok(dir)
}

/// Prints the directory for the running binary.
pub fn run() -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe.parent().ok_or("the binary has no directory")?;
    println!("{}", find(dir)?.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn makes_the_link_and_refuses_without_the_library() {
        let d = std::env::temp_dir().join(format!("uroce-libdir-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert!(super::find(&d).is_err());
        std::fs::write(d.join("liburoce_ibverbs.so"), b"").unwrap();
        let dir = super::find(&d).unwrap();
        assert_eq!(dir, d.join(super::SUBDIR));
        assert!(dir.join("libibverbs.so.1").exists());
        assert!(dir.join("librdmacm.so.1").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
