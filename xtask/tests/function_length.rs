//! No function in the library crates (`crates/*/src`) is longer than [`MAX_LINES`] lines, from
//! its `fn` to its closing brace: a longer one is split into steps with names (issue 35's rule,
//! kept by this test rather than by hand).

use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The most lines a function may span.
const MAX_LINES: usize = 150;

/// Every `.rs` file below `dir`, in a stable order.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The functions of one file longer than [`MAX_LINES`]: (name, first line, lines).
#[derive(Default)]
struct Long(Vec<(String, usize, usize)>);

impl Long {
    fn check(&mut self, name: &syn::Ident, fn_token: &syn::token::Fn, block: &syn::Block) {
        let first = fn_token.span.start().line;
        let lines = block.brace_token.span.close().end().line + 1 - first;
        if lines > MAX_LINES {
            self.0.push((name.to_string(), first, lines));
        }
    }
}

impl<'a> Visit<'a> for Long {
    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        self.check(&f.sig.ident, &f.sig.fn_token, &f.block);
        syn::visit::visit_item_fn(self, f);
    }
    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        self.check(&f.sig.ident, &f.sig.fn_token, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }
    fn visit_trait_item_fn(&mut self, f: &'a syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.check(&f.sig.ident, &f.sig.fn_token, block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

#[test]
fn no_library_function_is_longer_than_150_lines() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates");
    let mut files = Vec::new();
    for krate in std::fs::read_dir(&crates).expect("crates/") {
        let src = krate.expect("a crate").path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    assert!(
        files.len() > 100,
        "found only {} files under crates/*/src",
        files.len()
    );
    let mut long = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a readable source file");
        let ast = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let mut v = Long::default();
        v.visit_file(&ast);
        for (name, line, lines) in v.0 {
            long.push(format!(
                "{}:{line} fn {name}: {lines} lines",
                file.display()
            ));
        }
    }
    assert!(
        long.is_empty(),
        "functions longer than {MAX_LINES} lines (split them into named steps):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_length_check_counts_from_fn_to_the_closing_brace() {
    // `fn` line + body + closing brace: MAX_LINES with no extra line, one more with one.
    let body = "    let x = 1;\n".repeat(MAX_LINES - 2);
    for (extra, flagged) in [(0, false), (1, true)] {
        let text = format!("fn f() {{\n{body}{}}}\n", "    let y = 2;\n".repeat(extra));
        let mut v = Long::default();
        v.visit_file(&syn::parse_file(&text).expect("parses"));
        assert_eq!(!v.0.is_empty(), flagged, "{} lines", MAX_LINES + extra);
    }
}
