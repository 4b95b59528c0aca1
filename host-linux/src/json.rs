//! A small JSON writer for the one object the CLI prints on stdout.
//!
//! Owns JSON text output only: string escaping, number formatting, and the
//! [`Object`] / [`Array`] builders. It does not parse JSON and does not decide what
//! the CLI reports.
//!
//! Numbers: integers print exactly; floats print the shortest text that reads back to
//! the same value (`f64` via Rust's shortest round-trip formatting, `f32` as `f32`, so
//! `0.1f32` prints `0.1`). **NaN and ±infinity print as `null`**, since JSON has no
//! spelling for them; callers that must distinguish check `is_finite` themselves.
//! Strings: `"`, `\` and control characters are escaped (`\n`, `\t`, … or `\u00XX`),
//! as are U+2028/U+2029; all other Unicode passes through as UTF-8.
//!
//! ```
//! use keel_host_linux::json::Object;
//! let mut o = Object::new();
//! o.str("model", "smollm2-135m").u64("n_tokens", 12).f64("tok_per_s", 41.5);
//! o.arr("tokens", |a| {
//!     a.u64(1).u64(2);
//! });
//! assert_eq!(o.finish(), r#"{"model":"smollm2-135m","n_tokens":12,"tok_per_s":41.5,"tokens":[1,2]}"#);
//! ```

use std::fmt::Write as _;

/// Appends `s` to `out` as a quoted, escaped JSON string.
pub fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || c == '\u{7f}' || c == '\u{2028}' || c == '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Appends `v` as the shortest round-tripping JSON number, or `null` if not finite.
pub fn write_f64(out: &mut String, v: f64) {
    if v.is_finite() {
        // `{:?}` is Rust's shortest round-trip form: `1.0`, `0.1`, `1e-7`, `1e300`; all
        // valid JSON numbers.
        let _ = write!(out, "{v:?}");
    } else {
        out.push_str("null");
    }
}

/// Appends `v` as the shortest JSON number that reads back to the same `f32`, or
/// `null` if not finite.
pub fn write_f32(out: &mut String, v: f32) {
    if v.is_finite() {
        let _ = write!(out, "{v:?}");
    } else {
        out.push_str("null");
    }
}

/// Builds one JSON object. Keys are written in call order; duplicates are not checked.
#[derive(Debug, Clone)]
pub struct Object {
    buf: String,
    empty: bool,
}

/// Builds one JSON array, inside an [`Object`] or another array.
#[derive(Debug)]
pub struct Array<'a> {
    buf: &'a mut String,
    empty: bool,
}

impl Default for Object {
    fn default() -> Self {
        Self::new()
    }
}

impl Object {
    /// An empty object.
    pub fn new() -> Self {
        Object {
            buf: String::from("{"),
            empty: true,
        }
    }

    fn key(&mut self, k: &str) -> &mut String {
        if !self.empty {
            self.buf.push(',');
        }
        self.empty = false;
        write_str(&mut self.buf, k);
        self.buf.push(':');
        &mut self.buf
    }

    /// Adds a string field.
    pub fn str(&mut self, k: &str, v: &str) -> &mut Self {
        write_str(self.key(k), v);
        self
    }

    /// Adds an unsigned integer field.
    pub fn u64(&mut self, k: &str, v: u64) -> &mut Self {
        let _ = write!(self.key(k), "{v}");
        self
    }

    /// Adds a signed integer field.
    pub fn i64(&mut self, k: &str, v: i64) -> &mut Self {
        let _ = write!(self.key(k), "{v}");
        self
    }

    /// Adds a float field (`null` if not finite).
    pub fn f64(&mut self, k: &str, v: f64) -> &mut Self {
        write_f64(self.key(k), v);
        self
    }

    /// Adds an `f32` field in its shortest form (`null` if not finite).
    pub fn f32(&mut self, k: &str, v: f32) -> &mut Self {
        write_f32(self.key(k), v);
        self
    }

    /// Adds a boolean field.
    pub fn bool(&mut self, k: &str, v: bool) -> &mut Self {
        self.key(k).push_str(if v { "true" } else { "false" });
        self
    }

    /// Adds a `null` field.
    pub fn null(&mut self, k: &str) -> &mut Self {
        self.key(k).push_str("null");
        self
    }

    /// Adds a nested object, filled in by `f`.
    pub fn obj(&mut self, k: &str, f: impl FnOnce(&mut Object)) -> &mut Self {
        let mut inner = Object::new();
        f(&mut inner);
        let text = inner.finish();
        self.key(k).push_str(&text);
        self
    }

