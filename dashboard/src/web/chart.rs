//! Line charts drawn server-side as SVG (askama fills `templates/chart.html`;
//! no JavaScript charting), each with the numbers a text equivalent needs.

use serde::Serialize;

/// An SVG chart drawn server-side: polyline points in a `width × height` box
/// plus the numbers a screen reader (or a table) needs.
#[derive(Debug, Clone, Serialize)]
pub struct Chart {
    /// Title (also the accessible name).
    pub title: String,
    /// `x,y x,y …` in the view box (numbers only: safe in an attribute).
    pub points: String,
    /// View box width.
    pub width: u32,
    /// View box height.
    pub height: u32,
    /// Smallest and largest value, and the latest.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// Latest value.
    pub last: f64,
    /// Number of buckets drawn.
    pub samples: usize,
    /// Unit suffix for the text equivalent.
    pub unit: &'static str,
    /// The y axis's top, with its unit (the axis starts at 0): a rounded
    /// value at or above the largest, so 1 ms latencies are drawn as 1 ms on
    /// a 1 ms axis, not as full-height spikes of an unlabelled one.
    pub y_top: String,
}

impl Chart {
    /// Draws `values` (oldest first) as a polyline from 0 up to a rounded
    /// top at or above the largest value ([`nice_top`]).
    pub fn line(
        title: impl Into<String>,
        unit: &'static str,
        values: &[f64],
        width: u32,
        height: u32,
    ) -> Chart {
        let max = values.iter().copied().fold(0.0_f64, f64::max);
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let scale = nice_top(max);
        let step = if values.len() > 1 {
            f64::from(width) / (values.len() - 1) as f64
        } else {
            0.0
        };
        let top = 2.0;
        let usable = f64::from(height) - 2.0 * top;
        let points = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let x = i as f64 * step;
                let y = top + usable - (v / scale) * usable;
                format!("{x:.1},{y:.1}")
            })
            .collect::<Vec<_>>()
            .join(" ");
        Chart {
            title: title.into(),
            points,
            width,
            height,
            min: if min.is_finite() { min } else { 0.0 },
            max,
            last: values.last().copied().unwrap_or(0.0),
            samples: values.len(),
            unit,
            y_top: with_unit(scale, unit),
        }
    }

    /// The text equivalent: what the chart says, in words.
    pub fn describe(&self) -> String {
        if self.samples == 0 {
            return format!("{}: no samples yet.", self.title);
        }
        format!(
            "{}: {} samples, latest {}, lowest {}, highest {}.",
            self.title,
            self.samples,
            with_unit(self.last, self.unit),
            with_unit(self.min, self.unit),
            with_unit(self.max, self.unit),
        )
    }
}

/// The smallest of 1, 2, 2.5 and 5 times a power of ten at or above `max`
/// (1 for nothing above 0): an axis top a reader can read.
pub fn nice_top(max: f64) -> f64 {
    if !(max > 0.0 && max.is_finite()) {
        return 1.0;
    }
    let power = 10_f64.powf(max.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|step| step * power)
        .find(|top| *top >= max * (1.0 - 1e-9))
        .unwrap_or(10.0 * power)
}

/// A value with its unit; seconds below one as milliseconds.
fn with_unit(value: f64, unit: &str) -> String {
    if unit == " s" && value < 1.0 && value != 0.0 {
        return format!("{} ms", short(value * 1_000.0));
    }
    format!("{}{unit}", short(value))
}

fn short(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_scale_to_their_box_and_describe_themselves() {
        let chart = Chart::line("Lag", " events", &[0.0, 5.0, 10.0], 100, 24);
        assert_eq!(chart.points, "0.0,22.0 50.0,12.0 100.0,2.0");
        assert_eq!(chart.y_top, "10 events");
        // A 1 ms latency sits low on a readable axis, not at full height.
        let claims = Chart::line("Claims", " s", &[0.001, 0.0012], 100, 24);
        assert_eq!(claims.y_top, "2 ms");
        assert!(
            claims
                .describe()
                .ends_with("latest 1.2 ms, lowest 1 ms, highest 1.2 ms.")
        );
        assert_eq!(claims.points, "0.0,12.0 100.0,10.0");
        assert_eq!(
            [0.0, 0.3, 7.0, 26.0, 60_108.0].map(nice_top),
            [1.0, 0.5, 10.0, 50.0, 100_000.0]
        );
        assert_eq!(
            chart.describe(),
            "Lag: 3 samples, latest 10 events, lowest 0 events, highest 10 events."
        );
        assert_eq!(
            Chart::line("Empty", "", &[], 10, 10).describe(),
            "Empty: no samples yet."
        );
    }
}
