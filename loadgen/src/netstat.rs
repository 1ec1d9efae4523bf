//! The kernel's TCP counters that tell whether a burst of connections overflowed a listen
//! queue, read the way `nstat` reads them (`/proc/net/netstat`, `/proc/net/snmp`) before
//! and after a burst. They count the whole network namespace, so other loopback traffic on
//! the machine in the same seconds counts too. Absent files (not Linux) read as zeros.

use std::collections::HashMap;

/// The counters a scenario reports: (nstat's name, the record's name).
pub const WATCHED: [(&str, &str); 4] = [
    ("TcpExtListenOverflows", "listen_overflows"),
    ("TcpExtListenDrops", "listen_drops"),
    ("TcpExtTCPSynRetrans", "syn_retrans"),
    ("TcpExtSyncookiesSent", "syncookies_sent"),
];

/// One reading of every counter in both files, by nstat's name (`TcpExtListenOverflows`).
#[derive(Debug, Default)]
pub struct Counters(HashMap<String, u64>);

impl Counters {
    /// Reads both files now.
    pub fn read() -> Self {
        let mut counters = HashMap::new();
        for path in ["/proc/net/netstat", "/proc/net/snmp"] {
            if let Ok(text) = std::fs::read_to_string(path) {
                parse_into(&text, &mut counters);
            }
        }
        Self(counters)
    }

    /// How much each [`WATCHED`] counter grew since `before`, under its record name.
    pub fn grown_since(&self, before: &Counters) -> Vec<(&'static str, f64)> {
        WATCHED
            .iter()
            .map(|(name, record)| {
                let of = |c: &Counters| c.0.get(*name).copied().unwrap_or(0);
                (*record, of(self).saturating_sub(of(before)) as f64)
            })
            .collect()
    }
}

/// Both files are pairs of lines, `Prefix: name name ...` then `Prefix: value value ...`.
fn parse_into(text: &str, counters: &mut HashMap<String, u64>) {
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        let (Some((prefix, names)), Some((_, values))) =
            (names.split_once(':'), values.split_once(':'))
        else {
            continue;
        };
        for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(value) = value.parse() {
                counters.insert(format!("{prefix}{name}"), value);
            }
        }
    }
}
