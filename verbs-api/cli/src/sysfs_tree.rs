//! The tree of sysfs files `uroce exec` writes for uroce's devices, which
//! `liburoce_preload.so` (its `sysfs_view`) answers programs with.
//!
//! Programs that look for RDMA devices read the kernel's sysfs:
//! `/sys/class/infiniband/<dev>/ports/1/gid_attrs/types/<n>` (a GID's RoCE
//! version: UCX calls a GID without it RoCE v1), `.../gid_attrs/ndevs/<n>`,
//! `.../ports/1/state`, `.../gids/<n>`, `<dev>/device/net/<ifname>` (the
//! pyverbs tests), `node_guid`, `/sys/class/infiniband_verbs/uverbs*/ibdev`,
//! and list those directories. uroce's devices live in userspace and have
//! no sysfs entries, so `uroce exec` writes the same files, from the
//! devices' own state ([`uroce_verbs::Device::query_port`],
//! [`uroce_verbs::Device::query_gid`], the interface that holds the
//! address), as a read-only tree in a private directory, and
//! `liburoce_preload.so` opens, lists and stats that tree in place of
//! `/sys/class/infiniband` and `/sys/class/infiniband_verbs` (it is told
//! where by [`ENV`]). A real directory makes `readdir` and every way of
//! opening a file work as on sysfs; nothing under `/sys` is touched.
//!
//! The tree's name is a hash of its contents, under a directory of the
//! user's own ([`base_dir`]): runs with the same devices share one tree,
//! made once (atomically, by rename) and left for the next run, as
//! nothing outlives `exec` to remove it.
//!
//! As on a kernel, `class/infiniband/<dev>` is a link to the device's
//! directory under `/sys/devices` (here [`DEVICES`]`/<dev>/infiniband/<dev>`),
//! whose `device` links to its parent (`DEVICES/<dev>`, holding
//! `numa_node` and `net/<ifname>`): `realpath` of
//! `/sys/class/infiniband/<dev>/../..` is that parent, as Mooncake reads
//! it for a NIC's PCI device.
//!
//! What differs from the kernel's files: an empty GID entry has no
//! `gid_attrs/types/<n>` or `ndevs/<n>` file (the kernel's fail to read
//! with EINVAL); there are no `counters`/`hw_counters` (a snapshot would
//! not change); `infiniband_verbs/uverbs-<dev>` is a directory, not a link
//! into `/sys/devices`. Entries the kernel has in those two classes (kernel
//! RDMA devices) appear as links to their real directories.

use std::path::{Path, PathBuf};
use uroce_verbs::Device;

/// The variable that tells `liburoce_preload.so` where the tree is (the
/// directory that holds `class/infiniband`).
pub const ENV: &str = "UROCE_SYSFS";

/// The kernel's classes the tree stands in for, relative to `/sys`.
pub const CLASSES: [&str; 2] = ["class/infiniband", "class/infiniband_verbs"];

/// An entry of the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A directory.
    Dir,
    /// A file with this content.
    File(String),
    /// A symbolic link to this path.
    Link(PathBuf),
}

/// Where the devices' own directories are, relative to `/sys` (the
/// kernel has no `uroce` there; `liburoce_preload.so` answers for it).
pub const DEVICES: &str = "devices/virtual/uroce";

/// A device's `numa_node`: what the kernel reports for a device close to
/// no NUMA node (`NUMA_NO_NODE`), as for its virtual devices and for
/// every device of a machine that is not NUMA: uroce's devices have no
/// memory or CPU of their own.
const NUMA_NODE: &str = "-1";

/// The uverbs ABI version the kernel's `infiniband_verbs/abi_version`
/// reports (Linux 6.x).
const UVERBS_ABI: u32 = 6;

