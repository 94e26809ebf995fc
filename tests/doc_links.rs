//! The documentation's links: every relative link in `README.md`,
//! `fuzz/README.md` and the book (`docs/src/**/*.md`) names a file that
//! exists, every `#anchor` a heading of its target, every page of the book
//! is reached from `docs/src/SUMMARY.md`, and every other file under
//! `docs/src` (images) is linked from a page. mdBook itself checks none of
//! this; `.ci/run` builds the book, and this test keeps its links whole.
//!
//! Anchors follow mdBook's rule (`mdbook-html`'s `id_from_content` and
//! `unique_id`, 0.5): the heading's text, trimmed and lowercased, keeping
//! alphanumerics, `_` and `-`, whitespace becoming `-`, everything else
//! dropped; a repeated id gets `-1`, `-2`, ... in page order. GitHub's web
//! view makes the same ids for the headings these files use.
//!
//! External links (`http:`, `https:`, `mailto:`) are not fetched.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The repository root (this crate is `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// mdBook's `id_from_content`.
fn slug(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c)
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// mdBook's `unique_id`: the first use of an id keeps it, later ones get
/// the first free `-N`.
fn unique(id: String, used: &mut HashSet<String>) -> String {
    if used.insert(id.clone()) {
        return id;
    }
    (1..)
        .map(|n| format!("{id}-{n}"))
        .find(|c| used.insert(c.clone()))
        .expect("some suffix is free")
}

/// A heading's text as rendered: code spans keep their text, links their
/// link text (`[text](url)` is `text`), emphasis markers go.
fn rendered(markdown: &str) -> String {
    let chars: Vec<char> = markdown.chars().collect();
    let mut out = String::new();
    let mut in_code = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        if c == '`' {
            in_code = !in_code;
        } else if in_code {
            out.push(c);
        } else if c == ']' && chars.get(i) == Some(&'(') {
            // Skip the link's destination.
            while i < chars.len() && chars[i] != ')' {
                i += 1;
            }
            i += 1;
        } else {
            let image = c == '!' && chars.get(i) == Some(&'[');
            if !(image || matches!(c, '[' | ']' | '*')) {
                out.push(c);
            }
        }
    }
    out
}

/// One Markdown file: its lines outside fenced code blocks.
struct Page {
    /// (1-based line number, text) of every line outside code fences.
    lines: Vec<(usize, String)>,
}

impl Page {
    fn read(path: &Path) -> Page {
        let text = fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let mut lines = Vec::new();
        let mut fence: Option<&str> = None;
        for (i, line) in text.lines().enumerate() {
            let t = line.trim_start();
            let marker = if t.starts_with("```") {
                Some("```")
            } else if t.starts_with("~~~") {
                Some("~~~")
            } else {
                None
            };
            match (fence, marker) {
                (None, Some(m)) => fence = Some(m),
                (Some(f), Some(m)) if f == m => fence = None,
                (None, None) => lines.push((i + 1, line.to_string())),
                _ => {}
            }
        }
        Page { lines }
    }

    /// The anchors mdBook gives this page's headings (ATX and setext).
    fn anchors(&self) -> HashSet<String> {
        let mut used = HashSet::new();
        let mut prev: Option<&str> = None;
        for (_, line) in &self.lines {
            let t = line.trim();
            let hashes = t.chars().take_while(|&c| c == '#').count();
            let atx = (1..=6).contains(&hashes)
                && t[hashes..].starts_with(|c: char| c.is_whitespace())
                && line.len() - line.trim_start().len() < 4;
            if atx {
                let text = t[hashes..].trim().trim_end_matches('#').trim_end();
                unique(slug(&rendered(text)), &mut used);
                prev = None;
                continue;
            }
            let underline =
                !t.is_empty() && (t.chars().all(|c| c == '=') || t.chars().all(|c| c == '-'));
            if underline {
                if let Some(p) = prev {
                    unique(slug(&rendered(p.trim())), &mut used);
                    prev = None;
                    continue;
                }
            }
            let paragraph = !t.is_empty()
                && !t.starts_with('|')
                && !t.starts_with('>')
                && !t.starts_with("- ")
                && !t.starts_with("* ")
                && !t.starts_with(|c: char| c.is_ascii_digit());
            prev = paragraph.then_some(line.as_str());
        }
        used
    }