    /// Adds an array, filled in by `f`.
    pub fn arr(&mut self, k: &str, f: impl FnOnce(&mut Array<'_>)) -> &mut Self {
        let buf = self.key(k);
        buf.push('[');
        f(&mut Array {
            buf: &mut *buf,
            empty: true,
        });
        buf.push(']');
        self
    }

    /// Closes the object and returns its text (no trailing newline).
    pub fn finish(mut self) -> String {
        self.buf.push('}');
        self.buf
    }

    /// Closes the object and prints it on stdout as one line.
    pub fn print(self) {
        println!("{}", self.finish());
    }
}

/// Prints `objects` on stdout as one JSON array on one line.
pub fn print_array(objects: impl IntoIterator<Item = Object>) {
    let mut arr = String::from("[");
    for (i, o) in objects.into_iter().enumerate() {
        if i > 0 {
            arr.push(',');
        }
        arr.push_str(&o.finish());
    }
    arr.push(']');
    println!("{arr}");
}

impl Array<'_> {
    fn item(&mut self) -> &mut String {
        if !self.empty {
            self.buf.push(',');
        }
        self.empty = false;
        self.buf
    }

    /// Appends a string.
    pub fn str(&mut self, v: &str) -> &mut Self {
        write_str(self.item(), v);
        self
    }

    /// Appends an unsigned integer.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        let _ = write!(self.item(), "{v}");
        self
    }

    /// Appends a signed integer.
    pub fn i64(&mut self, v: i64) -> &mut Self {
        let _ = write!(self.item(), "{v}");
        self
    }

    /// Appends a float (`null` if not finite).
    pub fn f64(&mut self, v: f64) -> &mut Self {
        write_f64(self.item(), v);
        self
    }

    /// Appends an `f32` in its shortest form (`null` if not finite).
    pub fn f32(&mut self, v: f32) -> &mut Self {
        write_f32(self.item(), v);
        self
    }

    /// Appends a boolean.
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.item().push_str(if v { "true" } else { "false" });
        self
    }

    /// Appends an object, filled in by `f`.
    pub fn obj(&mut self, f: impl FnOnce(&mut Object)) -> &mut Self {
        let mut inner = Object::new();
        f(&mut inner);
        let text = inner.finish();
        self.item().push_str(&text);
        self
    }

    /// Appends a nested array, filled in by `f`.
    pub fn arr(&mut self, f: impl FnOnce(&mut Array<'_>)) -> &mut Self {
        let buf = self.item();
        buf.push('[');
        f(&mut Array {
            buf: &mut *buf,
            empty: true,
        });
        buf.push(']');
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> String {
        let mut out = String::new();
        write_str(&mut out, v);
        out
    }

    #[test]
    fn escapes_quotes_controls_and_separators() {
        assert_eq!(s("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(s("l1\nl2\r\t\u{8}\u{c}"), r#""l1\nl2\r\t\b\f""#);
        assert_eq!(s("\0\u{1}\u{1f}\u{7f}"), r#""\u0000\u0001\u001f\u007f""#);
        assert_eq!(s("x\u{2028}y\u{2029}"), r#""x\u2028y\u2029""#);
    }

    #[test]
    fn unicode_passes_through() {
        assert_eq!(s("héllo ▁world 日本 🦀"), "\"héllo ▁world 日本 🦀\"");
        assert_eq!(s(""), "\"\"");
    }

    #[test]
    fn floats_round_trip_and_non_finite_is_null() {
        for v in [
            0.0,
            -0.0,
            1.0,
            0.1,
            1.0 / 3.0,
            1e-7,
            123456.789,
            1e300,
            -2.5e-308,
            f64::MAX,
        ] {
            let mut out = String::new();
            write_f64(&mut out, v);
            let back: f64 = out.parse().unwrap();
            assert_eq!(back.to_bits(), v.to_bits(), "{v} printed as {out}");
            assert!(!out.contains("inf") && !out.contains("NaN"));
        }
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut out = String::new();
            write_f64(&mut out, v);
            assert_eq!(out, "null");
        }
        let mut out = String::new();
        write_f32(&mut out, 0.1);
        assert_eq!(out, "0.1");
        out.clear();
        write_f32(&mut out, f32::NAN);
        assert_eq!(out, "null");
    }

    #[test]
    fn builds_nested_objects_and_arrays() {
        let mut o = Object::new();
        o.str("k\"", "v")
            .i64("neg", -3)
            .bool("ok", true)
            .null("none");
        o.obj("t", |t| {
            t.f64("ms", 2.5).f32("p", f32::INFINITY);
        });
        o.arr("xs", |a| {
            a.str("a").f64(0.5).arr(|b| {
                b.u64(1).bool(false);
            });
            a.obj(|e| {
                e.u64("id", 7);
            });
            a.arr(|_| {});
        });
        o.obj("empty", |_| {});
        assert_eq!(
            o.finish(),
            r#"{"k\"":"v","neg":-3,"ok":true,"none":null,"t":{"ms":2.5,"p":null},"xs":["a",0.5,[1,false],{"id":7},[]],"empty":{}}"#
        );
        assert_eq!(Object::new().finish(), "{}");
    }
}