/// A GUID as sysfs prints it: four groups of four hex digits.
fn guid_str(g: u64) -> String {
    let b = g.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

/// A GID as sysfs prints it (`%pI6`: eight groups, none left out).
fn gid_str(gid: &[u8; 16]) -> String {
    gid.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// `ports/<n>/state` for an `ibv_port_state`, as the kernel words it.
fn port_state_str(state: u32) -> String {
    let name = match state {
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "NOP",
    };
    format!("{state}: {name}")
}

/// The entries for `devs`, paths relative to the tree's root (the
/// stand-in for `/sys`), each directory before what it holds.
pub fn entries(devs: &[Device]) -> Vec<(PathBuf, Node)> {
    let mut out: Vec<(PathBuf, Node)> = Vec::new();
    let mut dir = |p: &Path| out.push((p.to_path_buf(), Node::Dir));
    dir(Path::new("class"));
    for c in CLASSES {
        dir(Path::new(c));
    }
    let file = |out: &mut Vec<(PathBuf, Node)>, p: PathBuf, s: String| {
        out.push((p, Node::File(s + "\n")));
    };
    file(
        &mut out,
        PathBuf::from("class/infiniband_verbs/abi_version"),
        UVERBS_ABI.to_string(),
    );
    if !devs.is_empty() {
        for p in ["devices", "devices/virtual", DEVICES] {
            out.push((PathBuf::from(p), Node::Dir));
        }
    }
    for d in devs {
        // The device's parent (`<dev>/device`, whose `numa_node` programs
        // read), the device in it, and the class's link to the device, as
        // the kernel lays out a PCI NIC's.
        let parent = Path::new(DEVICES).join(d.name());
        out.push((parent.clone(), Node::Dir));
        file(&mut out, parent.join("numa_node"), NUMA_NODE.into());
        if let Some(ndev) = d.netdev() {
            out.push((parent.join("net"), Node::Dir));
            out.push((
                parent.join("net").join(&ndev),
                Node::Link(Path::new("/sys/class/net").join(&ndev)),
            ));
        }
        out.push((parent.join("infiniband"), Node::Dir));
        let ib = parent.join("infiniband").join(d.name());
        out.push((ib.clone(), Node::Dir));
        out.push((
            Path::new("class/infiniband").join(d.name()),
            Node::Link(Path::new("../..").join(&ib)),
        ));
        file(&mut out, ib.join("node_type"), "1: CA".into());
        file(&mut out, ib.join("node_guid"), guid_str(d.guid()));
        file(&mut out, ib.join("sys_image_guid"), guid_str(d.guid()));
        file(&mut out, ib.join("node_desc"), "uroce".into());
        file(&mut out, ib.join("fw_ver"), uroce_verbs::FW_VER.into());
        out.push((
            ib.join("device"),
            Node::Link(Path::new("../../..").join(d.name())),
        ));
        out.push((ib.join("ports"), Node::Dir));
        let port = ib.join("ports/1");
        out.push((port.clone(), Node::Dir));
        let Ok(attr) = d.query_port(1) else { continue };
        file(&mut out, port.join("state"), port_state_str(attr.state));
        let phys = if attr.state == 4 {
            "5: LinkUp"
        } else {
            "3: Disabled"
        };
        file(&mut out, port.join("phys_state"), phys.into());
        let ll = if attr.link_layer == 2 {
            "Ethernet"
        } else {
            "InfiniBand"
        };
        file(&mut out, port.join("link_layer"), ll.into());
        file(&mut out, port.join("lid"), format!("0x{:x}", attr.lid));
        file(&mut out, port.join("sm_lid"), "0x0".into());
        file(&mut out, port.join("sm_sl"), "0".into());
        file(&mut out, port.join("lid_mask_count"), "0".into());
        out.push((port.join("pkeys"), Node::Dir));
        for i in 0..attr.pkey_tbl_len {
            file(&mut out, port.join(format!("pkeys/{i}")), "0xffff".into());
        }
        for sub in ["gids", "gid_attrs", "gid_attrs/types", "gid_attrs/ndevs"] {
            out.push((port.join(sub), Node::Dir));
        }
        for i in 0..attr.gid_tbl_len {
            match d.query_gid(1, i) {
                Ok(g) => {
                    file(&mut out, port.join(format!("gids/{i}")), gid_str(&g.gid));
                    let types = port.join(format!("gid_attrs/types/{i}"));
                    file(&mut out, types, g.gid_type.into());
                    if let Some(ndev) = d.netdev() {
                        file(&mut out, port.join(format!("gid_attrs/ndevs/{i}")), ndev);
                    }
                }
                Err(_) => file(&mut out, port.join(format!("gids/{i}")), gid_str(&[0; 16])),
            }
        }
        let uv = Path::new("class/infiniband_verbs").join(format!("uverbs-{}", d.name()));
        out.push((uv.clone(), Node::Dir));
        file(&mut out, uv.join("ibdev"), d.name().into());
        file(&mut out, uv.join("abi_version"), "1".into());
        file(&mut out, uv.join("dev"), "231:192".into());
    }
    out
}

/// Links to what the kernel has in `sys` (normally `/sys`) under the two
/// classes, for names the tree does not have already.
pub fn kernel_entries(sys: &Path, have: &[(PathBuf, Node)]) -> Vec<(PathBuf, Node)> {
    let mut out = Vec::new();
    for c in CLASSES {
        let Ok(rd) = std::fs::read_dir(sys.join(c)) else {
            continue;
        };
        let mut names: Vec<_> = rd.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for name in names {
            let rel = Path::new(c).join(&name);
            if have.iter().any(|(p, _)| *p == rel) {
                continue;
            }
            let real = sys.join(c).join(&name);
            let target = std::fs::canonicalize(&real).unwrap_or(real);
            out.push((rel, Node::Link(target)));
        }
    }
    out
}

/// 64-bit FNV-1a of the entries: the tree's name.
fn digest(entries: &[(PathBuf, Node)]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: &[u8]| {
        for &x in b.iter().chain([0xffu8].iter()) {
            h ^= u64::from(x);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (p, n) in entries {
        eat(p.as_os_str().as_encoded_bytes());
        match n {
            Node::Dir => eat(b"d"),
            Node::File(s) => {
                eat(b"f");
                eat(s.as_bytes());
            }
            Node::Link(t) => {
                eat(b"l");
                eat(t.as_os_str().as_encoded_bytes());
            }
        }
    }
    h
}

/// The directory the trees go in: `$XDG_RUNTIME_DIR/uroce`, else
/// `<temp dir>/uroce-<uid>`; made mode 0700 if missing, and refused unless
/// it is a directory of this user's that no one else may write.
pub fn base_dir() -> Result<PathBuf, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let base = match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(run) => PathBuf::from(run).join("uroce"),
        None => std::env::temp_dir().join(format!("uroce-{uid}")),
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&base) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("{}: {e}", base.display())),
    }
    let m = std::fs::symlink_metadata(&base).map_err(|e| format!("{}: {e}", base.display()))?;
    if !m.is_dir() || m.uid() != uid || m.permissions().mode() & 0o022 != 0 {
        return Err(format!(
            "{}: not a directory of this user's that only it may write",
            base.display()
        ));
    }
    Ok(base)
}

