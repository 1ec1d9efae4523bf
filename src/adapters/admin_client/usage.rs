//! `edge usage`: what runs consumed, from `GET /admin/v1/usage`, as a table (one line per
//! bucket and group, then the totals) or the API's JSON.

use clap::Args;

use super::render::table;
use super::{AdminCommandError, Connection, client, emit, emit_json, segment};
use crate::adapters::admin::views::{UsageCountsView, UsageReport, UsageRowView};

/// `edge usage`.
#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Split by any of `key`, `model`, `node`, `affinity` (the source of the runs' affinity
    /// keys), comma-separated (none: totals only).
    #[arg(long = "group-by")]
    group_by: Option<String>,
    /// Runs that ended in this last while (`15m`, `2h`, `30d`) or since this time (ms since
    /// the Unix epoch).
    #[arg(long)]
    since: Option<String>,
    /// Runs that ended before this time, in the same forms.
    #[arg(long)]
    until: Option<String>,
    /// One line per `minute`, `hour` or `day`.
    #[arg(long)]
    bucket: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Where the management API is.
    #[command(flatten)]
    connection: Connection,
}

/// Prints the usage `args` ask for.
///
/// # Errors
/// [`AdminCommandError::Client`] when the API cannot be reached or refused (the message
/// says why), [`AdminCommandError::Output`] when standard output is closed.
pub(super) async fn usage(args: UsageArgs) -> Result<(), AdminCommandError> {
    let mut query = String::from("/admin/v1/usage?");
    for (name, value) in [
        ("group_by", &args.group_by),
        ("since", &args.since),
        ("until", &args.until),
        ("bucket", &args.bucket),
    ] {
        if let Some(value) = value {
            query.push_str(&format!("{name}={}&", segment(value)));
        }
    }
    let report: UsageReport = client(&args.connection)?
        .get(query.trim_end_matches(['&', '?']))
        .await?;
    if args.json {
        emit_json(&report)
    } else {
        emit(render(&report).trim_end())
    }
}

/// The table: the bucket start when split, the groups asked for, then the sums.
fn render(report: &UsageReport) -> String {
    let mut header: Vec<&str> = Vec::new();
    if report.per_bucket {
        header.push("BUCKET_START_MS");
    }
    header.extend(report.group_by.iter().map(|g| match g.as_str() {
        "key" => "KEY",
        "model" => "MODEL",
        "affinity" => "AFFINITY",
        _ => "NODE",
    }));
    let dimensions = header.len();
    header.extend([
        "RUNS",
        "ERRORS",
        "INPUT",
        "CACHED",
        "OUTPUT",
        "REASONING",
        "HIT_RATE",
    ]);
    let mut rows: Vec<Vec<String>> = report.rows.iter().map(|r| row(report, r)).collect();
    let mut totals = vec![String::new(); dimensions];
    if let Some(first) = totals.first_mut() {
        "total".clone_into(first);
    }
    totals.extend(counts(&report.totals));
    rows.push(totals);
    table(&header, &rows)
}

fn row(report: &UsageReport, row: &UsageRowView) -> Vec<String> {
    let mut cells = Vec::new();
    if report.per_bucket {
        cells.push(row.start_ms.map(|s| s.to_string()).unwrap_or_default());
    }
    for group in &report.group_by {
        let value = match group.as_str() {
            "key" => &row.key,
            "model" => &row.model,
            "affinity" => &row.affinity,
            _ => &row.node,
        };
        cells.push(value.clone().unwrap_or_else(|| "-".to_owned()));
    }
    cells.extend(counts(&row.counts));
    cells
}

fn counts(counts: &UsageCountsView) -> Vec<String> {
    let rate = counts
        .cache_hit_rate
        .map_or_else(|| "-".to_owned(), |r| format!("{:.1}%", r * 100.0));
    vec![
        counts.runs.to_string(),
        counts.errors.to_string(),
        counts.input_tokens.to_string(),
        counts.cached_input_tokens.to_string(),
        counts.output_tokens.to_string(),
        counts.reasoning_tokens.to_string(),
        rate,
    ]
}
