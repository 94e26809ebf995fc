//! `uroce libdir`: the directory holding uroce's `libibverbs.so.1` and
//! `librdmacm.so.1`, for `LD_LIBRARY_PATH=$(uroce libdir) ibv_devinfo`.
//!
//! `cargo build` puts the library (`liburoce_ibverbs.so`, package
//! `uroce-ibverbs`) next to the `uroce` binary, and its build script
//! `uroce-ibverbs/libibverbs.so.1` and `uroce-ibverbs/librdmacm.so.1`
//! symlinks to it (one file is both libraries); this finds that directory
//! (making the links if they are missing).
//!
//! `uroce exec` runs a program with that directory on `LD_LIBRARY_PATH`
//! and `liburoce_preload.so` (package `uroce-preload`, linked into the
//! same directory) on `LD_PRELOAD` and `LD_AUDIT` (where it makes any
//! libibverbs or librdmacm the program loads, whatever its name or path,
//! this directory's), with the devices' sysfs view
//! ([`crate::sysfs_tree`]) named in `UROCE_SYSFS`.

use std::path::{Path, PathBuf};

/// The subdirectory of the binary's directory that holds the link.
pub const SUBDIR: &str = "uroce-ibverbs";

/// The directory for `exe_dir` (the directory of the `uroce` binary).
pub fn find(exe_dir: &Path) -> Result<PathBuf, String> {
    let lib = exe_dir.join("liburoce_ibverbs.so");
    if !lib.exists() {
        return Err(format!(
            "{} is missing: build it with `cargo build --release -p uroce-ibverbs -p uroce-preload` \
             (a cargo invocation of its own, so that no test feature reaches it)",
            lib.display()
        ));
    }
    let dir = exe_dir.join(SUBDIR);
    let mut links = vec![
        ("libibverbs.so.1", "../liburoce_ibverbs.so"),
        ("librdmacm.so.1", "../liburoce_ibverbs.so"),
    ];
    if exe_dir.join(PRELOAD).exists() {
        links.push((PRELOAD, "../liburoce_preload.so"));
    }
    for (name, target) in links {
        let link = dir.join(name);
        if !link.exists() {
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(target, &link)
                .map_err(|e| format!("{}: {e}", link.display()))?;
        }
    }
    Ok(dir)
}

/// The preload library `uroce exec` uses.
pub const PRELOAD: &str = "liburoce_preload.so";

/// `uroce exec -- PROGRAM ARGS...`: replaces this process with the
/// program, on uroce's libraries and with the preload library. Returns
/// only on failure, with why.
pub fn exec(cmd: &[std::ffi::OsString]) -> String {
    use std::os::unix::process::CommandExt;
    let Some((prog, args)) = cmd.split_first() else {
        return "no program given".into();
    };
    let dir = match std::env::current_exe()
        .map_err(|e| e.to_string())
        .and_then(|exe| find(exe.parent().ok_or("the binary has no directory")?))
    {
        Ok(d) => d,
        Err(e) => return e,
    };
    let preload = dir.join(PRELOAD);
    if !preload.exists() {
        return format!(
            "{} is missing: build it with `cargo build --release -p uroce-ibverbs -p uroce-preload`",
            preload.display()
        );
    }
    let join = |var: &str, first: &Path, sep: &str| {
        let mut v = first.as_os_str().to_owned();
        if let Some(old) = std::env::var_os(var).filter(|o| !o.is_empty()) {
            v.push(sep);
            v.push(old);
        }
        v
    };
    let mut cmd = std::process::Command::new(prog);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", join("LD_LIBRARY_PATH", &dir, ":"))
        .env("LD_PRELOAD", join("LD_PRELOAD", &preload, " "))
        // The same library as an rtld-audit module: a libibverbs or
        // librdmacm loaded by any other name or path (a wheel's bundled,
        // renamed copy) is redirected to this directory's.
        .env("LD_AUDIT", join("LD_AUDIT", &preload, ":"))
        .env(
            "GLIBC_TUNABLES",
            tunables(std::env::var("GLIBC_TUNABLES").ok()),
        );
    // The sysfs view: without it the program runs on, as on a machine
    // whose sysfs has no RDMA devices.
    match crate::sysfs_tree::prepare() {
        Ok(root) => {
            cmd.env(crate::sysfs_tree::ENV, root);
        }
        Err(e) => eprintln!("uroce exec: no sysfs view of the devices: {e}"),
    }
    let err = cmd.exec();
    format!("{}: {err}", prog.to_string_lossy())
}

/// The static TLS glibc sets aside for libraries loaded after start
/// (`glibc.rtld.optional_static_tls`), raised to 64 KiB unless the caller
/// chose a size. An audit module loads a second copy of the C library in
/// a namespace of its own, which takes most of the default 512 bytes;
/// without more, a program with a large initial-exec TLS segment (rustc's
/// `librustc_driver` has 23 KiB) fails to start: "cannot allocate memory
/// in static TLS block". 64 KiB is reserved once per thread.
fn tunables(old: Option<String>) -> String {
    const TLS: &str = "glibc.rtld.optional_static_tls";
    match old.filter(|o| !o.is_empty()) {
        Some(o) if o.split(':').any(|t| t.starts_with(TLS)) => o,
        Some(o) => format!("{o}:{TLS}=0x10000"),
        None => format!("{TLS}=0x10000"),
    }
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
    fn tunables_raise_static_tls_unless_chosen() {
        let t = super::tunables;
        assert_eq!(t(None), "glibc.rtld.optional_static_tls=0x10000");
        assert_eq!(
            t(Some(String::new())),
            "glibc.rtld.optional_static_tls=0x10000"
        );
        assert_eq!(
            t(Some("glibc.malloc.arena_max=2".into())),
            "glibc.malloc.arena_max=2:glibc.rtld.optional_static_tls=0x10000"
        );
        let chosen = "glibc.rtld.optional_static_tls=0x400:glibc.malloc.arena_max=2";
        assert_eq!(t(Some(chosen.into())), chosen);
    }

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
        assert!(
            !dir.join(super::PRELOAD).exists(),
            "no preload library built"
        );
        std::fs::write(d.join(super::PRELOAD), b"").unwrap();
        super::find(&d).unwrap();
        assert!(dir.join(super::PRELOAD).exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
