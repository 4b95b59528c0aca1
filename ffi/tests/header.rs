//! `include/keel.h` against the Rust source: every exported function's prototype (name,
//! parameter names and C types, return type), the status codes and the text constant
//! must agree, so changing a signature on one side without the other fails here.

use keel_ffi::{ERRORS, KEEL_TEXT_BYTES_PER_CTX};

const HEADER: &str = include_str!("../include/keel.h");
const SOURCE: &str = include_str!("../src/lib.rs");

/// A prototype: (name, [(parameter, C type)], return C type), types in canonical spelling.
type Proto = (String, Vec<(String, String)>, String);

/// One spelling per C type: single spaces, every `*` its own word.
fn canon(ty: &str) -> String {
    ty.replace('*', " * ").split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The C type the header must use for a Rust FFI type.
fn c_type(rust: &str) -> String {
    let rust = rust.trim();
    if let Some(inner) = rust.strip_prefix("*const ") {
        return format!("const {} *", c_type(inner));
    }
    if let Some(inner) = rust.strip_prefix("*mut ") {
        return format!("{} *", c_type(inner));
    }
    match rust {
        "c_int" => "int",
        "c_char" => "char",
        "c_void" => "void",
        "u8" => "uint8_t",
        "u32" => "uint32_t",
        "u64" => "uint64_t",
        "usize" => "size_t",
        "f32" => "float",
        "KeelSession" => "keel_session",
        other => panic!("no C spelling for the Rust type {other:?}: add it to this test and to keel.h"),
    }
    .to_string()
}

/// `text` split at top-level commas, empty pieces dropped.
fn params(text: &str) -> Vec<&str> {
    text.split(',').map(str::trim).filter(|p| !p.is_empty()).collect()
}

/// Every `extern "C" fn` in the Rust source, with its types in C.
fn rust_protos() -> Vec<Proto> {
    let mut out = Vec::new();
    for (at, _) in SOURCE.match_indices("extern \"C\" fn ") {
        let rest = &SOURCE[at + "extern \"C\" fn ".len()..];
        let open = rest.find('(').unwrap();
        let close = rest.find(')').unwrap();
        let name = rest[..open].trim().to_string();
        let args = params(&rest[open + 1..close])
            .into_iter()
            .map(|p| {
                let (n, t) = p.split_once(':').unwrap_or_else(|| panic!("{name}: cannot read parameter {p:?}"));
                (n.trim().to_string(), canon(&c_type(t)))
            })
            .collect();
        let after = rest[close + 1..].split('{').next().unwrap().trim();
        let ret = after.strip_prefix("->").map_or("void".to_string(), |r| canon(&c_type(r)));
        out.push((name, args, ret));
    }
    out.sort();
    out
}

/// Every `keel_*(...);` prototype in the header, comments removed.
fn header_protos() -> Vec<Proto> {
    let mut code = String::new();
    let mut rest = HEADER;
    while let Some(i) = rest.find("/*") {
        code.push_str(&rest[..i]);
        rest = &rest[i + rest[i..].find("*/").expect("unclosed comment") + 2..];
    }
    code.push_str(rest);
    let code: String = code.lines().filter(|l| !l.trim_start().starts_with('#')).map(|l| format!("{l}\n")).collect();
    let mut out = Vec::new();
    for stmt in code.split(';') {
        let stmt = stmt.trim();
        if !stmt.contains("keel_") || !stmt.contains('(') || stmt.contains("typedef") {
            continue;
        }
        let paren = stmt.find('(').unwrap();
        let close = stmt.rfind(')').unwrap();
        let head = &stmt[..paren];
        let name_at = head.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
        let name = head[name_at..].to_string();
        let ret = canon(&head[..name_at]);
        let args = params(&stmt[paren + 1..close])
            .into_iter()
            .map(|p| {
                let n_at = p.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map(|i| i + 1).unwrap_or_else(|| panic!("{name}: parameter {p:?} has no name"));
                (p[n_at..].to_string(), canon(&p[..n_at]))
            })
            .collect();
        out.push((name, args, ret));
    }
    out.sort();
    out
}

#[test]
fn header_prototypes_match_the_rust_signatures() {
    let (rust, c) = (rust_protos(), header_protos());
    assert!(rust.len() >= 9, "found only {} exported functions in src/lib.rs", rust.len());
    for r in &rust {
        let h = c.iter().find(|h| h.0 == r.0).unwrap_or_else(|| panic!("{} is exported but keel.h does not declare it", r.0));
        assert_eq!(h, r, "keel.h's prototype of {} differs from the Rust signature (left: header, right: Rust)", r.0);
    }
    for h in &c {
        assert!(rust.iter().any(|r| r.0 == h.0), "keel.h declares {} but the library does not export it", h.0);
    }
}

#[test]
fn header_status_codes_match() {
    let mut found = 0;
    for line in HEADER.lines() {
        let line = line.trim();
        let Some((name, rest)) = line.split_once(" = ") else { continue };
        if !name.starts_with("KEEL_") {
            continue;
        }
        let value: i32 = rest.trim_start().split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap();
        let (code, _, _) = ERRORS.iter().find(|e| e.1 == name).unwrap_or_else(|| panic!("keel.h has {name}, the library does not"));
        assert_eq!(*code, value, "{name}");
        found += 1;
    }
    assert_eq!(found, ERRORS.len(), "keel.h lists {found} status codes, the library {}", ERRORS.len());
}

#[test]
fn header_text_constant_matches() {
    let want = format!("#define KEEL_TEXT_BYTES_PER_CTX {KEEL_TEXT_BYTES_PER_CTX}");
    assert!(HEADER.lines().any(|l| l.trim() == want), "keel.h lacks {want:?}");
}

#[test]
fn error_messages_cover_every_code() {
    for (i, (code, name, msg)) in ERRORS.iter().enumerate() {
        assert_eq!(*code, i as i32, "{name}: codes are consecutive from 0");
        // SAFETY: keel_error_message returns a pointer to a static NUL-terminated string.
        let got = unsafe { core::ffi::CStr::from_ptr(keel_ffi::keel_error_message(*code)) };
        assert_eq!(got, *msg);
    }
    // SAFETY: as above.
    let unknown = unsafe { core::ffi::CStr::from_ptr(keel_ffi::keel_error_message(-7)) };
    assert_eq!(unknown.to_str().unwrap(), "unknown keel error code");
}