/// Writes `entries` as a read-only tree under `base` (or finds the same
/// tree there from an earlier run) and returns its root.
pub fn materialize(base: &Path, entries: &[(PathBuf, Node)]) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let root = base.join(format!("sysfs-{:016x}", digest(entries)));
    if std::fs::symlink_metadata(&root).is_ok_and(|m| m.is_dir()) {
        return Ok(root);
    }
    let tmp = base.join(format!(
        "sysfs-{:016x}.{}.tmp",
        digest(entries),
        std::process::id()
    ));
    let err = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    let _ = make_writable_and_remove(&tmp);
    std::fs::create_dir(&tmp).map_err(|e| err(&tmp, e))?;
    let write = || -> Result<(), String> {
        for (rel, node) in entries {
            let p = tmp.join(rel);
            match node {
                Node::Dir => std::fs::create_dir(&p).map_err(|e| err(&p, e))?,
                Node::File(s) => {
                    std::fs::write(&p, s).map_err(|e| err(&p, e))?;
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444))
                        .map_err(|e| err(&p, e))?;
                }
                Node::Link(t) => std::os::unix::fs::symlink(t, &p).map_err(|e| err(&p, e))?,
            }
        }
        // Directories read-only too, the deepest first.
        for (rel, node) in entries.iter().rev() {
            if *node == Node::Dir {
                let p = tmp.join(rel);
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o555))
                    .map_err(|e| err(&p, e))?;
            }
        }
        Ok(())
    };
    if let Err(e) = write() {
        let _ = make_writable_and_remove(&tmp);
        return Err(e);
    }
    match std::fs::rename(&tmp, &root) {
        Ok(()) => Ok(root),
        // Another run made the same tree first: use that one.
        Err(_) if std::fs::symlink_metadata(&root).is_ok_and(|m| m.is_dir()) => {
            let _ = make_writable_and_remove(&tmp);
            Ok(root)
        }
        Err(e) => {
            let _ = make_writable_and_remove(&tmp);
            Err(err(&root, e))
        }
    }
}

