//! The preload library as programs reach it: through every name this
//! machine's C library exports for the calls it answers (old binaries bind
//! glibc's `__xstat@GLIBC_2.2.5` for `stat`, fortified ones
//! `__realpath_chk`), loaded and called as such a program's calls are.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;

/// `liburoce_preload.so` as this package's source makes it: built here
/// (cargo builds no cdylib for a package's tests), with the profile and
/// into the target directory of this test.
fn library() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap();
            let out = exe.parent().unwrap().parent().unwrap();
            let profile = match out.file_name().and_then(|n| n.to_str()) {
                Some("debug") | None => "dev".to_string(),
                Some(p) => p.to_string(),
            };
            let ok = std::process::Command::new(env!("CARGO"))
                .args(["build", "-q", "-p", "uroce-preload", "--lib", "--profile"])
                .arg(&profile)
                .arg("--target-dir")
                .arg(out.parent().unwrap())
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "cargo build -p uroce-preload");
            out.join("liburoce_preload.so")
        })
        .clone()
}

/// The dynamic symbols `file` defines (versions dropped).
fn defined(file: &std::path::Path) -> Vec<String> {
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(file)
        .output()
        .expect("nm (binutils) runs");
    assert!(out.status.success(), "nm {}", file.display());
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .map(|s| s.split('@').next().unwrap_or(s).to_string())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The C library this test runs on, from its own mappings.
fn libc_path() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            let name = p.rsplit('/').next().unwrap_or(p);
            name.starts_with("libc.so") || name.starts_with("libc-")
        })
        .map(PathBuf::from)
        .expect("libc mapped")
}

/// Whether a C library symbol is one of the families the preload must
/// answer for: a file looked at (`stat`, `access`), opened or listed,
/// or a link read or resolved, by its path.
fn in_family(s: &str) -> bool {
    let base = s.trim_start_matches('_');
    let stat = {
        // [l|f]?[x]?stat[at]?[64]?, statx; not the descriptor's own
        // (fstat, __fxstat: no path) nor the filesystem's (statfs, statvfs).
        let b = base.strip_suffix("64").unwrap_or(base);
        matches!(
            b,
            "stat" | "lstat" | "fstatat" | "xstat" | "lxstat" | "fxstatat" | "statx"
        )
    };
    let access = matches!(base, "access" | "faccessat" | "euidaccess" | "eaccess");
    let open = {
        let b = base.strip_suffix("_2").unwrap_or(base);
        let b = b.strip_suffix("64").unwrap_or(b);
        matches!(b, "open" | "openat" | "fopen" | "freopen" | "opendir")
            || matches!(b, "scandir" | "scandirat")
    };
    let link = {
        let b = base.strip_suffix("_chk").unwrap_or(base);
        matches!(
            b,
            "readlink" | "readlinkat" | "realpath" | "canonicalize_file_name"
        )
    };
    (stat || access || open || link) && !s.contains("nocancel")
}

#[test]
fn every_name_of_the_family_is_answered() {
    let libc = defined(&libc_path());
    let ours = defined(&library());
    let family: Vec<&String> = libc.iter().filter(|s| in_family(s)).collect();
    // The list is this machine's glibc's: it must at least hold the
    // names old and new binaries are known to bind.
    for known in [
        "stat",
        "__xstat",
        "__lxstat64",
        "statx",
        "open64",
        "realpath",
    ] {
        assert!(
            family.iter().any(|s| *s == known),
            "{known} not in {family:?}"
        );
    }
    let missing: Vec<_> = family.iter().filter(|s| !ours.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "the C library exports {missing:?}, which liburoce_preload.so does not answer"
    );
}

/// The library, loaded apart from this process's own lookups.
struct Lib(*mut c_void);

impl Lib {
    fn open() -> Lib {
        let p = CString::new(library().into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        let h = unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen liburoce_preload.so");
        Lib(h)
    }
    /// The library's own definition of `name`.
    fn sym(&self, name: &str) -> *mut c_void {
        let n = CString::new(name).unwrap();
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(self.0, n.as_ptr()) };
        assert!(!p.is_null(), "{name}");
        p
    }
}

const NODE: &CStr = c"/dev/infiniband/uverbs-uroce0";

fn is_node(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_mode & 0o666 == 0o666
}

