//! The shared-core rig (`loadgen api --rig shared-core`, issue 50) run for a moment: it must
//! start its server child, drive the bare baseline and the edge, stop the child and report
//! one record per case with every figure and no errors. Nothing here measures anything:
//! the figures are for `docs/benchmarks.md`, from release builds on a quiet machine.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The longest the run may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(180);

/// The figures every record of the rig carries.
const FIGURES: [&str; 12] = [
    "edge_rps",
    "bare_rps",
    "ratio",
    "edge_ttfb_p50_us",
    "edge_ttfb_p99_us",
    "bare_ttfb_p50_us",
    "bare_ttfb_p99_us",
    "ttfb_p99_overhead_us",
    "edge_cpu_us_per_request",
    "nodes_cpu_us_per_request",
    "bare_cpu_us_per_request",
    "errors",
];

#[test]
fn the_shared_core_rig_reports_the_edge_beside_the_bare_server() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["--edge-log-level", "warn", "api", "--rig=shared-core"])
        .args([
            "--modes=stream",
            "--concurrency=2",
            "--nodes=4",
            "--chunks=16",
        ])
        .args(["--duration-ms=200", "--warmup-ms=50"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start loadgen");
    let started = Instant::now();
    while child.try_wait().expect("wait for loadgen").is_none() {
        if started.elapsed() > LIMIT {
            // Only the child this test started.
            let _ = child.kill();
            let output = child.wait_with_output().expect("collect loadgen");
            panic!(
                "the rig hung; stderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().expect("collect loadgen");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the rig failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let prefix = "loadgen api: median of 1 rig=shared-core mode=stream c=2 ";
    let record = stdout
        .lines()
        .find_map(|line| line.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line:\n{stdout}\nstderr:\n{stderr}"));
    let figure = |name: &str| -> f64 {
        record
            .split(' ')
            .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {record}"))
    };
    for name in FIGURES {
        figure(name);
    }
    assert_eq!(figure("errors"), 0.0, "{record}");
    assert!(
        figure("edge_rps") > 0.0,
        "the edge served nothing: {record}"
    );
    assert!(
        figure("bare_rps") > 0.0,
        "the bare server served nothing: {record}"
    );
}
