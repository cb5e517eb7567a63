//! The architecture's rules inside each product crate (docs/architecture.md), checked on the
//! sources: no non-test file over 1 200 lines, and no circle of `use` paths between its files
//! (`crate::a` and `super::b` paths; a child naming its own parent does not count, the parent
//! owning the child's items being the point of a module).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CRATES: [&str; 8] = [
    "core",
    "certs",
    "serve",
    "scheduler",
    "webhook",
    "device-plugin",
    "runtime-hook",
    "sim",
];

const MAX_LINES: usize = 1200;

type Module = Vec<String>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are `[a, b]`; `lib.rs` and `main.rs` the root.
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn is_test_file(m: &Module) -> bool {
    m.last().is_some_and(|l| l == "tests")
}

/// The file without comment lines and without its inline `#[cfg(test)] mod tests { .. }` (always
/// the file's last item here).
fn code(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod tests {"))
        .unwrap_or(lines.len());
    lines[..end].join("\n")
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Every module path the code names from `crate::` or `super::`, resolved from `module`.
fn named_paths(code: &str, module: &Module) -> Vec<Module> {
    let mut out = Vec::new();
    for (at, _) in code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
    {
        let before = code[..at].chars().last();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut base: Module = Vec::new();
        let mut rest = &code[at..];
        if let Some(r) = rest.strip_prefix("crate::") {
            rest = r;
        } else {
            // `super` of a file `a/b.rs` (module a::b) is `a`; of `a/b/mod.rs` also `a`.
            base = module.clone();
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
        }
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let mut p = base.clone();
                p.extend(item.trim().split("::").map(|s| ident(s).to_string()));
                out.push(p);
            }
        } else {
            let mut p = base;
            for seg in rest.split("::") {
                let id = ident(seg);
                if id.is_empty() {
                    break;
                }
                p.push(id.to_string());
                if id.len() != seg.len() {
                    break;
                }
            }
            out.push(p);
        }
    }
    out
}

/// Strongly connected groups of more than one module.
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Tarjan<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, (usize, usize)>,
        stack: Vec<&'a Module>,
        out: Vec<Vec<Module>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a Module) {
            let i = self.index.len();
            self.index.insert(v, (i, i));
            self.stack.push(v);
            for w in &self.edges[v] {
                match self.index.get(w) {
                    None => {
                        self.visit(w);
                        let low = self.index[w].1;
                        let e = self.index.get_mut(v).unwrap();
                        e.1 = e.1.min(low);
                    }
                    Some(&(wi, _)) if self.stack.contains(&w) => {
                        let e = self.index.get_mut(v).unwrap();
                        e.1 = e.1.min(wi);
                    }
                    Some(_) => {}
                }
            }
            if self.index[v].0 == self.index[v].1 {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    group.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    self.out.push(group);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn no_source_file_is_over_1200_lines() {
    let mut long = Vec::new();
    for krate in CRATES {
        let src = root().join(krate).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            let lines = std::fs::read_to_string(&f).unwrap().lines().count();
            if lines > MAX_LINES && !is_test_file(&module_of(&src, &f)) {
                long.push(format!("{} ({lines} lines)", f.display()));
            }
        }
    }
    assert!(long.is_empty(), "split by job: {long:#?}");
}

#[test]
fn no_circle_of_imports_between_files_of_a_crate() {
    let mut found = Vec::new();
    for krate in CRATES {
        let src = root().join(krate).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let modules: BTreeMap<Module, PathBuf> = files
            .iter()
            .map(|f| (module_of(&src, f), f.clone()))
            .collect();
        let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
        for (m, f) in &modules {
            let into = edges.entry(m.clone()).or_default();
            if is_test_file(m) {
                continue;
            }
            let text = std::fs::read_to_string(f).unwrap();
            for path in named_paths(&code(&text), m) {
                // The longest prefix that is a file of this crate.
                let Some(target) = (0..=path.len())
                    .rev()
                    .map(|k| path[..k].to_vec())
                    .find(|p| modules.contains_key(p))
                else {
                    continue;
                };
                let ancestor = target.len() <= m.len() && m[..target.len()] == target[..];
                if !ancestor {
                    into.insert(target);
                }
            }
        }
        for group in circles(&edges) {
            let names: Vec<String> = group.iter().map(|m| m.join("/")).collect();
            found.push(format!("{krate}: {}", names.join(" <-> ")));
        }
    }
    assert!(found.is_empty(), "files that use each other: {found:#?}");
}

/// The checker itself: a circle through `super::` and `crate::` paths is found, a child naming
/// its parent is not one.
#[test]
fn the_circle_check_sees_circles() {
    let a: Module = vec!["a".into()];
    let b: Module = vec!["a".into(), "b".into()];
    let c: Module = vec!["c".into()];
    let mut paths = named_paths("use super::super::c::X;\nuse crate::{a, c::Y};", &b);
    paths.sort();
    assert_eq!(
        paths,
        vec![
            a.clone(),
            vec!["c".to_string(), "X".to_string()],
            vec!["c".to_string(), "Y".to_string()]
        ]
    );
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    edges.insert(b.clone(), [c.clone()].into());
    edges.insert(c.clone(), [b.clone()].into());
    edges.insert(a.clone(), [b.clone()].into());
    assert_eq!(circles(&edges).len(), 1);
    assert_eq!(
        code("// crate::x\nuse crate::y;\n#[cfg(test)]\nmod tests {\nuse crate::z;\n}"),
        "use crate::y;"
    );
}