#[test]
fn a_device_node_is_answered_through_every_stat_and_access_name() {
    type Xstat = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat) -> c_int;
    type Fxstatat =
        unsafe extern "C" fn(c_int, c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
    type Stat = unsafe extern "C" fn(*const c_char, *mut libc::stat) -> c_int;
    type Fstatat = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
    type Statx = unsafe extern "C" fn(c_int, *const c_char, c_int, u32, *mut libc::statx) -> c_int;
    type Access = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
    type Faccessat = unsafe extern "C" fn(c_int, *const c_char, c_int, c_int) -> c_int;
    let lib = Lib::open();
    let p = NODE.as_ptr();
    // SAFETY: each symbol is the library's definition of that C function,
    // called with its C arguments: a NUL-terminated path and a buffer of
    // the right structure.
    unsafe {
        for name in ["__xstat", "__xstat64", "__lxstat", "__lxstat64"] {
            let f: Xstat = std::mem::transmute(lib.sym(name));
            let mut st: libc::stat = std::mem::zeroed();
            assert_eq!(f(1, p, &mut st), 0, "{name}");
            assert!(is_node(&st), "{name}");
        }
        for name in ["__fxstatat", "__fxstatat64"] {
            let f: Fxstatat = std::mem::transmute(lib.sym(name));
            let mut st: libc::stat = std::mem::zeroed();
            assert_eq!(f(1, libc::AT_FDCWD, p, &mut st, 0), 0, "{name}");
            assert!(is_node(&st), "{name}");
        }
        for name in ["stat", "stat64", "lstat", "lstat64"] {
            let f: Stat = std::mem::transmute(lib.sym(name));
            let mut st: libc::stat = std::mem::zeroed();
            assert_eq!(f(p, &mut st), 0, "{name}");
            assert!(is_node(&st), "{name}");
        }
        for name in ["fstatat", "fstatat64"] {
            let f: Fstatat = std::mem::transmute(lib.sym(name));
            let mut st: libc::stat = std::mem::zeroed();
            let nofollow = libc::AT_SYMLINK_NOFOLLOW;
            assert_eq!(f(libc::AT_FDCWD, p, &mut st, nofollow), 0, "{name}");
            assert!(is_node(&st), "{name}");
        }
        let f: Statx = std::mem::transmute(lib.sym("statx"));
        let mut stx: libc::statx = std::mem::zeroed();
        assert_eq!(
            f(libc::AT_FDCWD, p, 0, libc::STATX_BASIC_STATS, &mut stx),
            0
        );
        assert_eq!(u32::from(stx.stx_mode) & libc::S_IFMT, libc::S_IFCHR);
        assert_eq!(stx.stx_rdev_major, 231);
        for name in ["access", "euidaccess", "eaccess"] {
            let f: Access = std::mem::transmute(lib.sym(name));
            assert_eq!(f(p, libc::R_OK | libc::W_OK), 0, "{name}");
        }
        let f: Faccessat = std::mem::transmute(lib.sym("faccessat"));
        assert_eq!(f(libc::AT_FDCWD, p, libc::R_OK | libc::W_OK, 0), 0);
        // Any other path is the C library's answer.
        let f: Xstat = std::mem::transmute(lib.sym("__xstat"));
        let mut st: libc::stat = std::mem::zeroed();
        // A character device that is not a uroce node keeps its own
        // numbers (1:3), not the faked 231:192.
        assert_eq!(f(1, c"/dev/null".as_ptr(), &mut st), 0);
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFCHR);
        assert_eq!(st.st_rdev, libc::makedev(1, 3));
        assert_eq!(f(1, c"/".as_ptr(), &mut st), 0);
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFDIR);
    }
}

