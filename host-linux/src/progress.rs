//! A progress bar on stderr, for long host-side steps (pull, load, quantize).
//!
//! Owns only the drawing. On a terminal it redraws one line in place, at most ten
//! times a second: `label [#########           ]  45%  44.2/98.4 MB  120.3 MB/s`.
//! When stderr is not a terminal (CI logs, pipes) it prints a plain line at each
//! quarter and one at the end, so logs stay short. Stdout is never touched: the CLI
//! keeps stdout for its JSON.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// What the counted units are; decides how amounts are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Bytes, printed in MB (10^6) with a rate.
    Bytes,
    /// Plain items (tensors, layers), printed as `n/total`.
    Items,
}

/// A progress indicator for one step of known total size.
#[derive(Debug)]
pub struct Progress {
    label: String,
    total: u64,
    done: u64,
    unit: Unit,
    tty: bool,
    start: Instant,
    last_draw: Option<Instant>,
    /// Quarters already reported in plain mode.
    quarters: u8,
    finished: bool,
}

const REDRAW: Duration = Duration::from_millis(100);
const BAR_WIDTH: usize = 24;

impl Progress {
    /// A bar for `total` bytes.
    pub fn bytes(label: &str, total: u64) -> Self {
        Self::new(label, total, Unit::Bytes, std::io::stderr().is_terminal())
    }

    /// A bar for `total` items.
    pub fn items(label: &str, total: u64) -> Self {
        Self::new(label, total, Unit::Items, std::io::stderr().is_terminal())
    }

    /// A bar with explicit terminal mode (`tty = false` gives the plain-line mode).
    pub fn new(label: &str, total: u64, unit: Unit, tty: bool) -> Self {
        Progress {
            label: label.to_string(),
            total,
            done: 0,
            unit,
            tty,
            start: Instant::now(),
            last_draw: None,
            quarters: 0,
            finished: false,
        }
    }

    /// Advances by `n` units.
    pub fn inc(&mut self, n: u64) {
        self.set(self.done.saturating_add(n));
    }

    /// Sets the amount done so far.
    pub fn set(&mut self, done: u64) {
        self.done = done;
        if self.tty {
            let now = Instant::now();
            if self.last_draw.is_none_or(|t| now - t >= REDRAW) {
                self.last_draw = Some(now);
                self.emit(&format!("\r{}\x1b[K", self.line()));
            }
        } else if let Some(q) = (self.done.min(self.total) * 4).checked_div(self.total) {
            let q = q as u8;
            if q > self.quarters && q < 4 {
                self.quarters = q;
                self.emit(&format!("{}\n", self.line()));
            }
        }
    }

    /// Ends the bar's line on a terminal, so that other output (a subprocess's, a
    /// message) starts on a fresh line; the next update draws the bar again below it.
    pub fn interrupt(&mut self) {
        if self.tty && self.last_draw.take().is_some() {
            self.emit(&format!("\r{}\x1b[K\n", self.line()));
        }
    }

    /// Draws the final state and ends the line. Called by `Drop` if not called before.
    pub fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        let line = self.line();
        self.emit(&if self.tty {
            format!("\r{line}\x1b[K\n")
        } else {
            format!("{line}\n")
        });
    }

    /// The text of the progress line for the current state (no control characters).
    pub fn line(&self) -> String {
        render(
            &self.label,
            self.done,
            self.total,
            self.unit,
            self.start.elapsed(),
        )
    }

    fn emit(&self, text: &str) {
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(text.as_bytes());
        let _ = err.flush();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Formats one progress line: label, bar, percent, amounts, and rate for bytes.
pub fn render(label: &str, done: u64, total: u64, unit: Unit, elapsed: Duration) -> String {
    let frac = if total == 0 {
        1.0
    } else {
        (done.min(total) as f64) / total as f64
    };
    let filled = ((frac * BAR_WIDTH as f64) as usize).min(BAR_WIDTH);
    let bar: String = "#".repeat(filled) + &" ".repeat(BAR_WIDTH - filled);
    let pct = (frac * 100.0) as u32;
    match unit {
        Unit::Bytes => {
            let mb = |b: u64| b as f64 / 1e6;
            let secs = elapsed.as_secs_f64();
            let rate = if secs > 0.0 {
                format!("  {:.1} MB/s", mb(done) / secs)
            } else {
                String::new()
            };
            format!(
                "{label} [{bar}] {pct:>3}%  {:.1}/{:.1} MB{rate}",
                mb(done),
                mb(total)
            )
        }
        Unit::Items => format!("{label} [{bar}] {pct:>3}%  {done}/{total}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_bytes_and_items() {
        let l = render(
            "fetch",
            49_200_000,
            98_400_000,
            Unit::Bytes,
            Duration::from_secs(2),
        );
        assert_eq!(
            l,
            "fetch [############            ]  50%  49.2/98.4 MB  24.6 MB/s"
        );
        let l = render("load", 3, 12, Unit::Items, Duration::ZERO);
        assert_eq!(l, "load [######                  ]  25%  3/12");
    }

    #[test]
    fn clamps_overshoot_and_empty_totals() {
        let l = render("x", 20, 10, Unit::Items, Duration::ZERO);
        assert!(l.contains("[########################] 100%"), "{l}");
        let l = render("x", 0, 0, Unit::Bytes, Duration::ZERO);
        assert!(l.contains("100%"), "{l}");
    }

    #[test]
    fn plain_mode_reports_each_quarter_once() {
        let mut p = Progress::new("t", 100, Unit::Items, false);
        for _ in 0..100 {
            p.inc(1);
        }
        assert_eq!(p.quarters, 3);
        p.finish();
        p.finish();
        assert!(p.finished);
    }
}
