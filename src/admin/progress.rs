//! The progress meter of `stickyvol volume export` and `import`: one line on stderr, redrawn in
//! place with `\r` at most four times a second, ended with a newline. It is shown only to a
//! person (stderr is a terminal, no `--quiet`); the formatting is in pure functions.

use std::io::{self, Write};
use std::time::{Duration, Instant};

use super::render::human_size;

/// The shortest time between two redraws.
pub const REDRAW_INTERVAL: Duration = Duration::from_millis(250);

/// `7s`, `2m05s`, `1h02m03s` (whole seconds, rounded up so a remaining time never shows 0s
/// before it is over).
pub fn format_duration(duration: Duration) -> String {
    let mut seconds = duration.as_secs();
    if duration.subsec_nanos() > 0 {
        seconds += 1;
    }
    let (hours, minutes, seconds) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    if hours > 0 {
        format!("{hours}h{minutes:02}m{seconds:02}s")
    } else if minutes > 0 {
        format!("{minutes}m{seconds:02}s")
    } else {
        format!("{seconds}s")
    }
}

/// Bytes per second so far, or None before any time has passed.
fn rate(done: u64, elapsed: Duration) -> Option<f64> {
    let seconds = elapsed.as_secs_f64();
    (seconds >= 0.001).then(|| done as f64 / seconds)
}

/// `45.3 MiB/s`, or `- MiB/s` before any time has passed.
pub fn format_rate(done: u64, elapsed: Duration) -> String {
    match rate(done, elapsed) {
        Some(rate) => format!("{:.1} MiB/s", rate / (1024.0 * 1024.0)),
        None => "- MiB/s".into(),
    }
}

/// How long the rest takes at the average rate so far. `total` is an estimate (an export
/// stream is a little bigger than its data), so what is past it counts as nothing left: the
/// ETA never goes below zero. None while nothing has moved yet.
pub fn eta(done: u64, total: u64, elapsed: Duration) -> Option<Duration> {
    let remaining = total.saturating_sub(done);
    if remaining == 0 {
        return Some(Duration::ZERO);
    }
    let rate = rate(done, elapsed).filter(|r| *r > 0.0)?;
    Some(Duration::from_secs_f64(
        (remaining as f64 / rate).min(u32::MAX as f64),
    ))
}

/// The percentage of `total` done, never above 100 (an empty total is complete).
pub fn percent(done: u64, total: u64) -> u64 {
    if total == 0 {
        return 100;
    }
    (u128::from(done) * 100 / u128::from(total)).min(100) as u64
}

/// The meter line: `1.2Gi / 4.0Gi  30%  45.3 MiB/s  ETA 1m02s` when the total is known,
/// `1.2Gi  45.3 MiB/s` when it is not.
pub fn format_progress(done: u64, total: Option<u64>, elapsed: Duration) -> String {
    let rate = format_rate(done, elapsed);
    match total {
        Some(total) => {
            let eta = eta(done, total, elapsed).map_or_else(|| "-".into(), format_duration);
            format!(
                "{} / {}  {}%  {rate}  ETA {eta}",
                human_size(done),
                human_size(total),
                percent(done, total)
            )
        }
        None => format!("{}  {rate}", human_size(done)),
    }
}

/// The last line, once everything has moved: `4.0Gi in 1m42s, 40.2 MiB/s`.
pub fn format_summary(done: u64, elapsed: Duration) -> String {
    format!(
        "{} in {}, {}",
        human_size(done),
        format_duration(elapsed),
        format_rate(done, elapsed)
    )
}

/// A meter drawing on `out`, or doing nothing when there is no `out`.
pub struct Meter<W: Write = io::Stderr> {
    out: Option<W>,
    total: Option<u64>,
    started: Instant,
    last_draw: Option<Instant>,
    /// The length of the line on screen, to blank what a shorter line leaves behind.
    shown: usize,
}

impl Meter<io::Stderr> {
    /// A meter on stderr when `show`, else one that draws nothing.
    pub fn stderr(show: bool) -> Self {
        Meter::new(show.then(io::stderr))
    }
}

impl<W: Write> Meter<W> {
    pub fn new(out: Option<W>) -> Self {
        Meter {
            out,
            total: None,
            started: Instant::now(),
            last_draw: None,
            shown: 0,
        }
    }

    /// The expected total, when it becomes known.
    pub fn set_total(&mut self, total: Option<u64>) {
        self.total = total;
    }

    /// `done` bytes so far: redraws when the last redraw is old enough.
    pub fn update(&mut self, done: u64) {
        let now = Instant::now();
        if self
            .last_draw
            .is_some_and(|last| now.duration_since(last) < REDRAW_INTERVAL)
        {
            return;
        }
        self.last_draw = Some(now);
        let line = format_progress(done, self.total, now.duration_since(self.started));
        self.draw(&line);
    }

    /// Everything moved: the summary replaces the meter and the line is ended.
    pub fn finish(&mut self, done: u64) {
        let line = format_summary(done, self.started.elapsed());
        self.draw(&line);
        self.end_line();
    }

