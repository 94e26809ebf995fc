//! The layout test: C compiled against the installed `<infiniband/verbs.h>`
//! (and `<rdma/rdma_cma.h>`) prints the size of every structure in
//! [`crate::ffi`] (and [`crate::rdmacm::ffi`]) and the offset of every field
//! listed in `layout_table!` (`rdmacm_layout_table!`); each must equal
//! Rust's.
//!
//! Needs a C compiler, libibverbs-dev and librdmacm-dev. Without a header
//! its test says so and passes, unless `UROCE_REQUIRE_VERBS_H` is set (as
//! `.ci/run` does, after installing the packages).

use crate::ffi::*;
use crate::rdmacm::ffi::*;
use std::collections::HashMap;
use std::process::Command;

/// The C name of a field (`priv` is a Rust keyword).
fn c_field(f: &str) -> &str {
    f.strip_suffix('_').unwrap_or(f)
}

/// Generates `$rust()` (Rust's sizes and offsets) and `$csrc()` (C that
/// prints the same list from `$header`) for a table of structures.
macro_rules! tables {
    ($rust:ident, $csrc:ident, $header:literal; $($s:ident [$($f:ident)*])*) => {
        fn $rust() -> Vec<(String, usize)> {
            let mut v = Vec::new();
            $(
                v.push((format!("sizeof {}", stringify!($s)), std::mem::size_of::<$s>()));
                $( v.push((format!("{}.{}", stringify!($s), stringify!($f)),
                           std::mem::offset_of!($s, $f))); )*
            )*
            v
        }
        fn $csrc() -> String {
            let mut s = format!(
                "#include <stdio.h>\n#include <stddef.h>\n#include <{}>\nint main(void) {{\n",
                $header);
            $(
                let kind = if stringify!($s) == "ibv_gid" { "union" } else { "struct" };
                s += &format!("printf(\"sizeof {0} %zu\\n\", sizeof({1} {0}));\n", stringify!($s), kind);
                $( s += &format!("printf(\"{0}.{1} %zu\\n\", offsetof(struct {0}, {2}));\n",
                                 stringify!($s), stringify!($f), c_field(stringify!($f))); )*
            )*
            s + "return 0;\n}\n"
        }
    };
}
macro_rules! verbs_tables {
    ($($t:tt)*) => { tables! { rust_layout, c_source, "infiniband/verbs.h"; $($t)* } };
}
macro_rules! rdmacm_tables {
    ($($t:tt)*) => { tables! { rdmacm_rust_layout, rdmacm_c_source, "rdma/rdma_cma.h"; $($t)* } };
}
crate::layout_table!(verbs_tables);
crate::rdmacm_layout_table!(rdmacm_tables);

