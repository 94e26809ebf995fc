//! The layout test: C compiled against the installed `<infiniband/verbs.h>`
//! prints the size of every structure in [`crate::ffi`] and the offset of
//! every field listed in `layout_table!`; each must equal Rust's.
//!
//! Needs a C compiler and libibverbs-dev. Without the header the test says
//! so and passes, unless `UROCE_REQUIRE_VERBS_H` is set (as `.ci/run`
//! does, after installing the package).

use crate::ffi::*;
use std::collections::HashMap;
use std::process::Command;

/// The C name of a field (`priv` is a Rust keyword).
fn c_field(f: &str) -> &str {
    f.strip_suffix('_').unwrap_or(f)
}

macro_rules! tables {
    ($($s:ident [$($f:ident)*])*) => {
        fn rust_layout() -> Vec<(String, usize)> {
            let mut v = Vec::new();
            $(
                v.push((format!("sizeof {}", stringify!($s)), std::mem::size_of::<$s>()));
                $( v.push((format!("{}.{}", stringify!($s), stringify!($f)),
                           std::mem::offset_of!($s, $f))); )*
            )*
            v
        }
        fn c_source() -> String {
            let mut s = String::from(
                "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n");
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
crate::layout_table!(tables);

#[test]
fn layouts_match_installed_verbs_h() {
    let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
    if !header.exists() {
        assert!(
            std::env::var_os("UROCE_REQUIRE_VERBS_H").is_none(),
            "UROCE_REQUIRE_VERBS_H is set but {} is missing (apt-get install libibverbs-dev)",
            header.display()
        );
        eprintln!(
            "skipped: {} missing (apt-get install libibverbs-dev)",
            header.display()
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("uroce-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c_source()).unwrap();
    let cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg(&src)
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
    let rust = rust_layout();
    let bad: Vec<String> = rust
        .iter()
        .filter(|(k, v)| c.get(k) != Some(v))
        .map(|(k, v)| format!("{k}: Rust {v}, C {:?}", c.get(k)))
        .collect();
    assert!(bad.is_empty(), "layout mismatches:\n{}", bad.join("\n"));
    assert!(rust.len() > 300, "checked {} sizes and offsets", rust.len());
}

#[test]
fn every_node_of_the_map_file_is_declared() {
    let map = include_str!("../libibverbs.map");
    let all = [
        crate::compat::EXPORTS,
        crate::device::EXPORTS,
        crate::misc::EXPORTS,
        crate::objects::EXPORTS,
        crate::post::EXPORTS,
    ];
    for (node, sym) in all.concat() {
        assert!(
            map.contains(&format!("{node} {{")),
            "{sym}: node {node} not in libibverbs.map"
        );
    }
}
