//! Latency histograms, medians over repetitions, and the report lines.
//!
//! A [`Histogram`] is log-linear (256 sub-buckets per power of two, under 0.4 % error:
//! 16 µs at 4–8 ms, fine enough to tell two paths' TTFT apart where the engine's own time
//! is most of it), so recording is a few instructions and millions of samples cost
//! 128 KiB; tasks keep their own and merge them at the end.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// Sub-buckets per power of two, as a power of two.
const SUB_BITS: u32 = 8;
const SUB: usize = 1 << SUB_BITS;

/// A latency histogram in nanoseconds.
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: vec![0; SUB * 64],
            total: 0,
            max: 0,
        }
    }
}

impl Histogram {
    fn index(value: u64) -> usize {
        if value < SUB as u64 {
            return value as usize;
        }
        let exponent = 63 - value.leading_zeros();
        let shift = exponent - SUB_BITS;
        let mantissa = (value >> shift) as usize;
        (shift as usize + 1) * SUB + (mantissa - SUB)
    }

    fn value(index: usize) -> u64 {
        if index < SUB {
            return index as u64;
        }
        let shift = (index / SUB - 1) as u32;
        let mantissa = (index % SUB + SUB) as u64;
        (mantissa << shift) + ((1u64 << shift) >> 1)
    }

    /// Records one sample.
    pub fn record(&mut self, nanos: u64) {
        self.counts[Self::index(nanos)] += 1;
        self.total += 1;
        self.max = self.max.max(nanos);
    }

    /// Records one duration.
    pub fn record_duration(&mut self, duration: Duration) {
        self.record(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Adds `other`'s samples.
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }

    /// The `q` quantile (0..=1) in nanoseconds; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Self::value(index).min(self.max);
            }
        }
        self.max
    }

    /// The `q` quantile in microseconds.
    pub fn quantile_us(&self, q: f64) -> f64 {
        self.quantile(q) as f64 / 1_000.0
    }
}

/// One measured thing: a key naming the case (`sink=file`, `mode=stream c=16`) and its
/// figures, in the order they were added.
#[derive(Debug, Clone)]
pub struct Record {
    pub key: String,
    pub values: Vec<(&'static str, f64)>,
}

impl Record {
    pub fn new(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            values: Vec::new(),
        }
    }

    pub fn with(mut self, name: &'static str, value: f64) -> Self {
        self.values.push((name, value));
        self
    }

    /// Every one of `values`, in order.
    pub fn with_all(mut self, values: impl IntoIterator<Item = (&'static str, f64)>) -> Self {
        self.values.extend(values);
        self
    }

    pub fn get(&self, name: &str) -> Option<f64> {
        self.values
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }
}

fn format_value(value: f64) -> String {
    if (value.fract() == 0.0 && value.abs() < 1e15) || value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.4}")
    }
}

/// The report line of one record: `loadgen SCENARIO: KEY name=value ...`.
pub fn line(scenario: &str, tag: &str, record: &Record) -> String {
    let mut out = format!("loadgen {scenario}: {tag}{}", record.key);
    for (name, value) in &record.values {
        let _ = write!(out, " {name}={}", format_value(*value));
    }
    out
}

/// Per key and figure, the median over the repetitions (keys in first-seen order).
pub fn medians(repetitions: &[Vec<Record>]) -> Vec<Record> {
    let mut order: Vec<String> = Vec::new();
    let mut by_key: BTreeMap<String, Vec<&Record>> = BTreeMap::new();
    for records in repetitions {
        for record in records {
            if !by_key.contains_key(&record.key) {
                order.push(record.key.clone());
            }
            by_key.entry(record.key.clone()).or_default().push(record);
        }
    }
    order
        .into_iter()
        .map(|key| {
            let records = &by_key[&key];
            let mut median = Record::new(key.clone());
            for (name, _) in &records[0].values {
                let mut values: Vec<f64> = records.iter().filter_map(|r| r.get(name)).collect();
                values.sort_by(f64::total_cmp);
                let middle = values.len() / 2;
                let value = if values.len() % 2 == 1 {
                    values[middle]
                } else {
                    (values[middle - 1] + values[middle]) / 2.0
                };
                median.values.push((name, value));
            }
            median
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_two_percent() {
        let mut h = Histogram::default();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 / 500_000.0 - 1.0).abs() < 0.02, "{p50}");
        assert!((p99 / 990_000.0 - 1.0).abs() < 0.02, "{p99}");
        assert_eq!(h.quantile(1.0), 1_000_000);
    }
}