/// Removes a tree [`materialize`] made (its directories are read-only).
pub fn make_writable_and_remove(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fn walk(p: &Path) {
        let Ok(m) = std::fs::symlink_metadata(p) else {
            return;
        };
        if m.is_dir() {
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    walk(&e.path());
                }
            }
        }
    }
    walk(dir);
    std::fs::remove_dir_all(dir)
}

/// The tree for the configured devices (and the kernel's own entries),
/// made or found under [`base_dir`]: the value of [`ENV`].
pub fn prepare() -> Result<PathBuf, String> {
    let devs = uroce_verbs::devices().map_err(|e| e.to_string())?;
    let mut all = entries(&devs);
    all.extend(kernel_entries(Path::new("/sys"), &all));
    materialize(&base_dir()?, &all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(name: &str, ip: &str) -> Device {
        Device::new(name, ip.parse().unwrap())
    }

    fn read(root: &Path, rel: &str) -> String {
        std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    #[test]
    fn formats_as_the_kernel_does() {
        assert_eq!(guid_str(0x0275_72ff_fe69_0101), "0275:72ff:fe69:0101");
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[127, 105, 1, 1]);
        assert_eq!(gid_str(&g), "0000:0000:0000:0000:0000:ffff:7f69:0101");
        assert_eq!(port_state_str(4), "4: ACTIVE");
    }

    #[test]
    fn the_tree_holds_what_programs_read() {
        let base = std::env::temp_dir().join(format!("uroce-sysfs-test-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        let devs = [dev("t0", "127.105.7.1"), dev("t1", "127.105.7.2")];
        let e = entries(&devs);
        let root = materialize(&base, &e).unwrap();
        let p = "class/infiniband/t0/ports/1";
        assert_eq!(read(&root, &format!("{p}/state")), "4: ACTIVE\n");
        assert_eq!(read(&root, &format!("{p}/link_layer")), "Ethernet\n");
        assert_eq!(read(&root, &format!("{p}/gid_attrs/types/1")), "RoCE v2\n");
        assert_eq!(read(&root, &format!("{p}/gid_attrs/ndevs/1")), "lo\n");
        assert_eq!(
            read(&root, &format!("{p}/gids/1")),
            "0000:0000:0000:0000:0000:ffff:7f69:0701\n"
        );
        assert_eq!(
            read(&root, &format!("{p}/gids/2")),
            "0000:0000:0000:0000:0000:0000:0000:0000\n",
            "an empty entry"
        );
        assert!(!root.join(format!("{p}/gid_attrs/types/2")).exists());
        assert_eq!(
            read(&root, "class/infiniband/t1/node_guid"),
            format!("{}\n", guid_str(devs[1].guid()))
        );
        assert_eq!(
            read(&root, "class/infiniband_verbs/uverbs-t1/ibdev"),
            "t1\n"
        );
        // Listings, as readdir gives them.
        let ls = |rel: &str| {
            let mut v: Vec<String> = std::fs::read_dir(root.join(rel))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(ls("class/infiniband"), ["t0", "t1"]);
        assert_eq!(ls("class/infiniband/t0/device/net"), ["lo"]);
        assert_eq!(
            std::fs::read_link(root.join("class/infiniband/t0/device/net/lo")).unwrap(),
            Path::new("/sys/class/net/lo")
        );
        // The class links into the devices' directories, and a device's
        // `device` to its parent, as on a kernel.
        assert_eq!(
            std::fs::read_link(root.join("class/infiniband/t0")).unwrap(),
            Path::new("../../devices/virtual/uroce/t0/infiniband/t0")
        );
        assert_eq!(
            std::fs::canonicalize(root.join("class/infiniband/t0/../..")).unwrap(),
            std::fs::canonicalize(root.join("devices/virtual/uroce/t0")).unwrap()
        );
        assert_eq!(read(&root, "class/infiniband/t1/device/numa_node"), "-1\n");
        assert_eq!(
            ls("class/infiniband_verbs"),
            ["abi_version", "uverbs-t0", "uverbs-t1"]
        );
        // Read-only (root may write anyway), and found again (not
        // rewritten) by the next run.
        // SAFETY: geteuid has no preconditions.
        let root_user = unsafe { libc::geteuid() } == 0;
        let state = root.join(format!("{p}/state"));
        assert!(root_user || std::fs::write(&state, "1: DOWN").is_err());
        let new = root.join("class/infiniband/new");
        assert!(root_user || std::fs::File::create(new).is_err());
        assert_eq!(materialize(&base, &e).unwrap(), root);
        // Other devices: another tree beside it.
        let other = materialize(&base, &entries(&devs[..1])).unwrap();
        assert_ne!(other, root);
        assert!(!other.join("class/infiniband/t1").exists());
        make_writable_and_remove(&base).unwrap();
    }

    #[test]
    fn the_base_directory_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let run = std::env::temp_dir().join(format!("uroce-sysfs-run-{}", std::process::id()));
        std::fs::create_dir_all(&run).unwrap();
        // Only this test reads XDG_RUNTIME_DIR in this binary.
        std::env::set_var("XDG_RUNTIME_DIR", &run);
        let base = base_dir().unwrap();
        assert_eq!(base, run.join("uroce"));
        let mode = std::fs::metadata(&base).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // One others may write into is refused (a tree there could be
        // anyone's).
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(base_dir().is_err());
        std::fs::remove_dir(&base).unwrap();
        std::os::unix::fs::symlink("/tmp", &base).unwrap();
        assert!(base_dir().is_err(), "a link is refused");
        std::env::remove_var("XDG_RUNTIME_DIR");
        std::fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn kernel_devices_are_linked_not_copied() {
        let base = std::env::temp_dir().join(format!("uroce-sysfs-kern-{}", std::process::id()));
        let sys = base.join("sys");
        std::fs::create_dir_all(sys.join("devices/virtual/infiniband/rxe0")).unwrap();
        std::fs::create_dir_all(sys.join("class/infiniband")).unwrap();
        std::os::unix::fs::symlink(
            "../../devices/virtual/infiniband/rxe0",
            sys.join("class/infiniband/rxe0"),
        )
        .unwrap();
        let e = entries(&[dev("t0", "127.105.7.1")]);
        let k = kernel_entries(&sys, &e);
        assert_eq!(
            k,
            [(
                PathBuf::from("class/infiniband/rxe0"),
                Node::Link(
                    std::fs::canonicalize(sys.join("devices/virtual/infiniband/rxe0")).unwrap()
                )
            )]
        );
        std::fs::remove_dir_all(&base).unwrap();
    }
}