    /// Every link target on the page: (line, target), inline links and
    /// images `[text](target)` outside code spans, and reference
    /// definitions `[label]: target`.
    fn links(&self) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for (n, line) in &self.lines {
            let prose = without_code_spans(line);
            let t = prose.trim_start();
            if let Some(rest) = t.strip_prefix('[') {
                if let Some(close) = rest.find("]:") {
                    let target = rest[close + 2..].split_whitespace().next();
                    if let Some(target) = target {
                        out.push((*n, target.trim_matches(['<', '>']).to_string()));
                        continue;
                    }
                }
            }
            let mut rest = prose.as_str();
            while let Some(at) = rest.find("](") {
                let after = &rest[at + 2..];
                let Some(end) = after.find(')') else { break };
                let inner = after[..end].trim();
                let target = inner.split_whitespace().next().unwrap_or("");
                out.push((*n, target.trim_matches(['<', '>']).to_string()));
                rest = &after[end..];
            }
        }
        out
    }
}

/// The line with every code span (`...`) blanked out.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

fn md_files(dir: &Path, out: &mut Vec<PathBuf>, all: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            md_files(&p, out, all);
        } else {
            if p.extension().is_some_and(|e| e == "md") {
                out.push(p.clone());
            }
            all.push(p);
        }
    }
}

/// What is wrong with the links of `pages` (all paths absolute under
/// `root`), one line per problem; `book` is `docs/src`.
fn problems(root: &Path, book: &Path, pages: &[PathBuf], book_files: &[PathBuf]) -> Vec<String> {
    let mut parsed: HashMap<PathBuf, Page> = HashMap::new();
    let mut page = |p: &Path| -> HashSet<String> {
        parsed
            .entry(p.to_path_buf())
            .or_insert_with(|| Page::read(p))
            .anchors()
    };
    let mut bad = Vec::new();
    let mut linked: BTreeSet<PathBuf> = BTreeSet::new();
    let show = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
    for file in pages {
        let this = Page::read(file);
        let dir = file.parent().expect("a file has a directory");
        for (line, target) in this.links() {
            let at = format!("{}:{line}", show(file));
            if target.is_empty() {
                bad.push(format!("{at}: empty link"));
                continue;
            }
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                normalize(&dir.join(path))
            };
            if !resolved.exists() {
                bad.push(format!("{at}: {target}: no such file"));
                continue;
            }
            if file.starts_with(book) && !resolved.starts_with(book) && path.ends_with(".md") {
                bad.push(format!(
                    "{at}: {target}: a book page links to a Markdown file outside docs/src \
                     (mdBook rewrites it to .html, which does not exist)"
                ));
            }
            linked.insert(resolved.clone());
            if let Some(anchor) = anchor {
                if resolved.extension().is_some_and(|e| e == "md") {
                    if !page(&resolved).contains(anchor) {
                        bad.push(format!(
                            "{at}: {target}: no heading with the anchor #{anchor} in {}",
                            show(&resolved)
                        ));
                    }
                } else {
                    bad.push(format!(
                        "{at}: {target}: an anchor into a file that is not Markdown"
                    ));
                }
            }
        }
    }
    // The book: every SUMMARY entry exists (checked above, as a link of
    // SUMMARY.md); every page is in SUMMARY; every other file is linked.
    let summary = book.join("SUMMARY.md");
    let in_summary: BTreeSet<PathBuf> = Page::read(&summary)
        .links()
        .into_iter()
        .filter(|(_, t)| !t.contains("://"))
        .map(|(_, t)| normalize(&book.join(t.split('#').next().unwrap_or(""))))
        .collect();
    for f in book_files {
        let md = f.extension().is_some_and(|e| e == "md");
        if md && *f != summary && !in_summary.contains(f) {
            bad.push(format!("{}: not reached from docs/src/SUMMARY.md", show(f)));
        }
        if !md && !linked.contains(f) {
            bad.push(format!("{}: a file of the book no page links to", show(f)));
        }
    }
    bad
}

