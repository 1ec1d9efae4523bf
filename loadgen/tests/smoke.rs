//! Smoke runs of the load generator (the `loadgen` binary of this crate): every scenario,
//! with tiny parameters, must complete and print its report line. Nothing here measures
//! anything (figures are for `docs/benchmarks.md`, from release builds on a quiet machine).
//!
//! Cargo builds `loadgen` before it runs these tests. The scenarios that run the edge as a
//! process take the `edge` binary beside it (`target/<profile>/edge`), which
//! `cargo test --workspace` builds for the edge's own integration tests.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The longest a smoke run may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(180);

/// The `edge` binary beside `loadgen`, for `--edge-bin`.
fn edge_bin() -> String {
    let binary = Path::new(env!("CARGO_BIN_EXE_loadgen")).with_file_name("edge");
    assert!(
        binary.is_file(),
        "{} is missing: run `cargo test --workspace` (or `cargo build` first)",
        binary.display()
    );
    format!("--edge-bin={}", binary.display())
}

/// Runs `loadgen ARGS` to its end (killing it after [`LIMIT`]).
fn run(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["--edge-log-level", "warn"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start loadgen");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait for loadgen").is_some() {
            break;
        }
        if started.elapsed() > LIMIT {
            // Only the child this test started.
            let _ = child.kill();
            let output = child.wait_with_output().expect("collect loadgen");
            panic!(
                "loadgen {args:?} hung; stderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("collect loadgen")
}

/// Asserts a clean exit and a report line for `scenario` naming `case`; returns stdout.
fn assert_reported(output: &Output, scenario: &str, case: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "loadgen {scenario} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let prefix = format!("loadgen {scenario}: median of 1 {case}");
    assert!(
        stdout.lines().any(|line| line.starts_with(&prefix)),
        "no `{prefix}` line:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

#[test]
fn register_reports_rate_latency_and_rss() {
    let output = run(&[
        "register",
        "--nodes=20",
        "--concurrency=4",
        "--settle-ms=50",
        &edge_bin(),
    ]);
    let stdout = assert_reported(&output, "register", "nodes=20 edge=process");
    assert!(stdout.contains("registrations_per_s="), "{stdout}");
    assert!(stdout.contains("rss_per_node_bytes="), "{stdout}");
    // Issue 50's topology: the edge on a core of its own, the nodes on the other.
    let output = run(&[
        "register",
        "--nodes=20",
        "--concurrency=4",
        "--settle-ms=50",
        "--rig=shared-core",
        &edge_bin(),
    ]);
    let stdout = assert_reported(
        &output,
        "register",
        "nodes=20 edge=process in_flight=4 rig=shared-core",
    );
    assert!(stdout.contains("handshake_p99_us="), "{stdout}");
}

#[test]
fn storm_brings_every_node_back_after_an_edge_restart_and_serves_runs() {
    let output = run(&[
        "storm",
        "--nodes=20",
        "--retry-ms=10",
        "--backoff-min-ms=20",
        "--backoff-max-ms=100",
        "--runs-after=2",
        "--listen-backlog=64",
        &edge_bin(),
    ]);
    for reconnect in ["immediate", "jitter"] {
        let case = format!("nodes=20 reconnect={reconnect} backlog=64");
        let stdout = assert_reported(&output, "storm", &case);
        assert!(stdout.contains("runs_served_after=2 "), "{stdout}");
        assert!(stdout.contains("listen_overflows="), "{stdout}");
    }
}

#[test]
fn relay_reports_every_sink_kind() {
    let output = run(&[
        "relay",
        "--nodes=2",
        "--events=4",
        "--duration-ms=200",
        "--warmup-ms=50",
        "--sinks=null,file,stdout",
    ]);
    for sink in ["null", "file", "stdout"] {
        let stdout = assert_reported(&output, "relay", &format!("sink={sink}"));
        assert!(stdout.contains("sink_events_per_s="), "{stdout}");
    }
}

#[test]
fn relay_publishes_into_jetstream_on_a_server_it_starts() {
    let output = run(&[
        "relay",
        "--nodes=2",
        "--events=4",
        "--duration-ms=200",
        "--warmup-ms=50",
        "--sinks=nats",
        "--nats-jetstream",
    ]);
    let stdout = assert_reported(&output, "relay", "sink=nats jetstream");
    assert!(stdout.contains("nats_published_per_s="), "{stdout}");
}

/// The edge as the one member of a site (`--cluster`, issue 49): its lease and replicated
/// journal on a JetStream `nats-server` the load generator starts.
#[test]
fn api_runs_as_a_member_of_a_site_on_a_server_it_starts() {
    let output = run(&[
        "api",
        "--cluster",
        "--modes=stream",
        "--concurrency=2",
        "--nodes=1",
        "--duration-ms=200",
        "--warmup-ms=50",
    ]);
    let stdout = assert_reported(&output, "api", "cluster mode=stream c=2");
    assert!(stdout.contains("errors=0"), "{stdout}");
    // The variant that snapshots the journal as a long-running site does.
    let output = run(&[
        "api",
        "--cluster",
        "--snapshot-after-mib=1",
        "--modes=stream",
        "--concurrency=2",
        "--nodes=1",
        "--duration-ms=200",
        "--warmup-ms=50",
    ]);
    let stdout = assert_reported(
        &output,
        "api",
        "cluster snapshot_after_mib=1 mode=stream c=2",
    );
    assert!(stdout.contains("snapshots="), "{stdout}");
}

/// An edge killed with streamed runs open (`readopt`, issue 32), and a site's active
/// member killed under them (`--cluster`, issue 49): every run completes, nothing lost.
#[test]
fn readopt_takes_every_open_run_back_after_a_restart_and_after_a_takeover() {
    for cluster in [None, Some("--cluster")] {
        let args = [
            "readopt",
            "--runs=4",
            "--nodes=2",
            "--deltas=4",
            "--before=1",
            "--limit-ms=60000",
            &edge_bin(),
        ];
        let output = run(&[&args[..], cluster.as_slice()].concat());
        let case = if cluster.is_some() {
            "takeover runs=4"
        } else {
            "runs=4"
        };
        let stdout = assert_reported(&output, "readopt", case);
        assert!(stdout.contains("runs_completed=4 "), "{stdout}");
        assert!(stdout.contains("runs_lost=0 "), "{stdout}");
    }
}

#[test]
fn api_runs_with_span_export_on() {
    let output = run(&[
        "--otlp",
        "api",
        "--concurrency=2",
        "--nodes=1",
        "--duration-ms=200",
        "--warmup-ms=50",
    ]);
    let stdout = assert_reported(&output, "api", "mode=stream c=2");
    assert!(stdout.contains("errors=0"), "{stdout}");
}

#[test]
fn runs_reports_added_latency() {
    let output = run(&["runs", "--duration-ms=200", "--warmup-ms=50"]);
    let stdout = assert_reported(&output, "runs", "concurrency=1 events=0");
    assert!(stdout.contains("added_p99_us="), "{stdout}");
}

#[test]
fn api_reports_both_modes_next_to_the_baseline() {
    let output = run(&[
        "api",
        "--concurrency=1,2",
        "--nodes=1",
        "--duration-ms=200",
        "--warmup-ms=50",
    ]);
    for case in ["mode=stream c=1", "mode=stream c=2", "mode=full c=2"] {
        let stdout = assert_reported(&output, "api", case);
        assert!(stdout.contains("ratio="), "{stdout}");
    }
}

#[test]
fn api_works_with_the_full_mock_node() {
    let output = run(&[
        "api",
        "--node=mock",
        "--concurrency=1",
        "--modes=stream",
        "--nodes=1",
        "--duration-ms=200",
        "--warmup-ms=50",
    ]);
    assert_reported(&output, "api", "mode=stream c=1");
}

#[test]
fn slow_consumer_reports_memory_growth_until_the_node_is_closed() {
    let output = run(&["slow-consumer", "--runs=16", "--run-bytes=65536"]);
    let stdout = assert_reported(&output, "slow-consumer", "runs=16");
    assert!(stdout.contains("rss_growth_mib="), "{stdout}");
    assert!(stdout.contains("closed_as_slow_consumer="), "{stdout}");
}

#[test]
fn churn_reports_the_completed_share() {
    let output = run(&["churn", "--requests=20", "--concurrency=4", "--nodes=2"]);
    let stdout = assert_reported(&output, "churn", "nodes=2 requests=20 c=4");
    assert!(stdout.contains("completed_share="), "{stdout}");
    assert!(stdout.contains("http_404=0"), "{stdout}");
}

/// A stand-in for an OpenAI-compatible engine on a loopback port: `GET /v1/models` lists
/// `tiny`; any POST is answered with a short streamed chat answer, and the connection is
/// closed after it (as `llama-server` does after a streamed answer).
fn fake_engine() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fake engine");
    let addr = listener.local_addr().expect("its address");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve_fake(stream));
        }
    });
    addr
}

