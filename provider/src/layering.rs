//! The provider's modules form layers: no import circle between its
//! top-level modules.
//!
//! An edge A -> B is a `crate::B` path (or a `crate::{B, ...}` group) in
//! any file of module A outside its test code (`#[cfg(test)] mod x;`
//! files and `#[cfg(test)] mod tests { ... }` blocks, which sit at the
//! ends of files); comments do not count. The test fails with the
//! circle and the file that makes each of its edges.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeMap<String, PathBuf>>;

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src is readable").flatten() {
        let p = e.path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The files that `#[cfg(test)] mod name;` lines declare.
fn test_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let base = if matches!(stem, "mod" | "lib") {
            f.parent().unwrap().to_path_buf()
        } else {
            f.with_extension("")
        };
        let mut rest = text.as_str();
        while let Some(i) = rest.find("#[cfg(test)]") {
            rest = &rest[i + "#[cfg(test)]".len()..];
            let decl = rest.trim_start();
            let decl = decl.strip_prefix("pub ").unwrap_or(decl);
            if let Some(d) = decl.strip_prefix("mod ") {
                let name: String = d
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if d[name.len()..].trim_start().starts_with(';') {
                    out.insert(base.join(format!("{name}.rs")));
                    out.insert(base.join(&name).join("mod.rs"));
                }
            }
        }
    }
    out
}

/// The shipped code of a file: no comments, nothing from the first
/// `#[cfg(test)] mod x {` on.
fn shipped(text: &str) -> String {
    let mut s: String = text
        .lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n");
    let mut at = 0;
    while let Some(i) = s[at..].find("#[cfg(test)]") {
        let start = at + i;
        let after = s[start + "#[cfg(test)]".len()..].trim_start();
        if let Some(d) = after.strip_prefix("mod ") {
            let name_len = d
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .count();
            if d[name_len..].trim_start().starts_with('{') {
                s.truncate(start);
                break;
            }
        }
        at = start + 1;
    }
    s
}

fn ident_at(s: &str) -> &str {
    let n = s
        .char_indices()
        .find(|(_, c)| !(c.is_alphanumeric() || *c == '_'))
        .map_or(s.len(), |(i, _)| i);
    &s[..n]
}

/// The modules a text names as `crate::x` or inside `crate::{...}`.
fn named(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let id = ident_at(part.trim());
                if !id.is_empty() {
                    out.insert(id.to_string());
                }
            }
        } else {
            out.insert(ident_at(rest).to_string());
        }
    }
    out
}

fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rs_files(src, &mut files);
    let tests = test_files(&files);
    let module_of = |f: &Path| -> Option<String> {
        let rel = f.strip_prefix(src).ok()?;
        let first = rel.components().next()?.as_os_str().to_str()?;
        let m = first.strip_suffix(".rs").unwrap_or(first);
        (m != "lib").then(|| m.to_string())
    };
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(f)).collect();
    let mut g: Graph = modules
        .iter()
        .map(|m| (m.clone(), BTreeMap::new()))
        .collect();
    for f in files.iter().filter(|f| !tests.contains(*f)) {
        let Some(m) = module_of(f) else { continue };
        let text = shipped(&std::fs::read_to_string(f).unwrap_or_default());
        for t in named(&text) {
            if t != m && modules.contains(&t) {
                g.get_mut(&m).unwrap().entry(t).or_insert_with(|| f.clone());
            }
        }
    }
    g
}

/// A circle of the graph, if it has one (the modules in order).
fn circle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        g: &Graph,
        m: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            return Some(path[i..].to_vec());
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for t in g.get(m).into_iter().flat_map(|e| e.keys()) {
            if let Some(c) = visit(g, t, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for m in g.keys() {
        if let Some(c) = visit(g, m, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_import_circle_between_top_level_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    assert!(
        g.len() > 10,
        "modules found: {:?}",
        g.keys().collect::<Vec<_>>()
    );
    if let Some(c) = circle(&g) {
        let mut why = String::new();
        for (i, a) in c.iter().enumerate() {
            let b = &c[(i + 1) % c.len()];
            why += &format!("\n  {a} -> {b} ({})", g[a][b].display());
        }
        panic!("import circle: {}{why}", c.join(" -> "));
    }
}

#[test]
fn the_graph_sees_paths_groups_and_skips_tests_and_comments() {
    let text = "use crate::a::X;\nuse crate::{b, c::Y};\n// crate::d\nfn f() { crate::e::g(); }\n\
                #[cfg(test)]\nmod tests { use crate::h; }\n";
    let got: Vec<String> = named(&shipped(text)).into_iter().collect();
    assert_eq!(got, ["a", "b", "c", "e"]);
    let mut g = Graph::new();
    for (a, b) in [("x", "y"), ("y", "z"), ("z", "x"), ("w", "x")] {
        g.entry(a.into())
            .or_default()
            .insert(b.into(), PathBuf::from("f.rs"));
        g.entry(b.into()).or_default();
    }
    let c = circle(&g).expect("a circle");
    assert_eq!(c.len(), 3, "{c:?}");
    g.get_mut("z").unwrap().clear();
    assert_eq!(circle(&g), None);
}

/// The crate root's `pub mod`s, each with the `#[cfg(...)]` line above
/// it (empty when it has none).
fn public_modules(lib: &str) -> BTreeMap<String, String> {
    let lines: Vec<&str> = lib.lines().map(str::trim).collect();
    let mut out = BTreeMap::new();
    for (i, l) in lines.iter().enumerate() {
        if let Some(rest) = l.strip_prefix("pub mod ") {
            let name = ident_at(rest).to_string();
            let above = i.checked_sub(1).map_or("", |j| lines[j]);
            let cfg = if above.starts_with("#[cfg(") {
                above
            } else {
                ""
            };
            out.insert(name, cfg.to_string());
        }
    }
    out
}

/// The face and the value types are the provider's public modules; test
/// machinery is public only with its feature. A new `pub mod` must be
/// added here, on purpose.
#[test]
fn only_the_face_and_the_value_types_are_public() {
    const SHIPPED: [&str; 7] = [
        "counters", "device", "diag", "env", "observe", "qp_attr", "types",
    ];
    const TESTING: &str = r#"#[cfg(any(test, feature = "testing"))]"#;
    const GATED: [(&str, &str); 3] = [
        ("planted", r#"#[cfg(feature = "planted")]"#),
        ("sans_io", TESTING),
        ("testing", TESTING),
    ];
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("lib.rs is readable");
    let mut want: BTreeMap<String, String> = SHIPPED
        .iter()
        .map(|m| (m.to_string(), String::new()))
        .collect();
    want.extend(GATED.iter().map(|(m, c)| (m.to_string(), c.to_string())));
    assert_eq!(public_modules(&lib), want);
    // No re-export of a private module's insides at the root either.
    let reexports: Vec<&str> = lib.lines().filter(|l| l.starts_with("pub use ")).collect();
    assert_eq!(
        reexports,
        [
            "pub use diag::{check, explain, stat, trace};",
            "pub use uroce_wire as wire;"
        ]
    );
}

#[test]
fn public_modules_are_read_with_their_gate() {
    let lib = "mod a;\npub mod b;\n#[cfg(feature = \"x\")]\npub mod c;\n// pub mod d;\n";
    let got = public_modules(lib);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got["b"], "");
    assert_eq!(got["c"], "#[cfg(feature = \"x\")]");
}
