//! The goodput example's pictures: for one run of every client against one server, requests
//! answered per second over time against the server's rate limit, and requests in flight over
//! time against its parallel cap, as one SVG.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use plotters::prelude::*;

/// What one client did over time, from its start.
#[derive(Debug, Default)]
pub struct Timeline {
    /// Requests in flight at the server now: +1 when an attempt is sent, -1 when its answer
    /// is refused or fails, or when a successful answer's body has been read.
    pub in_flight: AtomicI64,
    samples: Mutex<Samples>,
}

#[derive(Debug, Default, Clone)]
pub struct Samples {
    /// Seconds from the start at which a successful answer was read to its end.
    pub answered: Vec<f64>,
    /// (seconds from the start, requests in flight).
    pub in_flight: Vec<(f64, i64)>,
}

/// How often the sampler reads the in-flight count.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(20);
/// The step of the rate line, in seconds.
const STEP_S: f64 = 0.1;

impl Timeline {
    /// The body of an answer with status 200 ended at `at`, read whole if `ok`.
    pub fn body_done(&self, started: Instant, at: Instant, ok: bool) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        if ok {
            let t = at.duration_since(started).as_secs_f64();
            self.samples.lock().unwrap().answered.push(t);
        }
    }

    /// Records the in-flight count at `at`.
    pub fn sample(&self, started: Instant, at: Instant) {
        let n = self.in_flight.load(Ordering::Relaxed);
        let t = at.duration_since(started).as_secs_f64();
        self.samples.lock().unwrap().in_flight.push((t, n));
    }

    pub fn samples(&self) -> Samples {
        self.samples.lock().unwrap().clone()
    }
}

/// One client's line in the picture.
pub struct Line<'a> {
    pub client: &'a str,
    pub samples: &'a Samples,
}

/// The server's limits, drawn as lines.
pub struct Limits {
    pub title: String,
    /// Requests per second the server admits in the long run.
    pub rate_per_s: f64,
    /// The span the rate is averaged over, in seconds: the server's window.
    pub rate_window_s: f64,
    pub parallel: u32,
}

/// Answers per second averaged over the trailing `window` seconds, every `STEP_S`, as
/// (time, rate) points: the rate a sliding-window server sees, so its limit is one line.
fn rate(answered: &[f64], end: f64, window: f64) -> Vec<(f64, f64)> {
    let mut sorted = answered.to_vec();
    sorted.sort_by(f64::total_cmp);
    let steps = (end / STEP_S).ceil() as usize;
    (0..=steps)
        .map(|i| {
            let t = i as f64 * STEP_S;
            let upto = sorted.partition_point(|&a| a <= t);
            let from = sorted.partition_point(|&a| a <= t - window);
            (t, (upto - from) as f64 / window)
        })
        .collect()
}

/// Draws the two charts into an SVG at `path`.
pub fn draw(
    path: &Path,
    limits: &Limits,
    lines: &[Line<'_>],
) -> Result<(), Box<dyn std::error::Error>> {
    let end = lines
        .iter()
        .flat_map(|l| {
            l.samples
                .answered
                .iter()
                .chain(l.samples.in_flight.iter().map(|s| &s.0))
        })
        .fold(1.0f64, |a, &b| a.max(b));
    let window = limits.rate_window_s;
    let rates: Vec<_> = lines
        .iter()
        .map(|l| rate(&l.samples.answered, end, window))
        .collect();
    let top_rate = rates
        .iter()
        .flatten()
        .map(|p| p.1)
        .fold(limits.rate_per_s, f64::max)
        * 1.1;
    let top_flight = lines
        .iter()
        .flat_map(|l| l.samples.in_flight.iter().map(|s| s.1))
        .fold(i64::from(limits.parallel), i64::max) as f64
        * 1.1;

    let root = SVGBackend::new(path, (960, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&limits.title, ("sans-serif", 20))?;
    let (upper, lower) = root.split_vertically(360);

    let mut chart = ChartBuilder::on(&upper)
        .margin(10)
        .caption(
            format!("requests answered per second, over the last {window} s"),
            ("sans-serif", 16),
        )
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..end, 0.0..top_rate)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("requests / s")
        .draw()?;
    chart
        .draw_series(LineSeries::new(
            [(0.0, limits.rate_per_s), (end, limits.rate_per_s)],
            BLACK.stroke_width(2),
        ))?
        .label(format!("server limit, {:.0} / s", limits.rate_per_s))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.stroke_width(2)));
    for (i, (line, points)) in lines.iter().zip(&rates).enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(line.client.to_owned())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;

    let mut chart = ChartBuilder::on(&lower)
        .margin(10)
        .caption("requests in flight", ("sans-serif", 16))
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..end, 0.0..top_flight)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("in flight")
        .draw()?;
    let cap = f64::from(limits.parallel);
    chart
        .draw_series(LineSeries::new(
            [(0.0, cap), (end, cap)],
            BLACK.stroke_width(2),
        ))?
        .label(format!("server cap, {}", limits.parallel))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.stroke_width(2)));
    for (i, line) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points = line.samples.in_flight.iter().map(|&(t, n)| (t, n as f64));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(1)))?
            .label(line.client.to_owned())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}