#[test]
fn every_link_resolves() {
    let root = root();
    let book = root.join("docs/src");
    let mut pages = vec![root.join("README.md"), root.join("fuzz/README.md")];
    let mut book_files = Vec::new();
    md_files(&book, &mut pages, &mut book_files);
    let bad = problems(&root, &book, &pages, &book_files);
    assert!(
        bad.is_empty(),
        "{} broken link(s) in the documentation:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn anchors_follow_mdbook() {
    // mdbook-html 0.5.4's own cases (utils.rs, it_normalizes_ids).
    assert_eq!(
        slug(&rendered("`--passes`: add more rustdoc passes")),
        "--passes-add-more-rustdoc-passes"
    );
    assert_eq!(
        slug("Method-call 🐙 expressions \u{1f47c}"),
        "method-call--expressions-"
    );
    assert_eq!(slug("_-_12345"), "_-_12345");
    assert_eq!(slug("12345"), "12345");
    assert_eq!(slug("中文"), "中文");
    assert_eq!(slug("中文標題 CJK title"), "中文標題-cjk-title");
    assert_eq!(slug("한국어"), "한국어");
    assert_eq!(slug(""), "");
    assert_eq!(slug("Über"), "über");
    // Headings of this book.
    assert_eq!(
        slug(&rendered(
            "`uroce fuzz`: a RoCEv2 fuzzer for any RoCE stack"
        )),
        "uroce-fuzz-a-rocev2-fuzzer-for-any-roce-stack"
    );
    assert_eq!(slug(&rendered("rxe 6.1 and 6.12")), "rxe-61-and-612");
    assert_eq!(
        slug(&rendered("The reference model (`uroce-fuzz/src/model/`)")),
        "the-reference-model-uroce-fuzzsrcmodel"
    );
    assert_eq!(
        slug(&rendered("See [the book](docs/x.md) *now*")),
        "see-the-book-now"
    );
    let mut used = HashSet::new();
    assert_eq!(unique("a".into(), &mut used), "a");
    assert_eq!(unique("a".into(), &mut used), "a-1");
    assert_eq!(unique("a".into(), &mut used), "a-2");
    assert_eq!(unique("a-1".into(), &mut used), "a-1-1");
}

#[test]
fn a_broken_link_is_found() {
    // A scratch tree with one of each mistake the checker must catch.
    let dir = std::env::temp_dir().join(format!("uroce-doc-links-{}", std::process::id()));
    let book = dir.join("docs/src");
    fs::create_dir_all(book.join("guide")).expect("scratch dir");
    let write = |p: &str, s: &str| fs::write(dir.join(p), s).expect("scratch file");
    write(
        "docs/src/SUMMARY.md",
        "# Summary\n\n- [A](a.md)\n- [Gone](gone.md)\n",
    );
    write(
        "docs/src/a.md",
        "# A\n\n## Twice\n\n## Twice\n\n[ok](#twice-1) [ok](guide/b.md#b) \
         [bad anchor](#twice-2) [bad file](guide/c.md) `[in code](nowhere.md)` \
         [web](https://example.invalid/x)\n\n```\n[in a fence](nowhere.md)\n```\n",
    );
    write("docs/src/guide/b.md", "B\n=\n\n[up](../../../README.md)\n");
    write("docs/src/orphan.png", "");
    write(
        "README.md",
        "# R\n\n[book](docs/src/a.md#twice) [no](docs/src/a.md#thrice)\n",
    );
    let mut pages = vec![dir.join("README.md")];
    let mut files = Vec::new();
    md_files(&book, &mut pages, &mut files);
    let bad = problems(&dir, &book, &pages, &files);
    let _ = fs::remove_dir_all(&dir);
    let expect = [
        "README.md:3: docs/src/a.md#thrice: no heading",
        "docs/src/SUMMARY.md:4: gone.md: no such file",
        "docs/src/a.md:7: #twice-2: no heading",
        "docs/src/a.md:7: guide/c.md: no such file",
        "docs/src/guide/b.md:4: ../../../README.md: a book page links to a Markdown file outside",
        "docs/src/guide/b.md: not reached from docs/src/SUMMARY.md",
        "docs/src/orphan.png: a file of the book no page links to",
    ];
    for e in expect {
        assert!(
            bad.iter().any(|b| b.starts_with(e)),
            "missing {e:?} in {bad:#?}"
        );
    }
    assert_eq!(bad.len(), expect.len(), "{bad:#?}");
}
