//! How the operator commands print: aligned tables, like `kubectl get`, and key-value
//! details. Pure functions of the API's views and the current time.

use std::fmt::Write as _;

use crate::adapters::admin::fit_views::InventoryView;
use crate::adapters::admin::views::{NodeView, RunView};
use crate::domain::Bytes;

/// Lines of cells, each column padded to its widest cell.
pub(super) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

/// How long ago `then_ms` was, from `now_ms`: `42s`, `5m`, `3h`, `2d`.
pub(super) fn age(now_ms: u64, then_ms: u64) -> String {
    span(now_ms.saturating_sub(then_ms))
}

/// A span of milliseconds, short: `850ms`, `42s`, `5m`, `3h`, `2d`.
pub(super) fn span(ms: u64) -> String {
    let secs = ms / 1_000;
    match secs {
        0 => format!("{ms}ms"),
        1..60 => format!("{secs}s"),
        60..3_600 => format!("{}m", secs / 60),
        3_600..86_400 => format!("{}h", secs / 3_600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// The `edge nodes` table.
pub(super) fn nodes(nodes: &[NodeView], now_ms: u64) -> String {
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            let adapters: Vec<String> = n
                .adapters
                .iter()
                .map(|a| {
                    let targets: Vec<&str> = a.targets.iter().map(|t| t.name.as_str()).collect();
                    format!("{}[{}]", a.name, targets.join(","))
                })
                .collect();
            vec![
                n.id.clone(),
                n.alias.clone(),
                n.state.clone(),
                format!("{}/{}", n.active_runs, n.limits.max_concurrent_runs),
                n.peer.clone().unwrap_or_else(|| "-".into()),
                n.last_heartbeat_ms.map_or("-".into(), |t| age(now_ms, t)),
                n.connected_since_ms.map_or("-".into(), |t| age(now_ms, t)),
                devices(n.inventory.as_ref()),
                adapters.join(" "),
            ]
        })
        .collect();
    let header = [
        "ID",
        "ALIAS",
        "STATE",
        "RUNS",
        "PEER",
        "HEARTBEAT",
        "UP",
        "DEVICES",
        "ADAPTERS",
    ];
    table(&header, &rows)
}

/// A node's devices, each as `index:name:used/total`: `0:memory:3.1GiB/23.5GiB`.
fn devices(inventory: Option<&InventoryView>) -> String {
    let Some(inventory) = inventory.filter(|i| !i.devices.is_empty()) else {
        return "-".into();
    };
    let devices: Vec<String> = inventory
        .devices
        .iter()
        .map(|d| {
            let name = d.name.replace(' ', "_");
            let size = format!("{}/{}", Bytes(d.used_bytes), Bytes(d.total_bytes));
            format!("{}:{name}:{}", d.index, size.replace(' ', ""))
        })
        .collect();
    devices.join(" ")
}

/// The header of the `edge runs` table.
pub(super) const RUN_HEADER: [&str; 8] = [
    "ID",
    "OUTCOME",
    "ADAPTER/TARGET",
    "NODE",
    "AGE",
    "DURATION",
    "TOKENS",
    "CODE",
];

/// One row of the `edge runs` table.
pub(super) fn run_row(run: &RunView, now_ms: u64) -> Vec<String> {
    let end = run.finished_at_ms.unwrap_or(now_ms);
    vec![
        run.id.clone(),
        run.outcome.clone(),
        format!("{}/{}", run.adapter, run.target),
        run.node.clone().unwrap_or_else(|| "-".into()),
        age(now_ms, run.queued_at_ms),
        span(end.saturating_sub(run.queued_at_ms)),
        run.usage.as_ref().map_or("-".into(), |u| {
            format!("{}/{}", u.input_tokens, u.output_tokens)
        }),
        run.code.clone().unwrap_or_else(|| "-".into()),
    ]
}

/// `edge run show`: one field per line.
pub(super) fn run_details(run: &RunView, now_ms: u64) -> String {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let at = |v: Option<u64>| v.map_or("-".into(), |t| format!("{t} ({} ago)", age(now_ms, t)));
    let mut out = String::new();
    let mut field = |name: &str, value: String| {
        let _ = writeln!(out, "{name:<16}{value}");
    };
    field("id", run.id.clone());
    field("outcome", run.outcome.clone());
    field("code", opt(&run.code));
    field("message", opt(&run.message));
    field("finish reason", opt(&run.finish_reason));
    field("adapter", run.adapter.clone());
    field("target", run.target.clone());
    field("operation", run.operation.clone());
    field("pin", opt(&run.pin));
    field("api key", opt(&run.api_key_name));
    field("node", opt(&run.node));
    field("route reason", opt(&run.route_reason));
    field("attempts", run.attempts.len().to_string());
    field("queued at", at(Some(run.queued_at_ms)));
    field("started at", at(run.started_at_ms));
    field("first output", at(run.first_output_at_ms));
    field("finished at", at(run.finished_at_ms));
    field(
        "tokens",
        run.usage.as_ref().map_or("-".into(), |u| {
            format!("{} in, {} out", u.input_tokens, u.output_tokens)
        }),
    );
    field(
        "events",
        format!("{} ({} stored)", run.events, run.events_stored),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_spans_are_short() {
        let text = table(&["A", "LONGER"], &[vec!["wide-cell".into(), "x".into()]]);
        assert_eq!(text, "A          LONGER\nwide-cell  x\n");
        assert_eq!(span(850), "850ms");
        assert_eq!(span(42_000), "42s");
        assert_eq!(span(300_000), "5m");
        assert_eq!(span(3 * 3_600_000), "3h");
        assert_eq!(span(2 * 86_400_000), "2d");
        assert_eq!(age(1_000, 5_000), "0ms");
    }

    #[test]
    fn a_nodes_devices_say_their_memory() {
        use crate::adapters::admin::fit_views::DeviceView;
        let inventory = InventoryView {
            devices: vec![DeviceView {
                index: 0,
                kind: "gpu".into(),
                name: "NVIDIA GeForce RTX 4090".into(),
                total_bytes: 24 << 30,
                used_bytes: 1 << 30,
            }],
        };
        assert_eq!(
            devices(Some(&inventory)),
            "0:NVIDIA_GeForce_RTX_4090:1.00GiB/24.00GiB"
        );
        assert_eq!(devices(None), "-");
    }
}
