//! Reads of the usage rollups (`usage` table, written by `log.rs` in the transaction that
//! ends each run): the rows of one bucket size in a range, summed by the groups asked for.
//! Never a scan of runs or events.

use std::borrow::Cow;

use rusqlite::{Connection, Row, params};

use super::sql::to_sql;
use crate::domain::{UsageCounts, UsageGroup, UsageQuery, UsageRow};

/// The rows `query` asks for: ordered by bucket start, then key, model, node and affinity.
///
/// # Errors
/// What SQLite reported.
pub(super) fn read_usage(conn: &Connection, query: &UsageQuery) -> rusqlite::Result<Vec<UsageRow>> {
    let by = query.group_by;
    let column = |wanted: bool, name: &'static str| if wanted { name } else { "''" };
    let start = if query.per_bucket { "start_ms" } else { "-1" };
    let dimensions = [
        start,
        column(by.key, "key"),
        column(by.model, "model"),
        column(by.node, "node"),
        column(by.affinity, "affinity"),
    ]
    .join(", ");
    let sql = format!(
        "SELECT {dimensions}, sum(runs), sum(errors), sum(input_tokens),
            sum(cached_input_tokens), sum(output_tokens), sum(reasoning_tokens)
         FROM usage WHERE bucket = ?1 AND start_ms >= ?2 AND start_ms < ?3
         GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5"
    );
    let since = query.bucket.start_of(query.since_ms);
    let mut statement = conn.prepare_cached(&sql)?;
    let rows = statement.query_map(
        params![query.bucket.as_str(), to_sql(since), to_sql(query.until_ms)],
        |row| read_row(row, query),
    )?;
    rows.collect()
}

fn read_row(row: &Row<'_>, query: &UsageQuery) -> rusqlite::Result<UsageRow> {
    let by = query.group_by;
    let count = |index| {
        row.get::<_, i64>(index)
            .map(|n| u64::try_from(n).unwrap_or(0))
    };
    let name = |wanted: bool, index| -> rusqlite::Result<Option<String>> {
        let text: String = row.get(index)?;
        Ok((wanted && !text.is_empty()).then_some(text))
    };
    let start: i64 = row.get(0)?;
    Ok(UsageRow {
        start_ms: query.per_bucket.then(|| u64::try_from(start).unwrap_or(0)),
        group: UsageGroup {
            key: name(by.key, 1)?,
            model: name(by.model, 2)?,
            node: name(by.node, 3)?,
            affinity: name(by.affinity, 4)?.map(Cow::Owned),
        },
        counts: UsageCounts {
            runs: count(5)?,
            errors: count(6)?,
            input_tokens: count(7)?,
            cached_input_tokens: count(8)?,
            output_tokens: count(9)?,
            reasoning_tokens: count(10)?,
        },
    })
}