/// A tree laid out as `uroce exec` writes it (`uroce_cli::sysfs_tree`):
/// the class's entry a link into the devices' directories.
fn tree() -> PathBuf {
    use std::os::unix::fs::symlink;
    let root = std::env::temp_dir().join(format!("uroce-preload-rp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dev = root.join("devices/virtual/uroce/u0");
    std::fs::create_dir_all(dev.join("infiniband/u0/ports/1")).unwrap();
    std::fs::create_dir_all(dev.join("net")).unwrap();
    std::fs::create_dir_all(root.join("class/infiniband")).unwrap();
    std::fs::write(dev.join("numa_node"), "-1\n").unwrap();
    symlink("/sys/class/net/lo", dev.join("net/lo")).unwrap();
    symlink("../../../u0", dev.join("infiniband/u0/device")).unwrap();
    symlink(
        "../../devices/virtual/uroce/u0/infiniband/u0",
        root.join("class/infiniband/u0"),
    )
    .unwrap();
    root
}

#[test]
fn realpath_follows_the_views_links_as_a_kernels() {
    type Realpath = unsafe extern "C" fn(*const c_char, *mut c_char) -> *mut c_char;
    type RealpathChk = unsafe extern "C" fn(*const c_char, *mut c_char, usize) -> *mut c_char;
    type Canon = unsafe extern "C" fn(*const c_char) -> *mut c_char;
    type Open = unsafe extern "C" fn(*const c_char, c_int, u32) -> c_int;
    // The library reads its view's root from UROCE_SYSFS: this test runs
    // itself again in a child process that has it in its environment from
    // the start (setting a variable in this process, whose other tests'
    // threads read the environment, would race with them).
    if std::env::var_os("UROCE_SYSFS").is_none() {
        let root = tree();
        let name = "realpath_follows_the_views_links_as_a_kernels";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads=1"])
            .env("UROCE_SYSFS", &root)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&root);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let lib = Lib::open();
    // SAFETY: the library's definitions, called with their C arguments.
    // SAFETY: the library's definitions of these C functions.
    let (rp, chk, canon, open) = unsafe {
        (
            std::mem::transmute::<*mut c_void, Realpath>(lib.sym("realpath")),
            std::mem::transmute::<*mut c_void, RealpathChk>(lib.sym("__realpath_chk")),
            std::mem::transmute::<*mut c_void, Canon>(lib.sym("canonicalize_file_name")),
            std::mem::transmute::<*mut c_void, Open>(lib.sym("open")),
        )
    };
    let real = |p: &CStr| -> Result<String, i32> {
        let mut buf = [0 as c_char; libc::PATH_MAX as usize];
        // SAFETY: a NUL-terminated path and a PATH_MAX buffer.
        let r = unsafe { rp(p.as_ptr(), buf.as_mut_ptr()) };
        if r.is_null() {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
        }
        // SAFETY: realpath wrote a string into buf.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    };
    let parent = "/sys/devices/virtual/uroce/u0";
    // Mooncake's walk from the class entry to the device's parent.
    assert_eq!(
        real(c"/sys/class/infiniband/u0/../..").as_deref(),
        Ok(parent)
    );
    assert_eq!(
        real(c"/sys/class/infiniband/u0/device").as_deref(),
        Ok(parent)
    );
    assert_eq!(
        real(c"/sys/class/infiniband/u0/").as_deref(),
        Ok("/sys/devices/virtual/uroce/u0/infiniband/u0")
    );
    assert_eq!(
        real(c"/sys/class/infiniband").as_deref(),
        Ok("/sys/class/infiniband")
    );
    // A link out of the view resolves on the real filesystem.
    if let Ok(lo) = std::fs::canonicalize("/sys/class/net/lo") {
        assert_eq!(
            real(c"/sys/class/infiniband/u0/device/net/lo"),
            Ok(lo.to_string_lossy().into_owned())
        );
    }
    assert_eq!(real(c"/sys/class/infiniband/u1"), Err(libc::ENOENT));
    assert_eq!(
        real(c"/sys/class/infiniband/u0/device/numa_node/x"),
        Err(libc::ENOTDIR)
    );
    // Other paths: the C library's realpath.
    assert_eq!(real(c"/usr/../").as_deref(), Ok("/"));
    // SAFETY: as above; canonicalize_file_name's result is malloc'd.
    unsafe {
        let c = canon(c"/sys/class/infiniband/u0/../..".as_ptr());
        assert!(!c.is_null());
        assert_eq!(CStr::from_ptr(c).to_bytes(), parent.as_bytes());
        libc::free(c.cast());
        let mut small = [0 as c_char; 8];
        let r = chk(
            c"/sys/class/infiniband/u0/..".as_ptr(),
            small.as_mut_ptr(),
            8,
        );
        assert!(r.is_null(), "too long for the buffer");
        let mut big = [0 as c_char; libc::PATH_MAX as usize];
        let r = chk(
            c"/sys/class/infiniband/u0/..".as_ptr(),
            big.as_mut_ptr(),
            big.len(),
        );
        assert_eq!(
            CStr::from_ptr(r).to_bytes(),
            b"/sys/devices/virtual/uroce/u0/infiniband"
        );
        // What the resolved path names is in the view too.
        let fd = open(
            c"/sys/devices/virtual/uroce/u0/numa_node".as_ptr(),
            libc::O_RDONLY,
            0,
        );
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        let mut b = [0u8; 8];
        let n = libc::read(fd, b.as_mut_ptr().cast(), b.len());
        libc::close(fd);
        assert_eq!(&b[..n as usize], b"-1\n");
    }
}