    fn draw(&mut self, line: &str) {
        let Some(out) = self.out.as_mut() else {
            return;
        };
        let length = line.chars().count();
        let blank = self.shown.saturating_sub(length);
        // A meter that cannot be drawn is no reason to fail the transfer.
        let _ = write!(out, "\r{line}{:blank$}", "").and_then(|()| out.flush());
        self.shown = length;
    }

    /// Ends the line the meter drew on (if it drew one), so what follows starts afresh.
    fn end_line(&mut self) {
        if let Some(out) = self.out.as_mut()
            && self.shown > 0
        {
            let _ = out.write_all(b"\n").and_then(|()| out.flush());
        }
        self.shown = 0;
        self.out = None;
    }
}

impl<W: Write> Drop for Meter<W> {
    /// An abandoned meter (the transfer failed) leaves its line ended for the error message.
    fn drop(&mut self) {
        self.end_line();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * MIB;

    #[test]
    fn durations_read_as_hours_minutes_seconds() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(1), "1s"),
            (Duration::from_secs(7), "7s"),
            (Duration::from_secs(59), "59s"),
            (Duration::from_secs(60), "1m00s"),
            (Duration::from_secs(125), "2m05s"),
            (Duration::from_secs(3600), "1h00m00s"),
            (Duration::from_secs(3723), "1h02m03s"),
            (Duration::from_secs(100 * 3600 + 1), "100h00m01s"),
        ];
        for (duration, text) in cases {
            assert_eq!(format_duration(duration), text, "{duration:?}");
        }
    }

    #[test]
    fn rate_is_mebibytes_per_second() {
        assert_eq!(format_rate(100 * MIB, Duration::from_secs(2)), "50.0 MiB/s");
        assert_eq!(format_rate(0, Duration::from_secs(2)), "0.0 MiB/s");
        assert_eq!(format_rate(MIB, Duration::ZERO), "- MiB/s");
    }

    #[test]
    fn eta_follows_the_average_rate_and_never_goes_negative() {
        // 1 GiB of 4 in 10 s: 3 GiB left at 0.1 GiB/s.
        assert_eq!(
            eta(GIB, 4 * GIB, Duration::from_secs(10)),
            Some(Duration::from_secs(30))
        );
        // The stream outgrew its estimate: nothing left, not a negative time.
        assert_eq!(
            eta(4 * GIB + 100, 4 * GIB, Duration::from_secs(10)),
            Some(Duration::ZERO)
        );
        assert_eq!(eta(0, 0, Duration::ZERO), Some(Duration::ZERO));
        // Nothing moved yet: no rate, no estimate.
        assert_eq!(eta(0, GIB, Duration::from_secs(5)), None);
        assert_eq!(eta(MIB, GIB, Duration::ZERO), None);
    }

    #[test]
    fn percentage_stops_at_one_hundred() {
        assert_eq!(percent(0, 100), 0);
        assert_eq!(percent(50, 100), 50);
        assert_eq!(percent(99, 100), 99);
        assert_eq!(percent(150, 100), 100);
        assert_eq!(percent(0, 0), 100);
        assert_eq!(percent(u64::MAX, u64::MAX), 100);
    }

    #[test]
    fn progress_lines() {
        assert_eq!(
            format_progress(GIB, Some(4 * GIB), Duration::from_secs(10)),
            "1.0Gi / 4.0Gi  25%  102.4 MiB/s  ETA 30s"
        );
        assert_eq!(
            format_progress(4 * GIB + 4096, Some(4 * GIB), Duration::from_secs(40)),
            "4.0Gi / 4.0Gi  100%  102.4 MiB/s  ETA 0s"
        );
        assert_eq!(
            format_progress(0, Some(GIB), Duration::ZERO),
            "0 / 1.0Gi  0%  - MiB/s  ETA -"
        );
        assert_eq!(
            format_progress(512 * MIB, None, Duration::from_secs(4)),
            "512Mi  128.0 MiB/s"
        );
        assert_eq!(
            format_summary(4 * GIB, Duration::from_secs(102)),
            "4.0Gi in 1m42s, 40.2 MiB/s"
        );
    }

    #[test]
    fn meter_redraws_in_place_and_ends_its_line() {
        let mut screen = Vec::new();
        {
            let mut meter = Meter::new(Some(&mut screen));
            meter.set_total(Some(GIB));
            meter.update(0);
            // Too soon after the first draw: skipped.
            meter.update(MIB);
            meter.finish(GIB);
        }
        let text = String::from_utf8(screen).unwrap();
        assert!(text.starts_with("\r0 / 1.0Gi  0%"), "{text:?}");
        assert_eq!(text.matches('\r').count(), 2, "{text:?}");
        assert!(text.contains("\r1.0Gi in "), "{text:?}");
        assert!(text.ends_with('\n'), "{text:?}");
        assert_eq!(text.matches('\n').count(), 1, "{text:?}");
    }

    #[test]
    fn an_abandoned_meter_ends_its_line_and_a_silent_one_writes_nothing() {
        let mut screen = Vec::new();
        {
            let mut meter = Meter::new(Some(&mut screen));
            meter.update(MIB);
        }
        let text = String::from_utf8(screen).unwrap();
        assert!(text.starts_with('\r') && text.ends_with('\n'), "{text:?}");

        let mut meter: Meter<Vec<u8>> = Meter::new(None);
        meter.update(MIB);
        meter.finish(MIB);
    }
}