/// Compiles `src` against the installed `header` and compares what it
/// prints with `rust`. Without the header: skipped (said), unless
/// `UROCE_REQUIRE_VERBS_H` is set.
fn compare(header: &str, package: &str, src: String, rust: Vec<(String, usize)>, min: usize) {
    let header = std::path::Path::new(header);
    if !header.exists() {
        assert!(
            std::env::var_os("UROCE_REQUIRE_VERBS_H").is_none(),
            "UROCE_REQUIRE_VERBS_H is set but {} is missing (apt-get install {package})",
            header.display()
        );
        eprintln!(
            "skipped: {} missing (apt-get install {package})",
            header.display()
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!(
        "uroce-layout-{}-{}",
        std::process::id(),
        header.file_stem().and_then(|s| s.to_str()).unwrap_or("h")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let c_file = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&c_file, src).unwrap();
    let cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg(&c_file)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("a C compiler (cc)");
    assert!(
        cc.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let c: HashMap<String, usize> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect();
    let bad: Vec<String> = rust
        .iter()
        .filter(|(k, v)| c.get(k) != Some(v))
        .map(|(k, v)| format!("{k}: Rust {v}, C {:?}", c.get(k)))
        .collect();
    assert!(bad.is_empty(), "layout mismatches:\n{}", bad.join("\n"));
    assert!(rust.len() > min, "checked {} sizes and offsets", rust.len());
}

#[test]
fn layouts_match_installed_verbs_h() {
    compare(
        "/usr/include/infiniband/verbs.h",
        "libibverbs-dev",
        c_source(),
        rust_layout(),
        300,
    );
}

#[test]
fn layouts_match_installed_rdma_cma_h() {
    compare(
        "/usr/include/rdma/rdma_cma.h",
        "librdmacm-dev",
        rdmacm_c_source(),
        rdmacm_rust_layout(),
        100,
    );
}

#[test]
fn every_node_of_the_map_file_is_declared() {
    let map = include_str!("../libibverbs.map");
    let all = [
        crate::ah::EXPORTS,
        crate::compat::EXPORTS,
        crate::cq::EXPORTS,
        crate::device::EXPORTS,
        crate::enums::EXPORTS,
        crate::fork::EXPORTS,
        crate::pd_mr::EXPORTS,
        crate::qp::EXPORTS,
        crate::srq::EXPORTS,
        crate::sysfs_file::EXPORTS,
        crate::rdmacm::EXPORTS,
        crate::rdmacm::qp::EXPORTS,
        crate::rdmacm::rsocket::EXPORTS,
        crate::rdmacm::addrinfo::EXPORTS,
        crate::rdmacm::devices::EXPORTS,
        crate::rdmacm::ece::EXPORTS,
        crate::rdmacm::endpoint::EXPORTS,
        crate::rdmacm::multicast::EXPORTS,
    ];
    for (node, sym) in all.concat() {
        assert!(
            map.contains(&format!("{node} {{")),
            "{sym}: node {node} not in libibverbs.map"
        );
    }
}

/// Every symbol Debian's librdmacm 44 exports (`objdump -T
/// librdmacm.so.1`), at its version node: programs linked against it load
/// only if each is there.
#[test]
fn every_librdmacm_symbol_is_exported_at_its_node() {
    const RDMACM_1_0: &str = "rdma_create_event_channel rdma_destroy_event_channel \
        rdma_create_id rdma_destroy_id rdma_bind_addr rdma_resolve_addr rdma_resolve_route \
        rdma_create_qp rdma_destroy_qp rdma_connect rdma_listen rdma_accept rdma_reject \
        rdma_notify rdma_disconnect rdma_get_cm_event rdma_ack_cm_event rdma_get_src_port \
        rdma_get_dst_port rdma_join_multicast rdma_leave_multicast rdma_get_devices \
        rdma_free_devices rdma_event_str rdma_set_option rdma_migrate_id rdma_getaddrinfo \
        rdma_freeaddrinfo rdma_get_request rdma_create_ep rdma_destroy_ep rdma_create_srq \
        rdma_destroy_srq rsocket rbind rlisten raccept rconnect rshutdown rclose rrecv \
        rrecvfrom rrecvmsg rsend rsendto rsendmsg rread rreadv rwrite rwritev rpoll rselect \
        rgetpeername rgetsockname rsetsockopt rgetsockopt rfcntl riomap riounmap riowrite \
        rdma_create_srq_ex rdma_create_qp_ex";
    let expected: Vec<(&str, &str)> = RDMACM_1_0
        .split_whitespace()
        .map(|s| ("RDMACM_1.0", s))
        .chain([
            ("RDMACM_1.1", "rdma_join_multicast_ex"),
            ("RDMACM_1.2", "rdma_establish"),
            ("RDMACM_1.2", "rdma_init_qp_attr"),
            ("RDMACM_1.3", "rdma_get_remote_ece"),
            ("RDMACM_1.3", "rdma_reject_ece"),
            ("RDMACM_1.3", "rdma_set_local_ece"),
        ])
        .collect();
    assert_eq!(expected.len(), 68);
    let all = [
        crate::rdmacm::EXPORTS,
        crate::rdmacm::qp::EXPORTS,
        crate::rdmacm::rsocket::EXPORTS,
        crate::rdmacm::addrinfo::EXPORTS,
        crate::rdmacm::devices::EXPORTS,
        crate::rdmacm::ece::EXPORTS,
        crate::rdmacm::endpoint::EXPORTS,
        crate::rdmacm::multicast::EXPORTS,
    ]
    .concat();
    for (node, sym) in &expected {
        assert!(all.contains(&(node, sym)), "{sym}@@{node} is not exported");
    }
    assert_eq!(all.len(), expected.len(), "exports beyond librdmacm's");
}
