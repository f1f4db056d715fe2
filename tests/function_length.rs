//! No function in src/ (the bench under src/bench too) is longer than `MAX_LINES`, counted from
//! its `fn` line to its closing brace. Free functions, methods, nested and async functions and
//! those in `#[cfg(test)]` modules all count.
//!
//! The parser is deliberately small: it blanks out comments, string, raw string and char
//! literals (keeping line breaks), then finds each `fn NAME`, its body's `{` and the matching
//! `}`. Functions without a body (`fn f();` in traits and `extern` blocks) are skipped, as are
//! `fn(...)` pointer types and functions a macro writes (`fn $name`).

use std::fs;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 80;

#[derive(Debug, PartialEq)]
struct Function {
    name: String,
    /// 1-based line of the `fn` keyword.
    line: usize,
    /// From the `fn` line to the closing brace's line, both counted.
    lines: usize,
}

/// `source` with every comment and literal's characters turned into spaces, line breaks kept,
/// so that braces and `fn` inside them are not seen and line numbers stay the same.
fn code_only(source: &str) -> Vec<char> {
    let s: Vec<char> = source.chars().collect();
    let mut out = s.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in &mut out[from..to.min(s.len())] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    // Whether `s[i]` starts a token rather than continuing an identifier (`r"` vs `for"`).
    let starts_token = |i: usize| i == 0 || !(s[i - 1].is_alphanumeric() || s[i - 1] == '_');
    let mut i = 0;
    while i < s.len() {
        let at = |k: usize| s.get(k).copied().unwrap_or('\0');
        if at(i) == '/' && at(i + 1) == '/' {
            let end = (i..s.len()).find(|&k| s[k] == '\n').unwrap_or(s.len());
            blank(&mut out, i, end);
            i = end;
        } else if at(i) == '/' && at(i + 1) == '*' {
            // Block comments nest in Rust.
            let (mut depth, mut k) = (0, i);
            while k < s.len() {
                if at(k) == '/' && at(k + 1) == '*' {
                    depth += 1;
                    k += 2;
                } else if at(k) == '*' && at(k + 1) == '/' {
                    depth -= 1;
                    k += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    k += 1;
                }
            }
            blank(&mut out, i, k);
            i = k;
        } else if let Some(end) = raw_string_end(&s, i).filter(|_| starts_token(i)) {
            blank(&mut out, i, end);
            i = end;
        } else if at(i) == '"' {
            let mut k = i + 1;
            while k < s.len() && s[k] != '"' {
                k += if s[k] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, k + 1);
            i = k + 1;
        } else if at(i) == '\'' {
            // A char literal ('x', '\n', '\u{7b}') or else a lifetime ('a, 'static).
            let end = if at(i + 1) == '\\' {
                (i + 3..s.len()).find(|&k| s[k] == '\'').map(|k| k + 1)
            } else if at(i + 2) == '\'' {
                Some(i + 3)
            } else {
                None
            };
            match end {
                Some(end) => {
                    blank(&mut out, i, end);
                    i = end;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Where the raw string (`r"…"`, `r#"…"#`, `br##"…"##`) starting at `i` ends, if one does.
fn raw_string_end(s: &[char], i: usize) -> Option<usize> {
    let mut k = i;
    if s.get(k) == Some(&'b') {
        k += 1;
    }
    if s.get(k) != Some(&'r') {
        return None;
    }
    k += 1;
    let hashes = s[k..].iter().take_while(|&&c| c == '#').count();
    k += hashes;
    if s.get(k) != Some(&'"') {
        return None; // `r#ident`, or just an identifier starting with r
    }
    let close: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    (k + 1..s.len())
        .find(|&j| s[j..].starts_with(&close))
        .map(|j| j + close.len())
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every function with a body in `source`.
fn functions(source: &str) -> Vec<Function> {
    let code = code_only(source);
    let line_of = |at: usize| code[..at].iter().filter(|&&c| c == '\n').count() + 1;
    let mut found = Vec::new();
    for i in 0..code.len().saturating_sub(2) {
        let keyword = code[i] == 'f'
            && code[i + 1] == 'n'
            && (i == 0 || !is_ident(code[i - 1]))
            && code[i + 2].is_whitespace();
        if !keyword {
            continue;
        }
        let start = (i + 2..code.len()).find(|&k| !code[k].is_whitespace());
        let Some(start) = start.filter(|&k| is_ident(code[k])) else {
            continue; // `fn(u8) -> u8` types and `fn $name` in macros
        };
        let name: String = code[start..].iter().take_while(|&&c| is_ident(c)).collect();
        if let Some(close) = body_end(&code, start) {
            let line = line_of(i);
            found.push(Function {
                name,
                line,
                lines: line_of(close) - line + 1,
            });
        }
    }
    found
}

/// The index of the `}` closing the body of the function whose signature starts at `from`, or
/// None where a `;` ends the signature first. A `;` inside brackets (`[u8; 4]`) does not.
fn body_end(code: &[char], from: usize) -> Option<usize> {
    let mut brackets = 0i32;
    let open = (from..code.len()).find(|&k| match code[k] {
        '(' | '[' => {
            brackets += 1;
            false
        }
        ')' | ']' => {
            brackets -= 1;
            false
        }
        c => brackets == 0 && (c == '{' || c == ';'),
    })?;
    if code[open] == ';' {
        return None;
    }
    let mut depth = 0;
    (open..code.len()).find(|&k| {
        match code[k] {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        depth == 0
    })
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

#[test]
fn no_function_in_src_is_longer_than_80_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    assert!(
        files.iter().any(|f| f.ends_with("bench/main.rs")),
        "the walk missed src/bench"
    );
    let mut long = Vec::new();
    for file in &files {
        let source = fs::read_to_string(file).expect("reading a source file");
        for f in functions(&source) {
            if f.lines > MAX_LINES {
                let path = file.strip_prefix(root).unwrap_or(file).display();
                long.push(format!(
                    "{path}:{} fn {} is {} lines",
                    f.line, f.name, f.lines
                ));
            }
        }
    }
    assert!(
        long.is_empty(),
        "{} function(s) longer than {MAX_LINES} lines:\n{}",
        long.len(),
        long.join("\n")
    );
}

#[test]
fn the_parser_finds_long_functions_and_ignores_braces_in_literals_and_comments() {
    let body = "    let x = 1;\n".repeat(MAX_LINES);
    let source = format!(
        r####"
// fn in_a_comment() {{
/* fn in_a_block() {{ /* nested }} */ {{ */
pub async fn long() {{
{body}}}

impl Thing {{
    fn tricky<'a>(&'a self, x: [u8; 4]) -> &'a str {{
        let _ = ('{{', '\'', '\u{{7b}}', b'{{', "}} \" {{", r#"}} " {{"#, br##"{{"#"##);
        fn nested() {{ }}
        // }} {{
        /* }} */
        "fn fake() {{"
    }}
}}

trait T {{
    fn declared(&self) -> [u8; 2];
    fn defaulted(&self) {{}}
}}

type Callback = fn(u8) -> u8;
"####
    );
    let found = functions(&source);
    let summary: Vec<(&str, usize, usize)> = found
        .iter()
        .map(|f| (f.name.as_str(), f.line, f.lines))
        .collect();
    assert_eq!(
        summary,
        [
            ("long", 4, MAX_LINES + 2),
            ("tricky", MAX_LINES + 8, 7),
            ("nested", MAX_LINES + 10, 1),
            ("defaulted", MAX_LINES + 19, 1),
        ]
    );
    assert!(found[0].lines > MAX_LINES, "the long one is caught");
}