/// Serves one connection of the fake engine.
fn serve_fake(stream: std::net::TcpStream) {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut reader = BufReader::new(stream);
    loop {
        let (mut head, mut length) = (String::new(), 0usize);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
            if line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        if reader.read_exact(&mut vec![0; length]).is_err() {
            return;
        }
        let stream = reader.get_mut();
        if !head.starts_with("GET") {
            let _ = stream.write_all(fake_stream().as_bytes());
            return;
        }
        let list = r#"{"object":"list","data":[{"id":"tiny"}]}"#;
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{list}",
            list.len()
        );
    }
}

/// The fake engine's streamed chat answer: a role chunk, two words, the end, `[DONE]`.
fn fake_stream() -> String {
    let chunk = |delta: &str, finish: &str| {
        format!(r#"data: {{"choices":[{{"index":0,"finish_reason":{finish},"delta":{delta}}}]}}"#)
            + "\n\n"
    };
    let events = [
        chunk(r#"{"role":"assistant","content":null}"#, "null"),
        chunk(r#"{"content":" Hello"}"#, "null"),
        chunk(r#"{"content":" there"}"#, "null"),
        chunk("{}", r#""stop""#),
        "data: [DONE]\n\n".to_owned(),
    ];
    let mut out = String::from(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
    for event in events {
        out.push_str(&format!("{:x}\r\n{event}\r\n", event.len()));
    }
    out + "0\r\n\r\n"
}

#[test]
fn latency_breaks_the_edge_path_into_hops() {
    let engine = fake_engine();
    let output = run(&[
        "latency",
        &format!("--engine={engine}"),
        "--requests=4",
        "--warmup=1",
        "--concurrency=1,2",
    ]);
    for case in ["path=direct c=1", "path=edge c=1", "hops c=2"] {
        let stdout = assert_reported(&output, "latency", case);
        assert!(stdout.contains("ttft_p50_over_direct_ms="), "{stdout}");
        assert!(stdout.contains("engine_first_p50_us="), "{stdout}");
        assert!(stdout.contains("unmatched=0"), "{stdout}");
        let errors = stdout
            .split_whitespace()
            .filter(|w| w.starts_with("errors="));
        assert!(errors.clone().count() > 0, "{stdout}");
        assert!(errors.into_iter().all(|w| w == "errors=0"), "{stdout}");
    }
}

/// The figures every record of the rig carries.
const FIGURES: [&str; 15] = [
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
    // The per-thread account: the edge's runtime's, and its run-queue wait.
    "edge_runtime_cpu_us_per_request",
    "edge_runtime_run_queue_us_per_request",
    "nodes_run_queue_us_per_request",
];

/// The floor relay's figures, in the rig's records with `--floor` only.
const FLOOR_FIGURES: [&str; 8] = [
    "floor_rps",
    "floor_ratio",
    "edge_floor_ratio",
    "floor_ttfb_p50_us",
    "floor_ttfb_p99_us",
    "floor_total_p99_us",
    "floor_cpu_us_per_request",
    "floor_nodes_cpu_us_per_request",
];

/// Runs the shared-core rig (`api --rig shared-core`, issue 50) for a moment with `extra`
/// arguments, checks it ended cleanly, and returns the fields of its one record.
fn rig_record(extra: &[&str]) -> String {
    let mut args = vec![
        "api",
        "--rig=shared-core",
        "--modes=stream",
        "--concurrency=2",
        "--nodes=4",
        "--chunks=16",
        "--duration-ms=200",
        "--warmup-ms=50",
    ];
    args.extend_from_slice(extra);
    let output = run(&args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the rig failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let prefix = "loadgen api: median of 1 rig=shared-core mode=stream c=2 ";
    stdout
        .lines()
        .find_map(|line| line.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line:\n{stdout}\nstderr:\n{stderr}"))
        .to_owned()
}

/// The figure `name` of a rig's `record`.
fn figure(record: &str, name: &str) -> f64 {
    record
        .split(' ')
        .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {record}"))
}

/// The shared-core rig run for a moment: it must start its server child, drive the bare
/// baseline and the edge, stop the child and report one record per case with every figure
/// and no errors (and nothing of the floor relay, not asked for).
#[test]
fn the_shared_core_rig_reports_the_edge_beside_the_bare_server() {
    let record = rig_record(&[]);
    for name in FIGURES {
        figure(&record, name);
    }
    assert_served(&record, &["edge_rps", "bare_rps"]);
    assert!(!record.contains("floor"), "{record}");
}

/// `record` has no errors, and each server named by its rate field served requests.
fn assert_served(record: &str, rates: &[&str]) {
    assert_eq!(figure(record, "errors"), 0.0, "{record}");
    for rate in rates {
        assert!(
            figure(record, rate) > 0.0,
            "{rate}: nothing served: {record}"
        );
    }
}

/// The rig with `--floor`: the floor relay (a hop over the node protocol to lean nodes of
/// its own) is driven too and served every request, and so did the edge, with no errors.
#[test]
fn the_shared_core_rig_with_floor_reports_the_floor_relay() {
    let record = rig_record(&["--floor"]);
    for name in FIGURES.iter().chain(&FLOOR_FIGURES) {
        figure(&record, name);
    }
    assert_served(&record, &["floor_rps", "edge_rps", "bare_rps"]);
}
